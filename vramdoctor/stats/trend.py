"""Growth of one memory series over comparable points: leak, caching, stable. Pure.

Shared by `watch` (rolling, one host) and `fleet` (days of Prometheus history). Input is a
list of points `(x, level)` that were taken while the server did comparable work (chosen by
`comparable_points`): x is cumulative served requests (growth per request) or seconds (growth
per hour, when no request counter exists). The statistics are the ones soak uses for settled
levels: a Theil-Sen slope with its 95 % confidence interval and a Kendall tau trend test
(scipy). What separates a leak from caching is the physics of the layers (facts.md):

- caching (PyTorch's allocator, glibc arenas, pinned host memory) rises while the server first
  meets its traffic and then levels off: the slope of the *late half* is near zero;
- a leak grows in proportion to the work done, to the last point: the late-half slope is at
  least `decay_ratio` of the whole-window slope, the trend is significant, and the growth over
  the window exceeds both a resolution floor and the jitter measured between neighbouring
  points (`noise_k` x median absolute deviation of successive differences);
- a leak that starts late in the window (after hours of flat memory) shows as a significant,
  large late-half trend even when the whole window's slope is small: that also counts.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np
from scipy.stats import kendalltau, theilslopes

__all__ = [
    "CACHING",
    "INCONCLUSIVE",
    "LEAK",
    "STABLE",
    "VERDICTS",
    "Trend",
    "TrendThresholds",
    "classify",
    "low_envelope",
    "low_envelope_arrays",
]

LEAK = "LEAK"
CACHING = "CACHING"
STABLE = "STABLE"
INCONCLUSIVE = "INCONCLUSIVE"
VERDICTS = (LEAK, CACHING, STABLE, INCONCLUSIVE)
"""Every verdict, most serious first."""
VERDICT_RANK = {LEAK: 3, INCONCLUSIVE: 2, CACHING: 1, STABLE: 0}


@dataclass(frozen=True)
class TrendThresholds:
    """What counts as growth, in the series' own unit (MiB for memory, tokens for KV)."""

    min_growth: float = 16.0  # below this over the window a change is resolution / noise
    noise_k: float = 4.0  # growth must exceed noise_k x the point-to-point jitter
    decay_ratio: float = 0.5  # a leak's late-half slope keeps at least this share of its rate
    trend_p: float = 0.01  # Kendall tau p-value
    min_points: int = 8  # fewer comparable points: INCONCLUSIVE


@dataclass
class Trend:
    """One series' growth over its comparable points.

    `slope` is per unit of x (per request, or per second); `slope_ci` its 95 % interval;
    `growth` the fitted rise over the points' x span; `rise` the median of the last quarter
    minus the median of the first quarter (what caching shows); `late_slope` the Theil-Sen
    slope of the second half of the x span. `level` is the last point's value.
    """

    verdict: str
    reason: str
    n: int
    x_unit: str  # "request" or "s"
    level: float | None
    slope: float | None = None
    slope_ci: tuple[float, float] | None = None
    late_slope: float | None = None
    tau: float | None = None
    p_value: float | None = None
    growth: float | None = None
    rise: float | None = None
    noise: float | None = None
    floor: float | None = None
    x_span: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["slope_ci"] = list(self.slope_ci) if self.slope_ci else None
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()
        }


