"""The faces of `fleet`: the ranked table, the first sentence, a chart per leak. Never measures.

The table is the shared renderer (`vramdoctor.render.table`): nothing is ever cut; columns
of lowest priority go first on a narrow terminal, and when piped every column is at its full
width. Every row says why it got its verdict (the `why` column, never left out), numbers carry
units and signs ("+191 MiB/h", "+64 tokens/h", "+0.5 %/h" of a pool), and a KV pool's
projection reads "pool full in ...". The first sentence never calls too little data healthy.
"""

from __future__ import annotations

import io
import time
import warnings
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.text import Text

from vramdoctor.errors import InputError, MissingExtra
from vramdoctor.fleet.analysis import REASONS, FleetResult, FleetRow
from vramdoctor.redact import one_line
from vramdoctor.render.table import Table
from vramdoctor.units import format_duration

__all__ = ["chart", "data_span", "format_value", "render", "sentence", "span_words", "where"]

_STYLE = {"LEAK": "bold red", "CACHING": "yellow", "STABLE": "green", "INCONCLUSIVE": "dim"}


def _number(x: float) -> str:
    """Whole numbers above 100, one decimal above 10, two below; never a trailing ".0"."""
    a = abs(x)
    if a >= 100:
        text = f"{x:,.0f}"
    elif a >= 10:
        text = f"{x:,.1f}"
    elif a >= 0.005:
        text = f"{x:,.2f}"
    else:
        return "0"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "+0") else text


def format_value(unit: str, value: float | None, *, signed: bool = False, per: str = "") -> str:
    """A size in a row's unit: "62,345 MiB", "+191 MiB/h" (`per="/h"`), "+64 tokens",
    "12.5 %" (a 0..1 ratio). None and non-finite print "-"."""
    import math

    if value is None or not math.isfinite(value):
        return "-"
    number = _number(value * 100 if unit == "ratio" else value)
    sign = "+" if signed and value > 0 and number != "0" else ""
    if unit == "ratio":
        return f"{sign}{number} %{per}"
    return f"{sign}{number} {unit}{per}"


def where(row: FleetRow) -> str:
    """Host, GPU (and MIG slice), pod, process; a KV row its server and address."""
    parts = [row.host]
    if row.layer == "kv":
        if row.instance and row.instance.split(":")[0] != row.host:
            parts.append(f"({row.instance})")
        elif row.instance:
            parts[0] = row.instance
        from vramdoctor import servers

        parts.append(servers.display_name(row.server))
        return one_line(" ".join(parts))
    if row.gpu is not None:
        parts.append(f"GPU {row.gpu}")
    if row.mig is not None:
        parts.append(f"MIG {row.mig}" + (f" ({row.mig_profile})" if row.mig_profile else ""))
    if row.pod:
        parts.append(f"pod {row.pod}")
    if row.pid is not None:
        parts.append(f"PID {row.pid}" + (f" ({row.process})" if row.process else ""))
    elif row.process:
        parts.append(f"({row.process})")
    return one_line(" ".join(parts))


def _layer(row: FleetRow) -> str:
    if row.layer == "kv":
        return f"KV {row.pool}" if row.pool and row.pool not in ("kv", "full") else "KV pool"
    return {"device": "GPU", "vram": "VRAM", "pod": "GPU (pod)"}.get(row.layer, row.layer)


def _growth(row: FleetRow) -> str:
    if row.growth_per_hour is None:
        return "-"
    text = format_value(row.unit, row.growth_per_hour, signed=True, per="/h")
    if row.verdict == "LEAK" and row.growth_per_hour_ci:
        lo, hi = row.growth_per_hour_ci
        text += f" ({_bare(row.unit, lo)} to {_bare(row.unit, hi)})"
    return text


def _bare(unit: str, value: float) -> str:
    """A number of an interval, its unit said once before it: "+189" / "+0.5"."""
    number = _number(value * 100 if unit == "ratio" else value)
    return ("+" if value > 0 and number != "0" else "") + number


def _runs_out(row: FleetRow) -> str:
    if row.hours_to_oom is None:
        if row.verdict == "LEAK" and row.free_note:
            return "unknown"
        return "-"
    text = compact_duration(row.hours_to_oom * 3600.0)
    if row.runs_out == "pool":
        text = f"pool full in {text}"
    return text


def compact_duration(seconds: float) -> str:
    """A duration in its largest sensible unit, for a table cell: "45 minutes", "34 hours",
    "9.3 days", "8.6 months", "2.1 years"."""
    import math

    if not math.isfinite(seconds) or seconds < 0:
        return "-"

    def one(x: float) -> str:  # one decimal under 10, none above; never a trailing ".0"
        text = f"{x:,.1f}" if x < 10 else f"{x:,.0f}"
        return text[:-2] if text.endswith(".0") else text

    hours = seconds / 3600.0
    if hours < 1:
        return f"{max(1, round(seconds / 60))} minutes"
    if hours < 48:
        return f"{one(hours)} hours"
    days = hours / 24.0
    if days < 60:
        return f"{one(days)} days"
    if days < 730:
        return f"{one(days / 30.44)} months"
    return f"{one(days / 365.25)} years"


