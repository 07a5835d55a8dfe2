"""Sparklines: a series in one line of block characters, and the protocol on the same axis.

`sparkline` resamples values to a width; `time_sparkline` puts them on a time axis so its
cells line up with `phase_strip`. The scale spans at least a series' floor, so jitter below it
never draws full height.

Every cell of the time chart means something `chart_legend` names:

- the strip (`phase_strip`): `b` the baseline window, a round's digit while it loads (its last
  digit from round 10 on: `0` is round 10), `.` an idle window, `-` time in no window (sampling
  before the baseline began, the soak's own steps between an idle window and the next round:
  reading the server from inside, deciding on another round; the last samples after the last
  window). A cell partly in a window shows the window.
- a sparkline (`time_sparkline`): a cell shows the last sample at or before it; it is blank
  where its series has no sample near it (`SAMPLING_GAP`): before the series' first sample (a
  process that appeared later), after its last (one that exited), and across a gap in sampling.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import pairwise

from rich.cells import cell_len

from vramdoctor.judge.results import SoakAnalysis
from vramdoctor.render.wrap import unit_words
from vramdoctor.soak.report.text import known

__all__ = [
    "OUTSIDE",
    "SAMPLING_GAP",
    "chart_legend",
    "legend_lines",
    "phase_strip",
    "sparkline",
    "time_range",
    "time_sparkline",
]

_BLOCKS = "▁▂▃▄▅▆▇█"

OUTSIDE = "-"
"""The strip's glyph for time in no window of the protocol (module docstring)."""

SAMPLING_GAP = 3.0
"""A sparkline cell further than this many of its series' usual sampling intervals (the median)
from the series' nearest samples is blank: nothing was measured there (module docstring)."""


def sparkline(values: list[float], width: int = 40, *, min_span: float = 0.0) -> str:
    """Unicode sparkline of the values (resampled to `width`). The scale spans at least
    `min_span`, so jitter below a series' floor never draws full height."""
    vals = [v for v in values if known(v)]
    if not vals:
        return ""
    if len(vals) > width:
        step = len(vals) / width
        vals = [vals[int(i * step)] for i in range(width)]
    lo, hi = min(vals), max(vals)
    span = max(hi - lo, min_span)
    if span < 1e-9:
        return _BLOCKS[0] * len(vals)
    return "".join(_BLOCKS[min(7, int((v - lo) / span * 7.999))] for v in vals)


