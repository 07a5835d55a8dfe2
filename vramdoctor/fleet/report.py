"""The faces of `fleet`: the ranked table, one sentence, and a chart per culprit. Never measures."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from vramdoctor.errors import InputError
from vramdoctor.fleet.analysis import FleetResult, FleetRow
from vramdoctor.units import format_count, format_duration, format_mib, format_percent

__all__ = ["chart", "render", "sentence"]

_STYLE = {"LEAK": "bold red", "CACHING": "yellow", "STABLE": "green", "INCONCLUSIVE": "dim"}


def _size(row: FleetRow, value: float | None, *, signed: bool = False) -> str:
    if row.unit == "MiB":
        return format_mib(value, signed=signed)
    if row.unit == "tokens":
        return format_count(None if value is None else round(value, 1), "tokens")
    return format_percent(value)


def _where(row: FleetRow) -> str:
    parts = [row.host]
    if row.gpu is not None:
        parts.append(f"GPU {row.gpu}")
    if row.pod:
        parts.append(f"pod {row.pod}")
    if row.pid is not None:
        parts.append(f"PID {row.pid}" + (f" ({row.process})" if row.process else ""))
    return " ".join(parts)


def sentence(result: FleetResult) -> str:
    """Which server is leaking, how fast, and when it will die."""
    leaks = result.leaks
    if not leaks:
        return f"No leak in {len(result.rows)} series over {format_duration(result.end - result.start)}."
    r = leaks[0]
    when = (
        format_duration(r.hours_to_oom * 3600.0)
        if r.hours_to_oom is not None
        else "an unknown time (free memory not exported)"
    )
    more = f" ({len(leaks) - 1} more leaking series below)" if len(leaks) > 1 else ""
    return (
        f"{_where(r)} is leaking {r.layer} memory: {_size(r, r.growth_per_hour, signed=True)} per hour; "
        f"it runs out in {when}.{more}"
    )


def render(result: FleetResult, console: Console, *, top: int | None = None) -> None:
    console.print(sentence(result), style="bold red" if result.leaks else "green", markup=False)
    span = format_duration(result.end - result.start)
    table = Table(
        title=f"fleet: {span}, step {format_duration(result.step_s)}", title_justify="left"
    )
    for col in (
        "#",
        "where",
        "layer",
        "level",
        "growth/hour",
        "time to OOM",
        "restarts",
        "verdict",
        "source",
    ):
        table.add_column(col, overflow="fold")
    rows = result.rows if top is None else result.rows[:top]
    for i, r in enumerate(rows, 1):
        table.add_row(
            str(i),
            _where(r),
            r.layer,
            _size(r, r.level),
            _size(r, r.growth_per_hour, signed=True),
            format_duration(r.hours_to_oom * 3600.0) if r.hours_to_oom is not None else "-",
            str(r.restarts),
            f"[{_STYLE.get(r.verdict, '')}]{r.verdict}[/]",
            r.source,
        )
    console.print(table)
    if top is not None and len(result.rows) > top:
        console.print(
            f"({len(result.rows) - top} more series; --top 0 shows all)", style="dim", markup=False
        )
    for note in result.notes:
        console.print(f"note: {note}", style="dim", markup=False)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]


def chart(row: FleetRow, directory: Path) -> Path:
    """A PNG of one series: its level, the comparable points and the fitted growth."""
    if row.t is None or row.v is None:
        raise InputError(f"no history kept for {row.key}")
    try:
        import matplotlib
    except ImportError:
        raise InputError("--charts needs matplotlib: pip install 'vramdoctor[charts]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    hours = (row.t - row.t[0]) / 3600.0
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
    ax.plot(hours, row.v, lw=0.7, color="#888", label="level (step minimum)")
    if row.envelope:
        ex = [(x - row.t[0]) / 3600.0 for x, _ in row.envelope]
        ey = [y for _, y in row.envelope]
        ax.plot(ex, ey, "o", ms=3, color="#1f77b4", label="quietest moment of each block")
        tr = row.trend
        if tr is not None and tr.slope is not None and row.verdict == "LEAK":
            x_last, y_last = row.envelope[-1]
            xs = [row.envelope[0][0], x_last]
            ys = [y_last - tr.slope * (x_last - x) for x in xs]
            ax.plot(
                [(x - row.t[0]) / 3600.0 for x in xs],
                ys,
                "-",
                color="#d62728",
                label=f"{_size(row, row.growth_per_hour, signed=True)} per hour",
            )
    start = time.strftime("%Y-%m-%d %H:%M", time.gmtime(float(row.t[0])))
    ax.set_xlabel(f"hours since {start} UTC")
    ax.set_ylabel(row.unit)
    ax.set_title(f"{_where(row)} {row.layer}: {row.verdict}", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = directory / f"{_safe(row.key)}.png"
    fig.savefig(path)
    plt.close(fig)
    return path