def _short_why(row: FleetRow) -> str:
    """The table's why: the reason with its key figures (the full sentence is in --json)."""
    r = row.reason
    if r == "rose_then_flat" and row.warmup_skipped:
        text = (
            f"after warm-up rose {format_value(row.unit, row.rise, signed=True)}, settled at "
            f"{format_value(row.unit, row.settled_level)}"
        )
    elif r == "stepped":
        text = (
            f"rose {format_value(row.unit, row.rise, signed=True)} in steps, settled at "
            f"{format_value(row.unit, row.settled_level)}"
        )
    elif r == "grew_since_change" and row.growing_since is not None:
        text = "growing since " + time.strftime("%m-%d %H:%M UTC", time.gmtime(row.growing_since))
    elif r == "grew_with_time":
        text = "steady, to the last point"
    elif r == "grew_late":
        text = "growing in the late half of its life"
    elif r == "rose_then_flat":
        text = (
            f"rose {format_value(row.unit, row.rise, signed=True)}, settled at "
            f"{format_value(row.unit, row.settled_level)}"
        )
    elif r in ("flat", "screened_flat"):
        text = "flat"
    elif r == "kv_zero_at_idle":
        text = ("0 %" if row.unit == "ratio" else "0 tokens") + " held at every idle moment"
    elif r == "warming_up":
        text = "warming up: " + row.why.split(": ", 1)[-1].split(";")[0]
    elif r == "too_few_points":
        text = row.why.split(": ", 1)[-1]
    else:
        text = REASONS.get(r, r)
    if row.stale:
        text = "stopped reporting; " + text
    if row.verdict == "LEAK" and row.hours_to_oom is None and row.free_note:
        text += "; " + row.free_note
    if row.unknown_points:
        text += f"; {row.unknown_points} impossible readings left out"
    return one_line(text)


def data_span(result: FleetResult) -> float:
    """Seconds of history the rows' floors cover: from the first floor's block (a floor is
    stamped at its block's end, so one block before it) to the last floor or sample seen,
    within the window asked for. The window itself when no row holds a floor (nothing read)."""
    firsts = [float(r.lives[0]["began_at"]) for r in result.rows if r.lives]
    lasts = [float(x["ended_at"]) for r in result.rows for x in r.lives[-1:]]
    lasts += [float(r.last_seen) for r in result.rows if r.last_seen is not None]
    if not firsts or not lasts:
        return result.end - result.start
    first = max(result.start, min(firsts) - result.config.block_s)
    last = min(result.end, max(lasts))
    return max(last - first, 0.0)


def span_words(result: FleetResult) -> str:
    """'3 days', or '3 days of data (7 days asked)' when the history is shorter than the window
    by more than a block: a header never claims more history than was found."""
    window = result.end - result.start
    covered = data_span(result)
    if window - covered > 1.5 * result.config.block_s:
        return f"{format_duration(covered)} of data ({format_duration(window)} asked)"
    return format_duration(window)


def sentence(result: FleetResult) -> str:
    """What the table says, in one sentence: the soonest leak, or why nothing leaks, or why
    nothing could be judged. Never "no leak" on rows that could not be judged. The span named
    is the one the data cover (`data_span`), never a longer window that was asked for."""
    span = format_duration(data_span(result))
    rows = result.rows
    leaks = result.leaks
    if leaks:
        r = leaks[0]
        when = (
            f"it runs out in {format_duration(r.hours_to_oom * 3600.0)}"
            if r.hours_to_oom is not None and r.runs_out == "memory"
            else (
                f"its pool is full in {format_duration(r.hours_to_oom * 3600.0)}"
                if r.hours_to_oom is not None
                else (r.free_note or "time to OOM unknown")
            )
        )
        since = ""
        if r.growing_since is not None:
            since = " since " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r.growing_since))
        more = f" ({len(leaks) - 1} more leaking below)" if len(leaks) > 1 else ""
        return one_line(
            f"{where(r)} is leaking {_what(r)}: {_growth_plain(r)}{since}; {when}.{more}"
        )
    counts = result.counts()
    judged = counts["STABLE"] + counts["CACHING"]
    stale = result.stale_leaks
    tail = ""
    if stale:
        tail = (
            f" {len(stale)} series leaked until it stopped reporting ({where(stale[0])}): "
            "see its row."
        )
    if not rows:
        return f"No series to judge over {span}."
    if judged == 0:
        why = Counter(r.reason for r in rows if r.verdict == "INCONCLUSIVE").most_common(1)
        because = REASONS.get(why[0][0], why[0][0]) if why else "see the why column"
        return one_line(
            f"Nothing could be judged: all {len(rows)} rows are INCONCLUSIVE over {span} "
            f"(mostly: {because}).{tail}"
        )
    parts = [f"{counts['STABLE']} STABLE", f"{counts['CACHING']} CACHING"]
    undecided = ""
    if counts["INCONCLUSIVE"]:
        undecided = f"; {counts['INCONCLUSIVE']} INCONCLUSIVE (could not be judged: see why)"
    return one_line(
        f"No live leak among the {judged} rows judged over {span} ({', '.join(parts)}){undecided}.{tail}"
    )


