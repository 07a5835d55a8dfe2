"""Contrasts between round shapes: what `soak --vary` and `soak --cycle` decide with.

Both run rounds of different SHAPES (a request feature on or off; a lifecycle cycle in the idle
window or not), interleaved in seeded random order within blocks (every shape once per block),
after one warm-up round. What a round left behind is the change of a layer's settled level
from the previous idle window's end to its own (`LayerRounds.delta`), per request (`--vary`) or
per round (`--cycle`). The levels come from the judge's own series and settled levels
(`vramdoctor.judge.series.extract_series` / `settled_levels`, `vramdoctor.judge.timeline`): the
same numbers every soak verdict rests on.

The estimate (`fit_blocks`): y[b, s] = block effect + shape effect + noise, least squares over
every judged round (a block effect absorbs drift and warm-up common to a block; shapes are
compared within blocks). A contrast between two shapes has the 90 % interval of Student's t
with the residual degrees of freedom (rounds - blocks - shapes + 1): the noise of every round
pools into one estimate, so two blocks already give an interval. A contrast LEAKS when its
interval excludes zero, it exceeds the floor (the smallest change that counts), and it did not
fade (the last block's difference is at least 0.6 of the earlier blocks' mean: a cache that
fills the first times a shape is seen fades); with three blocks or more the first block is left
out as warm-up of every shape. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.judge.results import RoundInfo, Window
from vramdoctor.judge.series import Series, extract_series, settled_levels
from vramdoctor.judge.timeline import rounds_from_events, windows_from_events
from vramdoctor.samples import Event

CONFIDENCE = 0.90
SETTLE_FRACTION = 0.5  # the late half of an idle window gives its settled level

# The layers a contrast is judged on, with the series kinds that make them (summed over the
# server's own processes) and their units. host_pinned is RssShmem (CUDA pinned host memory).
LAYERS: Mapping[str, tuple[str, str]] = {
    "vram": ("vram", "MiB"),
    "kv": ("kv", "tokens"),
    "host": ("rss", "MiB"),
    "host_anon": ("rss_anon", "MiB"),
    "host_pinned": ("rss_shmem", "MiB"),
}
SERVER_ROLES = frozenset({"server", "watched", "launched"})


@dataclass
class LayerRounds:
    """One layer's settled level after the baseline and after each round (None: not measured
    in that window), and the series it sums."""

    layer: str
    unit: str
    baseline: float | None
    levels: dict[int, float | None]
    series: list[str]

    def delta(self, rnd: int) -> float | None:
        """What round `rnd` left behind: its level minus the previous window's (unit)."""
        now = self.levels.get(rnd)
        before = self.baseline if rnd == 1 else self.levels.get(rnd - 1)
        if now is None or before is None:
            return None
        return now - before


def _server_series(all_series: Mapping[str, Series], layer: str) -> list[Series]:
    kind = LAYERS[layer][0]
    if layer == "vram":
        vram = [s for s in all_series.values() if s.layer == "vram"]
        # the server's processes: by their host role, or (NVML rows without one) by the scope the
        # GPU source gave them; another tenant's process never counts
        mine = [
            s
            for s in vram
            if s.pid is not None
            and s.scope != "tenant"
            and (s.role in SERVER_ROLES or (s.role is None and s.scope == "server"))
        ]
        if mine:
            return mine
        # no per-process view: the device series (tenants included; the report says so)
        return [s for s in vram if s.pid is None]
    if layer == "kv":
        return [s for s in all_series.values() if s.layer == "kv"]
    return [
        s
        for s in all_series.values()
        if s.kind == kind and s.pid is not None and (s.role in SERVER_ROLES or s.role is None)
    ]


