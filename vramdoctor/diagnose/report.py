"""The diagnose report: one-line verdict, facts table, findings most severe first.

Evidence lines are shown as the server printed them (prefixes stripped), with the part that
fired the rule highlighted; rich drops the styling when piped or with NO_COLOR.
"""

from __future__ import annotations

import re
from pathlib import PurePath

from rich.console import Console, Group
from rich.text import Text

from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.findings import EVIDENCE_CHARS, Diagnosis, Evidence, Finding
from vramdoctor.diagnose.names import KNOWN_SERVERS as KNOWN_SERVERS  # (for the CLI)
from vramdoctor.diagnose.names import display_name
from vramdoctor.render.table import Table
from vramdoctor.render.wrap import Paragraph
from vramdoctor.units import format_count

# characters of an evidence line in the terminal: all that is kept (JSON has the same), so an OOM
# message's last figures are never cut off
EVIDENCE_SHOWN = EVIDENCE_CHARS
_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}
_HIGHLIGHT = re.compile(
    "|".join(
        rx.pattern
        for rx in (
            P.CUDA_OOM,
            P.LEAK,
            P.SGL_RETRACT,
            P.VLLM_NO_KV,
            P.TRITON_SMEM,
            P.RAY_OOM,
            P.SGL_GRAPH_FAILED,
            P.OOM_TRIED,
            P.OOM_GPU,
            P.OOM_PROCESS,
            P.LEAK_FIELD,
        )
    )
    + r"|disable_fast_image_processor=\w+|image_processor_backend='?\w+'?|type=\w+|mem_fraction_static=[\d.]+"
    r"|tp_size=\d+|CUDA IPC|avail mem=[\d.]+ GB",
    re.IGNORECASE,
)
_SHOW_FACTS = (
    ("model", "model"),
    ("architecture", "architecture"),
    ("multimodal", "multimodal"),
    ("tp_size", "tensor parallel"),
    ("dp_size", "data parallel"),
    ("pp_size", "pipeline parallel"),
    ("mem_fraction_static", "mem_fraction_static"),
    ("gpu_memory_utilization", "gpu_memory_utilization"),
    ("attention_backend", "attention backend"),
    ("platform", "platform"),
    ("fast_image_processor", "fast image processor"),
    ("cuda_ipc_transport", "CUDA IPC transport"),
    ("weights_mib", "weights"),
    ("kv_cache_mib", "KV cache"),
    ("kv_tokens", "KV tokens"),
    ("cuda_graph_mib", "CUDA graphs"),
    ("avail_after_graph_mib", "free after startup"),
)


def verdict(d: Diagnosis) -> tuple[str, str]:
    """(text, style) of the one-line verdict."""
    server = _server_name(d)
    ver = f" {d.version}" if d.version else ""
    if d.groups:
        server = (
            "Logs of different servers ("
            + "; ".join(
                f"{_server_name(g)}{' ' + g.version if g.version else ''}: {', '.join(f.file for f in g.files)}"
                for g in d.groups
            )
            + "), each diagnosed on its own"
        )
        ver = ""
    if not d.findings:
        return (
            f"{server}{ver}: no known cause of GPU-memory growth or OOM found in the log.",
            "green",
        )
    top = d.findings[0]
    n = {s: sum(1 for f in d.findings if f.severity == s) for s in ("critical", "warning", "info")}
    counts = ", ".join(f"{v} {k}" for k, v in n.items() if v)
    return f"{server}{ver}: {top.title} ({counts}).", _STYLE[top.severity]


def _server_name(d: Diagnosis) -> str:
    return display_name(d.server, d.facts.variant)


def _fmt(name: str, v: object) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if name.endswith("_mib") and isinstance(v, (int, float)):
        return f"{v / 1024:.2f} GiB" if v >= 1024 else f"{v:.0f} MiB"
    if name.endswith("_tokens") and isinstance(v, int):
        return format_count(v, "tokens")
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:,}"
    return str(v)