def _what(r: FleetRow) -> str:
    if r.layer == "kv":
        return "KV pool pages (held at idle)"
    return {"device": "GPU memory", "vram": "GPU memory", "pod": "GPU memory"}.get(
        r.layer, f"host memory ({r.layer})"
    )


def _growth_plain(r: FleetRow) -> str:
    text = format_value(r.unit, r.growth_per_hour, signed=True, per=" per hour")
    if r.growth_per_hour_ci:
        lo, hi = r.growth_per_hour_ci
        text += f" (95 % interval {_bare(r.unit, lo)} to {_bare(r.unit, hi)})"
    return text


def table(result: FleetResult, *, top: int | None = None) -> Table:
    """The ranked table (the first `top` rows; None: all). Its title names the span the data
    cover, and the window asked for when that is longer (`data_span`)."""
    t = Table(
        title=f"fleet: {span_words(result)}, floors of {format_duration(result.config.block_s)}"
    )
    t.add_column("#", justify="right", priority=4)
    t.add_column("where")
    t.add_column("layer", priority=2)
    t.add_column("verdict")
    t.add_column("growth/hour", justify="right")
    t.add_column("runs out")
    t.add_column("level", justify="right", priority=1)
    t.add_column("restarts", justify="right", priority=3)
    t.add_column("why")
    t.add_column("source", priority=5)
    rows = result.rows if top is None else result.rows[:top]
    for i, r in enumerate(rows, 1):
        verdict = r.verdict + (" (stopped)" if r.stale and r.verdict == "LEAK" else "")
        t.add_row(
            str(i),
            where(r),
            _layer(r),
            Text(verdict, style=_STYLE.get(r.verdict, "")),
            _growth(r),
            _runs_out(r),
            format_value(r.unit, r.level),
            "-" if r.restarts is None else str(r.restarts),
            _short_why(r),
            one_line(r.source),
        )
    return t


def render(result: FleetResult, console: Console, *, top: int | None = None) -> None:
    """The sentence, the table, and the notes."""
    style = "bold red" if result.leaks else ("green" if result.counts()["STABLE"] else "")
    console.print(Text(sentence(result), style=style))
    console.print(table(result, top=top))
    if top is not None and len(result.rows) > top:
        console.print(Text(f"({len(result.rows) - top} more rows; --top 0 shows all)", style="dim"))
    if result.recorded_rules:
        console.print(
            Text(f"read from the recording rules: {', '.join(result.recorded_rules)}", style="dim")
        )
    for note in result.notes:
        console.print(Text(f"note: {one_line(note)}", style="dim"))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]


def chart(row: FleetRow, directory: Path) -> Path:
    """A PNG of one row's analysed life: its floors and the fitted growth, written atomically
    (`render.files.write_report`). Raises InputError when it cannot be written (full disk,
    read-only folder) or there is no history, MissingExtra without matplotlib, OSError when
    the folder cannot be made."""
    if row.t is None or row.v is None or not len(row.t):
        raise InputError(f"no history kept for {row.key}")
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra("--charts", "matplotlib", "charts") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        directory.mkdir(parents=True, exist_ok=True)
        t0 = float(row.t[0])
        hours = (row.t - t0) / 3600.0
        fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
        try:
            ax.plot(
                hours, row.v, "o-", lw=0.7, ms=2.5, color="#1f77b4", label="floor of each block"
            )
            if row.verdict == "LEAK" and row.growth_per_hour is not None:
                x_from = (
                    row.growing_since
                    if row.growing_since is not None
                    else (row.analysed_from or t0)
                )
                x_to = float(row.t[-1])
                y_to = float(row.v[-1])
                rate = row.growth_per_hour / 3600.0
                ax.plot(
                    [(x_from - t0) / 3600.0, (x_to - t0) / 3600.0],
                    [y_to - rate * (x_to - x_from), y_to],
                    "-",
                    color="#d62728",
                    label=f"{format_value(row.unit, row.growth_per_hour, signed=True)} per hour",
                )
            start = time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0))
            ax.set_xlabel(f"hours since {start} UTC")
            ax.set_ylabel(row.unit)
            ax.set_title(f"{where(row)} {_layer(row)}: {row.verdict}", fontsize=10)
            ax.legend(loc="upper left", fontsize=8)
            fig.tight_layout()
            png = io.BytesIO()
            fig.savefig(png, format="png")
        finally:
            plt.close(fig)
    from vramdoctor.render.files import write_report

    # a temp file and a rename: never through a link planted at the chart's name
    return write_report(directory / f"{_safe(row.key)}.png", png.getvalue())
