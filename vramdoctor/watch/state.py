"""The rolling state of `watch`: samples in, bounded state, soak's verdicts out. Pure.

`WatchState.ingest(record)` takes what the sources produce (`GpuSample`, `HostSample`,
`MetricsSample`, `InsideSample`, the server's life `Event`s, and {"kind": "host_memory"} /
{"kind": "process_start"} dicts) and keeps, per series, a ring of downsampled buckets
(`series.BucketSeries`: the levels the exporter serves) and the server's idle windows
(`rounds.PassiveRounds`: the comparable moments). `analyse(wall)` turns the rolling window
into a `WatchResult`. Nothing here reads a clock or the outside world, so a recorded run
replays to the same result (`replay`).

How comparable moments are found (`WatchResult.mode`):

1. `rounds`: the server idles now and then (its /metrics: 0 running, 0 queued for
   `min_idle_s`). Each idle window is a settled level and the traffic between two of them a
   round, counted by the server's request counter: soak's judge decides (`watch.judging`),
   with its growth model, lives, scope rules, host rule and inside evidence.
2. `quiet`: the server is never idle in the window: its quietest moments instead
   (`watch.quiet`), judged the same way (no KV layer: it is never at rest).
3. `time`: no request counter (no /metrics, or none exported): each series against time by
   the same growth model (`judging.time_fit`); growth per hour only.

Warm-up is left out: idle windows that start within `warmup_s` of a server start (the port
owner's create time, and again after a replacement), and, in time mode, buckets within
`warmup_s` of a process's start. KV pools are preallocated: the KV layer is the server's used
tokens at idle moments, where a healthy server holds 0.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vramdoctor.judge.results import HOST, KV, VRAM
from vramdoctor.judge.series import gpu_key
from vramdoctor.samples import (
    PROCESS_APPEARED,
    PROCESS_EXITED,
    SERVER_DIED,
    SERVER_REPLACED,
    Event,
    GpuSample,
    HostSample,
    InsideSample,
    MetricsSample,
)
from vramdoctor.verdicts import Reason, Verdict, worst
from vramdoctor.watch.config import WatchConfig
from vramdoctor.watch.judging import (
    MEMORY_LAYER,
    WATCH_LAYER,
    analyse_windows,
    culprit_of,
    layer_views,
    rows_from_analysis,
    time_fit,
)
from vramdoctor.watch.quiet import TrackMeta, quiet_windows
from vramdoctor.watch.result import SCHEMA, LayerView, SeriesVerdict, WatchResult, rank_key
from vramdoctor.watch.rounds import IdleWindow, PassiveRounds, inflight_of
from vramdoctor.watch.series import BucketSeries

__all__ = [
    "LIFE_EVENTS",
    "SCHEMA",
    "SeriesVerdict",
    "WatchConfig",
    "WatchResult",
    "WatchState",
    "replay",
    "requests_served",
]

LIFE_EVENTS = frozenset({PROCESS_APPEARED, PROCESS_EXITED, SERVER_REPLACED, SERVER_DIED})
"""Events of the server's life (from `sources.discover.ServerWatch`): the judge's lives."""
DERIVED = "watch"  # Event.data["by"] of the events watch derives from the samples themselves

_HOST_KINDS = {
    "rss": "rss_mib",
    "rss_anon": "rss_anon_mib",
    "rss_file": "rss_file_mib",
    "rss_shmem": "rss_shmem_mib",
}
_UNIT = {"kv": "tokens"}


def requests_served(sample: MetricsSample) -> float | None:
    """The server's cumulative finished requests (`MetricsSample.requests_total`, filled by
    `sources.server_metrics` from the server kind's request counters in `vramdoctor.servers`)."""
    v = sample.requests_total
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


@dataclass
class _Track:
    series: BucketSeries
    meta: TrackMeta
    start_wall: float | None  # process start (None: started before watch, unknown)
    last_wall: float


@dataclass
class _Health:
    """What the state saw of its inputs (for the notes)."""

    metrics: int = 0
    metrics_with_counter: int = 0
    metrics_with_gauges: int = 0
    flavour: str | None = None
    inside: int = 0
    kinds: set[str] = field(default_factory=set)


