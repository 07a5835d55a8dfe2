"""The terminal report: headline panel, verdict per layer, key figures, settled levels after
each round, the time chart in sparklines, notes and what to run to decide.

Nothing is cut at 80 columns or when piped: every table is `vramdoctor.render.table.Table`
(cells wrap at spaces, a number stays with its unit, full content width when piped), and
sparklines sit on their own line with their range printed.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from vramdoctor.judge.results import (
    CACHING,
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    STABLE,
    LayerResult,
    SeriesResult,
    SoakAnalysis,
)
from vramdoctor.render.console import unbounded
from vramdoctor.render.table import Table
from vramdoctor.render.wrap import Paragraph
from vramdoctor.soak.report.layers import display_name
from vramdoctor.soak.report.sentences import (
    figures,
    headline,
    layer_order,
    layer_sentence,
    notes,
    suggestion,
)
from vramdoctor.soak.report.series import label
from vramdoctor.soak.report.sparklines import (
    chart_legend,
    legend_lines,
    phase_strip,
    time_range,
    time_sparkline,
)
from vramdoctor.soak.report.text import known, rate, value
from vramdoctor.units import format_duration

__all__ = ["PANEL_MIN", "VERDICT_STYLE", "levels_text", "panel_width", "render", "shown_series"]

VERDICT_STYLE: dict[str, str] = {
    LEAK: "bold red",
    CACHING: "bold yellow",
    STABLE: "bold green",
    INCONCLUSIVE: "bold magenta",
    NOT_MEASURED: "dim",
}


def levels_text(s: SeriesResult) -> str:
    """ "baseline -> level 1, level 2, ..." in the series' unit."""
    vals = [value(v, s.unit) for v in s.settled]
    base = value(s.baseline, s.unit)
    return f"{base} -> " + ", ".join(vals)


def shown_series(lay: LayerResult, limit: int) -> list[SeriesResult]:
    """The series worth a table row: deciding ones, then evidence that moved."""
    deciding = [s for s in lay.series if s.decides]
    culprit = lay.main_series
    deciding.sort(key=lambda s: (s.key != culprit, -abs(s.growth or 0.0), s.key))
    rest = [
        s
        for s in lay.series
        if not s.decides
        and (s.kind in ("gpu", "rss_anon", "rss_shmem", "arenas") or s.presence != "whole")
    ]
    return (deciding + rest)[:limit]


PANEL_MIN = 80
"""A headline too long for its line wraps in a panel at least this wide (or the whole width,
when narrower), however narrow the tables under it."""


def panel_width(headline_text: str, tables: list[Table], width: int) -> int:
    """The headline panel's width at a console `width`: as wide as the widest table under it
    (the panel is never narrower than they are: one left and one right edge for the report),
    and as its headline needs, up to `PANEL_MIN` (a longer headline wraps); never wider than
    `width`."""
    widest = max((cell_len(line.plain) for t in tables for line in t.lines(width)), default=0)
    natural = cell_len(headline_text) + 4  # the borders and one space of padding each side
    return max(1, min(width, max(widest, min(natural, PANEL_MIN))))


def render(a: SoakAnalysis, console: Console) -> None:
    """The terminal report: headline, layers, figures, settled levels, time chart, notes.

    Piped (unbounded), the headline is one line; at a width (--width, COLUMNS, a terminal) it
    sits in a panel exactly as wide as the widest table under it (`panel_width`)."""
    style = VERDICT_STYLE.get(a.verdict, "bold")
    text = Text(headline(a), style=style)  # wrapped at spaces, a number kept with its unit
    tables = _tables(a)
    if unbounded(console):  # piped: the headline whole on one line, no box to wrap it
        console.print(Text("vramdoctor soak: ").append_text(text))
    else:
        wide = panel_width(text.plain, tables, console.width)
        console.print(Panel(Paragraph(text), title="vramdoctor soak", width=wide))
    for t in tables:
        console.print(t)
    _render_time_chart(a, console)
    for n in notes(a):
        console.print(f"note: {n}", style="dim", markup=False, highlight=False)
    sugg = suggestion(a)
    if sugg:
        console.print(f"to decide: {sugg}", style="bold", markup=False, highlight=False)


def _tables(a: SoakAnalysis) -> list[Table]:
    """The report's tables, in order: verdict per layer, key figures, settled levels."""
    lt = Table(title="verdict per memory layer")
    lt.add_column("layer")
    lt.add_column("verdict")
    lt.add_column("why")
    for name in layer_order(a):
        lay = a.layers[name]
        sentence = layer_sentence(lay, a)
        lt.add_row(
            display_name(name),
            Text(lay.verdict.replace("_", " "), style=VERDICT_STYLE.get(lay.verdict, "")),
            Text(sentence.split(": ", 2)[-1] if lay.verdict != NOT_MEASURED else sentence),
        )
    fig = Table(show_header=False)
    fig.add_column("figure", style="dim")
    fig.add_column("value")
    for k, v in figures(a):
        fig.add_row(k, v)
    if not a.rounds:
        return [lt, fig]
    t = Table(
        title="settled level after each round (baseline -> rounds 1..N; late idle window median)"
    )
    t.add_column("series")
    t.add_column("verdict")
    t.add_column("levels")
    t.add_column("rate/request", justify="right")
    for name in layer_order(a):
        for s in shown_series(a.layers[name], 6):
            verdict = s.verdict if s.decides else "(evidence)"
            t.add_row(
                label(s),
                Text(verdict, style=VERDICT_STYLE.get(s.verdict, "") if s.decides else "dim"),
                levels_text(s),
                rate(s.slope_per_request, s.unit)
                if s.verdict == LEAK and s.kind != "arenas"
                else "-",
            )
    reqs = ", ".join(f"{r.sent}" + (f" ({r.errors} failed)" if r.errors else "") for r in a.rounds)
    t.add_row("requests per round", "", reqs, "", style="dim")
    return [lt, fig, t]


def _render_time_chart(a: SoakAnalysis, console: Console) -> None:
    """The strip of the protocol, then each series' range and sparkline on the same time axis,
    under one legend naming every glyph and blank they hold (`sparklines.chart_legend`)."""
    rng = time_range(a)
    if rng is None:
        return
    t0, t1 = rng
    width = max(20, min(72, console.width - 2))
    strip = phase_strip(a, t0, t1, width)
    charts: list[tuple[str, str]] = []
    for name in layer_order(a):
        for s in shown_series(a.layers[name], 4):
            pts = a.points.get(s.key, [])
            vals = [v for _, v in pts if known(v)]
            if not vals:
                continue
            line = time_sparkline(pts, t0, t1, width, min_span=s.threshold)
            lo, hi = min(vals), max(vals)
            charts.append((f"{label(s)}: {value(lo, s.unit)} to {value(hi, s.unit)}", line))
    rounds = max((w.round for w in a.windows if w.kind == "load"), default=0)
    legend = chart_legend(strip, [line for _, line in charts], rounds=rounds)
    text = f"time: {format_duration(t1 - t0)} from left to right; {legend}"
    for part in legend_lines(text, None if unbounded(console) else console.width):
        console.print(part, style="dim", markup=False, highlight=False, soft_wrap=True)
    console.print("  " + strip, markup=False, highlight=False, style="dim")
    for title, line in charts:
        console.print(title, markup=False, highlight=False)
        console.print(("  " + line).rstrip(), markup=False, highlight=False)  # no blank tail


# --- files -----------------------------------------------------------------------------------
