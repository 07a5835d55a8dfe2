"""Memory series from a run's samples, and their settled level after each round.

One series per thing that can hold memory, keyed so the reports can name it:
- VRAM: each GPU (`gpu0`, with each sample's per-process parts, so the processes that only
  came and went, and other tenants' processes, can be taken out of it) and each process on each
  GPU (`gpu0/pid42`); a MIG slice is a GPU of its own (`gpu0-gi1`, `gpu0-gi1/pid42`: GPU
  instance 1 of GPU 0; its compute instances share its memory);
- host RAM: each server process's RSS (`rss/pid42`) and its kinds (`rss_anon/`, `rss_file/`,
  `rss_shmem/`), its glibc malloc arenas (`arenas/`, a count; `arena_mib/`, reserved MiB;
  `arena_wmib/`, MiB the arena heaps have grown to), and `/dev/shm` (`dev_shm`);
- KV: each pool in tokens (`kv/full`, `kv/swa`, ...); runs recorded before per-pool tokens
  existed give `kv/kv` from `used_tokens` or the usage ratio times the pool size, else the
  bare ratio (`kv_usage`).

Values that are not finite (NaN from a broken exporter, inf) are skipped, never fitted.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.judge.results import HOST, KV, VRAM, Window
from vramdoctor.samples import GpuSample, HostSample, KvPoolSample, MetricsSample

# Stable names of vramdoctor.sources.server_metrics (the first is the current one).
KV_USAGE_NAMES = ("kv_usage_ratio", "kv_usage")
KV_POOL_GIB_NAMES = ("kv_cache_memory_gib", "kv_cache_mem_gib")


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class Series:
    """One series' identity and samples. `settle_points` are the samples a settled level may
    use (for KV: only samples with no running and no queued request); `points` all of them."""

    key: str
    layer: str
    kind: str
    unit: str
    pid: int | None = None
    gpu: int | None = None
    name: str | None = None
    role: str | None = None
    pool: str | None = None
    points: list[tuple[float, float]] = field(default_factory=list)
    settle_points: list[tuple[float, float]] | None = None
    # KV pools: what the server says about the pool (latest known value).
    total_tokens: float | None = None
    page_size_tokens: int | None = None
    bytes_per_token: float | None = None
    source: str | None = None
    idle_verified: bool = True  # KV: running/queued gauges were there to check idleness
    # Device series: MiB of each listed process in each sample (aligned with `points`).
    parts: list[dict[int, float]] | None = None
    # Whose process ("server", "tenant"; None: not known, read as the server's, as before
    # scopes were recorded) and, on a MIG slice, which one.
    scope: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    device: str | None = None  # "GPU 0", "GPU 0 MIG 3g.71gb GI 1"
    uid: int | None = None
    username: str | None = None

    @property
    def levels_from(self) -> list[tuple[float, float]]:
        return self.points if self.settle_points is None else self.settle_points


def kv_usage(sample: MetricsSample) -> float | None:
    """The KV pool usage ratio 0..1 of a /metrics sample, if the server publishes one."""
    for name in KV_USAGE_NAMES:
        v = sample.values.get(name)
        if _ok(v):
            return float(v)  # type: ignore[arg-type]
    return None


def _idle(running: float | None, queued: float | None) -> bool | None:
    """True when the server says nothing runs or waits, None when it does not say."""
    known = [v for v in (running, queued) if _ok(v)]
    if not known:
        return None
    return all(v == 0 for v in known)


def _kv_pools(r: MetricsSample) -> list[KvPoolSample]:
    """The sample's KV pools in tokens; for samples without `.kv`, one pool built from the
    stable values (`used_tokens`, or the usage ratio x `max_total_tokens`)."""
    if r.kv:
        return r.kv
    v = r.values
    running, queued = v.get("running_requests"), v.get("queued_requests")
    total = v.get("max_total_tokens")
    if _ok(v.get("used_tokens")):
        return [
            KvPoolSample(
                "kv",
                float(v["used_tokens"]),
                total_tokens=total if _ok(total) else None,
                running_requests=running,
                queued_requests=queued,
                source="used_tokens",
            )
        ]
    ratio = kv_usage(r)
    if ratio is not None and _ok(total) and total:
        return [
            KvPoolSample(
                "kv",
                ratio * float(total),
                total_tokens=float(total),
                running_requests=running,
                queued_requests=queued,
                source="kv_usage_ratio*max_total_tokens",
            )
        ]
    return []


def gpu_key(index: int, gpu_instance: int | None, compute_instance: int | None = None) -> str:
    """The series key of a GPU or MIG slice: "gpu0", "gpu0-gi1" (compute instances share
    their GPU instance's memory, so the key stops at the GPU instance)."""
    return f"gpu{index}" if gpu_instance is None else f"gpu{index}-gi{gpu_instance}"


def _series_of(
    out: dict[str, Series], key: str, layer: str, kind: str, unit: str, **ids: Any
) -> Series:
    """The series `key` of `out`, created (with `ids`) and added at its first sample."""
    s = out.get(key)
    if s is None:
        s = out[key] = Series(key, layer, kind, unit, **ids)
    return s


def _add_gpu_sample(out: dict[str, Series], r: GpuSample) -> None:
    """Adds one NVML sample to `out` (nothing returned): each process's MiB on each GPU or
    MIG slice (`gpu0/pid42`), then each device's MiB (`gpu0`) with the sample's
    per-process parts (pid -> MiB) beside it."""
    per_gpu: dict[str, dict[int, float]] = defaultdict(dict)
    for p in r.processes:
        if not _ok(p.used_mib):
            continue
        used = float(p.used_mib)  # type: ignore[arg-type]
        gi = getattr(p, "gpu_instance_id", None)
        dev = gpu_key(p.gpu, gi)
        per_gpu[dev][p.pid] = per_gpu[dev].get(p.pid, 0.0) + used
        s = _series_of(out, f"{dev}/pid{p.pid}", VRAM, "gpu_process", "MiB", pid=p.pid, gpu=p.gpu)
        s.name = s.name or p.name
        s.gpu_instance = gi
        s.compute_instance = getattr(p, "compute_instance_id", None)
        s.device = s.device or getattr(p, "label", None)
        _scope(s, p)
        s.points.append((r.t, used))
    for g in r.gpus:
        if not _ok(g.used_mib):
            continue
        gi = getattr(g, "gpu_instance_id", None)
        dev = gpu_key(g.index, gi)
        s = _series_of(out, dev, VRAM, "gpu", "MiB", gpu=g.index, name=g.name)
        s.gpu_instance = gi
        s.device = getattr(g, "label", None) or f"GPU {g.index}"
        s.points.append((r.t, float(g.used_mib)))
        if s.parts is None:
            s.parts = []
        s.parts.append(per_gpu.get(dev, {}))


def _add_host_sample(out: dict[str, Series], r: HostSample) -> None:
    """Adds one host sample to `out` (nothing returned): each server process's RSS and its
    kinds (MiB), its glibc arenas (a count; reserved and grown-to MiB), and /dev/shm (MiB)."""
    for hp in r.processes:
        ids = {"pid": hp.pid, "name": hp.name, "role": hp.role}
        for prefix, kind, value, unit in (
            ("rss", "rss", hp.rss_mib, "MiB"),
            ("rss_anon", "rss_anon", hp.rss_anon_mib, "MiB"),
            ("rss_file", "rss_file", hp.rss_file_mib, "MiB"),
            ("rss_shmem", "rss_shmem", hp.rss_shmem_mib, "MiB"),
            ("arenas", "arenas", hp.malloc_arenas, "arenas"),
            ("arena_mib", "arena_mib", hp.malloc_arena_reserved_mib, "MiB"),
            (
                "arena_wmib",
                "arena_wmib",
                getattr(hp, "malloc_arena_writable_mib", None),
                "MiB",
            ),
        ):
            if value is not None and _ok(value):
                s = _series_of(out, f"{prefix}/pid{hp.pid}", HOST, kind, unit, **ids)
                s.name, s.role = s.name or hp.name, s.role or hp.role
                _scope(s, hp)
                s.points.append((r.t, float(value)))
    if _ok(r.dev_shm_used_mib):
        _series_of(out, "dev_shm", HOST, "dev_shm", "MiB").points.append(
            (r.t, float(r.dev_shm_used_mib))  # type: ignore[arg-type]
        )


def _add_idle_point(s: Series, t: float, v: float, idle: bool | None) -> None:
    """Adds a KV sample `(t, v)` to the points a settled level may use unless the server said
    requests ran or waited (`idle` False); `idle` None (not said) marks the series as not
    checked for idleness. Returns nothing."""
    if s.settle_points is None:
        s.settle_points = []
    if idle is None:
        s.idle_verified = False
    if idle is not False:
        s.settle_points.append((t, v))


def _add_metrics_sample(out: dict[str, Series], r: MetricsSample) -> None:
    """Adds one /metrics sample to `out` (nothing returned): each KV pool's used tokens
    (`kv/full`, ...) with what the server says of the pool, else the bare usage ratio
    (`kv_usage`)."""
    pools = _kv_pools(r)
    for pool in pools:
        if not _ok(pool.used_tokens):
            continue
        s = _series_of(out, f"kv/{pool.pool}", KV, "kv", "tokens", pool=pool.pool)
        used = float(pool.used_tokens)  # type: ignore[arg-type]
        s.points.append((r.t, used))
        _add_idle_point(s, r.t, used, _idle(pool.running_requests, pool.queued_requests))
        if _ok(pool.total_tokens) and pool.total_tokens:
            s.total_tokens = float(pool.total_tokens)
        if pool.page_size_tokens and pool.page_size_tokens > 0:
            s.page_size_tokens = int(pool.page_size_tokens)
        if _ok(pool.bytes_per_token) and pool.bytes_per_token:
            s.bytes_per_token = float(pool.bytes_per_token)
        s.source = pool.source or s.source
    if not pools:
        ratio = kv_usage(r)
        if ratio is not None:
            s = _series_of(out, "kv_usage", KV, "kv", "ratio", pool="kv")
            s.points.append((r.t, ratio))
            idle = _idle(r.values.get("running_requests"), r.values.get("queued_requests"))
            _add_idle_point(s, r.t, ratio, idle)
            s.source = "kv_usage_ratio"


def extract_series(records: list[Any]) -> dict[str, Series]:
    """Every memory series in the run (records in time order), keyed as the module says."""
    out: dict[str, Series] = {}
    for r in records:
        if isinstance(r, GpuSample):
            _add_gpu_sample(out, r)
        elif isinstance(r, HostSample):
            _add_host_sample(out, r)
        elif isinstance(r, MetricsSample):
            _add_metrics_sample(out, r)
    # A run where the same pool shows up both in tokens and as a bare ratio keeps the tokens.
    if "kv_usage" in out and any(k.startswith("kv/") for k in out):
        del out["kv_usage"]
    return out


def _scope(s: Series, row: Any) -> None:
    """Whose process the row says it is (the latest word wins: a scope known later)."""
    scope = getattr(row, "scope", None)
    if scope is not None:
        s.scope = str(scope)
    for attr in ("uid", "username"):
        v = getattr(row, attr, None)
        if v is not None:
            setattr(s, attr, v)


def tenant_pids(raw: dict[str, Series]) -> set[int]:
    """Processes any sample called another tenant's (not the port owner's tree, not --pid)."""
    return {s.pid for s in raw.values() if s.scope == "tenant" and s.pid is not None}


def without(s: Series, pids: set[int]) -> Series:
    """A device series with the memory of `pids` taken out of every sample (processes that
    only came and went: their footprint is reported, it does not decide the device)."""
    if not pids or s.parts is None:
        return s
    pts = [
        (t, v - sum(mib for pid, mib in part.items() if pid in pids))
        for (t, v), part in zip(s.points, s.parts, strict=True)
    ]
    return dataclasses.replace(s, points=pts)


def late(values: list[tuple[float, float]], w: Window, fraction: float) -> list[float]:
    """Samples of the last `fraction` of a closed window (`values` in time order)."""
    if w.end is None:
        return []
    start = w.end - (w.end - w.start) * fraction
    lo = bisect.bisect_left(values, (start, -math.inf))
    hi = bisect.bisect_right(values, (w.end, math.inf))
    return [v for _, v in values[lo:hi]]


def settled_levels(
    values: list[tuple[float, float]], windows: list[Window], rounds: list[int], fraction: float
) -> tuple[float | None, list[float | None], list[list[float]]]:
    """(baseline level, settled level per round, the samples each level came from)."""
    baseline = None
    by_round: dict[int, list[float]] = {}
    for w in windows:
        if w.kind == "baseline":
            xs = late(values, w, max(fraction, 0.8))
            if xs:
                baseline = float(statistics.median(xs))
        elif w.kind == "idle" and w.round in rounds:
            by_round[w.round] = late(values, w, fraction)
    levels = [float(statistics.median(by_round[r])) if by_round.get(r) else None for r in rounds]
    samples = [by_round.get(r, []) for r in rounds]
    return baseline, levels, samples


def appeared_from_zero(
    values: list[tuple[float, float]],
    windows: list[Window],
    rounds: list[int],
    baseline: float | None,
    levels: list[float | None],
    fraction: float,
) -> tuple[float | None, list[float | None]]:
    """A process that first shows up after the baseline held nothing before: 0 MiB there.
    (A new process on the GPU is a step of the whole footprint, not a missing measurement.)"""
    if not values:
        return baseline, levels
    first_t = values[0][0]
    base_end = next((w.end for w in windows if w.kind == "baseline" and w.end is not None), None)
    if baseline is not None or base_end is None or first_t < base_end:
        return baseline, levels
    absent_until = {
        w.round: w.end - (w.end - w.start) * fraction / 2
        for w in windows
        if w.kind == "idle" and w.end is not None
    }
    fixed = [
        0.0 if r in absent_until and first_t > absent_until[r] else v
        for r, v in zip(rounds, levels, strict=True)
    ]
    return 0.0, fixed


def kv_pool_mib(records: list[Any], header: dict[str, Any] | None) -> float | None:
    """The KV pool's size in MiB, from /metrics (SGLang 0.5.17+) or the server's info."""
    for r in reversed(records):
        if isinstance(r, MetricsSample):
            gib = next(
                (
                    r.values[k]
                    for k in KV_POOL_GIB_NAMES
                    if _ok(r.values.get(k)) and r.values.get(k)
                ),
                None,
            )
            if gib:
                return float(gib) * 1024.0
    mem = (((header or {}).get("config") or {}).get("server") or {}).get("memory_usage") or {}
    kv = mem.get("kvcache") if isinstance(mem, dict) else None
    return float(kv) * 1024.0 if kv is not None and _ok(kv) else None
