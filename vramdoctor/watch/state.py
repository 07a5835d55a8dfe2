"""The rolling analysis of `watch`: samples in, bounded state, a verdict per process and layer. Pure.

`WatchState.ingest(record)` takes the records the sources produce (`GpuSample`,
`MetricsSample`, `HostSample`, and {"kind": "host_memory"} dicts) and keeps, per series, a
ring of downsampled buckets (`series.BucketSeries`). `analyse(wall)` turns the window into
`WatchResult`. Nothing here reads a clock or the outside world, so a recorded run replays to
the same result (`replay`).

How a verdict stays honest on production traffic (not identical rounds): only buckets where
the server did comparable work are compared (`comparable points`):

1. With the server's /metrics (in-flight = running + queued requests, and its request
   counter): the buckets whose mean in-flight count is at or below the window's 25th
   percentile (the quietest quarter; on a server that idles at times these are the idle
   moments, 0 in flight), each bucket's *minimum* level against the served requests so far.
   A leak grows per served request; caching levels off. Growth per hour = growth per
   request x the request rate the server actually served over the window.
2. With a request counter but too few quiet buckets: every bucket's minimum against served
   requests (mode "per-request").
3. Without server metrics: each bucket's minimum against time (mode "time"); the verdict
   then says growth per hour only, and the report says no request counter was read.

Warm-up is left out: buckets within `warmup_s` of a process's start (its create time when
known, else when watch first saw it appear) are not compared. A process that exits or is
replaced starts a new series (its pid), so a restart that drops memory is never a trend.
KV pools are preallocated: the KV layer is the server's used tokens, taken only at idle
moments (0 running, 0 queued), where a healthy server holds 0.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from vramdoctor.census.analysis import census
from vramdoctor.judge.results import finite
from vramdoctor.samples import (
    PROCESS_APPEARED,
    PROCESS_EXITED,
    SERVER_REPLACED,
    Event,
    GpuSample,
    HostSample,
    MetricsSample,
)
from vramdoctor.stats.trend import (
    CACHING,
    INCONCLUSIVE,
    LEAK,
    VERDICT_RANK,
    Trend,
    TrendThresholds,
    classify,
)
from vramdoctor.watch.series import Bucket, BucketSeries

__all__ = [
    "LAYERS",
    "SCHEMA",
    "SeriesKey",
    "SeriesVerdict",
    "WatchConfig",
    "WatchResult",
    "WatchState",
    "replay",
    "requests_served",
]

SCHEMA = "vramdoctor.watch/1"

# Layer name -> (unit, HostProcessMemory field or None). VRAM is per process per GPU.
LAYERS: dict[str, str] = {
    "vram": "MiB",  # NVML per process (context + allocator reserve + the rest)
    "device": "MiB",  # a GPU's used memory (exporters without processes)
    "rss": "MiB",
    "rss_anon": "MiB",  # heap: Python objects, malloc arenas
    "rss_file": "MiB",
    "rss_shmem": "MiB",  # shared memory, CUDA pinned host memory
    "kv": "tokens",  # KV pool used tokens at idle moments
}
_HOST_FIELDS = {
    "rss": "rss_mib",
    "rss_anon": "rss_anon_mib",
    "rss_file": "rss_file_mib",
    "rss_shmem": "rss_shmem_mib",
}

# Request counters of the servers (finished requests), summed over label sets.
_REQUEST_COUNTERS = ("sglang:num_requests_total", "vllm:request_success_total")


@dataclass(frozen=True)
class WatchConfig:
    """Window and thresholds. Window = bucket_s x max_buckets (default 6 hours of 1-minute buckets)."""

    bucket_s: float = 60.0
    max_buckets: int = 360
    warmup_s: float = 1800.0
    quiet_quantile: float = 0.25
    restart_window_s: float = 900.0
    max_series: int = 2048
    max_events: int = 200
    memory: TrendThresholds = field(default_factory=TrendThresholds)
    kv: TrendThresholds = field(default_factory=lambda: TrendThresholds(min_growth=32.0))

    @property
    def window_s(self) -> float:
        return self.bucket_s * self.max_buckets


@dataclass(frozen=True)
class SeriesKey:
    layer: str
    pid: int | None = None
    gpu: int | None = None
    pool: str | None = None

    def label(self) -> str:
        parts = [self.layer]
        if self.gpu is not None:
            parts.append(f"gpu{self.gpu}")
        if self.pid is not None:
            parts.append(f"pid{self.pid}")
        if self.pool is not None:
            parts.append(self.pool)
        return ":".join(parts)


@dataclass
class _Track:
    series: BucketSeries
    name: str | None
    start_wall: float | None  # process start (None: started before watch, unknown)
    last_wall: float
    host: str | None = None


@dataclass
class SeriesVerdict:
    """The rolling verdict of one series (memory in MiB, KV in tokens)."""

    layer: str
    unit: str
    pid: int | None
    gpu: int | None
    pool: str | None
    process: str | None
    alive: bool
    level: float | None
    verdict: str
    reason: str
    mode: str  # "quiet", "per-request", "time", "idle" (KV)
    points: int
    growth_per_hour: float | None
    growth_per_request: float | None
    growth_per_hour_ci: tuple[float, float] | None
    hours_to_oom: float | None
    free: float | None
    warmup_until: float | None
    floor_level: float | None = None  # the newest bucket's minimum
    trend: Trend | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            k: getattr(self, k)
            for k in (
                "layer",
                "unit",
                "pid",
                "gpu",
                "pool",
                "process",
                "alive",
                "level",
                "verdict",
                "reason",
                "mode",
                "points",
                "growth_per_hour",
                "growth_per_request",
                "hours_to_oom",
                "free",
                "warmup_until",
                "floor_level",
            )
        }
        d["growth_per_hour_ci"] = list(self.growth_per_hour_ci) if self.growth_per_hour_ci else None
        d["trend"] = self.trend.to_dict() if self.trend else None
        return finite(d)


@dataclass
class WatchResult:
    """What `watch` knows at one moment: a verdict per series, events, stray contexts."""

    wall: float
    window_s: float
    verdict: str
    series: list[SeriesVerdict]
    events: list[dict[str, Any]]
    strays: list[dict[str, Any]]
    requests_per_hour: float | None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    kv_idle_used_tokens: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def culprit(self) -> SeriesVerdict | None:
        leaks = [s for s in self.series if s.verdict == LEAK and s.alive]
        if not leaks:
            return None
        return min(
            leaks,
            key=lambda s: (
                s.hours_to_oom if s.hours_to_oom is not None else math.inf,
                -(s.growth_per_hour or 0.0),
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        c = self.culprit
        return finite(
            {
                "schema": SCHEMA,
                "wall": self.wall,
                "window_s": self.window_s,
                "verdict": self.verdict,
                "culprit": c.to_dict() if c else None,
                "requests_per_hour": self.requests_per_hour,
                "series": [s.to_dict() for s in self.series],
                "gpus": self.gpus,
                "kv_idle_used_tokens": self.kv_idle_used_tokens,
                "stray_contexts": self.strays,
                "events": self.events,
                "notes": self.notes,
            }
        )


def requests_served(sample: MetricsSample) -> float | None:
    """The server's cumulative finished requests: `requests_total`, else its counters in `raw`."""
    if sample.requests_total is not None:
        return float(sample.requests_total)
    total, found = 0.0, False
    for key, value in sample.raw.items():
        name = key.split("{", 1)[0]
        if name in _REQUEST_COUNTERS:
            total += value
            found = True
    return total if found else None


