"""The growth model: steady, converging, a step, flat or undecided, for one memory series.

One implementation for soak (settled levels after each round), watch (comparable points of one
host) and fleet (low envelopes of days of history). Pure: numbers in, a `GrowthFit` out; numpy
for the fit, scipy's F and t quantiles (imported on first use).

The physics (docs/soak.md, "The growth model"): every memory layer caches, and caches converge:
each round of identical traffic adds a smaller share than the one before, towards a bound (a
cache's cap, an allocator's working set). A leak adds the same amount for the same work, to
the last point. Over a few rounds the two can look alike; what tells them apart is the
increments' own trend, not the last increment. So each series is fitted with ONE family that
holds both, nested:

    level(x) = a + c * (1 - exp(-lam * x)) / lam          (lam > 0: converging to a + c/lam)
    level(x) = a + c * x                                   (lam = 0: steady, c per unit of x)

where x is the work done since the first point (requests, or seconds for growth in time). Per
normal step of x (`step`: one round's requests), ``r = exp(-lam * step)`` is the share of the
previous step's growth that the next one adds: r = 1 is a steady leak, r = 0.5 a cache whose
growth halves every round, r = 0 a step (everything in the first round), r > 1 a leak that
speeds up. For each r on a grid the model is linear in (a, c) and fitted in closed form; the
profile of the residual sum of squares over r gives r's interval (an F test on the profile,
with the level noise pooled from what the caller measured, e.g. inside idle windows, and from
the residuals themselves).

Model selection (the rule; `GrowthFit.model`, in this order):

1. FLAT: every point within `floor` of the first one.
2. too few points (< 3): UNDECIDED, `too_few_rounds`.
3. STEADY (LEAK, `grew_every_round`): r's interval reaches the steady band (r >= 0.98: a
   step adds at least 98 % of the previous one's growth), every convergence that would have
   halved the growth per step over the observed steps (at least 5, at most 8) is ruled out
   (``r_lo >= 0.5 ** (1 / (n_steps - 1))``: 0.84 up to five increments, 0.91 from eight),
   the steady rate's interval excludes zero, and the fitted growth over the points exceeds
   `floor`. "Clearly better than convergence" is this: a cache filling towards its cap
   would have shown its growth halve over these steps, and the points rule that out.
4. CONVERGING (CACHING, `converging`): r's interval lies below the steady band (each step
   adds a shrinking share: at least 2 % less each time), the growth rises and exceeds
   `floor`; `bound` is the projected level, `bound_hi` the level at the slowest convergence
   the interval allows. When the last step adds no more than `floor`, the reason is
   `rose_then_flat`.
5. NOISY (INCONCLUSIVE, `noisy`): the increments' noise is large next to `floor`, a rate
   above `floor` per step is not ruled out, and the growth does not stand clear of the noise
   (increments of both signs, or a step's growth under 4 x their noise): neither a leak nor
   caching can be claimed.
6. STEP (CACHING, `rose_then_flat`): the last steps are flat (within `floor`) after a rise.
7. FALLING (CACHING, `fell_back`): the last point is below an earlier high by more than
   `floor` (caches give memory back; a leak never does).
8. BOUNDED (CACHING, `bounded`): five or more points moving within a band, no significant
   trend, no new high in the last two.
Before 3, one change point inside the points is tried (a line that levels off at any point,
flat after it for two points or more; a flat line that starts growing at any point, for three
points or more), each against the straight line by an F test at 99 % confidence shared over
the candidate places (Bonferroni). Levelled off: STEP (CACHING, `rose_then_flat`, `bound` the
level it stopped at: a cache that filled to its cap, steps up that stopped). Started growing
late: the growth since then is judged (STEADY at its rate since the change). `change_at` says
where.

9. UNDECIDED (INCONCLUSIVE): `steady_or_converging` when the growth is significant but its
   shape is not (with `steps_to_decide`: about how many more steps of the same traffic would
   decide, should the growth go on as it is), else `still_changing`.

Confidence: r's lower end for STEADY at 95 % (two-sided F), its upper end for CONVERGING at
98 %: both errors are costly; a leak called converging is the rarer one here, on purpose, since
a cache whose growth goes on looking steady is still reported (INCONCLUSIVE, with the rate).
Measured by simulation (tests/stats/test_growth_calibration.py): no steady leak called CACHING
and no cache with r <= 0.8 called LEAK in 2,000 draws at level noise up to 40 % of one step's
growth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from vramdoctor.verdicts import Reason, Verdict

__all__ = [
    "GrowthFit",
    "Model",
    "fit_growth",
    "halving_ratio",
    "level_noise",
]

# r = exp(-lam * step) on a grid: a step (0), converging (0..1, finer near 1, where a slow
# cache and a leak are told apart), steady (1) and speeding up (> 1).
_R_GRID = np.unique(
    np.concatenate(
        [
            np.linspace(0.0, 0.9, 91),
            np.linspace(0.9, 1.0, 101),
            np.linspace(1.0, 1.6, 61),
        ]
    )
)
_NU0 = 2.0  # pseudo degrees of freedom of the caller's noise estimate (pooled with residuals)
CONF_STEADY = 0.98  # r's lower end (a leak): two-sided F interval
CONF_CONVERGING = 0.995  # r's upper end (converging)
CONF_RATE = 0.90  # the steady rate's interval (two-sided t), as the reports state it
NOISE_K = 4.0  # NOISY when NOISE_K x the level noise exceeds the floor
MAX_STEPS_TO_DECIDE = 24


class Model(str, Enum):
    """The growth model that explains a series best (`GrowthFit.model`)."""

    FLAT = "flat"
    STEADY = "steady"
    CONVERGING = "converging"
    STEP = "step"
    FALLING = "falling"
    BOUNDED = "bounded"
    NOISY = "noisy"
    UNDECIDED = "undecided"

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]


@dataclass
class GrowthFit:
    """One series' growth model and the numbers behind it, in the series' unit.

    `rate` and `rate_ci` are per unit of x (`x_unit`: "request" or "s"), the steady model's
    slope and its 90 % interval; `ratio` (r) and `ratio_ci` the share of a step's growth the
    next step adds (1: steady; < 1 converging; its interval's ends are those the model
    selection uses); `bound` (and `bound_hi`, the slowest convergence allowed) the projected
    level of a converging series; `noise` the level noise used (pooled), `noise_known` the
    caller's; `increments` the growth of each step scaled to a normal step (`step` of x);
    `steps_to_decide` about how many more steps would decide an undecided growth.
    """

    model: Model
    verdict: Verdict
    reason: Reason
    n: int
    x_unit: str = "request"
    step: float | None = None
    growth: float | None = None  # last point - first point
    fitted_growth: float | None = None  # rate x the points' x span
    rate: float | None = None
    rate_ci: tuple[float, float] | None = None
    ratio: float | None = None
    ratio_ci: tuple[float, float] | None = None
    bound: float | None = None
    bound_hi: float | None = None
    noise: float = 0.0
    noise_known: float = 0.0
    floor: float = 0.0
    increments: list[float] = field(default_factory=list)
    steps_to_decide: int | None = None
    change_at: float | None = None  # the x where growth levelled off or started (change point)
    x0: float = 0.0  # the first point's x (the fit's x are relative to it)
    steps_missing: int = 0  # STEADY held back: increments short of `min_steady_steps`
    # the first point the rate was fitted on, where a change point cut the points (a leak
    # under a cache that filled, a leak that started late): the increments before it are
    # the fill or the flat hours, not the leak's own scatter
    tail_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples as lists, non-finite floats as None."""
        d = asdict(self)
        for k in ("rate_ci", "ratio_ci"):
            d[k] = list(d[k]) if d[k] is not None else None
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()
        }