def time_sparkline(
    values: list[tuple[float, float]], t0: float, t1: float, width: int, *, min_span: float = 0.0
) -> str:
    """A sparkline on a time axis: one cell per (t1-t0)/width seconds, so cells line up with
    `phase_strip`. A cell shows the last sample at or before it (the first sample, for a cell
    just before it); it is blank where the series has no sample within `SAMPLING_GAP` of its
    usual sampling intervals (before its first sample, after its last, across a gap)."""
    pts = sorted((t, v) for t, v in values if known(t) and known(v))
    if not pts or t1 <= t0 or width <= 0:
        return " " * max(width, 0)
    step = (t1 - t0) / width
    times = [t for t, _ in pts]
    gaps = sorted(b - a for a, b in pairwise(times) if b > a)
    usual = gaps[len(gaps) // 2] if gaps else 0.0
    near = max(SAMPLING_GAP * usual, 2 * step)  # a cell this close to a sample is drawn
    cells: list[float | None] = [None] * width
    for i in range(width):
        c_lo = -math.inf if i == 0 else t0 + i * step  # the end cells take what lies beyond
        c_hi = math.inf if i == width - 1 else t0 + (i + 1) * step
        k = bisect_left(times, c_hi)  # pts[:k] come before the cell's end
        prev = pts[k - 1] if k else None
        j = bisect_left(times, c_lo)  # pts[j:] come at or after its start
        nxt = pts[j] if j < len(pts) else None
        if prev is not None and prev[0] >= c_lo:
            cells[i] = prev[1]  # a sample in the cell: its last one
        elif prev is not None and nxt is not None:
            cells[i] = prev[1] if nxt[0] - prev[0] <= near else None  # between two samples
        elif prev is not None:
            cells[i] = prev[1] if c_lo - prev[0] <= near else None  # after the last sample
        elif nxt is not None:
            cells[i] = nxt[1] if nxt[0] - c_hi <= near else None  # before the first sample
    vals = [v for v in cells if v is not None]
    if not vals:
        return " " * width
    lo, hi = min(vals), max(vals)
    span = max(hi - lo, min_span)
    out = []
    for cell in cells:
        if cell is None:
            out.append(" ")
        elif span < 1e-9:
            out.append(_BLOCKS[0])
        else:
            out.append(_BLOCKS[min(7, int((cell - lo) / span * 7.999))])
    return "".join(out)


def phase_strip(a: SoakAnalysis, t0: float, t1: float, width: int) -> str:
    """The protocol on the same time axis: a round's digit while loading (its last digit from
    round 10 on), '.' idle, 'b' baseline, `OUTSIDE` ('-') for time in no window."""
    if t1 <= t0:
        return OUTSIDE * width
    step = (t1 - t0) / width
    cells = [OUTSIDE] * width
    for w in a.windows:
        end = w.end if w.end is not None else t1
        lo = max(0, int((w.start - t0) / step))
        hi = min(width, max(lo + 1, int((end - t0) / step + 0.5)))
        ch = {"load": str(w.round % 10), "idle": ".", "baseline": "b"}.get(w.kind)
        if ch is None:
            continue  # a window kind this strip does not know: shown as no window
        for i in range(lo, hi):
            if cells[i] == OUTSIDE or w.kind == "load":
                cells[i] = ch
    return "".join(cells)


def chart_legend(strip: str, lines: list[str], *, rounds: int = 0) -> str:
    """What the strip's glyphs and the sparklines' blanks mean, naming only what is drawn (but
    always the baseline, the rounds and idle): for `strip` and the sparklines `lines` drawn under
    it; `rounds` is the highest round number (from 10 on, a round is drawn by its last digit)."""
    digits = "1-9 load round"
    if rounds >= 10:
        digits += " (from round 10 on, its last digit: 0 is round 10)"
    parts = ["b baseline", digits, ". idle"]
    if OUTSIDE in strip:
        parts.append(
            f"{OUTSIDE} between windows (the soak's own steps: before the baseline, between "
            "rounds, after the last window)"
        )
    legend = ", ".join(parts) + "; each line's own range is printed above it"
    if any(" " in line for line in lines):
        legend += (
            ", blank where that series has no sample (before it appeared, after it went, "
            "a gap in sampling)"
        )
    return legend


def time_range(a: SoakAnalysis) -> tuple[float, float] | None:
    """(first, last) monotonic time of the run's samples and windows; None when empty."""
    starts = [p[0][0] for p in a.points.values() if p] + [w.start for w in a.windows]
    ends = [p[-1][0] for p in a.points.values() if p] + [
        w.end for w in a.windows if w.end is not None
    ]
    starts = [t for t in starts if known(t)]
    ends = [t for t in ends if known(t)]
    if not starts or not ends or max(ends) <= min(starts):
        return None
    return min(starts), max(ends)


# The legend's glyphs: each stays on the line of the word after it (`-` / `between windows`
# split over two lines reads as a stray dash).
_GLYPH_WORDS = frozenset({"b", "1-9", ".", OUTSIDE, "0"})


def legend_lines(text: str, width: int | None) -> list[str]:
    """The legend `text` as lines of at most `width` cells (None: one line), broken only where
    `vramdoctor.render.wrap` may break, and never right after one of its glyphs."""
    words: list[str] = []
    glue = False
    for start, end in unit_words(text):
        word = text[start:end]
        if glue:
            words[-1] += " " + word
        else:
            words.append(word)
        glue = word in _GLYPH_WORDS
    if width is None:
        return [" ".join(words)]
    lines: list[str] = []
    for word in words:
        if lines and cell_len(lines[-1]) + 1 + cell_len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines
