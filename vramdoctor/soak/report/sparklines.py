"""Sparklines: a series in one line of block characters, and the protocol on the same axis.

`sparkline` resamples values to a width; `time_sparkline` puts them on a time axis so its
cells line up with `phase_strip` (round digits while loading, "." idle, "b" baseline). The
scale spans at least a series' floor, so jitter below it never draws full height.
"""

from __future__ import annotations

from vramdoctor.judge.results import SoakAnalysis
from vramdoctor.soak.report.text import known

__all__ = ["phase_strip", "sparkline", "time_range", "time_sparkline"]

_BLOCKS = "▁▂▃▄▅▆▇█"


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
    """A sparkline on a time axis: one cell per (t1-t0)/width seconds (last value in the cell;
    blank before the first sample), so cells line up with `phase_strip`."""
    pts = [(t, v) for t, v in values if known(t) and known(v)]
    if not pts or t1 <= t0:
        return " " * width
    step = (t1 - t0) / width
    cells: list[float | None] = [None] * width
    for t, v in pts:
        cells[min(width - 1, max(0, int((t - t0) / step)))] = v
    last: float | None = None
    for i, cell in enumerate(cells):
        if cell is None:
            cells[i] = last
        else:
            last = cell
    vals = [v for v in cells if v is not None]
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
    """The protocol on the same time axis: round digits while loading, '.' idle, 'b' baseline."""
    if t1 <= t0:
        return " " * width
    step = (t1 - t0) / width
    cells = [" "] * width
    for w in a.windows:
        end = w.end if w.end is not None else t1
        lo = max(0, int((w.start - t0) / step))
        hi = min(width, max(lo + 1, int((end - t0) / step + 0.5)))
        ch = {"load": str(w.round % 10), "idle": ".", "baseline": "b"}.get(w.kind, " ")
        for i in range(lo, hi):
            if cells[i] == " " or w.kind == "load":
                cells[i] = ch
    return "".join(cells)


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
