"""What soak users see: the live view while it runs, and the final report.

Live view (only on an interactive terminal): progress bars for rounds and requests, error
counts, and a sparkline of memory per GPU and per leading process. Final report: the verdict
sentence, the figures, a table of settled levels per round, a terminal sparkline per series,
and on request the same as a PNG chart or a self-contained HTML file for a bug report.
"""

from __future__ import annotations

import base64
import html
import threading
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..analysis.soak import (
    CACHING,
    INCONCLUSIVE,
    LEAK,
    STABLE,
    SoakResult,
    kv_usage,
)
from ..errors import InputError
from ..model import GpuSample, HostSample, MetricsSample
from .charts import Line, Span, memory_chart

_BLOCKS = "▁▂▃▄▅▆▇█"
VERDICT_STYLE = {LEAK: "bold red", CACHING: "bold yellow", STABLE: "bold green",
                 INCONCLUSIVE: "bold magenta"}


def sparkline(values: list[float], width: int = 40) -> str:
    """Unicode sparkline of the last `width` values (resampled when longer)."""
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [values[int(i * step)] for i in range(width)]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        return _BLOCKS[0] * len(values)
    return "".join(_BLOCKS[min(7, int((v - lo) / (hi - lo) * 7.999))] for v in values)


def _time_grid(points: dict[str, list[tuple[float, float]]], result: SoakResult,
               width: int) -> tuple[float, float, int] | None:
    starts = [p[0][0] for p in points.values() if p] + [w.start for w in result.windows]
    ends = [p[-1][0] for p in points.values() if p] + [w.end for w in result.windows if w.end]
    if not starts or not ends or max(ends) <= min(starts):
        return None
    return min(starts), max(ends), width


def time_sparkline(values: list[tuple[float, float]], t0: float, t1: float, width: int) -> str:
    """A sparkline on a time axis: one cell per (t1-t0)/width seconds (last value in the cell;
    blank where the series has no sample yet), so cells line up with `phase_strip`."""
    if not values:
        return " " * width
    step = (t1 - t0) / width
    cells: list[float | None] = [None] * width
    for t, v in values:
        i = min(width - 1, max(0, int((t - t0) / step)))
        cells[i] = v
    last = None
    for i, v in enumerate(cells):  # carry the level through empty cells after the first sample
        if v is None:
            cells[i] = last
        else:
            last = v
    vals = [v for v in cells if v is not None]
    lo, hi = min(vals), max(vals)
    out = []
    for v in cells:
        if v is None:
            out.append(" ")
        elif hi - lo < 1e-9:
            out.append(_BLOCKS[0])
        else:
            out.append(_BLOCKS[min(7, int((v - lo) / (hi - lo) * 7.999))])
    return "".join(out)


def phase_strip(result: SoakResult, t0: float, t1: float, width: int) -> str:
    """The protocol on the same time axis: round digits while loading, '.' idle, 'b' baseline."""
    step = (t1 - t0) / width
    cells = [" "] * width
    for w in result.windows:
        end = w.end if w.end is not None else t1
        a = max(0, int((w.start - t0) / step))
        b = min(width, max(a + 1, int((end - t0) / step + 0.5)))
        ch = {"load": str(w.round % 10), "idle": ".", "baseline": "b"}.get(w.kind, " ")
        for i in range(a, b):
            if cells[i] == " " or w.kind == "load":
                cells[i] = ch
    return "".join(cells)


# --- live view -----------------------------------------------------------------------------