def _theil(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    if len(x) < 2 or float(np.ptp(x)) == 0.0:
        return 0.0, 0.0, 0.0
    with warnings.catch_warnings(), np.errstate(invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        res = theilslopes(y, x, 0.95)
    return float(res[0]), float(res[2]), float(res[3])


def _jitter(y: np.ndarray) -> float:
    """Median absolute deviation of successive differences (robust short-term noise)."""
    if len(y) < 3:
        return 0.0
    d = np.diff(y)
    return float(1.4826 * np.median(np.abs(d - np.median(d))))


class _LateHalf(NamedTuple):
    """The second half of the x span on its own: `n` its points, `slope` its Theil-Sen
    slope (the series' unit per unit of x) with its 95 % interval `lo`..`hi`, `growth` that
    slope x the half's x span (the series' unit), `p` its Kendall tau p-value (1.0 with
    fewer than three points or none finite)."""

    n: int
    slope: float
    lo: float
    hi: float
    growth: float
    p: float


def _kendall(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(Kendall tau, its p-value) over the points; 0.0 and 1.0 where not finite."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        tau_res = kendalltau(x, y)
    # indexed, not .statistic: scipy 1.9 (the floor) names it .correlation
    tau = float(tau_res[0]) if np.isfinite(tau_res[0]) else 0.0
    p = float(tau_res[1]) if np.isfinite(tau_res[1]) else 1.0
    return tau, p


def _late_half(x: np.ndarray, y: np.ndarray, span: float) -> _LateHalf:
    """The points from the middle of the x span on, fitted on their own (a `_LateHalf`)."""
    mid = x[0] + span / 2
    late = x >= mid
    late_slope, late_lo, late_hi = _theil(x[late], y[late])
    late_span = float(x[late][-1] - x[late][0]) if late.sum() > 1 else 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        late_tau = kendalltau(x[late], y[late]) if late.sum() >= 3 else None
    late_p = float(late_tau[1]) if late_tau is not None and np.isfinite(late_tau[1]) else 1.0
    late_growth = late_slope * late_span
    return _LateHalf(int(late.sum()), late_slope, late_lo, late_hi, late_growth, late_p)


def _trend_verdict(
    th: TrendThresholds,
    base: dict[str, object],
    whole: bool,
    started: bool,
    slope: float,
    growth: float,
    rise: float,
    floor: float,
    late: _LateHalf,
) -> Trend:
    """The `Trend` of the points from the whole window's numbers (`base`, the `Trend`'s
    fields but verdict and reason; `slope`, `growth`, `rise` and `floor` among them, as
    fitted), whether the whole window shows a leak (`whole`) or the late half alone does
    (`started`), and the late half's fit."""
    if started and (not whole or late.slope > slope):
        # the rate now is the late half's: a leak that began late, or one that speeds up
        base["slope"], base["slope_ci"] = late.slope, (late.lo, late.hi)
        base["growth"] = late.growth
        reason = (
            "grows in proportion to the work done, faster in the second half of the window"
            if whole
            else "started growing in the second half of the window and keeps growing"
        )
        return Trend(LEAK, reason, **base)  # type: ignore[arg-type]
    if whole:
        return Trend(LEAK, "grows in proportion to the work done, to the last point", **base)  # type: ignore[arg-type]
    if rise > floor or growth > floor:
        if late.growth <= floor / 2 or late.slope < th.decay_ratio * slope:
            return Trend(
                CACHING,
                "rose, then levelled off (an allocator or cache filling up)",
                **base,  # type: ignore[arg-type]
            )
        return Trend(INCONCLUSIVE, "rising, but not a significant, sustained trend yet", **base)  # type: ignore[arg-type]
    return Trend(STABLE, "no growth beyond the noise", **base)  # type: ignore[arg-type]


def classify(
    points: Sequence[tuple[float, float]],
    *,
    x_unit: str = "request",
    thresholds: TrendThresholds | None = None,
) -> Trend:
    """Classify `points` [(x, level)] sorted by x. Pure; never raises on short or flat input."""
    th = thresholds or TrendThresholds()
    pts = [(float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    pts.sort()
    n = len(pts)
    level = pts[-1][1] if pts else None
    if n < th.min_points:
        return Trend(
            INCONCLUSIVE, f"only {n} comparable points (need {th.min_points})", n, x_unit, level
        )
    x = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    span = float(x[-1] - x[0])
    if span <= 0:
        return Trend(INCONCLUSIVE, "no served work between the comparable points", n, x_unit, level)
    slope, lo, hi = _theil(x, y)
    tau, p = _kendall(x, y)
    late = _late_half(x, y, span)
    q = max(n // 4, 2)
    rise = float(np.median(y[-q:]) - np.median(y[:q]))
    noise = _jitter(y)
    floor = max(th.min_growth, th.noise_k * noise)
    growth = slope * span
    base = dict(
        n=n,
        x_unit=x_unit,
        level=level,
        slope=slope,
        slope_ci=(lo, hi),
        late_slope=late.slope,
        tau=tau,
        p_value=p,
        growth=growth,
        rise=rise,
        noise=noise,
        floor=floor,
        x_span=span,
    )
    whole = (
        p < th.trend_p
        and tau > 0
        and lo > 0
        and growth > floor
        and late.slope >= th.decay_ratio * slope
    )
    started = (
        late.n >= th.min_points and late.p < th.trend_p and late.lo > 0 and late.growth > floor
    )
    return _trend_verdict(th, base, whole, started, slope, growth, rise, floor, late)


def low_envelope(points: Sequence[tuple[float, float]], block: float) -> list[tuple[float, float]]:
    """The minimum of each `block`-wide stretch of x: the level at the quietest moment.

    Transient peaks (batches in flight) come and go; what a process keeps is its floor. Each
    block gives (x of its minimum, minimum). Blocks without points are skipped.
    """
    if block <= 0:
        raise ValueError("block must be positive")
    out: list[tuple[float, float]] = []
    current: int | None = None
    best: tuple[float, float] | None = None
    for x, y in points:
        if not (math.isfinite(x) and math.isfinite(y)):
            continue
        k = math.floor(x / block)
        if k != current:
            if best is not None:
                out.append(best)
            current, best = k, (x, y)
        elif best is None or y < best[1]:
            best = (x, y)
    if best is not None:
        out.append(best)
    return out


def low_envelope_arrays(t: np.ndarray, v: np.ndarray, block: float) -> list[tuple[float, float]]:
    """`low_envelope` over numpy arrays (t sorted, finite): the same points, vectorised for days of data."""
    if block <= 0:
        raise ValueError("block must be positive")
    if len(t) == 0:
        return []
    keys = np.floor(t / block)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    mins = np.minimum.reduceat(v, starts)
    # x of each block's first minimum: the first index in the block where v equals its minimum
    block_of = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(t)]))
    is_min = v == mins[block_of]
    first = np.full(len(starts), len(t))
    np.minimum.at(first, block_of[is_min], np.flatnonzero(is_min))
    return list(zip(t[first].tolist(), mins.tolist(), strict=True))
