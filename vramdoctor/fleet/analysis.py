"""Fleet analysis: a history of floors per GPU, process or KV pool -> one ranked row each. Pure.

A row is one *slot* (a GPU, a MIG slice, a process on a GPU, a pod sharing a GPU, a server's
KV pool) over the range. Its history is the floor of every block (the least memory of each
hour: `promql.floor`), from one or more series: each series is one identity (a pid, a pod),
and a new identity in the slot is a restart. Per row:

1. **Lives.** A restart is an identity change (a new pid or pod in the slot, joined by
   `collect`), a counter reset (a server's request counter fell: KV rows), or, for device-level
   GPU memory that carries no identity, the GPU emptying (a floor at or below `empty_mib`: no
   process held memory, so the one before it ended). A gap (no samples: an exporter or the
   database down, NaN readings) is a gap, never a restart; a drop that leaves memory above
   the empty level is a cache giving memory back inside one life. Only the current life is
   judged; the restarts are counted and listed.
2. **Warm-up.** A life that started inside the range loses its first `warmup_s`: weights
   load, CUDA graphs are captured, allocator and arena caches fill.
3. **Impossible readings** (negative memory, a ratio above 1, NaN) are unknown: dropped and
   counted (`unknown_points`), never a level.
4. **The trend** of the life's floors: `vramdoctor.stats.trend.classify` (Theil-Sen slope with
   its interval, Kendall tau, the late half still growing; x in seconds) decides LEAK,
   CACHING, STABLE or INCONCLUSIVE; a LEAK must have a rate whose 95 % interval excludes zero.
   **Change point**: `stats.changepoint.fit_hinge` looks for the moment growth began or sped
   up (a line against a hinge, by BIC); when there is one, the rate, its interval and the time
   to OOM come from the floors after it (the trend test is run again on those), and the row
   says since when. A steady leak keeps the whole life's rate.
5. **Time to OOM** = memory left now (the least free memory of the last block) / growth per
   hour, with the interval [left / upper rate, left / lower rate]; for a KV pool it is the
   time until the pool is full (capacity - tokens held at idle). Unknown when the free
   reading is missing or impossible, or the series stopped reporting (`stale`).

Series the database's screen showed flat (`Screen`) are never pulled: their rows are STABLE
from the server's own figures (`screened_row`). Ranking: live LEAK rows first, soonest out of
memory first, then fastest growing; stale leaks; INCONCLUSIVE; CACHING; STABLE.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vramdoctor.fleet.config import FleetConfig

if TYPE_CHECKING:  # loaded with the statistics, on first use
    from vramdoctor.stats.changepoint import Hinge, Slope
    from vramdoctor.stats.trend import Trend, TrendThresholds

__all__ = [
    "REASONS",
    "SCHEMA",
    "FleetConfig",
    "FleetResult",
    "FleetRow",
    "FleetSeries",
    "Life",
    "Screen",
    "analyse",
    "analyse_series",
    "lives",
    "rank_key",
    "screened_row",
]

SCHEMA = "vramdoctor.fleet/2"

LEAK, CACHING, STABLE, INCONCLUSIVE = "LEAK", "CACHING", "STABLE", "INCONCLUSIVE"
_RANK = {LEAK: 3, INCONCLUSIVE: 2, CACHING: 1, STABLE: 0}

REASONS: dict[str, str] = {
    # STABLE
    "flat": "no growth beyond the noise",
    "screened_flat": "its floor stayed flat over the range (the database's own figures)",
    "kv_zero_at_idle": "0 tokens held at every idle moment",
    # CACHING
    "rose_then_flat": "rose, then levelled off (an allocator or a cache filling up)",
    "grew_then_stopped": "grew, then stopped growing (a cache that filled)",
    "stepped": "rose in a few steps, then levelled off (a cache stepping up)",
    # LEAK
    "grew_with_time": "grows steadily in time, to the last point",
    "grew_since_change": "flat, then growing steadily from a change point to the last point",
    "grew_late": "growing in the second half of its life, to the last point",
    "grew_last_life": "its current life is too young to judge; the life before it leaked",
    # INCONCLUSIVE
    "too_few_points": "too few comparable points to judge",
    "warming_up": "still in its warm-up after a start",
    "still_changing": "rising, but not a significant, sustained trend yet",
    "interval_includes_zero": "rising, but the rate's interval includes zero",
    "never_idle": "never idle in the range: KV held at idle cannot be measured",
    "idle_unknown": "no running/queued gauges: idle moments cannot be told",
    "no_data": "no usable reading in the range",
}
"""Reason code -> what it means (the row's `why` adds the figures)."""


@dataclass
class Screen:
    """What the database computed for one series at the range end (`collect`): the standard
    deviation of its 3-block floor over the range (`sd`), the slope of its floor over the late
    window (per second, `late_slope`), its level now (None: no sample in the stale window),
    and whether it had samples at the range start."""

    sd: float | None
    late_slope: float | None
    level: float | None
    at_start: bool
    late_s: float
    restarts: int = 0  # counter resets (KV rows)


@dataclass
class FleetSeries:
    """One row's history: the floors of every block (unix s at the block's end, sorted; values
    in `unit`: MiB, tokens or ratio) of every life in the range, and where new lives began.

    `cuts`: (time, why) where a new identity or a counter reset began a life (`collect` finds
    them); `last_seen`: the last raw sample (None: unknown); `level`: the last raw reading;
    `capacity`: a KV pool's size in `unit` (None: unknown); `unknown`: impossible floors the
    database already dropped."""

    host: str
    layer: str  # "device", "vram", "rss", "rss_anon", ..., "pod", "kv"
    unit: str
    source: str
    t: np.ndarray
    v: np.ndarray
    gpu: str | None = None
    mig: str | None = None
    mig_profile: str | None = None
    uuid: str | None = None
    pid: int | None = None
    process: str | None = None
    pod: str | None = None
    instance: str | None = None
    server: str | None = None  # server kind for KV rows ("sglang")
    pool: str | None = None  # KV pool ("full", "swa")
    cuts: list[tuple[float, str]] = field(default_factory=list)
    last_seen: float | None = None
    level: float | None = None
    capacity: float | None = None
    unknown: int = 0
    screen: Screen | None = None

    @property
    def key(self) -> str:
        return row_key(self.host, self.layer, self.gpu, self.mig, self.pid, self.pod, self.pool)


def row_key(
    host: str,
    layer: str,
    gpu: str | None,
    mig: str | None,
    pid: int | None,
    pod: str | None,
    pool: str | None,
) -> str:
    """`host/layer[/gpu=G][/mig=M][/pid=P][/pod=NS/NAME][/pool=P]`: a row's name in tests and JSON."""
    parts = [host, layer]
    pod = pod if layer == "pod" else None  # elsewhere a pod is a life of the GPU, not the row
    for k, v in (("gpu", gpu), ("mig", mig), ("pid", pid), ("pod", pod), ("pool", pool)):
        if v is not None:
            parts.append(f"{k}={v}")
    return "/".join(parts)


@dataclass(frozen=True)
class Life:
    """One life of a row: floors [i0, i1), when it began and why ("range start", "new
    identity", "counter reset", "emptied")."""

    i0: int
    i1: int
    began_at: float
    began: str


@dataclass
class FleetRow:
    """One row's answer. Sizes in the row's unit; rates per hour; times unix seconds."""

    host: str
    layer: str
    unit: str
    source: str
    gpu: str | None
    mig: str | None
    mig_profile: str | None
    uuid: str | None
    pid: int | None
    process: str | None
    pod: str | None
    instance: str | None
    server: str | None
    pool: str | None
    verdict: str
    reason: str
    why: str
    level: float | None
    growth_per_hour: float | None = None
    growth_per_hour_ci: tuple[float, float] | None = None
    growing_since: float | None = None  # a change point: when growth began (None: all life)
    rise: float | None = None  # CACHING: how much the floor rose in this life
    settled_level: float | None = None  # CACHING: the floor it settled at
    hours_to_oom: float | None = None
    hours_to_oom_ci: tuple[float, float] | None = None
    runs_out: str = "memory"  # "memory" or "pool" (a KV pool full)
    free: float | None = None
    free_note: str | None = None
    restarts: int | None = 0  # None: not counted (a screened GPU row)
    lives: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[tuple[float, float]] = field(default_factory=list)
    unknown_points: int = 0
    stale: bool = False
    last_seen: float | None = None
    points: int = 0
    analysed_from: float | None = None
    analysed_to: float | None = None
    warmup_skipped: bool = False
    screened: bool = False  # judged from the database's screen alone (never pulled)
    screen: dict[str, Any] | None = None
    trend: dict[str, Any] | None = None
    # For charts (not in to_dict): the analysed life's floors.
    t: np.ndarray | None = field(default=None, repr=False)
    v: np.ndarray | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return row_key(self.host, self.layer, self.gpu, self.mig, self.pid, self.pod, self.pool)

    @property
    def live_leak(self) -> bool:
        return self.verdict == LEAK and not self.stale

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.key}
        for k in (
            "host",
            "layer",
            "unit",
            "source",
            "gpu",
            "mig",
            "mig_profile",
            "uuid",
            "pid",
            "process",
            "pod",
            "instance",
            "server",
            "pool",
            "verdict",
            "reason",
            "why",
            "level",
            "growth_per_hour",
            "growing_since",
            "rise",
            "settled_level",
            "hours_to_oom",
            "runs_out",
            "free",
            "free_note",
            "restarts",
            "lives",
            "unknown_points",
            "stale",
            "last_seen",
            "points",
            "analysed_from",
            "analysed_to",
            "warmup_skipped",
            "screened",
            "screen",
            "trend",
        ):
            d[k] = getattr(self, k)
        d["growth_per_hour_ci"] = list(self.growth_per_hour_ci) if self.growth_per_hour_ci else None
        d["hours_to_oom_ci"] = list(self.hours_to_oom_ci) if self.hours_to_oom_ci else None
        d["gaps"] = [list(g) for g in self.gaps]
        clean: dict[str, Any] = _finite(d)
        return clean