class WatchState:
    """Bounded rolling state. Life cycle: ingest(record)* -> analyse(wall) (any time, again).

    Memory: at most `max_series` series of `max_buckets` buckets, `max_rounds + 1` idle
    windows of `window_samples` samples of each kind, `max_events` events. `ingest` returns
    the life events it derived from the samples (a process appeared, exited, was replaced).
    `header`: the run facts soak's judge reads (cpu_count, server_malloc_arena_max, the
    server's memory_usage), as a run header's `config`.
    """

    def __init__(
        self, config: WatchConfig | None = None, *, header: Mapping[str, Any] | None = None
    ) -> None:
        self.config = c = (config or WatchConfig()).check()
        self.header: dict[str, Any] = {"config": dict(header or {})}
        self._tracks: dict[str, _Track] = {}
        self._requests = BucketSeries(c.bucket_s, c.max_buckets)
        self._inflight = BucketSeries(c.bucket_s, c.max_buckets)
        self._req_offset = 0.0  # counter resets (server restarts) folded in
        self._req_last: float | None = None
        self.rounds = PassiveRounds(
            min_idle_s=c.min_idle_s,
            max_rounds=c.max_rounds,
            window_samples=c.window_samples,
            window_s=c.window_s,
            settle_s=c.settle_s or 0.0,
        )
        self._events: deque[dict[str, Any]] = deque(maxlen=c.max_events)
        self._life: deque[Event] = deque(maxlen=max(c.max_events, 64))
        self._present: dict[str, set[int]] = {}
        self._names: dict[int, str | None] = {}
        self._gpus_of: dict[int, set[int]] = {}
        self._exited: deque[tuple[float, int, str | None, frozenset[int]]] = deque(maxlen=64)
        self._start_walls: dict[int, float] = {}
        self._server_starts: deque[float] = deque(maxlen=64)
        self._last_gpu: GpuSample | None = None
        self._gpu_free: dict[tuple[int, int | None], float] = {}
        self._host_memory: dict[str, Any] | None = None
        self._kv_total: dict[str, float] = {}
        self._kv_idle_last: dict[str, float] = {}
        self._gpu_procs_seen = False
        self.seen = _Health()
        self.samples = 0

    @property
    def series_count(self) -> int:
        """Series held now (bounded by `max_series`)."""
        return len(self._tracks)

    # -- ingest -------------------------------------------------------------------------
    def set_start_times(self, starts: Mapping[int, float]) -> None:
        """Process create times (wall) where the host can read them: warm-up counts from there."""
        self._start_walls.update(starts)

    def ingest(self, record: Any) -> list[Event]:
        """Fold one record into the state; unknown records are ignored. Returns the events
        derived from the samples (process appeared / exited / replaced by name and GPU)."""
        if isinstance(record, GpuSample):
            return self._gpu(record)
        if isinstance(record, HostSample):
            return self._host(record)
        if isinstance(record, MetricsSample):
            self._metrics(record)
        elif isinstance(record, InsideSample):
            self.seen.inside += 1
            self.rounds.inside(record)  # left out when measured outside idle: counted there
        elif isinstance(record, Event):
            self._event(record)
        elif isinstance(record, dict):
            self._dict(record)
        return []

    def _dict(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "host_memory":
            self._host_memory = dict(record)
            self.rounds.sample(record)
        elif kind == "process_start":
            with contextlib.suppress(KeyError, TypeError, ValueError, OverflowError):
                pid, start = int(record["pid"]), float(record["start_wall"])
                if math.isfinite(start):
                    self._start_walls[pid] = start
                    if record.get("server"):
                        self._server_starts.append(start)

    def _event(self, ev: Event) -> None:
        if ev.name not in LIFE_EVENTS or not isinstance(ev.data, dict):
            return
        if ev.data.get("by") == DERIVED:
            return  # derived from the samples again on replay
        self._life.append(ev)
        self._events.append({**ev.data, "wall": ev.wall, "event": ev.name})

    def _first(self) -> None:
        self.samples += 1

    def _track(self, key: str, wall: float, value: float, meta: TrackMeta) -> None:
        tr = self._tracks.get(key)
        if tr is None:
            if len(self._tracks) >= self.config.max_series:
                self._evict()
            start = self._start_walls.get(meta.pid) if meta.pid is not None else None
            tr = self._tracks[key] = _Track(
                BucketSeries(self.config.bucket_s, self.config.max_buckets), meta, start, wall
            )
        tr.series.add(wall, value)
        tr.last_wall = wall
        tr.meta = meta

    def _evict(self) -> None:
        stalest = min(self._tracks, key=lambda k: self._tracks[k].last_wall)
        del self._tracks[stalest]

    def _lifecycle(
        self, source: str, wall: float, t: float, pids: dict[int, tuple[str | None, set[int]]]
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
            out.append(self._derived(t, wall, PROCESS_EXITED, pid=pid, name=name, gpus=sorted(old)))
        for pid in sorted(after - before):
            if first_of_source:
                continue  # present when this source was first read: not an appearance
            name = self._names.get(pid)
            now_gpus = frozenset(self._gpus_of.get(pid, set()))
            self._start_walls.setdefault(pid, wall)
            for tr in self._tracks.values():
                if tr.meta.pid == pid and tr.start_wall is None:
                    tr.start_wall = self._start_walls[pid]
            out.append(
                self._derived(t, wall, PROCESS_APPEARED, pid=pid, name=name, gpus=sorted(now_gpus))
            )
            for ex_wall, old_pid, old_name, old_gpus in reversed(self._exited):
                if (
                    wall - ex_wall <= self.config.restart_window_s
                    and old_name == name
                    and (not now_gpus or not old_gpus or now_gpus == old_gpus)
                ):
                    down = round(wall - ex_wall, 3)
                    out.append(
                        self._derived(
                            t,
                            wall,
                            "process_replaced",
                            old_pid=old_pid,
                            new_pid=pid,
                            name=name,
                            down_s=down,
                        )
                    )
                    break
        for ev in out:
            self._events.append({**ev.data, "wall": ev.wall, "event": ev.name})
        return out

    @staticmethod
    def _derived(t: float, wall: float, event: str, **data: Any) -> Event:
        return Event(t=t, wall=wall, name=event, data={**data, "by": DERIVED})

    def _gpu(self, s: GpuSample) -> list[Event]:
        self._first()
        self._last_gpu = s
        self._gpu_procs_seen = self._gpu_procs_seen or bool(s.processes)
        self.seen.kinds.add("gpu")
        for g in s.gpus:
            gi = g.gpu_instance_id
            self._gpu_free[(g.index, gi)] = g.free_mib
            meta = TrackMeta(
                "gpu",
                gpu=g.index,
                gpu_instance=gi,
                mig_profile=g.mig_profile,
                name=g.name,
                total_mib=g.total_mib,
            )
            self._track(gpu_key(g.index, gi), s.wall, g.used_mib, meta)
        pids: dict[int, tuple[str | None, set[int]]] = {}
        for p in s.processes:
            entry = pids.setdefault(p.pid, (p.name, set()))
            entry[1].add(p.gpu)
        events = self._lifecycle("gpu", s.wall, s.t, pids)
        for p in s.processes:
            if p.used_mib is None:
                continue
            gi = p.gpu_instance_id
            meta = TrackMeta(
                "gpu_process",
                pid=p.pid,
                gpu=p.gpu,
                gpu_instance=gi,
                compute_instance=p.compute_instance_id,
                name=p.name,
                scope=p.scope,
                uid=p.uid,
                username=p.username,
            )
            self._track(f"{gpu_key(p.gpu, gi)}/pid{p.pid}", s.wall, p.used_mib, meta)
        self.rounds.sample(s)
        return events

    def _host(self, s: HostSample) -> list[Event]:
        self._first()
        self.seen.kinds.add("host")
        events = self._lifecycle("host", s.wall, s.t, {p.pid: (p.name, set()) for p in s.processes})
        for p in s.processes:
            for kind, attr in _HOST_KINDS.items():
                value = getattr(p, attr, None)
                if value is None:
                    continue
                meta = TrackMeta(
                    kind,
                    pid=p.pid,
                    name=p.name,
                    role=p.role,
                    scope=p.scope,
                    uid=p.uid,
                    username=p.username,
                )
                self._track(f"{kind}/pid{p.pid}", s.wall, float(value), meta)
        self.rounds.sample(s)
        return events

    def _metrics(self, s: MetricsSample) -> None:
        self._first()
        h = self.seen
        h.metrics += 1
        h.flavour = s.flavour or h.flavour
        served = requests_served(s)
        if served is not None:
            h.metrics_with_counter += 1
            if self._req_last is not None and served < self._req_last:
                self._req_offset += self._req_last  # counter reset: the server restarted
            self._req_last = served
            served += self._req_offset
            self._requests.add(s.wall, served)
        inflight = inflight_of(s)
        if inflight is not None:
            h.metrics_with_gauges += 1
            self._inflight.add(s.wall, inflight)
        self.rounds.metrics(s, served)
        for pool in s.kv:
            if pool.total_tokens is not None and math.isfinite(pool.total_tokens):
                self._kv_total[pool.pool] = float(pool.total_tokens)
            if inflight == 0 and pool.used_tokens is not None:
                self._kv_idle_last[pool.pool] = float(pool.used_tokens)
                meta = TrackMeta("kv", extra={"pool": pool.pool})
                self._track(f"kv/{pool.pool}", s.wall, float(pool.used_tokens), meta)

    # -- analysis -----------------------------------------------------------------------
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
        keep |= {tr.meta.pid for tr in self._tracks.values() if tr.meta.pid is not None}
        keep |= {pid for _, pid, _, _ in self._exited}
        for table in (self._names, self._gpus_of, self._start_walls):
            for pid in [p for p in table if p not in keep]:
                del table[pid]
        horizon = start * self.config.bucket_s
        while self._life and self._life[0].wall < horizon - self.config.window_s:
            self._life.popleft()

    def requests_per_hour(self) -> float | None:
        first, last = self._requests.first, self._requests.last
        if first is None or last is None or last.key == first.key:
            return None
        hours = (last.key - first.key) * self.config.bucket_s / 3600.0
        return (last.vlast - first.vlast) / hours

    def _alive(self) -> set[int]:
        return set().union(*self._present.values()) if self._present else set()

    def _level(self, key: str) -> tuple[float | None, float | None]:
        tr = self._tracks.get(key)
        last = tr.series.last if tr is not None else None
        return (last.vlast, last.vmin) if last is not None else (None, None)

    def _warm_windows(self, windows: list[IdleWindow]) -> list[IdleWindow]:
        """Idle windows outside every server start's warm-up."""
        w_s = self.config.warmup_s
        if w_s <= 0 or not self._server_starts:
            return windows
        starts = list(self._server_starts)
        return [w for w in windows if not any(s <= w.start_wall < s + w_s for s in starts)]

    def mode(self, wall: float) -> str:
        """How comparable moments are found now: rounds, quiet or time (module doc)."""
        if self.seen.metrics_with_counter == 0 or self.seen.metrics_with_gauges == 0:
            return "time"
        idle = self.rounds.last_idle_wall
        if idle is not None and idle >= wall - self.config.window_s:
            return "rounds"
        return "quiet"

    def analyse(self, wall: float) -> WatchResult:
        """The verdicts over the window ending at `wall`. Pure over the state; prunes."""
        c = self.config
        self._prune(wall)
        rph = self.requests_per_hour()
        mode = self.mode(wall)
        alive = self._alive()
        if mode == "time":
            rows, layers = self._time_rows(alive)
            windows: list[IdleWindow] = []
        else:
            if mode == "rounds":
                windows = self._warm_windows(self.rounds.windows(wall))
                events = list(self._life)
            else:
                windows = quiet_windows(
                    {k: (tr.series, tr.meta) for k, tr in self._tracks.items()},
                    self._inflight,
                    {b.key: b.vlast for b in self._requests},
                    bucket_s=c.bucket_s,
                    blocks=c.quiet_blocks,
                )
                events = [replace(e, t=e.wall) for e in self._life]
            analysis = analyse_windows(
                windows,
                events,
                header=self.header,
                th=c.th,
                rate_rps=rph / 3600.0 if rph else None,
                host_memory=self._host_memory,
            )
            layers = layer_views(analysis, rph)
            rows = rows_from_analysis(
                analysis, mode=mode, rph=rph, level=self._level, alive=lambda p: p in alive
            )
        rows += self._level_rows(rows, mode, alive)
        exited = self._live_layers(layers, rows)
        culprit, culprit_layer = culprit_of(rows, layers)
        rows.sort(key=rank_key)
        verdict = self._verdict(layers, rows)
        return WatchResult(
            wall=wall,
            window_s=c.window_s,
            verdict=verdict,
            mode=mode,
            series=rows,
            layers=layers,
            culprit_key=culprit,
            culprit_layer=culprit_layer,
            rounds=max(len(windows) - 1, 0),
            idle_windows=len(windows) if mode == "rounds" else 0,
            requests_per_hour=rph,
            events=list(self._events),
            strays=self._strays(),
            gpus=self._gpus(),
            kv_idle_used_tokens=dict(self._kv_idle_last),
            notes=self._notes(mode, windows) + exited,
        )

    def _live_layers(self, layers: dict[str, LayerView], rows: list[SeriesVerdict]) -> list[str]:
        """The live processes decide: a layer whose LEAK the judge found in a process that
        has exited since is decided again by the live series of that layer (the exited one
        stays in the table and the JSON). Returns what it says about it."""
        notes: list[str] = []
        by_key = {r.key: r for r in rows}
        for name, view in list(layers.items()):
            top = by_key.get(view.main_series or "")
            if view.verdict != Verdict.LEAK or top is None or top.alive:
                continue
            notes.append(
                f"{top.key} grew until its process exited"
                + (f" ({top.process})" if top.process else "")
                + ": the live processes decide the layer"
            )
            live = [r for r in rows if r.memory_layer == name and r.decides and r.alive]
            v = worst(r.verdict for r in live) or Verdict.INCONCLUSIVE
            pick = [r for r in live if r.verdict == v]
            nxt = max(pick, key=lambda r: r.growth_per_hour or 0.0) if pick else None
            layers[name] = LayerView(
                layer=name,
                verdict=v,
                reason=nxt.reason if nxt is not None else Reason.TRANSIENT,
                unit=view.unit,
                explanation=nxt.explanation if nxt is not None else None,
                decided_by=nxt.decided_by if nxt is not None else None,
                main_series=nxt.key if nxt is not None else None,
                rate_per_request=nxt.growth_per_request if nxt and v == Verdict.LEAK else None,
                rate_ci=nxt.growth_per_request_ci if nxt and v == Verdict.LEAK else None,
                rate_per_hour=nxt.growth_per_hour if nxt and v == Verdict.LEAK else None,
                tenants=view.tenants,
            )
            if nxt is not None and v == Verdict.LEAK:
                tr = self._tracks.get(nxt.key)
                free = self._free(tr.meta) if tr is not None else None
                rate = nxt.growth_per_hour
                layers[name].capacity_left = free
                if free is not None and rate and rate > 0:
                    layers[name].hours_to_oom = max(free, 0.0) / rate
        return notes

    @staticmethod
    def _verdict(layers: Mapping[str, LayerView], rows: list[SeriesVerdict]) -> str:
        """soak's run rule over the layers: LEAK if one leaks; else INCONCLUSIVE if one is
        undecided (or none measured); else CACHING if one caches; else STABLE."""
        verdicts = [v.verdict for v in layers.values() if v.verdict != Verdict.NOT_MEASURED]
        if Verdict.LEAK in verdicts:
            return Verdict.LEAK
        if not verdicts or Verdict.INCONCLUSIVE in verdicts:
            return Verdict.INCONCLUSIVE
        if Verdict.CACHING in verdicts:
            return Verdict.CACHING
        return Verdict.STABLE

    def _level_rows(
        self, rows: list[SeriesVerdict], mode: str, alive: set[int]
    ) -> list[SeriesVerdict]:
        """Series the judge had nothing to say about yet (too few comparable moments): their
        level, INCONCLUSIVE, evidence only (so the exporter serves every level from the start)."""
        have = {r.key for r in rows}
        out: list[SeriesVerdict] = []
        for key, tr in self._tracks.items():
            if key in have:
                continue
            kind = tr.meta.kind
            layer = WATCH_LAYER.get(kind, kind)
            level, low = self._level(key)
            out.append(
                SeriesVerdict(
                    key=key,
                    layer=layer,
                    memory_layer=MEMORY_LAYER.get(layer, VRAM),
                    unit=_UNIT.get(layer, "MiB"),
                    verdict=Verdict.INCONCLUSIVE,
                    reason=Reason.TOO_FEW_ROUNDS if mode != "time" else Reason.TOO_FEW_POINTS,
                    mode=mode,
                    **self._who(tr.meta),
                    alive=tr.meta.pid is None or tr.meta.pid in alive,
                    decides=False,
                    level=level,
                    floor_level=low,
                )
            )
        return out

    @staticmethod
    def _who(meta: TrackMeta) -> dict[str, Any]:
        return {
            "pid": meta.pid,
            "gpu": meta.gpu,
            "gpu_instance": meta.gpu_instance,
            "compute_instance": meta.compute_instance,
            "pool": meta.extra.get("pool"),
            "process": meta.name,
            "role": meta.role,
            "scope": meta.scope or "server",
            "username": meta.username,
        }

    def _free(self, meta: TrackMeta) -> float | None:
        if meta.kind in ("gpu_process", "gpu") and meta.gpu is not None:
            return self._gpu_free.get((meta.gpu, meta.gpu_instance))
        if meta.kind in _HOST_KINDS:
            v = (self._host_memory or {}).get("available_mib")
            return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None
        pool = meta.extra.get("pool")
        if meta.kind == "kv" and pool in self._kv_total:
            return self._kv_total[pool] - self._kv_idle_last.get(pool, 0.0)
        return None

    def _time_rows(self, alive: set[int]) -> tuple[list[SeriesVerdict], dict[str, LayerView]]:
        """Every series against time (no request counter): the growth model per series."""
        c = self.config
        procs_on = {
            (tr.meta.gpu, tr.meta.gpu_instance)
            for tr in self._tracks.values()
            if tr.meta.kind == "gpu_process"
        }
        rows: list[SeriesVerdict] = []
        for key, tr in self._tracks.items():
            meta = tr.meta
            layer = WATCH_LAYER.get(meta.kind, meta.kind)
            warm = tr.start_wall + c.warmup_s if tr.start_wall is not None else None
            pts = [
                (b.key * c.bucket_s, b.vmin)
                for b in tr.series
                if warm is None or b.key * c.bucket_s >= warm
            ]
            floor = c.kv_time_floor_tokens if layer == "kv" else c.time_floor_mib
            verdict, reason, rate, ci, model = time_fit(pts, floor=floor, blocks=c.quiet_blocks)
            scope = meta.scope or "server"
            decides = scope != "tenant" and (meta.pid is None or meta.pid in alive)
            if layer == "device" and (meta.gpu, meta.gpu_instance) in procs_on:
                decides = False  # its processes decide (a device total holds every tenant)
            if verdict == Verdict.LEAK and layer in ("rss", "rss_anon"):
                # From outside, allocator retention and a leak look the same (soak's host rule).
                verdict, reason = Verdict.INCONCLUSIVE, Reason.RETENTION_OR_LEAK
            free = self._free(meta)
            hours = (
                max(free, 0.0) / rate
                if verdict == Verdict.LEAK and rate and rate > 0 and free is not None
                else None
            )
            level, low = self._level(key)
            rows.append(
                SeriesVerdict(
                    key=key,
                    layer=layer,
                    memory_layer=MEMORY_LAYER.get(layer, VRAM),
                    unit=_UNIT.get(layer, "MiB"),
                    verdict=verdict,
                    reason=reason,
                    mode="time",
                    **self._who(meta),
                    alive=meta.pid is None or meta.pid in alive,
                    decides=decides,
                    level=level,
                    floor_level=low,
                    points=len(pts),
                    growth_per_hour=rate,
                    growth_per_hour_ci=ci,
                    hours_to_oom=hours,
                    free=free,
                    model=model,
                    decided_by="time",
                    warmup_until=warm,
                )
            )
        rows.sort(key=rank_key)
        layers: dict[str, LayerView] = {}
        for name in (VRAM, KV, HOST):
            mine = [r for r in rows if r.memory_layer == name and r.decides]
            if not mine:
                continue
            v = worst(r.verdict for r in mine) or Verdict.INCONCLUSIVE
            top = next(r for r in mine if r.verdict == v)
            layers[name] = LayerView(
                layer=name,
                verdict=v,
                reason=top.reason,
                unit=top.unit,
                decided_by="time",
                main_series=top.key,
                rate_per_hour=top.growth_per_hour,
                rate_per_hour_ci=top.growth_per_hour_ci,
                hours_to_oom=top.hours_to_oom,
                capacity_left=top.free,
                tenants=[r.key for r in rows if r.memory_layer == name and r.scope == "tenant"],
            )
        return rows, layers

    def _gpus(self) -> list[dict[str, Any]]:
        if self._last_gpu is None:
            return []
        return [
            {
                "index": g.index,
                "gpu_instance": g.gpu_instance_id,
                "device": g.label,
                "name": g.name,
                "host": g.host,
                "total_mib": g.total_mib,
                "used_mib": g.used_mib,
                "free_mib": g.free_mib,
                "reachable_mib": g.reachable_mib,
            }
            for g in self._last_gpu.gpus
        ]

    def _notes(self, mode: str, windows: list[IdleWindow]) -> list[str]:
        h = self.seen
        notes: list[str] = []
        if h.metrics == 0:
            notes.append(
                "no server /metrics was read: growth is compared over time only (no request "
                "counter, no idle moments, no KV layer)"
            )
        elif h.metrics_with_counter == 0:
            notes.append(
                "the server's /metrics has no request counter vramdoctor knows"
                + (f" ({h.flavour})" if h.flavour else "")
                + ": growth is compared over time only, per hour"
            )
        elif h.metrics_with_gauges == 0:
            notes.append(
                "the server's /metrics has no running/queued gauges: its idle moments cannot be "
                "told; growth is compared over time only"
            )
        elif mode == "quiet":
            notes.append(
                "the server was never idle in the window: its quietest moments are compared "
                "(no KV layer: its pool is never at rest)"
            )
        elif mode == "rounds" and len(windows) < 4:
            notes.append(
                f"{len(windows)} idle window(s) of at least {self.config.min_idle_s:g} s in the "
                "window so far: a verdict needs about four (the server's own pauses are watch's "
                "rounds)"
            )
        if self.rounds.merged:
            notes.append(
                f"{self.rounds.merged} smaller rounds were merged into the next "
                f"(at most {self.config.max_rounds} rounds are kept)"
            )
        if self.rounds.inside_dropped:
            notes.append(
                f"{self.rounds.inside_dropped} inside-evidence records were measured outside "
                "the server's settled idle moments (traffic had resumed, or had just ended) and "
                "were left out"
            )
        return notes

    def _strays(self) -> list[dict[str, Any]]:
        if self._last_gpu is None or not self._last_gpu.processes:
            return []
        from vramdoctor.census.analysis import census

        result = census(self._last_gpu)
        return [
            {
                "code": f.code,
                "pid": f.pid,
                "gpu": f.gpu,
                "mib": f.mib,
                "host": f.host,
                "process": self._names.get(f.pid) if f.pid is not None else None,
                "message": f.message,
            }
            for f in result.flags
            if f.code in ("stray_context", "off_main_gpu")
        ]


def replay(
    records: Iterable[Any],
    config: WatchConfig | None = None,
    *,
    header: Mapping[str, Any] | None = None,
) -> WatchResult:
    """Re-run the rolling analysis over recorded records (a watch run file's), at the last
    record's wall time. `header`: the run header's `config` (the judge's run facts)."""
    state = WatchState(config, header=header)
    last = None
    for r in records:
        state.ingest(r)
        wall = r.get("wall") if isinstance(r, dict) else getattr(r, "wall", None)
        if isinstance(wall, (int, float)) and math.isfinite(wall):
            last = float(wall) if last is None else max(last, float(wall))
    return state.analyse(last if last is not None else 0.0)
