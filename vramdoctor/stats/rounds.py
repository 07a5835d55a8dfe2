"""Soak's rounds through the growth model: one series' settled level after each round.

The physics: a caching allocator (PyTorch's, glibc's, a bounded cache, a KV prefix cache)
keeps freed memory and does not give it back when idle, so memory that stays up after an idle
window is not a leak. Replaying the *same* traffic in rounds separates the two: caching rises
in the first round or two and then stays flat, or converges (each round adds a shrinking
share); a leak grows in every round, in proportion to that round's requests.

`classify_series` takes the settled levels (median of the late half of each idle window),
the cumulative requests that reached the server, and the samples behind each level, and:

1. leaves out rounds no request reached (no evidence about growth per request);
2. is STABLE when every level is within the floor (`floor`, and `noise_k` x the noise inside
   the idle windows) of the reference (the baseline, else the first level);
3. needs three settled rounds to say more;
4. treats round 1 as warm-up (caches fill when the server first meets the traffic): the
   growth model (`vramdoctor.stats.growth`, the rule documented there) is fitted to the
   levels from round 1 on, against the requests since then, with the level noise of the
   idle windows; a flat fit after a rise in round 1 is CACHING `rose_then_flat`.

`time_driven` tells growth in time (a timer's allocations, a log kept in memory) from growth
per request: inside an idle window no request is in flight, so caching and a leak per request
are flat there, and a level that rises inside the idle windows at a rate that explains the
growth of the settled levels over the elapsed time grows with time.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from vramdoctor.stats.growth import GrowthFit, Model, fit_growth, level_noise
from vramdoctor.verdicts import Reason, Verdict

__all__ = [
    "SeriesFit",
    "TimeGrowth",
    "classify_series",
    "noise_of",
    "time_driven",
    "time_growth",
]


class _Window(Protocol):
    """A closed or open protocol window (vramdoctor.judge.results.Window has this shape)."""

    start: float
    end: float | None


@dataclass
class SeriesFit:
    """The verdict of one series and the numbers behind it (units of the series).

    `noise` is the robust spread of the samples inside the idle windows (or, when the rounds
    were noisy, of the increments); `threshold` the growth that counts (max of the floor and
    `noise_k` x noise); `slope`/`ci` the steady rate per request from round 1 on with its
    90 % interval; `model` the growth model selected (`vramdoctor.stats.growth.Model`);
    `ratio`/`ratio_ci` the share of a round's growth the next round adds; `bound`/`bound_hi`
    the projected level of a converging series; `steps_to_decide` about how many more rounds
    would decide an undecided growth; `growth_fit` the whole fit.
    """

    verdict: str
    reason: str  # vramdoctor.verdicts.Reason
    noise: float = 0.0
    threshold: float = 0.0
    growth: float | None = None
    slope: float | None = None  # per request
    ci: tuple[float, float] | None = None
    tau: float | None = None
    tau_p: float | None = None
    increments: list[float] = field(default_factory=list)
    round_growth: float | None = None  # growth a full round gives at the fitted rate
    creep_floor_per_request: float | None = None  # a leak under this cannot be ruled out
    model: str | None = None
    ratio: float | None = None
    ratio_ci: tuple[float, float] | None = None
    bound: float | None = None
    bound_hi: float | None = None
    steps_to_decide: int | None = None
    growth_fit: GrowthFit | None = None


def noise_of(groups: Sequence[Sequence[float]]) -> float:
    """Pooled robust spread of samples around their own window's median (MAD x 1.4826)."""
    resid: list[float] = []
    for g in groups:
        # Two samples are enough to show spread (a short idle window at --interval 0.5 s
        # settles on 2 or 3 samples; a level re-drawn every 0.3 s must not read as noise-free).
        if len(g) >= 2:
            mid = statistics.median(g)
            resid += [abs(x - mid) for x in g]
    if len(resid) < 3:
        return 0.0
    return float(1.4826 * statistics.median(resid))


