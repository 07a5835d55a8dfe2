"""Fleet analysis: days of memory history per host, GPU and process -> one ranked table. Pure.

Per series (one GPU of one host, one process on it, or one server's KV pool):

1. Restarts: the series is cut where it stops for longer than `gap_s` (a process or exporter
   down) or drops by more than `restart_drop_share` of its level and at least
   `restart_drop_mib` between two points (a server restart frees everything at once; caching
   never does). Only the last piece, the process running now, is analysed; the number of
   cuts is reported (a server that restarts every few days because it dies is a finding too).
2. Warm-up: when the piece starts inside the range (we saw the process start), its first
   `warmup_s` are left out: weights load, CUDA graphs are captured, allocator and arena
   caches fill there.
3. Comparable moments: production traffic is not identical rounds, so levels are compared
   only at each block's quietest moment: the minimum of every `block_s` (Prometheus already
   gives the minimum of each step with `min_over_time`). A process's floor is what it keeps
   when its requests are gone; caching raises the floor once and levels off, a leak raises
   it block after block. For KV pools the points are the idle moments themselves (0 running,
   0 queued; selected in PromQL), where a healthy server holds 0 tokens.
4. The trend test of `watch.trend.classify` (Theil-Sen slope with CI, Kendall tau, the late
   half still growing), with x in seconds: growth per hour; hours to OOM = free / growth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vramdoctor.judge.results import finite
from vramdoctor.stats.trend import (
    LEAK,
    VERDICT_RANK,
    Trend,
    TrendThresholds,
    classify,
    low_envelope_arrays,
)

__all__ = [
    "SCHEMA",
    "FleetConfig",
    "FleetResult",
    "FleetRow",
    "FleetSeries",
    "analyse",
    "analyse_series",
    "segments",
]

SCHEMA = "vramdoctor.fleet/1"


@dataclass
class FleetSeries:
    """One history: values in `unit` (MiB, tokens or ratio) at unix times `t` (sorted)."""

    host: str
    layer: str  # "device", "vram", "rss", "rss_anon", ..., "kv", "pod"
    unit: str
    source: str
    t: np.ndarray
    v: np.ndarray
    gpu: str | None = None
    uuid: str | None = None
    pid: int | None = None
    process: str | None = None
    pod: str | None = None

    @property
    def key(self) -> str:
        parts = [self.host, self.layer]
        for k, v in (
            ("gpu", self.gpu),
            ("pid", self.pid),
            ("pod", self.pod),
            ("process", self.process),
        ):
            if v is not None:
                parts.append(f"{k}={v}")
        return "/".join(parts)


@dataclass(frozen=True)
class FleetConfig:
    """Durations in seconds; thresholds per unit."""

    block_s: float = 3600.0
    warmup_s: float = 7200.0
    gap_s: float = 900.0
    restart_drop_mib: float = 1024.0
    restart_drop_share: float = 0.3
    mib: TrendThresholds = field(default_factory=lambda: TrendThresholds(min_growth=32.0))
    tokens: TrendThresholds = field(default_factory=lambda: TrendThresholds(min_growth=64.0))
    ratio: TrendThresholds = field(default_factory=lambda: TrendThresholds(min_growth=0.01))

    def thresholds(self, unit: str) -> TrendThresholds:
        return {"MiB": self.mib, "tokens": self.tokens}.get(unit, self.ratio)


@dataclass
class FleetRow:
    """One series' answer. Sizes in the series' unit; rates per hour."""

    host: str
    layer: str
    unit: str
    source: str
    gpu: str | None
    pid: int | None
    process: str | None
    pod: str | None
    verdict: str
    reason: str
    level: float | None
    growth_per_hour: float | None
    growth_per_hour_ci: tuple[float, float] | None
    hours_to_oom: float | None
    free: float | None
    restarts: int
    points: int
    analysed_from: float | None
    analysed_to: float | None
    warmup_skipped: bool
    trend: Trend | None = None
    # For charts (not in to_dict): the analysed piece and its comparable points.
    t: np.ndarray | None = field(default=None, repr=False)
    v: np.ndarray | None = field(default=None, repr=False)
    envelope: list[tuple[float, float]] = field(default_factory=list, repr=False)

    @property
    def key(self) -> str:
        parts = [self.host, self.layer]
        for k, v in (("gpu", self.gpu), ("pid", self.pid), ("pod", self.pod)):
            if v is not None:
                parts.append(f"{k}={v}")
        return "/".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = {
            k: getattr(self, k)
            for k in (
                "host",
                "layer",
                "unit",
                "source",
                "gpu",
                "pid",
                "process",
                "pod",
                "verdict",
                "reason",
                "level",
                "growth_per_hour",
                "hours_to_oom",
                "free",
                "restarts",
                "points",
                "analysed_from",
                "analysed_to",
                "warmup_skipped",
            )
        }
        d["growth_per_hour_ci"] = list(self.growth_per_hour_ci) if self.growth_per_hour_ci else None
        d["trend"] = self.trend.to_dict() if self.trend else None
        return finite(d)


@dataclass
class FleetResult:
    """The ranked table: leaks first (soonest to die first), then the rest."""

    start: float
    end: float
    step_s: float
    config: FleetConfig
    rows: list[FleetRow]
    notes: list[str] = field(default_factory=list)
    queries: list[dict[str, Any]] = field(default_factory=list)
    source_url: str | None = None

    @property
    def leaks(self) -> list[FleetRow]:
        return [r for r in self.rows if r.verdict == LEAK]

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return finite(
            {
                "schema": SCHEMA,
                "prometheus": self.source_url,
                "start": self.start,
                "end": self.end,
                "step_s": self.step_s,
                "block_s": c.block_s,
                "warmup_s": c.warmup_s,
                "leaks": len(self.leaks),
                "rows": [r.to_dict() for r in self.rows],
                "notes": self.notes,
                "queries": self.queries,
            }
        )


def segments(
    t: np.ndarray,
    v: np.ndarray,
    config: FleetConfig,
    *,
    min_drop: float | None = None,
    gaps: bool = True,
) -> list[tuple[int, int]]:
    """[i0, i1) pieces of a series between restarts (gaps or sudden large drops).

    `min_drop` is the smallest drop that counts (default `restart_drop_mib`); `gaps=False` for
    series whose gaps are by design (KV at idle moments only).
    """
    n = len(t)
    if n == 0:
        return []
    dt = np.diff(t)
    dv = np.diff(v)
    prev = v[:-1]
    floor = config.restart_drop_mib if min_drop is None else min_drop
    drop = (-dv >= floor) & (-dv >= config.restart_drop_share * np.abs(prev))
    cut_at = drop | (dt > config.gap_s) if gaps else drop
    cut = np.nonzero(cut_at)[0] + 1
    bounds = [0, *cut.tolist(), n]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1) if bounds[i + 1] > bounds[i]]


def analyse_series(
    s: FleetSeries, *, range_start: float, step_s: float, free: float | None, config: FleetConfig
) -> FleetRow:
    """The verdict of one series' current piece (after its last restart, past warm-up)."""
    ok = np.isfinite(s.v) & np.isfinite(s.t)
    t, v = s.t[ok], s.v[ok]
    th = config.thresholds(s.unit)
    if s.unit == "MiB":
        pieces = segments(t, v, config)
    else:  # KV at idle: gaps are the busy moments; a restart empties the pool (a large drop)
        pieces = segments(t, v, config, min_drop=4 * th.min_growth, gaps=False)
    base = dict(
        host=s.host,
        layer=s.layer,
        unit=s.unit,
        source=s.source,
        gpu=s.gpu,
        pid=s.pid,
        process=s.process,
        pod=s.pod,
        free=free,
        restarts=max(len(pieces) - 1, 0),
    )
    if not pieces:
        return FleetRow(
            verdict="INCONCLUSIVE",
            reason="no data in the range",
            level=None,
            growth_per_hour=None,
            growth_per_hour_ci=None,
            hours_to_oom=None,
            points=0,
            analysed_from=None,
            analysed_to=None,
            warmup_skipped=False,
            **base,  # type: ignore[arg-type]
        )
    i0, i1 = pieces[-1]
    pt, pv = t[i0:i1], v[i0:i1]
    started_inside = pt[0] > range_start + 2 * step_s
    if started_inside:
        keep = pt >= pt[0] + config.warmup_s
        at, av = pt[keep], pv[keep]
    else:
        at, av = pt, pv
    env = low_envelope_arrays(at, av, config.block_s)
    trend = classify(env, x_unit="s", thresholds=th)
    per_hour = trend.slope * 3600.0 if trend.slope is not None else None
    ci = (trend.slope_ci[0] * 3600.0, trend.slope_ci[1] * 3600.0) if trend.slope_ci else None
    hours = None
    if trend.verdict == LEAK and per_hour and per_hour > 0 and free is not None:
        hours = max(free, 0.0) / per_hour
    reason = trend.reason
    if started_inside and not len(at):
        reason = "still in its warm-up hours after a start"
    return FleetRow(
        verdict=trend.verdict,
        reason=reason,
        level=float(pv[-1]),
        growth_per_hour=per_hour,
        growth_per_hour_ci=ci,
        hours_to_oom=hours,
        points=trend.n,
        analysed_from=float(at[0]) if len(at) else None,
        analysed_to=float(at[-1]) if len(at) else None,
        warmup_skipped=bool(started_inside),
        trend=trend,
        t=pt,
        v=pv,
        envelope=env,
        **base,  # type: ignore[arg-type]
    )