def layer_rounds(records: Sequence[Any]) -> tuple[dict[str, LayerRounds], list[RoundInfo]]:
    """Every layer's settled levels per round, from a run's records (time order), and the
    rounds' outcomes. Layers with no series are left out."""
    events = [r for r in records if isinstance(r, Event)]
    windows: list[Window] = windows_from_events(events)
    rounds = rounds_from_events(events)
    numbers = [r.round for r in rounds]
    series = extract_series(list(records))
    out: dict[str, LayerRounds] = {}
    for layer, (_kind, unit) in LAYERS.items():
        chosen = _server_series(series, layer)
        if not chosen:
            continue
        base_sum: float | None = 0.0
        sums: dict[int, float | None] = {n: 0.0 for n in numbers}
        for s in chosen:
            values = s.settle_points if s.settle_points is not None else s.points
            base, levels, _samples = settled_levels(values, windows, numbers, SETTLE_FRACTION)
            if base_sum is not None:
                base_sum = None if base is None and s.pid is None else base_sum + (base or 0.0)
            for n, level in zip(numbers, levels, strict=False):
                if sums[n] is None:
                    continue
                if level is None:
                    # a process that is not there (yet, or any more) holds nothing; a device
                    # series without a level leaves the window unmeasured
                    if s.pid is None:
                        sums[n] = None
                    continue
                sums[n] = (sums[n] or 0.0) + level
        out[layer] = LayerRounds(layer, unit, base_sum, sums, [s.key for s in chosen])
    return out, rounds


# --- the block-design estimate -------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One judged round: its block, its shape and what it left behind (per request or per
    cycle, in the layer's unit)."""

    round: int
    block: int
    shape: str
    y: float


@dataclass
class Estimate:
    """A contrast (or one shape's own rate): the estimate, its 90 % interval (None: not enough
    rounds to say), the per-block values it rests on, and the decision."""

    value: float
    lo: float | None
    hi: float | None
    df: int
    per_block: list[float] = field(default_factory=list)
    decision: str = "undecided"  # "leak" | "none" | "undecided"
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "lo": self.lo,
            "hi": self.hi,
            "df": self.df,
            "per_block": self.per_block,
            "decision": self.decision,
            "why": self.why,
        }


@dataclass
class BlockFit:
    """The least-squares fit of y = block + shape: shape effects and their covariance."""

    shapes: list[str]
    blocks: list[int]
    coef: list[float]
    cov: list[list[float]] | None
    df: int
    sigma: float | None
    obs: list[Observation]

    def _vec(self, weights: Mapping[str, float], block_mean: bool) -> list[float]:
        v = [weights.get(s, 0.0) for s in self.shapes] + [0.0] * (len(self.blocks) - 1)
        if block_mean and len(self.blocks) > 1:
            share = 1.0 / len(self.blocks)
            for k in range(1, len(self.blocks)):
                v[len(self.shapes) + k - 1] = share
        return v

    def contrast(self, weights: Mapping[str, float], *, absolute: bool = False) -> Estimate:
        """sum(weight x shape effect); `absolute`: plus the mean block effect (a shape's own
        rate averaged over blocks, rather than a difference of shapes)."""
        v = self._vec(weights, absolute)
        value = sum(a * b for a, b in zip(v, self.coef, strict=True))
        per_block = []
        for b in self.blocks:
            ys = {o.shape: o.y for o in self.obs if o.block == b}
            if all(s in ys for s in weights):
                per_block.append(sum(w * ys[s] for s, w in weights.items()))
        if self.cov is None or self.df <= 0:
            return Estimate(value, None, None, self.df, per_block)
        var = sum(v[i] * self.cov[i][j] * v[j] for i in range(len(v)) for j in range(len(v)))
        from scipy import stats as _stats

        half = float(_stats.t.ppf(0.5 + CONFIDENCE / 2, self.df)) * math.sqrt(max(var, 0.0))
        return Estimate(value, value - half, value + half, self.df, per_block)


def growth_estimate(
    x: Sequence[float], y: Sequence[float], *, floor: float, step: float, noise: float = 0.0
) -> tuple[Estimate, Any]:
    """The growth model (`vramdoctor.stats.growth.fit_growth`) of levels `y` after work `x`,
    as an Estimate of the steady rate per unit of x (decision: leak = steady growth, none =
    flat/converging/caching, undecided otherwise) and the fit itself."""
    from vramdoctor.stats.growth import fit_growth

    fit = fit_growth(list(x), list(y), noise=noise, floor=floor, step=step)
    lo, hi = fit.rate_ci if fit.rate_ci is not None else (None, None)
    verdict = fit.verdict.value
    decision = {"LEAK": "leak", "CACHING": "none", "STABLE": "none"}.get(verdict, "undecided")
    est = Estimate(
        float(fit.rate or 0.0), lo, hi, max(0, fit.n - 2), [], decision, fit.reason.value
    )
    return est, fit