class LiveView:
    """Rich live display fed by the collector (samples) and the load (request outcomes)."""

    def __init__(self, console: Console, rounds: int, per_round: int, history: int = 120) -> None:
        self.console = console
        self.rounds = rounds
        self.per_round = per_round
        self._series: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=history))
        self._lock = threading.Lock()
        self.errors: dict[str, int] = defaultdict(int)
        self.phase = "starting"
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console)
        self._t_rounds = self.progress.add_task("rounds", total=rounds)
        self._t_reqs = self.progress.add_task("requests (round)", total=per_round)
        # Live redraws from _render 4 times a second (and once at exit); feeding it data does
        # not rebuild the display for every sample.
        self._live = Live(get_renderable=self._render, console=console, refresh_per_second=4,
                          transient=False)

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.__exit__(*exc)

    def on_sample(self, source: str, record: Any) -> None:
        with self._lock:
            if isinstance(record, GpuSample):
                for g in record.gpus:
                    self._series[f"GPU {g.index} used"].append(g.used_mib)
                for p in record.processes:
                    if p.used_mib is not None:
                        self._series[f"GPU {p.gpu} pid {p.pid} {p.name or ''}".strip()].append(p.used_mib)
            elif isinstance(record, HostSample):
                for p in record.processes:
                    self._series[f"RSS pid {p.pid} {p.name or ''}".strip()].append(p.rss_mib)
            elif isinstance(record, MetricsSample) and (kv := kv_usage(record)) is not None:
                self._series["KV usage (ratio)"].append(kv)

    def on_result(self, _req: Any, outcome: Any) -> None:
        with self._lock:
            if not outcome.ok:
                self.errors[outcome.kind] += 1
        self.progress.advance(self._t_reqs)

    def on_state(self, state: Any) -> None:
        self.phase = state.phase
        if state.phase == "load" and len(state.results) < state.round:
            self.progress.update(self._t_reqs, completed=0, description=f"requests (round {state.round})")
        self.progress.update(self._t_rounds, completed=len(state.results))
        if state.phase_ends_at and state.phase in ("idle", "baseline"):
            left = max(0.0, state.phase_ends_at - time.monotonic())
            self.phase = f"{state.phase} ({left:.0f} s left)"

    def _render(self) -> Group:
        table = Table(box=None, show_header=True, pad_edge=False)
        table.add_column("series")
        table.add_column("now", justify="right")
        table.add_column("history")
        with self._lock:
            items = [(k, list(v)) for k, v in self._series.items() if v]
        gpus = [i for i in items if i[0].endswith(" used")]
        procs = sorted((i for i in items if " pid " in i[0]), key=lambda i: -i[1][-1])[:4]
        kv = [i for i in items if i[0].startswith("KV")]
        for key, vals in gpus + procs + kv:
            now_v = f"{vals[-1]:.2f}" if key.startswith("KV") else f"{vals[-1]:.0f} MiB"
            table.add_row(key, now_v, sparkline(vals))
        errs = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        head = Text(f"phase: {self.phase}   errors: {errs}")
        return Group(head, self.progress, table)


# --- final report --------------------------------------------------------------------------

def _fmt(v: float | None, unit: str = "MiB", digits: int = 1) -> str:
    if v is None:
        return "-"
    if unit == "ratio":
        return f"{v:.3f}"
    return f"{v:.{digits}f}"


def _hours(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} days"


def key_series(result: SoakResult, limit: int = 8) -> list[Any]:
    """The series worth showing: each GPU, the culprit, the most grown processes, KV."""
    out = [s for s in result.series if s.kind == "gpu"]
    culprit = result.culprit.get("series")
    procs = [s for s in result.series if s.kind in ("gpu_process", "rss")]
    procs.sort(key=lambda s: (s.key != culprit, -(abs(s.growth or 0.0)), -(s.last or 0.0)))
    out += procs[: max(1, limit - len(out) - 1)]
    out += [s for s in result.series if s.kind == "kv"]
    return out[:limit]


def _label(s: Any) -> str:
    if s.kind == "gpu":
        return f"GPU {s.gpu} (device)"
    if s.kind == "gpu_process":
        return f"GPU {s.gpu} pid {s.pid} {s.name or ''}".strip()
    if s.kind == "rss":
        return f"RSS pid {s.pid} {s.name or ''}".strip()
    return "KV usage"