# STEADY rules out every cache that would halve its growth within this many steps: the
# observed steps, but at least HALVING_MIN (four rounds cannot tell a leak from a cache that
# halves in six) and at most HALVING_HORIZON (the bar stops rising on long runs).
HALVING_MIN = 5
HALVING_HORIZON = 8
STEADY_DECAY = 0.02  # a share of the previous step's growth lost per step that is still steady


def halving_ratio(steps: int) -> float:
    """The r at which a converging series halves its growth per step over `steps` increments
    (at least `HALVING_MIN`, at most `HALVING_HORIZON`): the convergence STEADY must rule
    out (``0.5 ** (1 / (steps - 1))``: 0.84 up to five increments, 0.91 from eight)."""
    return float(0.5 ** (1.0 / (min(max(steps, HALVING_MIN), HALVING_HORIZON) - 1)))


def level_noise(samples: Sequence[Sequence[float]], *, resolution: float = 0.0) -> float:
    """The noise of one settled level (a median of the late samples of an idle window), from
    the spread of the samples around their own window's median (MAD x 1.4826, pooled over
    windows of two or more samples), and the measurement's `resolution` (a level read in
    whole MiB is uncertain by 1/sqrt(12) MiB). Consecutive samples are correlated, so no
    more than five count as independent."""
    resid: list[float] = []
    counts: list[int] = []
    for g in samples:
        if len(g) >= 2:
            mid = float(np.median(g))
            resid += [abs(float(x) - mid) for x in g]
            counts.append(len(g))
    spread = 1.4826 * float(np.median(resid)) if len(resid) >= 3 else 0.0
    m = float(np.median(counts)) if counts else 1.0
    per_level = spread * math.sqrt(math.pi / (2.0 * min(max(m, 1.0), 5.0)))
    return max(per_level, resolution / math.sqrt(12.0))