def _finite(obj: Any) -> Any:
    """JSON has no NaN/inf: map them to null; numpy scalars and tuples to Python ones."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


@dataclass
class FleetResult:
    """The ranked table (leaks first), what it rests on, and every query made."""

    start: float
    end: float
    step_s: float
    config: FleetConfig
    rows: list[FleetRow]
    notes: list[str] = field(default_factory=list)
    queries: list[dict[str, Any]] = field(default_factory=list)
    source_url: str | None = None
    strategy: str = "screen"
    recorded_rules: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def leaks(self) -> list[FleetRow]:
        """Live LEAK rows (the series still reports), ranked."""
        return [r for r in self.rows if r.live_leak]

    @property
    def stale_leaks(self) -> list[FleetRow]:
        return [r for r in self.rows if r.verdict == LEAK and r.stale]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys((LEAK, INCONCLUSIVE, CACHING, STABLE), 0)
        for r in self.rows:
            out[r.verdict] = out.get(r.verdict, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        doc: dict[str, Any] = _finite(
            {
                "schema": SCHEMA,
                "prometheus": self.source_url,
                "start": self.start,
                "end": self.end,
                "step_s": self.step_s,
                "block_s": c.block_s,
                "warmup_s": c.warmup_s,
                "strategy": self.strategy,
                "recorded_rules": self.recorded_rules,
                "leaks": len(self.leaks),
                "stale_leaks": len(self.stale_leaks),
                "counts": self.counts(),
                "rows": [r.to_dict() for r in self.rows],
                "notes": self.notes,
                "queries": self.queries,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            }
        )
        return doc


# --- lives --------------------------------------------------------------------------------


def _empties(s: FleetSeries) -> bool:
    """Whether an empty floor ends a life: device-level GPU memory with no identity."""
    return s.unit == "MiB" and s.layer in ("device", "pod")


def lives(s: FleetSeries, t: np.ndarray, v: np.ndarray, config: FleetConfig) -> list[Life]:
    """The lives of a row's cleaned floors `t`, `v`: cut at `s.cuts` and, for device memory,
    where the GPU emptied (the empty floors themselves belong to no life)."""
    n = len(t)
    if n == 0:
        return []
    starts: list[tuple[int, str]] = [(0, "range start")]
    for when, why in sorted(s.cuts):
        i = int(np.searchsorted(t, when, side="left"))
        if 0 < i < n:
            starts.append((i, why))
    empty = np.zeros(n, dtype=bool)
    if _empties(s):
        empty = v <= config.empty_mib
        # a new life begins at the first non-empty floor after an empty one
        after = np.flatnonzero(~empty[1:] & empty[:-1]) + 1
        starts += [(int(i), "emptied") for i in after]
    starts.sort()
    out: list[Life] = []
    bounds = [*starts, (n, "")]
    for (i0, why), (i1, _) in itertools.pairwise(bounds):
        j0, j1 = i0, i1
        while j1 > j0 and empty[j1 - 1]:  # the empty floors belong to no life
            j1 -= 1
        while j0 < j1 and empty[j0]:
            j0 += 1
        if j1 > j0:
            out.append(Life(j0, j1, float(t[j0]), why))
    return out


def _gaps(t: np.ndarray, block_s: float) -> list[tuple[float, float]]:
    """Stretches with no floor for more than 3 blocks: (last floor before, first after)."""
    if len(t) < 2:
        return []
    dt = np.diff(t)
    idx = np.flatnonzero(dt > 3 * block_s + 1e-6)
    return [(float(t[i]), float(t[i + 1])) for i in idx]


# --- one row ------------------------------------------------------------------------------


def _base_row(s: FleetSeries) -> dict[str, Any]:
    return {
        "host": s.host,
        "layer": s.layer,
        "unit": s.unit,
        "source": s.source,
        "gpu": s.gpu,
        "mig": s.mig,
        "mig_profile": s.mig_profile,
        "uuid": s.uuid,
        "pid": s.pid,
        "process": s.process,
        "pod": s.pod,
        "instance": s.instance,
        "server": s.server,
        "pool": s.pool,
    }


def _fmt(unit: str, value: float | None, *, signed: bool = False) -> str:
    from vramdoctor.fleet.report import format_value

    return format_value(unit, value, signed=signed)


def _hours(seconds: float) -> str:
    from vramdoctor.units import format_duration

    return format_duration(seconds)


def _impossible(s: FleetSeries, v: np.ndarray) -> np.ndarray:
    bad = ~np.isfinite(v) | (v < 0)
    if s.unit == "ratio":
        bad |= v > 1.0
    if s.unit == "MiB":
        bad |= v > 16 * 1024 * 1024  # 16 TiB: no device or host holds that
    return np.asarray(bad)


def analyse_series(
    s: FleetSeries,
    *,
    range_start: float,
    range_end: float,
    free: float | None,
    config: FleetConfig,
    free_note: str | None = None,
) -> FleetRow:
    """The verdict of one row's current life (after its last restart, past warm-up)."""
    t, v, unknown = _readable_floors(s)
    stale = s.last_seen is not None and s.last_seen < range_end - config.stale_s
    base = _base_row(s)
    common: dict[str, Any] = {
        "unknown_points": unknown,
        "stale": stale,
        "last_seen": s.last_seen,
        "free": free,
        "free_note": free_note,
        "runs_out": "pool" if s.layer == "kv" else "memory",
        "gaps": _gaps(t, config.block_s),
    }
    ls = lives(s, t, v, config)
    common["restarts"] = max(len(ls) - 1, 0)
    common["lives"] = _lives_listed(ls, t)
    level = _level_now(s, v, stale=stale)
    if not ls:
        return FleetRow(
            **base,
            verdict=INCONCLUSIVE,
            reason="no_data",
            why=REASONS["no_data"]
            + (f" ({unknown} impossible readings left out)" if unknown else ""),
            level=level,
            **common,
        )
    life = ls[-1]
    lt, lv, at, av, started_inside = _past_warmup(life, t, v, range_start, config)
    common.update(
        points=len(at),
        analysed_from=float(at[0]) if len(at) else None,
        analysed_to=float(at[-1]) if len(at) else None,
        warmup_skipped=bool(started_inside),
        t=lt,
        v=lv,
    )
    from_life_before = len(at) < config.min_points
    if from_life_before:
        reason, why = _too_few(life, len(at), started_inside, range_end, config)
        before = _life_before(ls, t, v, s.unit, range_start, config)
        if before is None:
            return FleetRow(
                **base, verdict=INCONCLUSIVE, reason=reason, why=why, level=level, **common
            )
        # a restart hides a leak, it does not fix it: the last whole life decides until the
        # new one can (a weekly restart of a GPU leaking since mid-month read "warming up")
        judged, b_at = before
        rate = judged.get("growth_per_hour")
        grew = f" by {_fmt(s.unit, rate, signed=True)} per hour" if rate is not None else ""
        judged["reason"] = "grew_last_life"
        judged["why"] = (
            f"{REASONS['grew_last_life']}: it grew steadily{grew} for "
            f"{_hours(float(b_at[-1] - b_at[0]))} until the restart; the current one: {why}"
        )
        common.update(points=len(b_at), analysed_from=float(b_at[0]), analysed_to=float(b_at[-1]))
    else:
        judged = _judge(at, av, s.unit, config)
        if started_inside and judged.get("rise") is not None:
            judged["why"] = judged["why"].replace("rose by", "after its warm-up, rose by", 1)
    row = FleetRow(**base, level=level, **judged, **common)
    if row.verdict == LEAK and row.growth_per_hour and row.growth_per_hour > 0 and not stale:
        _time_to_oom(row, s, free)
        if from_life_before and row.hours_to_oom is not None:
            row.why += "; the time to OOM assumes this life grows as the last one did"
    if stale:
        _say_stale(row, s, range_end)
    return row