def _culprit_text(c: dict[str, Any]) -> str:
    who = f"pid {c['pid']} ({c.get('name') or '?'})" if c.get("pid") is not None else c.get("series", "?")
    where = f" on GPU {c['gpu']}" if c.get("gpu") is not None else ""
    return f"{who}{where}, layer {c.get('layer')}"


def figures(result: SoakResult) -> list[tuple[str, str]]:
    c = result.culprit
    rows = [
        ("verdict", result.verdict),
        ("leak per request", f"{result.leak_mib_per_request:.3f} MiB" if result.leak_mib_per_request is not None else "-"),
        ("leak per hour (observed load)", f"{result.leak_mib_per_hour:.0f} MiB" if result.leak_mib_per_hour is not None else "-"),
        ("time to out of memory", _hours(result.hours_to_oom)),
        ("free memory now", f"{result.free_mib:.0f} MiB" if result.free_mib is not None else "-"),
        ("load", f"{result.requests_per_hour:.0f} requests/hour while sending" if result.requests_per_hour else "-"),
        ("culprit" if result.verdict == LEAK else "main series",
         _culprit_text(c) if c.get("series") and result.verdict == LEAK else (c.get("series") or "-")),
        ("rounds", f"{len(result.rounds)} ({sum(r.sent for r in result.rounds)} requests, "
                   f"{sum(r.errors for r in result.rounds)} errors)"),
    ]
    cs = next((s for s in result.series if s.key == c.get("series")), None)
    if cs is not None:
        rows.append(("why", cs.reason))
    if result.status != "complete":
        rows.append(("run", f"{result.status}: report on what was measured"))
    return rows


def render(result: SoakResult, console: Console) -> None:
    style = VERDICT_STYLE.get(result.verdict, "bold")
    console.print(Panel(Text(result.sentence, style=style), title="vramdoctor soak", expand=False))
    fig = Table(box=None, show_header=False, pad_edge=False)
    fig.add_column(style="dim")
    fig.add_column()
    for k, v in figures(result):
        fig.add_row(k, v)
    console.print(fig)
    shown = key_series(result)
    if shown and result.rounds:
        t = Table(title="settled level after each round (median of the late idle window)",
                  title_justify="left", show_lines=False)
        t.add_column("series")
        t.add_column("baseline", justify="right")
        for r in result.rounds:
            t.add_column(f"r{r.round}", justify="right")
        t.add_column("slope/req", justify="right")
        t.add_column("verdict")
        for s in shown:
            t.add_row(_label(s), _fmt(s.baseline, s.unit), *[_fmt(v, s.unit) for v in s.settled],
                      "-" if s.slope_per_request is None else f"{s.slope_per_request:+.3g}",
                      Text(s.verdict, style=VERDICT_STYLE.get(s.verdict, "")))
        reqs = ["requests", ""] + [f"{r.sent}" + (f" ({r.errors} err)" if r.errors else "")
                                   for r in result.rounds] + ["", ""]
        t.add_row(*reqs, style="dim")
        console.print(t)
    points = result.points
    grid = _time_grid(points, result, width=max(20, min(60, console.width - 36)))
    if grid is not None:
        t0, t1, width = grid
        legend = f"{t1 - t0:.0f} s: b base, N load, . idle"
        console.print(f"{legend:<34} {phase_strip(result, t0, t1, width)}",
                      markup=False, highlight=False, style="dim")
        for s in shown:
            line = time_sparkline(points.get(s.key, []), t0, t1, width)
            if line.strip():
                console.print(f"{_label(s):<34} {line}", markup=False, highlight=False)
    for n in result.notes:
        console.print(f"note: {n}", style="dim", markup=False)
    if result.suggestion:
        console.print(f"to decide: {result.suggestion}", style="bold", markup=False)


# --- files ---------------------------------------------------------------------------------