def classify_series(
    baseline: float | None,
    levels: Sequence[float | None],
    cum_requests: Sequence[float],
    samples: Sequence[Sequence[float]],
    *,
    floor: float,
    th: object | None = None,
    noise_k: float | None = None,
    resolution: float = 0.0,
    min_steady_steps: int = 0,
) -> SeriesFit:
    """Verdict for one series from its settled levels after each round.

    `cum_requests[k]` is the number of requests that reached the server up to round k; a round
    where none did carries no evidence about growth per request and is skipped. `floor` is the
    smallest change that counts (the series' resolution, in its unit); `resolution` the
    measurement's own step (NVML reports whole MiB: 1.0); `noise_k` (or `th.noise_k`) how many
    times the idle-window noise growth must exceed; `min_steady_steps` the increments from
    round 1 on a LEAK needs at least (`vramdoctor.stats.growth.fit_growth`). Never raises on
    odd input.
    """
    k = noise_k if noise_k is not None else float(getattr(th, "noise_k", 4.0))
    with np.errstate(all="ignore"):
        return _classify(
            baseline, levels, cum_requests, samples, floor, k, resolution, min_steady_steps
        )


def _reached_rounds(
    levels: Sequence[float | None],
    cum_requests: Sequence[float],
    samples: Sequence[Sequence[float]],
) -> list[tuple[float, float, Sequence[float]]]:
    """(cumulative requests, settled level, its samples) of each round with a finite level
    that requests reached (the first such round always counts), in round order."""
    pts: list[tuple[float, float, Sequence[float]]] = []
    prev_c = 0.0
    for c, v, smp in zip(cum_requests, levels, samples, strict=False):
        if v is not None and math.isfinite(v) and (c > prev_c or not pts):
            pts.append((float(c), float(v), smp))
        prev_c = c
    return pts


def _typical_round(pts: list[tuple[float, float, Sequence[float]]]) -> float:
    """The planned round size in requests: the median of the rounds' sizes (the first one
    counted from zero requests)."""
    all_sizes = [b[0] - a[0] for a, b in itertools.pairwise([(0.0, 0.0, []), *pts])]
    return float(np.median(all_sizes))  # the planned round size, robust to one short round


def _take_fit(out: SeriesFit, fit: GrowthFit, typical: float) -> None:
    """Fills `out` from the growth fit, in place (returns nothing): model, increments, rate
    per request and its interval, ratio, bounds, steps to decide, and the growth a full
    round of `typical` requests gives at the fitted rate (the series' unit)."""
    out.growth_fit = fit
    out.model = fit.model
    out.increments = list(fit.increments)
    out.slope, out.ratio, out.ratio_ci = fit.rate, fit.ratio, fit.ratio_ci
    out.bound, out.bound_hi, out.steps_to_decide = fit.bound, fit.bound_hi, fit.steps_to_decide
    out.ci = _rate_interval(fit, typical)
    out.round_growth = (fit.rate or 0.0) * typical


def _settled_verdict(
    out: SeriesFit,
    fit: GrowthFit,
    vals: list[float],
    peak: float,
    h: float,
    floor: float,
    noise_k: float,
) -> tuple[str, str]:
    """(verdict, reason) of the settled levels `vals` from the growth fit, where a FLAT fit is
    read against the rise in round 1 (`peak`, the largest distance from the reference) and the
    threshold `h`; a NOISY fit widens `out`'s noise and threshold to the increments'."""
    verdict, reason = fit.verdict, fit.reason
    spread = max(vals) - min(vals)
    if fit.model is Model.FLAT and h > floor and spread > floor and spread >= 0.5 * abs(peak):
        # "Flat" only within a threshold the idle windows' own noise set, with the levels
        # swinging by half the rise or more: no settled level was seen (a server
        # holding 50-200 MiB buffers for seconds read 279, 166, 181, 387 MiB, "rose, then
        # flat", over a 256 KiB/request leak a longer --idle found).
        verdict, reason = Verdict.INCONCLUSIVE, Reason.NOISY
    elif fit.model is Model.FLAT:
        # Flat from round 1 on after the rise in round 1: warm-up, then flat.
        verdict, reason = Verdict.CACHING, Reason.ROSE_THEN_FLAT
    elif fit.model is Model.NOISY:
        out.noise = max(out.noise, fit.noise)
        out.threshold = max(h, noise_k * fit.noise)
    return verdict, reason