def facts_table(
    d: Diagnosis, single: bool = False, title: str = "Facts read from the log"
) -> Table:
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("fact")
    t.add_column("value")
    t.add_column("from", style="dim", priority=1)
    t.add_row("server", d.server or "unknown", "")
    f = d.facts
    if d.version or not f.version_at_least:
        t.add_row("version", d.version or "not printed", _where(d.version_evidence, single))
    else:  # no version line, but a line's format dates the server
        t.add_row(
            "version",
            f"not printed; {f.version_at_least} or later by the log's format",
            _where(f.evidence.get("version_at_least"), single),
        )
    for name, label in _SHOW_FACTS:
        v = getattr(f, name)
        if v is None and name in f.hints:
            # a name suggests it, no line shows it: said as such, never as the fact
            hint = f.hints[name]
            t.add_row(
                label,
                f"not shown (the name suggests {_fmt(name, hint['value'])})",
                str(hint["rests_on"]),
            )
            continue
        if name == "tp_size" and v is None and f.tp_size_at_least is not None:
            # only some ranks printed: a lower bound, said as one
            t.add_row(
                label,
                f"at least {f.tp_size_at_least}",
                _where(f.evidence.get("tp_size_at_least"), single),
            )
            continue
        if v is None:
            continue
        shown = _fmt(name, v)
        if name == "tp_size" and f.tp_size_is_lower_bound:
            shown = f"at least {v} (from the rank tags seen)"
        t.add_row(label, shown, _where(f.evidence.get(name), single))
    return t


def _loc(e: Evidence, single: bool) -> str:
    """'line N' when there is one input file, else 'name:N'."""
    return f"line {e.line}" if single else f"{PurePath(e.file).name}:{e.line}"


def _where(e: Evidence | None, single: bool) -> str:
    if e is None:
        return ""
    return _loc(e, single) if e.line else e.text  # a reasoning (no line): whole, the column folds


def _evidence_text(e: Evidence, single: bool) -> Text:
    head = Text(f"{_loc(e, single)}: " if e.line else "", style="dim")
    # a line longer than the evidence keeps (EVIDENCE_CHARS) was cut when read: say so with "…"
    text = e.text if len(e.text) < EVIDENCE_SHOWN else e.text[: EVIDENCE_SHOWN - 1] + "…"
    body = Text(text)
    for m in _HIGHLIGHT.finditer(text):
        body.stylize("bold magenta", m.start(), m.end())
    return head + body


def finding_panel(f: Finding, single: bool = False, width: int | None = None) -> Group:
    """One finding as a block: its heading (severity, title, rule id), then the explanation, the
    evidence lines, what it rests on and the fix, indented. Every part wraps between words, a number
    kept with its unit, and nothing is cut at any width or in a pipe (vramdoctor.render.wrap); no
    box around it (a box crops a word longer than its inside)."""
    del width  # (kept for callers: the block wraps at whatever width it is given)
    head = Text.assemble(
        (f"{f.severity.upper()} ", _STYLE[f.severity]), (f.title, "bold"), (f"  [{f.id}]", "dim")
    )
    parts: list[Text] = [head, Text("  ") + Text(f.explanation)]
    if f.evidence:
        parts.append(Text("  Evidence:", style="bold"))
        parts.extend(Text("    ") + _evidence_text(e, single) for e in f.evidence)
    basis = f.rests_on
    if basis == "derived":
        # a cause computed from read figures says so, and shows the arithmetic
        shown = "; ".join(f.derived) if f.derived else "computed from the lines above"
        parts.append(Text.assemble(("  Rests on: ", "bold"), f"derived ({shown})"))
    elif basis == "unknown":
        parts.append(
            Text.assemble(("  Rests on: ", "bold"), "unknown (the log does not show the cause)")
        )
    parts.append(Text.assemble(("  Fix: ", "bold green"), f.fix))
    return Group(*(Paragraph(p) for p in parts), Text(""))


def _events_line(d: Diagnosis, con: Console, where: str) -> None:
    """'Events: cuda_oom x2, server_crash x2' (of one server's files), or nothing."""
    if d.event_counts:
        counts = ", ".join(f"{k} x{v}" for k, v in sorted(d.event_counts.items()))
        con.print(Text(f"Events{where}: {counts}", style="dim"))


def render(d: Diagnosis, con: Console) -> None:
    single = len(d.files) == 1
    text, style = verdict(d)
    con.print(Paragraph(Text(text, style=style)))
    for fs in d.files:
        for note in fs.notes:
            con.print(Text(f"note: {fs.file}: {note}", style="dim"))
        if not fs.recognised and not any(n.startswith("not read: ") for n in fs.notes):
            con.print(
                Text(
                    f"note: {fs.file}: not a server log diagnose reads ({KNOWN_SERVERS}; no known line found)",
                    style="yellow",
                )
            )
    if d.groups:  # different servers: one facts table and one events line each, never merged
        for g in d.groups:
            names = ", ".join(f.file for f in g.files)
            con.print(facts_table(g, single, f"Facts read from {names} ({_server_name(g)})"))
            _events_line(g, con, f" in {names}")
    else:
        con.print(facts_table(d, single))
        _events_line(d, con, "")
    for f in d.findings:
        con.print(finding_panel(f, single, con.width))