def chart_png(result: SoakResult, title: str) -> bytes:
    points = result.points
    t0 = min((p[0][0] for p in points.values() if p), default=0.0)
    for w in result.windows:
        t0 = min(t0, w.start)
    spans = []
    end_all = max((p[-1][0] for p in points.values() if p), default=t0)
    for w in result.windows:
        end = w.end if w.end is not None else end_all
        label = f"round {w.round}" if w.kind == "load" else ("baseline" if w.kind == "baseline" else "")
        spans.append(Span(w.kind, w.start - t0, end - t0, label))
    idle_mid = {w.round: ((w.start + (w.end or w.start)) / 2 - t0) for w in result.windows if w.kind == "idle"}
    lines = []
    for s in key_series(result, limit=6):
        settled = [(idle_mid[r.round], v) for r, v in zip(result.rounds, s.settled, strict=False)
                   if v is not None and r.round in idle_mid]
        lines.append(Line(f"{_label(s)} [{s.verdict}]", [(t - t0, v) for t, v in points.get(s.key, [])],
                          s.unit, settled))
    return memory_chart(lines, spans, title)


def write_report_file(result: SoakResult, path: Path, *, target: str | None = None) -> None:
    """FILE.png: the chart. FILE.html: verdict, figures, levels table and the chart inlined."""
    suffix = path.suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise InputError(f"--report {path}: use a .html or .png file name")
    title = f"vramdoctor soak: {result.verdict}" + (f" — {target}" if target else "")
    png = chart_png(result, title)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if suffix == ".png":
            path.write_bytes(png)
            return
        path.write_text(_html(result, png, title), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write report {path}: {exc.strerror}") from None


def _html(result: SoakResult, png: bytes, title: str) -> str:
    e = html.escape
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in figures(result))
    head = "".join(f"<th>r{r.round}</th>" for r in result.rounds)
    body = ""
    for s in key_series(result, limit=12):
        cells = "".join(f"<td>{e(_fmt(v, s.unit))}</td>" for v in s.settled)
        slope = "-" if s.slope_per_request is None else f"{s.slope_per_request:+.3g}"
        body += (f"<tr><td>{e(_label(s))}</td><td>{e(_fmt(s.baseline, s.unit))}</td>{cells}"
                 f"<td>{e(slope)}</td><td class='{e(s.verdict)}'>{e(s.verdict)}</td>"
                 f"<td>{e(s.reason)}</td></tr>")
    reqs = "".join(f"<td>{r.sent} ({r.errors} err)</td>" for r in result.rounds)
    notes = "".join(f"<li>{e(n)}</li>" for n in result.notes)
    sugg = f"<p><b>To decide:</b> {e(result.suggestion)}</p>" if result.suggestion else ""
    img = base64.b64encode(png).decode("ascii")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{e(title)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
th{{background:#f4f4f4}}.LEAK{{color:#b00;font-weight:bold}}.CACHING{{color:#a60}}
.STABLE{{color:#080}}.INCONCLUSIVE{{color:#808}}.sentence{{font-size:1.2em;padding:.6em;border-left:4px solid #888}}</style>
</head><body><h1>{e(title)}</h1>
<p class="sentence {e(result.verdict)}">{e(result.sentence)}</p>{sugg}
<table>{rows}</table>
<img alt="memory over time, rounds shaded" src="data:image/png;base64,{img}" style="max-width:100%">
<h2>Settled level after each round</h2>
<table><tr><th>series</th><th>baseline</th>{head}<th>slope / request</th><th>verdict</th><th>why</th></tr>
{body}<tr><td>requests</td><td></td>{reqs}<td></td><td></td><td></td></tr></table>
<ul>{notes}</ul>
<p style="color:#777">Shaded orange: load rounds; blue: idle windows; dots: settled levels.
Generated by vramdoctor; the run file re-creates this report with <code>vramdoctor report RUN.jsonl</code>.</p>
</body></html>
"""