def _creep_floor(out: SeriesFit, h: float, typical: float) -> float | None:
    """The per-request creep a CACHING verdict (`rose_then_flat`, `converging`) whose rate's
    interval reaches above zero cannot rule out (the series' unit per request), else None:
    the larger of the threshold `h` and twice the spread of the increments after round 1,
    over a round of `typical` requests."""
    if (
        out.verdict == Verdict.CACHING
        and out.reason in (Reason.ROSE_THEN_FLAT, Reason.CONVERGING)
        and out.ci is not None
        and out.ci[1] > 0
        and typical > 0
    ):
        # A creep under the floor, or under the rounds' own scatter, cannot be ruled out: say
        # how large it could be (a 3 MiB/round host leak under increments that swung by
        # tens of MiB read as converging on an H200; the floor alone bounded it too low).
        later = out.increments[1:]
        spread = 2.0 * float(np.std(later, ddof=1)) if len(later) >= 3 else 0.0
        return max(h, spread) / typical
    return None


def _classify(
    baseline: float | None,
    levels: Sequence[float | None],
    cum_requests: Sequence[float],
    samples: Sequence[Sequence[float]],
    floor: float,
    noise_k: float,
    resolution: float,
    min_steady_steps: int = 0,
) -> SeriesFit:
    """The `SeriesFit` of one series' settled levels (the rule of `classify_series`)."""
    noise = noise_of(samples)
    h = max(floor, noise_k * noise)
    out = SeriesFit(Verdict.INCONCLUSIVE, Reason.NO_LEVEL, noise=noise, threshold=h)
    pts = _reached_rounds(levels, cum_requests, samples)
    if not pts:
        return out
    if baseline is None and len(pts) < 2:  # one level and nothing to compare it with
        out.reason = Reason.NO_REFERENCE
        return out
    ref = baseline if baseline is not None else pts[0][1]
    vals = [v for _, v, _ in pts]
    out.growth = vals[-1] - ref
    peak = max(abs(v - ref) for v in vals)
    _trend(out, pts)
    if peak <= h:
        out.verdict, out.reason = (
            (Verdict.INCONCLUSIVE, Reason.ONE_ROUND)
            if len(pts) < 2
            else (Verdict.STABLE, Reason.FLAT)
        )
        return out
    if len(pts) < 3:
        out.reason = Reason.TOO_FEW_ROUNDS
        return out
    typical = _typical_round(pts)
    fit = fit_growth(
        [c for c, _, _ in pts],
        vals,
        noise=level_noise(samples, resolution=resolution),
        floor=h,
        step=typical if typical > 0 else None,
        min_steady_steps=min_steady_steps,
    )
    _take_fit(out, fit, typical)
    out.verdict, out.reason = _settled_verdict(out, fit, vals, peak, h, floor, noise_k)
    out.creep_floor_per_request = _creep_floor(out, h, typical)
    return out


def _trend(out: SeriesFit, pts: list[tuple[float, float, Sequence[float]]]) -> None:
    """Kendall tau over the settled samples from round 1 on (reported: the model decides)."""
    xs = [c for c, _, smp in pts for _ in smp]
    ys = [float(x) for _, _, smp in pts for x in smp]
    if len(set(xs)) >= 2 and len(set(ys)) >= 2:
        from scipy.stats import kendalltau

        tau = kendalltau(xs, ys)
        out.tau, out.tau_p = float(tau[0]), float(tau[1])