def fit_blocks(obs: Sequence[Observation]) -> BlockFit | None:
    """Least squares of y on shape (one column each) and block (all but the first block);
    None when there is nothing to fit."""
    import numpy as np

    if not obs:
        return None
    shapes = sorted({o.shape for o in obs})
    blocks = sorted({o.block for o in obs})
    p = len(shapes) + len(blocks) - 1
    x = np.zeros((len(obs), p))
    y = np.array([o.y for o in obs], dtype=float)
    for i, o in enumerate(obs):
        x[i, shapes.index(o.shape)] = 1.0
        k = blocks.index(o.block)
        if k > 0:
            x[i, len(shapes) + k - 1] = 1.0
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    rank = int(np.linalg.matrix_rank(x))
    df = len(obs) - rank
    cov: list[list[float]] | None = None
    sigma: float | None = None
    if df > 0:
        resid = y - x @ coef
        s2 = float(resid @ resid) / df
        sigma = math.sqrt(s2)
        cov = (s2 * np.linalg.pinv(x.T @ x)).tolist()
    return BlockFit(shapes, blocks, [float(c) for c in coef], cov, df, sigma, list(obs))


def decide(
    est: Estimate,
    floor: float,
    *,
    fading_share: float = 0.6,
    sigma: float | None = None,
    trend: Any = None,
) -> Estimate:
    """Set `est.decision` and `est.why` (see the module doc). `floor` in the estimate's unit.

    Fading: the last block's value is below `fading_share` of the mean of the blocks before
    it, or below the block before by more than 4 x `sigma` (the noise of one block's value). A
    leak leaves the same for the same traffic block after block; a cache that fills towards a
    bound leaves a shrinking share. With three blocks or more, `trend` (a
    `vramdoctor.stats.growth.GrowthFit` of the contrast's cumulative sum, block by block) must
    call it steady: converging is caching, undecided stays undecided."""
    if est.lo is None or est.hi is None:
        est.decision, est.why = "undecided", "not enough rounds for an interval yet"
        return est
    if est.lo > 0 and est.value > floor:
        last = est.per_block[-1] if est.per_block else est.value
        earlier = est.per_block[:-1]
        before = sum(earlier) / len(earlier) if earlier else last
        if earlier and last < fading_share * before:
            est.decision = "undecided"
            est.why = (
                f"it fades: the last block left {last:.3g} against {before:.3g} before "
                "(a cache filling the first times?); more blocks decide"
            )
        elif earlier and sigma is not None and last < earlier[-1] - 4 * sigma:
            est.decision = "undecided"
            est.why = (
                f"it declines: {earlier[-1]:.3g} then {last:.3g}, more than the rounds' noise "
                "allows for a steady leak; more blocks decide"
            )
        elif trend is not None and len(est.per_block) >= 3:
            if trend.verdict.value == "LEAK":
                est.decision, est.why = (
                    "leak",
                    (
                        "the interval excludes zero and block after block it grows steadily "
                        f"(growth model: {trend.reason.value})"
                    ),
                )
            elif trend.verdict.value == "CACHING":
                est.decision, est.why = (
                    "none",
                    (f"it converges: the growth model calls it caching ({trend.reason.value})"),
                )
            else:
                est.decision, est.why = (
                    "undecided",
                    (
                        f"steady or converging, the growth model cannot tell yet ({trend.reason.value})"
                    ),
                )
        else:
            est.decision, est.why = "leak", "the interval excludes zero and it does not fade"
        return est
    if est.hi < floor or (est.lo <= 0 and est.value <= floor):
        est.decision = "none"
        est.why = (
            "the interval holds zero" if est.lo <= 0 else "below the smallest change that counts"
        )
        return est
    est.decision = "undecided"
    est.why = "the interval is too wide to tell: more blocks decide"
    return est
