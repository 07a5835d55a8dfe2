"""Leak, caching or stable for one series, from its settled level after each round.

The physics: a caching allocator (PyTorch's, glibc's, a bounded cache, a KV prefix cache)
keeps freed memory and does not give it back when idle, so memory that stays up after an idle
window is not a leak. Replaying the *same* traffic in rounds separates the two: caching rises
in the first round or two and then stays flat; a leak grows in every round, in proportion to
that round's requests.

The method: the settled levels are fitted against the cumulative requests that reached the
server with a robust slope (Theil-Sen, scipy, 90 % interval) and a trend test (Kendall tau,
scipy) over the settled samples. The first round is warm-up and is left out of the slope when
at least three rounds settled; growth must continue to the last round without decaying, be
about the same in every round (identical rounds leak identical amounts), and be larger than
both the series' floor (its resolution) and the noise inside the idle windows.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import kendalltau, theilslopes
from scipy.stats import t as student_t

from vramdoctor.judge.results import (
    CACHING,
    INCONCLUSIVE,
    LEAK,
    R_BOUNDED,
    R_FELL_BACK,
    R_FLAT,
    R_GREW_EVERY_ROUND,
    R_NO_LEVEL,
    R_NO_REFERENCE,
    R_ONE_ROUND,
    R_ROSE_THEN_FLAT,
    R_STILL_CHANGING,
    R_TOO_FEW_ROUNDS,
    STABLE,
    Thresholds,
    Window,
)


@dataclass
class SeriesFit:
    """The verdict of one series and the numbers behind it (units of the series)."""

    verdict: str
    reason: str  # results.R_* code
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


def noise_of(groups: list[list[float]]) -> float:
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
    levels: list[float | None],
    cum_requests: list[float],
    samples: list[list[float]],
    *,
    floor: float,
    th: Thresholds = Thresholds(),
) -> SeriesFit:
    """Verdict for one series from its settled levels after each round.

    `cum_requests[k]` is the number of requests that reached the server up to round k; a round
    where none did carries no evidence about growth per request and is skipped. `floor` is the
    smallest change that counts (the series' resolution, in its unit).
    """
    with np.errstate(all="ignore"):
        return _classify(baseline, levels, cum_requests, samples, floor, th)


def _classify(
    baseline: float | None,
    levels: list[float | None],
    cum_requests: list[float],
    samples: list[list[float]],
    floor: float,
    th: Thresholds,
) -> SeriesFit:
    noise = noise_of(samples)
    h = max(floor, th.noise_k * noise)
    out = SeriesFit(INCONCLUSIVE, R_NO_LEVEL, noise=noise, threshold=h)
    pts: list[tuple[float, float, list[float]]] = []
    prev_c = 0.0
    for c, v, smp in zip(cum_requests, levels, samples, strict=False):
        if v is not None and (c > prev_c or not pts):
            pts.append((c, v, smp))
        prev_c = c
    if not pts:
        return out
    if baseline is None and len(pts) < 2:  # one level and nothing to compare it with
        out.reason = R_NO_REFERENCE
        return out
    ref = baseline if baseline is not None else pts[0][1]
    vals = [v for _, v, _ in pts]
    out.growth = vals[-1] - ref
    peak = max(abs(v - ref) for v in vals)
    # The first round warms caches up: fit from round 2 on when at least 2 later rounds exist.
    tail = pts[1:] if len(pts) >= 3 else pts
    incs = [b[1] - a[1] for a, b in itertools.pairwise(tail)]
    sizes = [b[0] - a[0] for a, b in itertools.pairwise(tail)]  # requests behind each increment
    out.increments = incs
    if len(tail) >= 2:
        res = theilslopes([v for _, v, _ in tail], [c for c, _, _ in tail], alpha=0.90)
        out.slope = float(res.slope)
        out.ci = (float(res.low_slope), float(res.high_slope))
        xs = [c for c, _, smp in tail for _ in smp]
        ys = [x for _, _, smp in tail for x in smp]
        if len(set(xs)) >= 2 and len(set(ys)) >= 2:
            tau = kendalltau(xs, ys)
            out.tau, out.tau_p = float(tau.statistic), float(tau.pvalue)
    if peak <= h and len(pts) < 2:
        out.reason = R_ONE_ROUND
        return out
    if peak <= h:
        out.verdict, out.reason = STABLE, R_FLAT
        return out
    if len(pts) < 3:
        out.reason = R_TOO_FEW_ROUNDS
        return out
    slope, ci = out.slope, out.ci
    all_sizes = [b[0] - a[0] for a, b in itertools.pairwise([(0.0, 0.0, []), *pts])]
    typical = float(np.median(all_sizes))  # the planned round size, robust to one short round
    round_growth = (slope or 0.0) * typical  # growth a normal round gives at the fitted rate
    out.round_growth = round_growth
    # Each increment scaled to a normal round, so a short last round is judged fairly.
    scaled = [d * typical / n for d, n in zip(incs, sizes, strict=True)]
    last, last_n = incs[-1], sizes[-1]
    # The trend test needs samples to have power (4 points cannot reach p < 0.05): with few
    # settled samples it is reported but does not veto; the slope's CI and the increments decide.
    n_trend = sum(len(smp) for _, _, smp in tail)
    trend_ok = n_trend < th.trend_min_samples or (
        out.tau is not None and out.tau > 0 and out.tau_p is not None and out.tau_p < th.trend_p
    )
    proportional = min(scaled) + th.noise_k * noise >= th.proportional_ratio * max(scaled)
    # Level noise the increments show (a level with noise s gives increments with spread
    # s x sqrt(2)): allocator churn can leave each idle window flat and still move the
    # settled level by tens of MiB from round to round.
    # A fall from round 1 to round 2 is not warm-up (caching only rises): it is noise too.
    pre = [pts[1][1] - pts[0][1]] if len(pts) >= 3 and pts[1][1] - pts[0][1] < 0 else []
    noisy_incs = scaled + [d * typical / max(pts[1][0] - pts[0][0], 1.0) for d in pre]
    spread = statistics.stdev(noisy_incs) / math.sqrt(2) if len(noisy_incs) >= 2 else 0.0
    steady = round_growth > th.noise_k * spread  # every round's growth stands above that noise
    grew = (
        slope is not None
        and ci is not None
        and ci[0] > 0
        and all(d > 0 for d in scaled)
        and scaled[-1] >= th.decay_ratio * round_growth
        and proportional
        and steady
        and trend_ok
    )
    tail_growth = tail[-1][1] - tail[0][1]
    # Noisy rounds (allocator churn) with enough of them: the trend is significant (Kendall
    # over >= 12 settled samples, the interval above 0) and the fitted growth over the rounds
    # after the first stands above 4 x the level noise the increments show. Rounds decide
    # what a single increment cannot.
    lvl_noise = max(noise, spread)
    fitted_tail = (slope or 0.0) * (tail[-1][0] - tail[0][0])
    noisy_trend = (
        len(scaled) >= 4
        and ci is not None
        and ci[0] > 0
        and n_trend >= th.trend_min_samples
        and out.tau is not None
        and out.tau > 0
        and out.tau_p is not None
        and out.tau_p < th.trend_p
        and fitted_tail > max(h, th.noise_k * lvl_noise)
    )
    if noisy_trend or (
        grew and ((round_growth > h and all(d > h / 2 for d in scaled)) or tail_growth > h)
    ):
        # Either every round grows by more than the floor, or every round grows by the same
        # amount and the rounds after the first add up to more than the floor: a per-round
        # floor must not hide a consistent trend (1.6 MiB every round is a leak).
        out.verdict, out.reason = LEAK, R_GREW_EVERY_ROUND
        if len(scaled) >= 2 and typical > 0 and ci is not None and slope is not None:
            # The interval says what the increments' own scatter allows (Student t over the
            # per-round growth): Theil-Sen on three or four levels is narrower than the noise.
            half = (
                float(student_t.ppf(0.95, len(scaled) - 1))
                * statistics.stdev(scaled)
                / math.sqrt(len(scaled))
                / typical
            )
            out.ci = (min(ci[0], slope - half), max(ci[1], slope + half))
        return out
    # Noise in the increments (both signs, or three or more of them: one step is not noise)
    # above the floor, with a rising fitted rate whose interval allows more than the floor a
    # round: a leak that noise hides is not ruled out, so no confident caching verdict either
    # (more rounds can decide). A level that breathes around a flat line stays bounded.
    mixed = any(d < 0 for d in noisy_incs) and any(d > 0 for d in noisy_incs)
    inc_noise = 0.0
    if len(noisy_incs) >= 3 or mixed:
        mid = statistics.median(noisy_incs)
        inc_noise = 1.4826 * statistics.median(abs(d - mid) for d in noisy_incs) / math.sqrt(2)
        if mixed:
            inc_noise = max(inc_noise, spread)
    if (
        th.noise_k * inc_noise > h
        and slope is not None
        and slope > 0
        and ci is not None
        and ci[1] * typical > floor
    ):
        out.noise = inc_noise
        out.threshold = max(floor, th.noise_k * inc_noise)
        out.reason = R_STILL_CHANGING
        return out
    full_last = last_n >= 0.5 * typical  # a plateau needs a real round of traffic to show it
    # Flat relative to the rise: the last increment is small next to what came before it
    # (a steady creep under the floor is not "then flat"; more rounds will decide it).
    rise = max(vals[:-1]) - ref
    if (
        full_last
        and abs(last) <= h
        and (max(incs[-2:]) <= h or abs(last) <= h / 2)
        and (abs(last) <= th.flat_share * rise or not grew)
    ):
        out.verdict, out.reason = CACHING, R_ROSE_THEN_FLAT
        if slope is not None and ci is not None and ci[0] > 0 and typical > 0:
            out.creep_floor_per_request = h / typical
        return out
    if full_last and last < -h:
        out.verdict, out.reason = CACHING, R_FELL_BACK
        return out
    tail_vals = [v for _, v, _ in tail]
    if (
        len(tail_vals) >= 4
        and ci is not None
        and ci[0] <= 0
        and tail_vals[-1] <= max(tail_vals[:-1]) + h
        and max(tail_vals[-2:]) <= max(tail_vals[:-2]) + h
    ):
        # Up and down within a band (a cache trimmed now and then, a pool that breathes): no
        # trend and no new high in the last two rounds. Bounded, not growing.
        out.verdict, out.reason = CACHING, R_BOUNDED
        return out
    out.reason = R_STILL_CHANGING
    return out


def time_driven(
    values: list[tuple[float, float]],
    idle_windows: list[Window],
    levels: list[float | None],
    times: list[float | None],
    *,
    floor: float,
    min_windows: int = 3,
) -> float | None:
    """The rate (unit per second) of a leak driven by time, or None.

    Inside an idle window no request is in flight: caching is flat there (frees have landed)
    and so is a leak per request. A level that rises inside every idle window, at a rate that
    explains the growth of the settled levels over the elapsed time (within a factor of 2),
    grows with time: a timer's allocations, a log buffer. `values` (t, v) in time order;
    `levels[k]` the settled level after round k, measured around `times[k]`; `floor` the
    smallest growth that counts. The first quarter of each window (frees landing) is skipped.
    """
    slopes: list[float] = []
    for w in idle_windows:
        if w.end is None:
            continue
        start = w.start + (w.end - w.start) * 0.25
        pts = [(t, v) for t, v in values if start <= t <= w.end]
        if len(pts) >= 3 and pts[-1][0] > pts[0][0]:
            slopes.append(float(theilslopes([v for _, v in pts], [t for t, _ in pts]).slope))
    if len(slopes) < min_windows or not all(x > 0 for x in slopes):
        return None
    rate = float(statistics.median(slopes))
    got = [(t, v) for t, v in zip(times, levels, strict=False) if t is not None and v is not None]
    if len(got) < min_windows:
        return None
    (t0, v0), (t1, v1) = got[0], got[-1]
    grown = v1 - v0
    if grown <= floor or t1 <= t0:
        return None
    predicted = rate * (t1 - t0)
    return rate if 0.5 * grown <= predicted <= 2.0 * grown else None