def _rate_interval(fit: GrowthFit, typical: float) -> tuple[float, float] | None:
    """The steady rate's 90 % interval, at least as wide as the increments' own scatter
    allows (Student t over the per-round growth: identical rounds leak identical amounts, so
    their spread is the rate's uncertainty). Where a change point cut the points (a leak
    under a cache that filled, or one that started late), only the increments the rate was
    fitted on count: a cache's fill before them is not the leak's scatter (seen: glibc's bytes
    in use +24.5, +7.5, +7.5, +7.5 MiB a round, a 256 KiB/request leak under a feature cache
    filling in round 1, had its rate's interval widened to -83 to 583 KiB/request by the
    fill, and the host layer called it noisy)."""
    if fit.rate_ci is None or fit.rate is None:
        return None
    lo, hi = fit.rate_ci
    incs = fit.increments[fit.tail_from or 0 :]
    if len(incs) >= 2 and typical > 0:
        from scipy.stats import t as student_t

        half = (
            float(student_t.ppf(0.95, len(incs) - 1))
            * statistics.stdev(incs)
            / math.sqrt(len(incs))
            / typical
        )
        lo, hi = min(lo, fit.rate - half), max(hi, fit.rate + half)
    return (lo, hi)


@dataclass
class TimeGrowth:
    """Growth inside the idle windows: the pooled rate (unit per second) and its interval."""

    rate_per_s: float
    ci: tuple[float, float]
    windows: int
    explains: float | None  # share of the settled levels' growth the rate explains


def time_growth(
    values: Sequence[tuple[float, float]],
    idle_windows: Sequence[_Window],
    *,
    skip: float = 0.25,
    min_windows: int = 3,
) -> TimeGrowth | None:
    """The level's slope inside the idle windows, pooled: each window's samples after its
    first `skip` share (frees still landing) are fitted with their own intercept and one
    common slope (least squares, so a level that steps up now and then counts as much as one
    that creeps); the interval (90 %, Student t) is from the windows' own slopes, so one
    odd window cannot make it. None with fewer than `min_windows` windows of 3+ samples."""
    per: list[tuple[float, float]] = []  # (slope, weight)
    for w in idle_windows:
        if w.end is None:
            continue
        start = w.start + (w.end - w.start) * skip
        pts = [(t, v) for t, v in values if start <= t <= w.end]
        if len(pts) < 3:
            continue
        ts = np.array([p[0] for p in pts])
        vs = np.array([p[1] for p in pts])
        sxx = float(((ts - ts.mean()) ** 2).sum())
        if sxx <= 0:
            continue
        per.append((float(((ts - ts.mean()) * (vs - vs.mean())).sum() / sxx), sxx))
    if len(per) < min_windows:
        return None
    slopes = np.array([p[0] for p in per])
    weights = np.array([p[1] for p in per])
    rate = float((slopes * weights).sum() / weights.sum())
    from scipy.stats import t as student_t

    spread = float(np.std(slopes, ddof=1))
    half = float(student_t.ppf(0.95, len(per) - 1)) * spread / math.sqrt(len(per))
    return TimeGrowth(rate, (rate - half, rate + half), len(per), None)


def time_driven(
    values: Sequence[tuple[float, float]],
    idle_windows: Sequence[_Window],
    levels: Sequence[float | None],
    times: Sequence[float | None],
    *,
    floor: float,
    min_windows: int = 3,
) -> float | None:
    """The rate (unit per second) of a leak driven by time, or None.

    A level that rises inside the idle windows (the pooled slope's 90 % interval above zero,
    `time_growth`), at a rate that explains the growth of the settled levels over the elapsed
    time (within a factor of 2), grows with time: a timer's allocations, a log buffer.
    `values` (t, v) in time order; `levels[k]` the settled level after round k, measured
    around `times[k]`; `floor` the smallest growth that counts.
    """
    tg = time_growth(values, idle_windows, min_windows=min_windows)
    if tg is None or tg.ci[0] <= 0:
        return None
    got = [(t, v) for t, v in zip(times, levels, strict=False) if t is not None and v is not None]
    if len(got) < min_windows:
        return None
    (t0, v0), (t1, v1) = got[0], got[-1]
    grown = v1 - v0
    if grown <= floor or t1 <= t0:
        return None
    predicted = tg.rate_per_s * (t1 - t0)
    return tg.rate_per_s if 0.5 * grown <= predicted <= 2.0 * grown else None
