"""The quiet moments of a server that is never idle, as idle windows for soak's judge. Pure.

A busy production server may never reach 0 requests in flight. Its comparable moments are
then its quietest ones: the rolling window is cut into `blocks` equal stretches and in each
the bucket with the fewest requests in flight (mean of the server's running + queued gauges)
is taken; each series' level there is that bucket's minimum (what it keeps between
requests). Where a series' level follows the requests in flight (activations of the requests
still running at the quietest moment), that share is taken out (`per_inflight`). These
moments, with the requests the counter served up to each, become idle windows
(`watch.rounds.IdleWindow`) of synthetic samples that soak's judge reads as it reads rounds
(`watch.judging`). The KV layer is not judged there (its used tokens are not 0 while requests
run: the judge says `never_idle`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.samples import (
    GpuMemory,
    GpuSample,
    HostProcessMemory,
    HostSample,
    MetricsSample,
    ProcessGpuMemory,
)
from vramdoctor.watch.rounds import IdleWindow
from vramdoctor.watch.series import Bucket, BucketSeries

__all__ = ["TrackMeta", "per_inflight", "quiet_windows"]

_HOST_FIELD = {
    "rss": "rss_mib",
    "rss_anon": "rss_anon_mib",
    "rss_file": "rss_file_mib",
    "rss_shmem": "rss_shmem_mib",
}


@dataclass
class TrackMeta:
    """What a series is, from its latest sample: enough to write it again as a sample."""

    kind: str  # gpu_process, gpu, rss, rss_anon, rss_file, rss_shmem, kv
    pid: int | None = None
    gpu: int | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    mig_profile: str | None = None
    name: str | None = None
    role: str | None = None
    scope: str | None = None
    uid: int | None = None
    username: str | None = None
    total_mib: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def per_inflight(series: BucketSeries, inflight: BucketSeries) -> float | None:
    """MiB per request in flight, when a series' level follows the in-flight count.

    Measured inside each bucket (no leak moves a level that fast): the rise from a bucket's
    minimum to its maximum against the rise of its in-flight count. Only when the two go
    together (Kendall tau > 0, p < 0.01 over at least 20 buckets) is it used, to take out the
    activations of the requests still in flight at a bucket's quietest moment. A caching
    allocator's level (NVML under PyTorch) does not follow the load: then None."""
    import numpy as np
    from scipy.stats import kendalltau

    infl = {b.key: b for b in inflight}
    d_mem, d_req = [], []
    for b in series:
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


def _quietest(inflight: Sequence[Bucket], blocks: int) -> list[Bucket]:
    """The bucket with the lowest mean in-flight count in each of `blocks` equal stretches."""
    if not inflight:
        return []
    first, last = inflight[0].key, inflight[-1].key
    span = last - first + 1
    out: list[Bucket] = []
    for i in range(blocks):
        lo = first + (span * i) // blocks
        hi = first + (span * (i + 1)) // blocks
        cands = [b for b in inflight if lo <= b.key < hi]
        if cands:
            out.append(min(cands, key=lambda b: (b.mean, b.key)))
    return out


def quiet_windows(
    tracks: Mapping[str, tuple[BucketSeries, TrackMeta]],
    inflight: BucketSeries,
    served_at: Mapping[int, float],
    *,
    bucket_s: float,
    blocks: int,
) -> list[IdleWindow]:
    """The quiet moments as idle windows of synthetic samples (module doc). `served_at`:
    bucket key -> cumulative requests served by then. Times are wall-clock seconds (`t` =
    `wall`). Fewer than three moments with a request count: []."""
    moments = _quietest(list(inflight), blocks)
    keys = sorted(served_at)
    adjust = {
        key: per_inflight(series, inflight)
        for key, (series, meta) in tracks.items()
        if meta.kind != "kv"
    }
    low = {b.key: b.vmin for b in inflight}
    by_key: dict[str, dict[int, float]] = {
        key: {b.key: b.vmin for b in series} for key, (series, _) in tracks.items()
    }
    out: list[IdleWindow] = []
    for m in moments:
        served = _served_by(keys, served_at, m.key)
        if served is None:
            continue
        values: dict[str, float] = {}
        for key, vals in by_key.items():
            v = vals.get(m.key)
            if v is None:
                continue
            k = adjust.get(key)
            values[key] = v - k * low.get(m.key, 0.0) if k is not None else v
        start = m.key * bucket_s
        end = start + bucket_s * 0.98
        recs = _samples(tracks, values, (start + bucket_s * 0.25, start + bucket_s * 0.75), m.mean)
        w = IdleWindow(start, start, end, end, served)
        for kind, rs in recs.items():
            w.records[kind] = rs
        out.append(w)
    return out if len(out) >= 3 else []


def _served_by(keys: list[int], served_at: Mapping[int, float], key: int) -> float | None:
    best = None
    for k in keys:
        if k > key:
            break
        best = served_at[k]
    return best


def _samples(
    tracks: Mapping[str, tuple[BucketSeries, TrackMeta]],
    values: Mapping[str, float],
    times: tuple[float, float],
    inflight_mean: float,
) -> dict[str, list[Any]]:
    """Two GPU, host and metrics samples (at `times`) holding `values` by series key."""
    procs: list[ProcessGpuMemory] = []
    gpus: list[GpuMemory] = []
    hosts: dict[int, HostProcessMemory] = {}
    for key, v in values.items():
        meta = tracks[key][1]
        if meta.kind == "gpu_process" and meta.pid is not None and meta.gpu is not None:
            procs.append(
                ProcessGpuMemory(
                    meta.pid,
                    meta.gpu,
                    v,
                    name=meta.name,
                    scope=meta.scope,
                    uid=meta.uid,
                    username=meta.username,
                    gpu_instance_id=meta.gpu_instance,
                    compute_instance_id=meta.compute_instance,
                )
            )
        elif meta.kind == "gpu" and meta.gpu is not None:
            total = meta.total_mib if meta.total_mib is not None else v
            gpus.append(
                GpuMemory(
                    meta.gpu,
                    total,
                    v,
                    max(total - v, 0.0),
                    name=meta.name,
                    gpu_instance_id=meta.gpu_instance,
                    mig_profile=meta.mig_profile,
                )
            )
        elif meta.kind in _HOST_FIELD and meta.pid is not None:
            row = hosts.get(meta.pid)
            if row is None:
                row = hosts[meta.pid] = HostProcessMemory(
                    meta.pid,
                    0.0,
                    name=meta.name,
                    role=meta.role,
                    scope=meta.scope,
                    uid=meta.uid,
                    username=meta.username,
                )
            setattr(row, _HOST_FIELD[meta.kind], v)
    out: dict[str, list[Any]] = {"gpu": [], "host": [], "metrics": []}
    for t in times:
        if procs or gpus:
            out["gpu"].append(
                GpuSample(t=t, wall=t, source="watch-quiet", gpus=gpus, processes=procs)
            )
        if hosts:
            out["host"].append(HostSample(t=t, wall=t, processes=list(hosts.values())))
        out["metrics"].append(
            MetricsSample(
                t=t,
                wall=t,
                flavour=None,
                values={"running_requests": inflight_mean, "queued_requests": 0.0},
            )
        )
    return out