def rank_key(r: FleetRow) -> tuple[float, float, float, str]:
    """Leaks first, soonest OOM first, then fastest growth; then INCONCLUSIVE, CACHING, STABLE."""
    return (
        -VERDICT_RANK.get(r.verdict, 0),
        r.hours_to_oom if r.hours_to_oom is not None else math.inf,
        -(r.growth_per_hour or 0.0) if r.unit == "MiB" else 0.0,
        r.key,
    )


def analyse(
    series: list[FleetSeries],
    *,
    start: float,
    end: float,
    step_s: float,
    free: dict[tuple[str, str], float] | None = None,
    config: FleetConfig | None = None,
) -> FleetResult:
    """Every series' row, ranked. `free`: (host, gpu) -> free MiB now; (instance, "kv") -> free KV now."""
    config = config or FleetConfig()
    free = free or {}
    rows = []
    for s in series:
        f = None
        if s.layer in ("device", "vram", "pod") and s.gpu is not None:
            f = free.get((s.host, s.gpu))
        elif s.layer == "kv":
            f = free.get((s.host, "kv"))
        rows.append(analyse_series(s, range_start=start, step_s=step_s, free=f, config=config))
    rows.sort(key=rank_key)
    return FleetResult(start=start, end=end, step_s=step_s, config=config, rows=rows)