@lru_cache(maxsize=8)
def _f_quantile(conf: float, dof: float) -> float:
    from scipy.stats import f as f_dist

    return float(f_dist.ppf(conf, 1, dof))


@lru_cache(maxsize=8)
def _t_quantile(conf: float, dof: float) -> float:
    from scipy.stats import t as t_dist

    return float(t_dist.ppf(0.5 + conf / 2.0, dof))


def _profile(
    x: np.ndarray, y: np.ndarray, step: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sse, a, c) of the model at every r of the grid (x starts at 0)."""
    with np.errstate(all="ignore"):
        lam = -np.log(_R_GRID) / step  # r = 0 -> inf: a step at the second point
        lx = lam[:, None] * x[None, :]
        g = np.where(np.abs(lam)[:, None] < 1e-12, x[None, :], -np.expm1(-lx) / lam[:, None])
        g = np.where(np.isinf(lam)[:, None], (x > 0)[None, :].astype(float), g)
    g = np.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)
    gm = g.mean(axis=1, keepdims=True)
    gc = g - gm
    yc = y - y.mean()
    vg = np.einsum("ij,ij->i", gc, gc)
    cov = gc @ yc
    ok = vg > 1e-300
    c = np.where(ok, cov / np.where(ok, vg, 1.0), 0.0)
    sse = np.maximum(float(yc @ yc) - c * cov, 0.0)
    a = y.mean() - c * gm[:, 0]
    return sse, a, c


def _bound(a: float, c: float, r: float, step: float) -> float | None:
    """The level a converging model tends to (None when it does not converge)."""
    if not 0.0 <= r < 1.0:
        return None
    if r == 0.0:
        return a + c  # a step: everything in the first step (c is the step's size)
    lam = -math.log(r) / step
    return a + c / lam


def _steps_to_decide(m: int, rate_per_step: float, noise: float, dof: float) -> int | None:
    """About how many more steps of the same growth would put r's interval above the halving
    ratio (STEADY), at this level noise: the model linearised around r = 1."""
    if rate_per_step <= 0 or not math.isfinite(rate_per_step):
        return None
    if noise <= 0:
        return 1
    q = math.sqrt(_f_quantile(CONF_STEADY, dof + 1.0))
    for total in range(m + 1, m + MAX_STEPS_TO_DECIDE + 1):
        k = np.arange(total, dtype=float)
        design = np.column_stack([np.ones(total), k, rate_per_step * k * (k - 1) / 2.0])
        try:
            cov = np.linalg.inv(design.T @ design)
        except np.linalg.LinAlgError:
            continue
        half = q * noise * math.sqrt(max(cov[2, 2], 0.0))
        if 1.0 - half >= halving_ratio(total - 1):
            return total - m
    return None


def fit_growth(
    x: Sequence[float],
    y: Sequence[float],
    *,
    noise: float = 0.0,
    floor: float = 0.0,
    step: float | None = None,
    x_unit: str = "request",
    min_steady_steps: int = 0,
    fill_search: bool = True,
) -> GrowthFit:
    """Fit the growth model to points `(x[i], y[i])` and select the model (the rule above).

    `x`: work done (cumulative requests, or seconds), increasing; `y`: the levels (any unit);
    `noise`: the caller's estimate of one level's noise (same unit; 0 = unknown, the residuals
    decide it); `floor`: the smallest change that counts (the series' resolution); `step`: the
    x of one normal step (one round's requests; default the median spacing);
    `min_steady_steps`: the increments a STEADY verdict needs at least (fewer: UNDECIDED
    `steady_or_converging`, `steps_to_decide` the increments missing), for a series read once
    a round with no noise of its own (the agent's counters), where a cache that fills at a
    fixed rate up to its cap is exactly linear until it is full. Points with a non-finite
    coordinate are dropped, x is made relative to the first point. Never raises on short,
    flat or degenerate input: it says UNDECIDED. `fill_search=False`: no search for a leak
    under a cache that filled (the tails that search fits are judged without one: linear, not
    exponential, in the points).
    """
    pts = sorted(
        (float(a), float(b))
        for a, b in zip(x, y, strict=False)
        if math.isfinite(float(a)) and math.isfinite(float(b))
    )
    m = len(pts)
    floor = max(float(floor), 0.0)
    noise = max(float(noise), 0.0) if math.isfinite(noise) else 0.0
    out = GrowthFit(
        Model.UNDECIDED,
        Verdict.INCONCLUSIVE,
        Reason.NO_LEVEL if m == 0 else Reason.TOO_FEW_ROUNDS,
        m,
        x_unit,
        noise=noise,
        noise_known=noise,
        floor=floor,
    )
    if m == 0:
        return out
    xs = np.array([p[0] for p in pts]) - pts[0][0]
    ys = np.array([p[1] for p in pts])
    out.x0 = pts[0][0]
    out.growth = float(ys[-1] - ys[0])
    if float(np.max(np.abs(ys - ys[0]))) <= floor:
        out.model, out.verdict = Model.FLAT, Verdict.STABLE
        out.reason = Reason.FLAT if m >= 2 else Reason.ONE_ROUND
        if m < 2:
            out.verdict = Verdict.INCONCLUSIVE
        return out
    spacing = np.diff(xs)
    if m < 3 or float(xs[-1]) <= 0:
        return out
    step = float(step) if step and step > 0 else float(np.median(spacing[spacing > 0]))
    out.step = step
    out.increments = [
        float(d * step / n) for d, n in zip(np.diff(ys), spacing, strict=True) if n > 0
    ]
    with np.errstate(all="ignore"):
        fit = _select(out, xs, ys, noise, floor, step, fill_search)
    # After a change point the tail alone carries the rate: it needs the increments too (a
    # second cache filling at a fixed rate after the first one is full reads steady; seen: two
    # caches, full after rounds 2 and 5, called a leak after round 5).
    if fit.model is Model.STEADY and len(fit.increments[fit.tail_from or 0 :]) < min_steady_steps:
        fit.model, fit.verdict = Model.UNDECIDED, Verdict.INCONCLUSIVE
        fit.reason = Reason.STEADY_OR_CONVERGING
        fit.steps_to_decide = fit.steps_missing = min_steady_steps - len(
            fit.increments[fit.tail_from or 0 :]
        )
    return fit


def pts_x0(out: GrowthFit) -> float:
    """The x the fit's points were made relative to (their first x)."""
    return out.x0


def _change_point(
    xs: np.ndarray, ys: np.ndarray, noise: float, nu0: float, sse_line: float
) -> tuple[str, int, float, float] | None:
    """The one change point that explains the points clearly better than a line, if any:
    ("levelled", i, a, b) for growth up to x[i] and flat after it (two points or more after),
    ("started", i, a, b) for flat up to x[i] and growth after it (three points or more from
    it). An F test against the line at 99 % confidence shared over the candidates (each has
    one more parameter, the change's place is searched: Bonferroni)."""
    m = len(xs)
    cands: list[tuple[str, int]] = [("levelled", i) for i in range(1, m - 2)]
    cands += [("started", i) for i in range(1, m - 2)]
    if not cands:
        return None
    best: tuple[float, str, int, float, float] | None = None
    for kind, i in cands:
        c = float(xs[i])
        g = np.minimum(xs, c) if kind == "levelled" else np.maximum(xs - c, 0.0)
        gm = float(g.mean())
        vg = float(((g - gm) ** 2).sum())
        if vg <= 0:
            continue
        b = float(((g - gm) * (ys - ys.mean())).sum() / vg)
        a = float(ys.mean() - b * gm)
        r = ys - (a + b * g)
        sse = float(r @ r)
        if best is None or sse < best[0]:
            best = (sse, kind, i, a, b)
    if best is None:
        return None
    sse, kind, i, a, b = best
    dof = max(nu0 + m - 3, 1.0)
    s2 = max(noise**2, (nu0 * noise**2 + sse) / dof)
    conf = 1.0 - 0.01 / len(cands)
    if sse_line - sse <= _f_quantile(conf, dof) * s2:
        return None
    return kind, i, a, b


def _tail_fit(
    xs: np.ndarray, ys: np.ndarray, i: int, noise: float, floor: float, step: float, x_unit: str
) -> GrowthFit:
    """The points from `i` on, fitted on their own (no further search for a fill in them)."""
    return fit_growth(
        xs[i:].tolist(),
        ys[i:].tolist(),
        noise=noise,
        floor=floor,
        step=step,
        x_unit=x_unit,
        fill_search=False,
    )


# A leak under a cache that fills: the points after the cache stopped growing are judged on
# their own, and need at least this many (three increments at the leak's own rate).
FILL_TAIL_POINTS = 4


def _leak_after_fill(
    xs: np.ndarray, ys: np.ndarray, noise: float, floor: float, step: float, x_unit: str
) -> tuple[int, GrowthFit] | None:
    """A cache that filled and a leak that goes on under it (the growth slows to a steady
    rate, not to zero): the earliest point from which the rest (FILL_TAIL_POINTS or more) is
    STEADY by the same model, at a rate below the growth before it, whose growth since then
    exceeds `floor`. (index, the tail's fit), else None. Seen on an H200: glibc's bytes in use
    of a server with a 256 KiB/request leak under a cache filling 768 KiB/request read
    +12, +12, +12, +7, +3, +3 MiB a round, which the converging model alone called caching.)"""
    m = len(xs)
    for i in range(1, m - FILL_TAIL_POINTS + 1):
        after = _tail_fit(xs, ys, i, noise, floor, step, x_unit)
        if after.model is not Model.STEADY or after.rate is None:
            continue
        before = float(ys[i] - ys[0]) / float(xs[i]) if xs[i] > 0 else 0.0
        if after.rate < before and after.rate * float(xs[-1] - xs[i]) > floor:
            return i, after
    return None


def _not_shrinking(incs: Sequence[float], noise: float, floor: float) -> bool:
    """The last step added above `floor` and no less than the one before it (within the two
    steps' noise): what converges adds less each step; this has stopped converging, or never
    did under a cache that filled."""
    if len(incs) < 3 or incs[-1] <= floor:
        return False
    return incs[-1] >= incs[-2] - 2.0 * math.sqrt(2.0) * noise and incs[-1] < max(incs[:-2])


class _RatioFit(NamedTuple):
    """The grid fit of r (`_profile`) and r's intervals: `a`, `c` the fitted (a, c) at every
    r of `_R_GRID` (arrays, the series' unit and unit per x), `best` the grid index of the
    least squares, `r_hat` its r, `r_lo` r's lower end at CONF_STEADY and `r_hi` its upper
    end at CONF_CONVERGING; `s` the pooled level noise (the series' unit), `dof` its degrees
    of freedom, `nu0` the pseudo degrees of freedom given the caller's noise."""

    a: np.ndarray
    c: np.ndarray
    best: int
    r_hat: float
    r_lo: float
    r_hi: float
    s: float
    dof: float
    nu0: float


class _SteadyLine(NamedTuple):
    """The steady model (r = 1) fitted as a straight line: `b` its rate (the series' unit per
    unit of x), `half` the half-width of the rate's CONF_RATE interval, `sse` its residual
    sum of squares (the series' unit squared)."""

    b: float
    half: float
    sse: float


def _ratio_interval(
    sse: np.ndarray, sse_min: float, dof: float, s2: float, conf: float
) -> tuple[float, float]:
    """(lowest r, highest r) of the grid whose profile SSE lies within the F bound at `conf`
    of the minimum; the whole grid when nothing does."""
    inside = _R_GRID[sse - sse_min <= _f_quantile(conf, dof) * s2 * (1 + 1e-9) + 1e-300]
    if not inside.size:  # non-finite sums (levels near the float limit): nothing known
        return float(_R_GRID[0]), float(_R_GRID[-1])
    return float(inside.min()), float(inside.max())


def _fit_ratio(
    out: GrowthFit, xs: np.ndarray, ys: np.ndarray, noise: float, step: float
) -> _RatioFit:
    """The profile over r's grid, the pooled level noise and r's intervals (a `_RatioFit`);
    sets `out.noise`, `out.ratio` and `out.ratio_ci`."""
    m = len(xs)
    sse, a_r, c_r = _profile(xs, ys, step)
    best = int(np.argmin(sse))
    sse_min = float(sse[best])
    nu = m - 3
    # The caller's noise counts as _NU0 degrees of freedom next to the residuals' (none when
    # the caller knows no noise: then the residuals alone say it, with their own few dof).
    nu0 = _NU0 if noise > 0 else 0.0
    dof = max(nu0 + max(nu, 0), 1.0)
    s2 = max(noise**2, (nu0 * noise**2 + sse_min) / dof)
    s = math.sqrt(s2)
    out.noise = s
    r_lo, _ = _ratio_interval(sse, sse_min, dof, s2, CONF_STEADY)
    _, r_hi = _ratio_interval(sse, sse_min, dof, s2, CONF_CONVERGING)
    r_hat = float(_R_GRID[best])
    out.ratio, out.ratio_ci = r_hat, (r_lo, r_hi)
    return _RatioFit(a_r, c_r, best, r_hat, r_lo, r_hi, s, dof, nu0)


def _fit_steady_line(
    out: GrowthFit, xs: np.ndarray, ys: np.ndarray, noise: float, nu0: float
) -> _SteadyLine:
    """The steady model's line (a `_SteadyLine`); sets `out.rate`, `out.rate_ci` and
    `out.fitted_growth` (the rate x the points' x span)."""
    m = len(xs)
    # The steady model (r = 1): its rate and 90 % interval, the residuals pooled like s2.
    xm = float(xs.mean())
    sxx = float(((xs - xm) ** 2).sum())
    b = float(((xs - xm) * (ys - ys.mean())).sum() / sxx)
    a = float(ys.mean() - b * xm)
    res = ys - (a + b * xs)
    dof_lin = max(nu0 + max(m - 2, 0), 1.0)
    s2_lin = max(noise**2, (nu0 * noise**2 + float(res @ res)) / dof_lin)
    half = _t_quantile(CONF_RATE, dof_lin) * math.sqrt(s2_lin / sxx)
    out.rate, out.rate_ci = b, (b - half, b + half)
    span = float(xs[-1])
    out.fitted_growth = b * span
    return _SteadyLine(b, half, float(res @ res))


def _done(out: GrowthFit, model: Model, verdict: Verdict, reason: Reason) -> GrowthFit:
    """`out` with its model, verdict and reason set."""
    out.model, out.verdict, out.reason = model, verdict, reason
    return out


def _steady_from_tail(out: GrowthFit, xs: np.ndarray, i: int, after: GrowthFit) -> GrowthFit:
    """`out` STEADY (LEAK, `grew_every_round`) at the rate of the tail from point `i` on
    (`after`, its own fit): rate, ratio and fitted growth the tail's, `change_at` the x
    where the tail starts (in the caller's x), `tail_from` = `i`."""
    out.rate, out.rate_ci = after.rate, after.rate_ci
    out.ratio, out.ratio_ci = after.ratio, after.ratio_ci
    out.fitted_growth = after.fitted_growth
    out.change_at = float(xs[i]) + float(pts_x0(out))
    out.tail_from = i
    return _done(out, Model.STEADY, Verdict.LEAK, Reason.GREW_EVERY_ROUND)


def _change_verdict(
    out: GrowthFit,
    xs: np.ndarray,
    ys: np.ndarray,
    change: tuple[str, int, float, float] | None,
    fill_leak: tuple[int, GrowthFit] | None,
    noise: float,
    floor: float,
    step: float,
) -> GrowthFit | None:
    """`out` decided by a change point inside the points (`_change_point`): STEP where the
    growth levelled off to flat, STEADY where it levelled off to a leak under a filled cache
    (`fill_leak`) or started late and the tail is steady; None when no change decides."""
    if change is not None and change[0] == "levelled":
        _, i, a_h, b_h = change
        top = a_h + b_h * float(xs[i])
        if fill_leak is not None:  # it levelled off to a steady leak, not to flat
            return _steady_from_tail(out, xs, *fill_leak)
        if b_h > 0 and top - float(ys[0]) > floor:
            out.bound = out.bound_hi = top
            out.change_at = float(xs[i]) + float(pts_x0(out))
            return _done(out, Model.STEP, Verdict.CACHING, Reason.ROSE_THEN_FLAT)
    if change is not None and change[0] == "started":
        _, i, _, b_h = change
        if b_h > 0 and b_h * float(xs[-1] - xs[i]) > floor:
            after = _tail_fit(xs, ys, i, noise, floor, step, out.x_unit)
            if after.model is Model.STEADY:
                return _steady_from_tail(out, xs, i, after)
    return None


def _converging_verdict(
    out: GrowthFit,
    xs: np.ndarray,
    ratio: _RatioFit,
    fill_leak: tuple[int, GrowthFit] | None,
    noise: float,
    floor: float,
    step: float,
) -> GrowthFit:
    """`out` for growth whose r lies below the steady band: STEADY for a leak under a filled
    cache, UNDECIDED while the last increments stop shrinking, else CONVERGING with its
    projected `bound` and `bound_hi` (the level at the slowest convergence allowed)."""
    if fill_leak is not None:
        return _steady_from_tail(out, xs, *fill_leak)
    if _not_shrinking(out.increments, noise, floor):
        # The last steps add the same again, not less: a cache that filled with a leak
        # under it, or one still converging; one more step tells (a tail of four).
        out.steps_to_decide = FILL_TAIL_POINTS - 3
        return _done(out, Model.UNDECIDED, Verdict.INCONCLUSIVE, Reason.STEADY_OR_CONVERGING)
    a_r, c_r, best, r_hi = ratio.a, ratio.c, ratio.best, ratio.r_hi
    out.bound = _bound(float(a_r[best]), float(c_r[best]), ratio.r_hat, step)
    i_hi = int(np.searchsorted(_R_GRID, r_hi))
    i_hi = min(i_hi, len(_R_GRID) - 1)
    out.bound_hi = _bound(float(a_r[i_hi]), float(c_r[i_hi]), float(_R_GRID[i_hi]), step)
    if out.bound is not None and out.bound_hi is not None:
        out.bound_hi = max(out.bound_hi, out.bound)
    last = out.increments[-1] if out.increments else 0.0
    reason = Reason.ROSE_THEN_FLAT if abs(last) <= floor else Reason.CONVERGING
    return _done(out, Model.CONVERGING, Verdict.CACHING, reason)


def _increment_noise(incs: Sequence[float], noise: float) -> tuple[bool, float]:
    """(whether the increments take both signs, the level noise they show, at least
    `noise`; the series' unit)."""
    # Noise the increments show, robustly (a clean step has none: one jump is not noise):
    # their MAD, and where they take both signs their spread; a level with noise s gives
    # increments with spread s x sqrt(2).
    mixed = any(d < 0 for d in incs) and any(d > 0 for d in incs)
    inc_noise = 0.0
    if len(incs) >= 3 or mixed:
        mid = float(np.median(incs))
        inc_noise = 1.4826 * float(np.median([abs(d - mid) for d in incs])) / math.sqrt(2.0)
        if mixed and len(incs) >= 2:
            inc_noise = max(inc_noise, float(np.std(incs, ddof=1)) / math.sqrt(2.0))
    return mixed, max(inc_noise, noise)


def _shape_verdict(
    out: GrowthFit,
    xs: np.ndarray,
    ys: np.ndarray,
    ratio: _RatioFit,
    line: _SteadyLine,
    fill_leak: tuple[int, GrowthFit] | None,
    rising: bool,
    noise: float,
    floor: float,
    step: float,
) -> GrowthFit:
    """`out` for growth neither steady nor converging (rules 5 to 9): NOISY, STEP, FALLING,
    BOUNDED, STEADY for a leak under a filled cache, else UNDECIDED."""
    m = len(xs)
    b, half = line.b, line.half
    span = float(xs[-1])
    incs = out.increments
    last = incs[-1] if incs else 0.0
    mixed, inc_noise = _increment_noise(incs, noise)
    # Noisy: the increments move more than the floor, a rate above the floor per step is not
    # ruled out, and the growth per step does not stand clear of that noise (increments of
    # both signs, or a step's growth under NOISE_K x the noise): clear growth whose shape is
    # not yet named is undecided below, not noisy.
    clear = not mixed and b * step > NOISE_K * inc_noise
    if NOISE_K * inc_noise > floor and (b + half) * step > floor and b > 0 and not clear:
        out.noise = max(out.noise, inc_noise)
        return _done(out, Model.NOISY, Verdict.INCONCLUSIVE, Reason.NOISY)
    rise = float(np.max(ys[:-1]) - ys[0])
    if abs(last) <= floor and (len(incs) < 2 or max(incs[-2:]) <= floor) and rise > floor:
        return _done(out, Model.STEP, Verdict.CACHING, Reason.ROSE_THEN_FLAT)
    if ys[-1] < float(np.max(ys[:-1])) - floor and (b - half) <= 0:
        return _done(out, Model.FALLING, Verdict.CACHING, Reason.FELL_BACK)
    if (
        m >= 5
        and b - half <= 0
        and ys[-1] <= float(np.max(ys[:-1])) + floor
        and float(np.max(ys[-2:])) <= float(np.max(ys[:-2])) + floor
    ):
        return _done(out, Model.BOUNDED, Verdict.CACHING, Reason.BOUNDED)
    if fill_leak is not None and rising:
        return _steady_from_tail(out, xs, *fill_leak)
    if b - half > 0 and b * span > floor:
        out.steps_to_decide = _steps_to_decide(m, b * step, ratio.s, ratio.dof)
        return _done(out, Model.UNDECIDED, Verdict.INCONCLUSIVE, Reason.STEADY_OR_CONVERGING)
    return _done(out, Model.UNDECIDED, Verdict.INCONCLUSIVE, Reason.STILL_CHANGING)


def _select(
    out: GrowthFit,
    xs: np.ndarray,
    ys: np.ndarray,
    noise: float,
    floor: float,
    step: float,
    fill_search: bool = True,
) -> GrowthFit:
    """`out` with its model selected by the rule of the module docstring (the points `xs`
    relative to the first one, `ys` in the series' unit, at least three; `step` one normal
    step of x), and the numbers behind it filled in."""
    ratio = _fit_ratio(out, xs, ys, noise, step)
    line = _fit_steady_line(out, xs, ys, noise, ratio.nu0)
    span = float(xs[-1])
    n_steps = len(xs) - 1
    rising = float(ratio.c[ratio.best]) > 0 and out.growth is not None and out.growth > floor

    # A change inside the points: growth that levelled off (a cache that filled at its cap, a
    # few steps up and then flat) or growth that started late (a leak that began mid-way).
    change = _change_point(xs, ys, noise, ratio.nu0, line.sse)
    fill_leak = _leak_after_fill(xs, ys, noise, floor, step, out.x_unit) if fill_search else None
    changed = _change_verdict(out, xs, ys, change, fill_leak, noise, floor, step)
    if changed is not None:
        return changed

    steady_r = 1.0 - STEADY_DECAY
    b, half = line.b, line.half
    if (
        ratio.r_hi >= steady_r
        and ratio.r_lo >= halving_ratio(n_steps)
        and b - half > 0
        and b * span > floor
    ):
        return _done(out, Model.STEADY, Verdict.LEAK, Reason.GREW_EVERY_ROUND)
    if ratio.r_hi < steady_r and rising:
        return _converging_verdict(out, xs, ratio, fill_leak, noise, floor, step)
    return _shape_verdict(out, xs, ys, ratio, line, fill_leak, rising, noise, floor, step)
