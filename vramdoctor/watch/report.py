"""The terminal face of `watch`: one table of series, worst first, and the events. Never measures."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from vramdoctor.units import format_count, format_duration, format_mib
from vramdoctor.watch.state import SeriesVerdict, WatchResult

__all__ = ["render", "sentence"]

_STYLE = {"LEAK": "bold red", "CACHING": "yellow", "STABLE": "green", "INCONCLUSIVE": "dim"}


def _size(s: SeriesVerdict, value: float | None, *, signed: bool = False) -> str:
    if s.unit == "tokens":
        return format_count(None if value is None else round(value, 1), "tokens")
    return format_mib(value, signed=signed)


def _where(s: SeriesVerdict) -> str:
    who = (
        f"PID {s.pid}" + (f" ({s.process})" if s.process else "")
        if s.pid is not None
        else (s.process or "")
    )
    if s.layer == "kv":
        return f"KV pool {s.pool or 'kv'}"
    gpu = f" on GPU {s.gpu}" if s.gpu is not None else ""
    return f"{who}{gpu}".strip() or "device"


def sentence(result: WatchResult) -> str:
    """One sentence answering: is anything leaking, how fast, when will it run out."""
    c = result.culprit
    if c is None:
        if result.verdict == "INCONCLUSIVE":
            return "Not enough comparable moments yet to call a leak or caching (see notes)."
        return f"No leak: every watched layer is {result.verdict.lower()} over the window."
    rate = _size(c, c.growth_per_hour, signed=True)
    when = (
        format_duration(c.hours_to_oom * 3600.0)
        if c.hours_to_oom is not None
        else "an unknown time"
    )
    per_req = ""
    if c.growth_per_request is not None:
        per_req = f" ({_size(c, c.growth_per_request, signed=True)} per served request)"
    return (
        f"LEAK in {c.layer} of {_where(c)}: {rate} per hour{per_req}; "
        f"runs out in {when} at the traffic it serves."
    )


def render(result: WatchResult, console: Console) -> None:
    console.print(sentence(result), style=_STYLE.get(result.verdict, ""), markup=False)
    table = Table(title=f"watch: {format_duration(result.window_s)} window", title_justify="left")
    for col in (
        "where",
        "layer",
        "level",
        "growth/hour",
        "growth/request",
        "time to OOM",
        "verdict",
        "basis",
    ):
        table.add_column(col, overflow="fold")
    for s in result.series:
        table.add_row(
            _where(s) + ("" if s.alive else " (exited)"),
            s.layer,
            _size(s, s.level),
            _size(s, s.growth_per_hour, signed=True),
            _size(s, s.growth_per_request, signed=True),
            format_duration(s.hours_to_oom * 3600.0) if s.hours_to_oom is not None else "-",
            f"[{_STYLE.get(s.verdict, '')}]{s.verdict}[/]",
            f"{s.mode}, {s.points} points",
        )
    console.print(table)
    for f in result.strays:
        console.print(f"stray context: {f['message']}", markup=False, style="yellow")
    for ev in result.events[-10:]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ev.get("wall", 0)))
        rest = ", ".join(f"{k}={v}" for k, v in ev.items() if k not in ("wall", "name"))
        console.print(f"{when} {ev.get('name')}: {rest}", markup=False, style="dim")
    for note in result.notes:
        console.print(f"note: {note}", markup=False, style="dim")