def _readable_floors(s: FleetSeries) -> tuple[np.ndarray, np.ndarray, int]:
    """Returns a row's floors with the gaps (NaN times) and impossible readings left out, and
    how many readings are unknown (the impossible ones and those the series counted)."""
    ok = np.isfinite(s.t)
    t_all, v_all = s.t[ok], s.v[ok]
    bad = _impossible(s, v_all)
    t, v = t_all[~bad], v_all[~bad]
    unknown = int(bad.sum()) + s.unknown
    return t, v, unknown


def _lives_listed(ls: list[Life], t: np.ndarray) -> list[dict[str, Any]]:
    """Returns each life as the row lists it: when and why it began, when it ended, its
    floors."""
    return [
        {
            "began_at": x.began_at,
            "began": x.began,
            "ended_at": float(t[x.i1 - 1]),
            "points": x.i1 - x.i0,
        }
        for x in ls
    ]


def _level_now(s: FleetSeries, v: np.ndarray, *, stale: bool) -> float | None:
    """Returns the row's level now: the database's reading when there is a possible one and the
    series still reports, else the last floor (None: no floor)."""
    level = s.level if s.level is not None and not stale else (float(v[-1]) if len(v) else None)
    if s.level is not None and (
        not math.isfinite(s.level) or s.level < 0 or (s.unit == "ratio" and s.level > 1)
    ):
        level = float(v[-1]) if len(v) else None
    return level