def _kv_used(sample: MetricsSample) -> dict[str, float]:
    pools = {k.pool: float(k.used_tokens) for k in sample.kv if k.used_tokens is not None}
    if pools:
        return pools
    used = sample.values.get("used_tokens")
    if used is not None:
        return {"kv": float(used)}
    ratio, total = sample.values.get("kv_usage_ratio"), sample.values.get("max_total_tokens")
    if ratio is not None and total is not None:
        return {"kv": float(ratio) * float(total)}
    return {}


def _kv_total(sample: MetricsSample) -> dict[str, float]:
    out = {k.pool: float(k.total_tokens) for k in sample.kv if k.total_tokens is not None}
    if not out and sample.values.get("max_total_tokens") is not None:
        out["kv"] = float(sample.values["max_total_tokens"])
    return out


class WatchState:
    """Bounded rolling state. Life cycle: ingest(record)* -> analyse(wall) (any time, repeatedly).

    Memory: at most `max_series` series of `max_buckets` buckets, `max_events` events.
    `ingest` returns the life events it derived (process appeared, exited, replaced).
    """

    def __init__(self, config: WatchConfig | None = None) -> None:
        self.config = config or WatchConfig()
        c = self.config
        self._tracks: dict[SeriesKey, _Track] = {}
        self._requests = BucketSeries(c.bucket_s, c.max_buckets)
        self._inflight = BucketSeries(c.bucket_s, c.max_buckets)
        self._req_offset = 0.0  # counter resets (server restarts) folded in, as increase() does
        self._req_last: float | None = None
        self._events: deque[dict[str, Any]] = deque(maxlen=c.max_events)
        self._present: dict[str, set[int]] = {}
        self._names: dict[int, str | None] = {}
        self._gpus_of: dict[int, set[int]] = {}
        self._exited: deque[tuple[float, int, str | None, frozenset[int]]] = deque(maxlen=64)
        self._start_walls: dict[int, float] = {}
        self._first_wall: float | None = None
        self._last_gpu: GpuSample | None = None
        self._gpu_free: dict[int, float] = {}
        self._host_available: float | None = None
        self._kv_total: dict[str, float] = {}
        self._kv_idle_last: dict[str, float] = {}
        self._has_metrics = False
        self._gpu_procs_seen = False
        self.samples = 0

    @property
    def series_count(self) -> int:
        """Series held now (bounded by `max_series`)."""
        return len(self._tracks)

    # -- ingest -----------------------------------------------------------------------------
    def set_start_times(self, starts: dict[int, float]) -> None:
        """Process create times (wall) where the host can read them: warm-up counts from there."""
        self._start_walls.update(starts)

    def ingest(self, record: Any) -> list[Event]:
        """Fold one record into the state. Unknown records are ignored. Returns derived events."""
        if isinstance(record, GpuSample):
            return self._gpu(record)
        if isinstance(record, HostSample):
            return self._host(record)
        if isinstance(record, MetricsSample):
            self._metrics(record)
        elif isinstance(record, dict) and record.get("kind") == "host_memory":
            avail = record.get("available_mib")
            if isinstance(avail, (int, float)):
                self._host_available = float(avail)
        elif isinstance(record, dict) and record.get("kind") == "process_start":
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self._start_walls[int(record["pid"])] = float(record["start_wall"])
        elif isinstance(record, Event) and record.name in (
            PROCESS_APPEARED,
            PROCESS_EXITED,
            SERVER_REPLACED,
        ):
            self._events.append({"wall": record.wall, "name": record.name, **record.data})
        return []

    def _first(self, wall: float) -> None:
        if self._first_wall is None:
            self._first_wall = wall
        self.samples += 1

    def _track(self, key: SeriesKey, wall: float, value: float, name: str | None) -> None:
        tr = self._tracks.get(key)
        if tr is None:
            if len(self._tracks) >= self.config.max_series:
                self._evict()
            start = self._start_walls.get(key.pid) if key.pid is not None else None
            tr = self._tracks[key] = _Track(
                BucketSeries(self.config.bucket_s, self.config.max_buckets), name, start, wall
            )
        tr.series.add(wall, value)
        tr.last_wall = wall
        if name:
            tr.name = name

    def _evict(self) -> None:
        stalest = min(self._tracks, key=lambda k: self._tracks[k].last_wall)
        del self._tracks[stalest]

    def _lifecycle(
        self, source: str, wall: float, pids: dict[int, tuple[str | None, set[int]]]
    ) -> list[Event]:
        """Appeared / exited / replaced events from the pids a source reports now."""
        before = set().union(*self._present.values()) if self._present else set()
        first_of_source = source not in self._present
        self._present[source] = set(pids)
        for pid, (name, gpus) in pids.items():
            if name:
                self._names[pid] = name
            self._gpus_of.setdefault(pid, set()).update(gpus)
        after = set().union(*self._present.values())
        out: list[Event] = []
        for pid in sorted(before - after):
            name = self._names.get(pid)
            old = frozenset(self._gpus_of.get(pid, set()))
            self._exited.append((wall, pid, name, old))
            out.append(
                Event(
                    t=wall,
                    wall=wall,
                    name=PROCESS_EXITED,
                    data={"pid": pid, "name": name, "gpus": sorted(old)},
                )
            )
        for pid in sorted(after - before):
            if first_of_source:
                continue  # present when this source was first read: not an appearance
            name = self._names.get(pid)
            now_gpus = frozenset(self._gpus_of.get(pid, set()))
            self._start_walls.setdefault(pid, wall)
            for tr_key, tr in self._tracks.items():
                if tr_key.pid == pid and tr.start_wall is None:
                    tr.start_wall = self._start_walls[pid]
            out.append(
                Event(
                    t=wall,
                    wall=wall,
                    name=PROCESS_APPEARED,
                    data={"pid": pid, "name": name, "gpus": sorted(now_gpus)},
                )
            )
            for ex_wall, old_pid, old_name, old_gpus in reversed(self._exited):
                if (
                    wall - ex_wall <= self.config.restart_window_s
                    and old_name == name
                    and (not now_gpus or not old_gpus or now_gpus == old_gpus)
                ):
                    out.append(
                        Event(
                            t=wall,
                            wall=wall,
                            name=SERVER_REPLACED,
                            data={
                                "old_pid": old_pid,
                                "new_pid": pid,
                                "name": name,
                                "down_s": round(wall - ex_wall, 3),
                            },
                        )
                    )
                    break
        for ev in out:
            self._events.append({"wall": ev.wall, "name": ev.name, **ev.data})
        return out

    def _gpu(self, s: GpuSample) -> list[Event]:
        self._first(s.wall)
        self._last_gpu = s
        self._gpu_procs_seen = self._gpu_procs_seen or bool(s.processes)
        for g in s.gpus:
            self._gpu_free[g.index] = g.free_mib
            if not self._gpu_procs_seen:  # a device-level source (dcgm-exporter): no process rows
                self._track(SeriesKey("device", gpu=g.index), s.wall, g.used_mib, g.name)
        pids: dict[int, tuple[str | None, set[int]]] = {}
        for p in s.processes:
            entry = pids.setdefault(p.pid, (p.name, set()))
            entry[1].add(p.gpu)
        events = self._lifecycle("gpu", s.wall, pids)
        for p in s.processes:
            if p.used_mib is not None:
                self._track(SeriesKey("vram", pid=p.pid, gpu=p.gpu), s.wall, p.used_mib, p.name)
        return events

    def _host(self, s: HostSample) -> list[Event]:
        self._first(s.wall)
        events = self._lifecycle("host", s.wall, {p.pid: (p.name, set()) for p in s.processes})
        for p in s.processes:
            for layer, attr in _HOST_FIELDS.items():
                value = getattr(p, attr, None)
                if value is not None:
                    self._track(SeriesKey(layer, pid=p.pid), s.wall, float(value), p.name)
        return events

    def _metrics(self, s: MetricsSample) -> None:
        self._first(s.wall)
        self._has_metrics = True
        served = requests_served(s)
        if served is not None:
            if self._req_last is not None and served < self._req_last:
                self._req_offset += self._req_last  # counter reset: the server restarted
            self._req_last = served
            self._requests.add(s.wall, served + self._req_offset)
        running = s.values.get("running_requests")
        queued = s.values.get("queued_requests")
        inflight = (
            None if running is None and queued is None else (running or 0.0) + (queued or 0.0)
        )
        if inflight is not None:
            self._inflight.add(s.wall, inflight)
        self._kv_total.update(_kv_total(s))
        if inflight == 0:
            for pool, used in _kv_used(s).items():
                self._kv_idle_last[pool] = used
                self._track(SeriesKey("kv", pool=pool), s.wall, used, None)

    # -- analysis ---------------------------------------------------------------------------
    def _window_start(self, wall: float) -> int:
        return math.floor(wall / self.config.bucket_s) - self.config.max_buckets + 1

    def _prune(self, wall: float) -> None:
        start = self._window_start(wall)
        self._requests.drop_before(start)
        self._inflight.drop_before(start)
        for key in list(self._tracks):
            tr = self._tracks[key]
            tr.series.drop_before(start)
            if not len(tr.series):
                del self._tracks[key]
        # per-PID bookkeeping only for PIDs still alive or still in a series: PIDs churn for weeks
        keep = set().union(*self._present.values()) if self._present else set()
        keep |= {k.pid for k in self._tracks if k.pid is not None}
        keep |= {pid for _, pid, _, _ in self._exited}
        for table in (self._names, self._gpus_of, self._start_walls):
            for pid in [p for p in table if p not in keep]:
                del table[pid]

    def _requests_at(self) -> dict[int, float]:
        return {b.key: b.vlast for b in self._requests}

    def _quiet_keys(self) -> set[int] | None:
        means = [(b.key, b.mean) for b in self._inflight]
        if not means:
            return None
        cut = float(np.quantile([m for _, m in means], self.config.quiet_quantile))
        return {k for k, m in means if m <= cut}

    def requests_per_hour(self) -> float | None:
        first, last = self._requests.first, self._requests.last
        if first is None or last is None or last.key == first.key:
            return None
        hours = (last.key - first.key) * self.config.bucket_s / 3600.0
        return (last.vlast - first.vlast) / hours

    def analyse(self, wall: float) -> WatchResult:
        """The verdicts over the window ending at `wall`. Pure over the state; prunes old buckets."""
        c = self.config
        self._prune(wall)
        req_at = self._requests_at()
        quiet = self._quiet_keys()
        rph = self.requests_per_hour()
        alive = set().union(*self._present.values()) if self._present else set()
        out: list[SeriesVerdict] = []
        for key, tr in self._tracks.items():
            out.append(self._one(key, tr, req_at, quiet, rph, key.pid is None or key.pid in alive))
        out.sort(
            key=lambda s: (
                -VERDICT_RANK[s.verdict],
                s.hours_to_oom if s.hours_to_oom is not None else math.inf,
                -(s.growth_per_hour or 0.0),
                s.layer,
                s.gpu or -1,
                s.pid or -1,
            )
        )
        worst = max(
            (s.verdict for s in out if s.alive), key=lambda v: VERDICT_RANK[v], default=INCONCLUSIVE
        )
        if out and all(s.verdict == INCONCLUSIVE for s in out):
            worst = INCONCLUSIVE
        notes: list[str] = []
        if not self._has_metrics:
            notes.append(
                "no server /metrics read: growth is compared over time only (no request "
                "counter, no idle moments); pass --server URL for growth per served request"
            )
        elif not req_at:
            notes.append(
                "the server exports no request counter (sglang:num_requests_total, "
                "vllm:request_success_total): growth is per hour at quiet moments"
            )
        strays = self._strays()
        gpus = []
        if self._last_gpu is not None:
            gpus = [
                {
                    "index": g.index,
                    "name": g.name,
                    "host": g.host,
                    "total_mib": g.total_mib,
                    "used_mib": g.used_mib,
                    "free_mib": g.free_mib,
                }
                for g in self._last_gpu.gpus
            ]
        return WatchResult(
            wall=wall,
            window_s=c.window_s,
            verdict=worst,
            series=out,
            events=list(self._events),
            strays=strays,
            requests_per_hour=rph,
            gpus=gpus,
            kv_idle_used_tokens=dict(self._kv_idle_last),
            notes=notes,
        )

    def _one(
        self,
        key: SeriesKey,
        tr: _Track,
        req_at: dict[int, float],
        quiet: set[int] | None,
        rph: float | None,
        alive: bool,
    ) -> SeriesVerdict:
        c = self.config
        th = c.kv if key.layer == "kv" else c.memory
        warm_until = tr.start_wall + c.warmup_s if tr.start_wall is not None else None
        buckets = [b for b in tr.series if warm_until is None or b.key * c.bucket_s >= warm_until]
        # x = served requests at the bucket (the counter's last value there, else the latest before)
        xs: list[tuple[int, float, float]] = []  # (key, requests, level)
        if req_at:
            keys = sorted(req_at)
            j, last_req = 0, None
            for b in buckets:
                while j < len(keys) and keys[j] <= b.key:
                    last_req = req_at[keys[j]]
                    j += 1
                if last_req is not None:
                    xs.append((b.key, last_req, b.vmin))
        mode = "time"
        points: list[tuple[float, float]]
        if key.layer == "kv":
            mode = "idle"
            points = (
                [(r, y) for _, r, y in xs]
                if len(xs) >= th.min_points
                else [(b.key * c.bucket_s, b.vmin) for b in buckets]
            )
            x_unit = "request" if len(xs) >= th.min_points else "s"
        elif xs:
            per_inflight = self._per_inflight(buckets)
            if per_inflight is not None:  # memory follows the requests in flight: take that out
                low = {b.key: b.vmin for b in self._inflight}
                xs = [(k, r, y - per_inflight * low[k]) for k, r, y in xs if k in low]
            q = [(r, y) for k, r, y in xs if quiet is not None and k in quiet]
            if len(q) >= th.min_points:
                mode, points = "quiet", q
            else:
                mode, points = "per-request", [(r, y) for _, r, y in xs]
            if per_inflight is not None:
                mode += ", load-adjusted"
            x_unit = "request"
        else:
            points = [(b.key * c.bucket_s, b.vmin) for b in buckets]
            x_unit = "s"
        trend = classify(points, x_unit=x_unit, thresholds=th)
        if x_unit == "s" and key.layer != "kv" and trend.verdict == CACHING:
            # Against time alone a level that stopped rising may only mean the traffic stopped:
            # a leak that grows per request looks the same. Caching needs the request counter.
            trend = replace(
                trend,
                verdict=INCONCLUSIVE,
                reason=(
                    trend.reason + ", but without the server's request counter a leak that stopped "
                    "with the traffic looks the same"
                ),
            )
        per_req = per_hour = None
        ci = None
        if trend.slope is not None:
            if x_unit == "request":
                per_req = trend.slope
                if rph is not None:
                    per_hour = trend.slope * rph
                    if trend.slope_ci:
                        ci = (trend.slope_ci[0] * rph, trend.slope_ci[1] * rph)
            else:
                per_hour = trend.slope * 3600.0
                if trend.slope_ci:
                    ci = (trend.slope_ci[0] * 3600.0, trend.slope_ci[1] * 3600.0)
        free = self._free(key)
        hours = None
        if trend.verdict == LEAK and per_hour and per_hour > 0 and free is not None:
            hours = max(free, 0.0) / per_hour
        last = tr.series.last
        return SeriesVerdict(
            layer=key.layer,
            unit=LAYERS[key.layer],
            pid=key.pid,
            gpu=key.gpu,
            pool=key.pool,
            process=tr.name,
            alive=alive,
            level=last.vlast if last else None,
            verdict=trend.verdict,
            reason=trend.reason + ("" if alive else " (process exited)"),
            mode=mode,
            points=trend.n,
            growth_per_hour=per_hour,
            growth_per_request=per_req,
            growth_per_hour_ci=ci,
            hours_to_oom=hours if alive else None,
            free=free,
            warmup_until=warm_until,
            floor_level=last.vmin if last else None,
            trend=trend,
        )

    def _per_inflight(self, buckets: list[Bucket]) -> float | None:
        """MiB per request in flight, when a series' level follows the in-flight count.

        Measured inside each bucket (a minute: no leak moves a level that fast): the rise from a
        bucket's minimum to its maximum against the rise of its in-flight count. Only when the
        two go together (Kendall tau > 0, p < 0.01 over at least 20 buckets) is it used, to
        subtract the activations of the requests still in flight at a bucket's quietest moment.
        A caching allocator's level (NVML under PyTorch) does not follow the load: then None.
        """
        infl = {b.key: b for b in self._inflight}
        d_mem, d_req = [], []
        for b in buckets:
            ib = infl.get(b.key)
            if ib is None or ib.n < 2 or b.n < 2 or ib.vmax <= ib.vmin:
                continue
            d_mem.append(b.vmax - b.vmin)
            d_req.append(ib.vmax - ib.vmin)
        if len(d_req) < 20:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = kendalltau(d_req, d_mem)
        tau, p = float(res[0]), float(res[1])
        if not (math.isfinite(tau) and tau > 0 and p < 0.01):
            return None
        ratio = float(np.median(np.array(d_mem) / np.array(d_req)))
        return ratio if ratio > 0 else None

    def _free(self, key: SeriesKey) -> float | None:
        if key.layer in ("vram", "device") and key.gpu is not None:
            return self._gpu_free.get(key.gpu)
        if key.layer.startswith("rss"):
            return self._host_available
        if key.layer == "kv" and key.pool in self._kv_total:
            return self._kv_total[key.pool] - self._kv_idle_last.get(key.pool or "", 0.0)
        return None

    def _strays(self) -> list[dict[str, Any]]:
        if self._last_gpu is None or not self._last_gpu.processes:
            return []
        result = census(self._last_gpu)
        return [
            {
                "code": f.code,
                "pid": f.pid,
                "gpu": f.gpu,
                "mib": f.mib,
                "host": f.host,
                "process": self._names.get(f.pid),
                "message": f.message,
            }
            for f in result.flags
            if f.code in ("stray_context", "off_main_gpu")
        ]


def replay(records: Iterable[Any], config: WatchConfig | None = None) -> WatchResult:
    """Re-run the rolling analysis over recorded records (a watch run file's records)."""
    state = WatchState(config)
    last = None
    for r in records:
        state.ingest(r)
        wall = getattr(r, "wall", None)
        if wall is None and isinstance(r, dict):
            wall = r.get("wall")
        if isinstance(wall, (int, float)):
            last = float(wall)
    return state.analyse(last if last is not None else 0.0)