def _past_warmup(
    life: Life, t: np.ndarray, v: np.ndarray, range_start: float, config: FleetConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """Returns the current life's floors (t, v), those analysed (past its warm-up when it began
    inside the range) and whether it began inside the range."""
    lt, lv = t[life.i0 : life.i1], v[life.i0 : life.i1]
    started_inside = life.began != "range start" or lt[0] > range_start + 3 * config.block_s
    if started_inside:
        keep = lt >= life.began_at + config.warmup_s
        at, av = lt[keep], lv[keep]
    else:
        at, av = lt, lv
    return lt, lv, at, av, bool(started_inside)


def _life_before(
    ls: list[Life],
    t: np.ndarray,
    v: np.ndarray,
    unit: str,
    range_start: float,
    config: FleetConfig,
) -> tuple[dict[str, Any], np.ndarray] | None:
    """The judgement of the life before the current one, and the times (unix s) of the floors it
    rests on, when that life is long enough to judge and was a LEAK; None otherwise (also with
    one life)."""
    if len(ls) < 2:
        return None
    _lt, _lv, at, av, _inside = _past_warmup(ls[-2], t, v, range_start, config)
    if len(at) < config.min_points:
        return None
    judged = _judge(at, av, unit, config)
    if judged["verdict"] != LEAK:
        return None
    return judged, at


def _too_few(
    life: Life, points: int, started_inside: bool, range_end: float, config: FleetConfig
) -> tuple[str, str]:
    """Returns (reason, why) of a life with too few floors to judge: still warming up after a
    start near the end, or too few floors."""
    if (
        started_inside
        and range_end - life.began_at < config.warmup_s + config.min_points * config.block_s
    ):
        age = _hours(range_end - life.began_at)
        why = (
            f"{REASONS['warming_up']}: its life began {age} before the end ({life.began}); "
            f"the first {_hours(config.warmup_s)} are left out and the test needs "
            f"{config.min_points} hourly floors after them"
        )
        return "warming_up", why
    why = (
        f"{REASONS['too_few_points']}: {points} floors of {_hours(config.block_s)} "
        f"(the test needs {config.min_points})"
    )
    return "too_few_points", why


def _say_stale(row: FleetRow, s: FleetSeries, range_end: float) -> None:
    """Says in `row` that its series stopped reporting (why, and no time to OOM); returns
    nothing."""
    ago = _hours(range_end - (s.last_seen or range_end))
    row.why = (
        f"stopped reporting {ago} before the end (the process or its exporter is gone); {row.why}"
    )
    row.free_note = "time to OOM unknown: the series stopped reporting"


def _time_to_oom(row: FleetRow, s: FleetSeries, free: float | None) -> None:
    rate = row.growth_per_hour
    assert rate is not None
    if s.layer == "kv":
        if s.capacity is None or row.level is None:
            row.free_note = "pool size not exported: time until the pool is full unknown"
            return
        free = s.capacity - row.level
        row.free = free
    if free is None:
        row.free_note = row.free_note or "free memory not exported: time to OOM unknown"
        return
    if not math.isfinite(free) or free < 0:
        row.free_note = (
            f"free memory reading impossible ({_fmt(s.unit, free)}): time to OOM unknown"
        )
        row.free = None
        return
    row.hours_to_oom = free / rate
    ci = row.growth_per_hour_ci
    if ci and ci[0] > 0:
        row.hours_to_oom_ci = (free / ci[1], free / ci[0])


def _coarsen(t: np.ndarray, v: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `most` floors: the least of each k consecutive ones, at the last one's time."""
    n = len(t)
    if n <= most:
        return t, v
    k = math.ceil(n / most)
    cut = n - (n // k) * k  # the oldest floors that do not fill a group are left out
    tt, vv = t[cut:].reshape(-1, k), v[cut:].reshape(-1, k)
    return tt[:, -1], vv.min(axis=1)


def _judge(t: np.ndarray, v: np.ndarray, unit: str, config: FleetConfig) -> dict[str, Any]:
    """Verdict, reason, why and rates for one life's analysed floors (t sorted)."""
    floor_growth = config.min_growth(unit)
    # floors only err upwards (a busy block): the top 5 % are left out, never the low ones
    top = float(np.quantile(v, 0.95)) if len(v) >= 20 else float(np.max(v))
    spread = top - float(np.min(v))
    if spread < floor_growth / 2 and float(np.ptp(v[-max(4, len(v) // 10) :])) < floor_growth / 2:
        # nothing moved (but a busy hour or two): no statistics needed
        return {
            "verdict": STABLE,
            "reason": "flat",
            "why": f"{REASONS['flat']}: its floor stayed within {_fmt(unit, spread)}",
            "trend": None,
            "growth_per_hour": 0.0,
        }
    t, v = _coarsen(t, v, config.max_points)
    steps = _steps(t, v, floor_growth)
    if steps is None:
        return _judge_shape(t, v, unit, config)
    # a cache stepping up: judge what is left when the steps are taken out
    heights, at = steps
    jumps = np.zeros(len(v))
    jumps[at + 1] = heights
    inner = _judge_shape(t, v - np.cumsum(jumps), unit, config)
    total = float(heights.sum())
    said = f"{len(heights)} step{'s' if len(heights) > 1 else ''} of {_fmt(unit, total, signed=True)} in all"
    if inner["verdict"] == LEAK:
        inner["why"] += f" (besides {said}: a cache stepping up)"
        return inner
    q = max(len(v) // 4, 2)
    settled = float(np.median(v[-q:]))
    return {
        **inner,
        "verdict": CACHING,
        "reason": "stepped",
        "why": (
            f"rose in {said}, then levelled off at {_fmt(unit, settled)} (a cache stepping up); "
            f"between the steps: {inner['why']}"
        ),
        "rise": total,
        "settled_level": settled,
        "growth_per_hour": inner.get("growth_per_hour"),
        "growth_per_hour_ci": None,
        "growing_since": None,
    }


MAX_STEPS = 4
"""More jumps than this in a life is its way of growing, not a cache stepping up."""


def _steps(
    t: np.ndarray, v: np.ndarray, floor_growth: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """The upward steps of a life's floors, (heights, index before each step), when its growth
    is a few steps (1 to `MAX_STEPS`) and it never steps down; None otherwise.

    A step is a rise between two floors (after a rolling median of three, so one busy block is
    no step) beyond the typical rise by more than twice the floor of growth, 8 x the robust
    spread of the rises and twice the typical rise itself: a cache
    allocates a segment and keeps it. A leak grows every block (its rises are its median) and a
    cache that gives memory back steps down too: neither is stepping. Rises are per block, so
    growth across a gap (no floors for hours) is no step."""
    n = len(v)
    if n < 8:
        return None
    m = v.astype(float).copy()
    m[1:-1] = np.median(np.stack([v[:-2], v[1:-1], v[2:]]), axis=0)
    dt = np.diff(t)
    block = float(np.median(dt))
    d = np.diff(m) / np.maximum(dt / block, 1.0)
    typical = float(np.median(d))
    centred = d - typical
    scale = 1.4826 * float(np.median(np.abs(centred)))
    thr = max(2.0 * floor_growth, 8.0 * scale, 2.0 * abs(typical))
    # a rise next to a gap is no step: the first floor after an outage rests on few samples
    regular = dt <= 1.5 * block
    near = regular.copy()
    near[1:] &= regular[:-1]
    near[:-1] &= regular[1:]
    up = np.flatnonzero((centred > thr) & near)
    if len(up) == 0 or len(up) > MAX_STEPS or ((centred < -thr) & near).any():
        return None
    return centred[up], up


def _judge_shape(t: np.ndarray, v: np.ndarray, unit: str, config: FleetConfig) -> dict[str, Any]:
    """The trend and change-point verdict of floors that hold no steps."""
    from vramdoctor.stats.changepoint import fit_hinge
    from vramdoctor.stats.trend import classify

    th = config.thresholds(unit)
    pts = list(zip(t.tolist(), v.tolist(), strict=True))
    base = classify(pts, x_unit="s", thresholds=th)
    hinge = fit_hinge(t, v, min_side=max(4, config.min_points // 2), bic_margin=config.bic_margin)
    out: dict[str, Any] = {"trend": base.to_dict()}
    change = hinge is not None and hinge.chosen and hinge.accelerated and hinge.after > 0
    if change:
        assert hinge is not None
        since_change = _leak_since_change(t, v, unit, config, th, base, hinge, out)
        if since_change is not None:
            return since_change
    if base.verdict == LEAK:
        return _leak_over_life(t, v, unit, base, out)
    return _no_leak(v, unit, config, base, out)


def _leak_verdict(
    out: dict[str, Any], unit: str, slope: Slope, since: float | None, reason: str, why: str
) -> dict[str, Any]:
    """Returns `out` with a LEAK verdict at the rate of `slope` (per hour, with its interval),
    or INCONCLUSIVE when the rate's 95 % interval includes zero."""
    per_h = slope.slope * 3600.0
    ci = (slope.lo * 3600.0, slope.hi * 3600.0)
    if not ci[0] > 0:
        return {
            **out,
            "verdict": INCONCLUSIVE,
            "reason": "interval_includes_zero",
            "why": (
                f"{REASONS['interval_includes_zero']}: {_fmt(unit, per_h, signed=True)}/h, "
                f"95 % interval {_fmt(unit, ci[0], signed=True)} to {_fmt(unit, ci[1], signed=True)}"
            ),
            "growth_per_hour": per_h,
            "growth_per_hour_ci": ci,
        }
    return {
        **out,
        "verdict": LEAK,
        "reason": reason,
        "why": why,
        "growth_per_hour": per_h,
        "growth_per_hour_ci": ci,
        "growing_since": since,
    }


def _leak_since_change(
    t: np.ndarray,
    v: np.ndarray,
    unit: str,
    config: FleetConfig,
    th: TrendThresholds,
    base: Trend,
    hinge: Hinge,
    out: dict[str, Any],
) -> dict[str, Any] | None:
    """Returns the leak verdict of the floors after a change point (the rate from after it,
    growing since it), or None when they are too few or the trend test calls them no leak."""
    from vramdoctor.stats.changepoint import growth_since
    from vramdoctor.stats.trend import classify

    margin = config.block_s  # one block after the fitted change: no flat floor in the rate
    after = t >= hinge.tau + margin
    if not after.sum() >= config.min_points:
        return None
    post = classify(
        list(zip(t[after].tolist(), v[after].tolist(), strict=True)),
        x_unit="s",
        thresholds=th,
    )
    if post.verdict != LEAK:
        return None
    slope = growth_since(t, v, hinge.tau + margin)
    out["trend"] = {**base.to_dict(), "after_change": post.to_dict()}
    from time import gmtime, strftime

    when = strftime("%Y-%m-%d %H:%M UTC", gmtime(hinge.tau))
    return _leak_verdict(
        out,
        unit,
        slope,
        hinge.tau,
        "grew_since_change",
        f"flat, then growing from {when} to the last point (a change point; the rate "
        f"is from after it)",
    )


def _leak_over_life(
    t: np.ndarray, v: np.ndarray, unit: str, base: Trend, out: dict[str, Any]
) -> dict[str, Any]:
    """Returns the leak verdict of floors the trend test calls a leak and no change point
    explains: the whole life's rate when it grew steadily, else the late half's."""
    from vramdoctor.stats.changepoint import Slope, growth_since

    slope = growth_since(t, v, float(t[0]))
    if slope.lo > 0:  # steady over the whole life
        return _leak_verdict(out, unit, slope, None, "grew_with_time", REASONS["grew_with_time"])
    # the trend test saw growth only in the late half, and no change point stands out
    lo, hi = base.slope_ci or (0.0, 0.0)
    late = Slope(base.slope or 0.0, lo, hi, base.n, float(t[0]), float(t[-1]))
    half = float(t[0] + (t[-1] - t[0]) / 2)
    return _leak_verdict(out, unit, late, half, "grew_late", REASONS["grew_late"])


def _rose_then_flat(
    out: dict[str, Any], unit: str, rise: float, settled: float, base: Trend
) -> dict[str, Any]:
    """Returns `out` with a CACHING verdict: the floor rose by `rise`, then levelled off at its
    settled level."""
    return {
        **out,
        "verdict": CACHING,
        "reason": "rose_then_flat",
        "why": (
            f"rose by {_fmt(unit, rise, signed=True)}, then levelled off at "
            f"{_fmt(unit, settled)} (an allocator or a cache filling up)"
        ),
        "rise": rise,
        "settled_level": settled,
        "growth_per_hour": (base.late_slope or 0.0) * 3600.0,
    }


def _no_leak(
    v: np.ndarray, unit: str, config: FleetConfig, base: Trend, out: dict[str, Any]
) -> dict[str, Any]:
    """Returns the verdict of floors that show no leak: CACHING when they rose and levelled
    off (from the start, or early in the range), STABLE, or INCONCLUSIVE."""
    floor_growth = config.min_growth(unit)
    q = max(len(v) // 4, 2)
    start_level, settled = float(np.median(v[:q])), float(np.median(v[-q:]))
    if base.verdict == CACHING and settled - start_level > floor_growth:
        return _rose_then_flat(out, unit, settled - start_level, settled, base)
    # a rise that came early and stayed (a cache that filled in the first hours of the range)
    early = float(np.min(v[: max(1, (3 * len(v)) // 4)]))
    if base.verdict in (STABLE, CACHING) and settled - early > floor_growth:
        return _rose_then_flat(out, unit, settled - early, settled, base)
    if base.verdict == STABLE:
        return {
            **out,
            "verdict": STABLE,
            "reason": "flat",
            "why": REASONS["flat"],
            "growth_per_hour": (base.slope or 0.0) * 3600.0,
        }
    reason = "too_few_points" if base.reason.startswith("only") else "still_changing"
    return {
        **out,
        "verdict": INCONCLUSIVE,
        "reason": reason,
        "why": f"{REASONS[reason]} ({base.reason})",
        "growth_per_hour": (base.slope or 0.0) * 3600.0 if base.slope is not None else None,
    }


def screened_row(
    s: FleetSeries, *, range_start: float, range_end: float, config: FleetConfig, free: float | None
) -> FleetRow:
    """A STABLE row from the database's screen alone (the series was flat and never pulled)."""
    sc = s.screen
    assert sc is not None
    late = (
        sc.late_slope * 3600.0
        if sc.late_slope is not None and math.isfinite(sc.late_slope)
        else None
    )
    if s.layer == "kv":
        held = "0 % of the pool" if s.unit == "ratio" else "0 tokens"
        why = (
            f"{held} held at every idle moment over {_hours(range_end - range_start)} (the "
            "database's figure)"
        )
        reason = "kv_zero_at_idle"
        late = 0.0
    else:
        sd = sc.sd if sc.sd is not None else 0.0
        why = (
            f"its {_hours(3 * config.block_s)} floor moved by {_fmt(s.unit, sd)} (standard "
            f"deviation) over {_hours(range_end - range_start)}: flat (the database's figures)"
        )
        reason = "screened_flat"
    return FleetRow(
        **_base_row(s),
        verdict=STABLE,
        reason=reason,
        why=why,
        level=sc.level,
        growth_per_hour=late,
        free=free,
        runs_out="pool" if s.layer == "kv" else "memory",
        # a device row's empty floors were left out of the screen: its restarts are not known;
        # a process row was there at the start and is now, one pid: none; KV: counter resets
        restarts=None if s.layer in ("device", "pod") else sc.restarts,
        screened=True,
        screen={"sd": sc.sd, "late_slope_per_hour": late, "late_window_s": sc.late_s},
        last_seen=s.last_seen,
        analysed_from=range_start,
        analysed_to=range_end,
    )


def rank_key(r: FleetRow) -> tuple[float, float, float, str]:
    """Live leaks first (soonest OOM, then fastest), then stale leaks, INCONCLUSIVE, CACHING,
    STABLE; ties by key."""
    rank = _RANK.get(r.verdict, 0) + (0.5 if r.live_leak else 0.0)
    return (
        -rank,
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
    free: dict[tuple[str, str, str], float] | None = None,
    free_notes: dict[tuple[str, str, str], str] | None = None,
    config: FleetConfig | None = None,
    rows: list[FleetRow] | None = None,
) -> FleetResult:
    """Every series' row, ranked. `free`: (host, gpu, mig) -> free MiB now (and (host, "",
    "") -> host memory available, for host-RAM rows); series with a `screen` and no floors
    get `screened_row`. `rows`: rows made elsewhere (never-idle servers), ranked with them."""
    config = config or FleetConfig()
    free = free or {}
    free_notes = free_notes or {}
    out = list(rows or [])
    for s in series:
        key = free_key(s)
        f = free.get(key) if key else None
        note = free_notes.get(key) if key else None
        if len(s.t) == 0 and s.screen is not None:
            out.append(screened_row(s, range_start=start, range_end=end, config=config, free=f))
        else:
            out.append(
                analyse_series(
                    s, range_start=start, range_end=end, free=f, config=config, free_note=note
                )
            )
    out.sort(key=rank_key)
    return FleetResult(start=start, end=end, step_s=step_s, config=config, rows=out)


def free_key(s: FleetSeries) -> tuple[str, str, str] | None:
    """Which free-memory reading a row's time to OOM uses: its GPU's (or slice's), or for a
    host-RAM row its host's; None for KV rows (their pool size is their own)."""
    if s.layer == "kv":
        return None
    if s.layer.startswith("rss"):
        return (s.host, "", "")
    if s.gpu is None:
        return None
    return (s.host, s.gpu, s.mig or "")
