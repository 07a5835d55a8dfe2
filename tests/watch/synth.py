"""Histories of a server as watch's sources record them, with a known truth.

`history(...)` yields the records watch's sampler writes (MetricsSample with the server's
request counter and running/queued gauges, HostSample of its processes, GpuSample of its GPU,
host_memory), every `interval_s`, for traffic in bursts (`burst_s` of `rps` requests a second)
separated by idle stretches (`idle_s`, 0 running), or never idle (`idle_s=0`: the load only
dips). Memory follows functions of (seconds, requests served) given by the test: the truth.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.samples import (
    GpuMemory,
    GpuSample,
    HostProcessMemory,
    HostSample,
    InsideSample,
    KvPoolSample,
    MetricsSample,
    ProcessGpuMemory,
)

MIB = 1024 * 1024

Level = Callable[[float, float], float]  # (seconds since start, requests served) -> MiB


@dataclass
class Proc:
    pid: int
    name: str = "python3"
    anon: Level | None = None  # host RssAnon (MiB)
    vram: Level | None = None  # NVML per process (MiB) on `gpu`
    gpu: int = 0
    gpu_instance: int | None = None
    scope: str | None = "server"
    uid: int | None = 1000
    username: str | None = "svc"
    load_mib: float = 0.0  # MiB per request in flight (activations)
    until_s: float | None = None  # the process exits then
    from_s: float = 0.0  # ... and appears then
    arenas: int | None = 4  # glibc arenas in /proc/PID/maps (None: unreadable)
    in_use: Level | None = None  # the agent's mallinfo2 bytes in use (MiB); None: no agent
    py_blocks: Level | None = None  # the agent's Python allocated blocks


@dataclass
class Traffic:
    rps: float = 4.0
    burst_s: float = 30.0
    idle_s: float = 30.0
    concurrency: float = 2.0  # requests in flight during a burst
    jitter: float = 0.0


@dataclass
class Server:
    procs: list[Proc]
    traffic: Traffic = field(default_factory=Traffic)
    kv_leak_tokens: float = 0.0  # tokens kept per request at idle
    kv_total: float = 100_000.0
    gpu_total_mib: float = 143771.0
    counter: bool = True
    gauges: bool = True
    noise_mib: float = 0.0
    seed: int = 0
    host_available_mib: float = 200_000.0


def history(
    server: Server, *, seconds: float, interval_s: float = 1.0, start_wall: float = 1.8e9
) -> Iterator[Any]:
    rng = random.Random(server.seed)
    tr = server.traffic
    served = 0.0
    period = tr.burst_s + tr.idle_s
    t = 0.0
    while t <= seconds:
        phase = t % period if period > 0 else 0.0
        busy = tr.idle_s <= 0 or phase < tr.burst_s
        if busy:
            inflight = tr.concurrency + (rng.random() * tr.jitter if tr.jitter else 0.0)
            if tr.idle_s <= 0:  # never idle: the load dips at times, never to 0
                inflight = max(0.5, tr.concurrency * (1 + 0.8 * math.sin(t / 97.0)))
            served += tr.rps * interval_s
        else:
            inflight = 0.0
        wall = start_wall + t
        metrics_values = {}
        if server.gauges:
            metrics_values = {"running_requests": float(round(inflight)), "queued_requests": 0.0}
        kv_used = 0.0 if inflight == 0 else 64.0 * inflight
        kv_used += server.kv_leak_tokens * served
        yield MetricsSample(
            t=t,
            wall=wall,
            flavour="sglang",
            values=metrics_values,
            kv=[KvPoolSample("full", kv_used, total_tokens=server.kv_total)],
            requests_total=float(math.floor(served)) if server.counter else None,
        )
        hosts, gpus_rows = [], []
        used_gpu = 0.0
        for p in server.procs:
            if t < p.from_s or (p.until_s is not None and t >= p.until_s):
                continue
            load = p.load_mib * round(inflight)
            noise = rng.gauss(0.0, server.noise_mib) if server.noise_mib else 0.0
            if p.anon is not None:
                anon = p.anon(t, served) + load + noise
                hosts.append(
                    HostProcessMemory(
                        p.pid,
                        anon + 50.0,
                        name=p.name,
                        role="server",
                        rss_anon_mib=anon,
                        rss_file_mib=50.0,
                        rss_shmem_mib=0.0,
                        scope=p.scope,
                        uid=p.uid,
                        username=p.username,
                        malloc_arenas=p.arenas,
                        malloc_arena_reserved_mib=None if p.arenas is None else 64.0 * p.arenas,
                    )
                )
            if p.vram is not None:
                v = p.vram(t, served) + load + noise
                used_gpu += v
                gpus_rows.append(
                    ProcessGpuMemory(
                        p.pid,
                        p.gpu,
                        v,
                        name=p.name,
                        scope=p.scope,
                        uid=p.uid,
                        username=p.username,
                        gpu_instance_id=p.gpu_instance,
                    )
                )
        if hosts:
            yield HostSample(t=t + 0.01, wall=wall + 0.01, processes=hosts)
        # the agent answers once per idle stretch, near its end (as watch asks it)
        if (
            not busy
            and tr.idle_s > 0
            and tr.idle_s - interval_s * 2 <= phase - tr.burst_s < tr.idle_s - interval_s
        ):
            for p in server.procs:
                if p.in_use is None or t < p.from_s or (p.until_s is not None and t >= p.until_s):
                    continue
                in_use = p.in_use(t, served)
                blocks = p.py_blocks(t, served) if p.py_blocks is not None else 100_000.0
                kept = max((p.anon(t, served) if p.anon else 0.0) - in_use, 0.0)
                yield InsideSample(
                    t=t + 0.04,
                    wall=wall + 0.04,
                    pid=p.pid,
                    glibc={
                        "in_use_bytes": int(in_use * MIB),
                        "free_kept_bytes": int(kept * MIB),
                        "arena_bytes": int((in_use + kept) * MIB),
                        "mmap_bytes": 0,
                    },
                    python={"allocated_blocks": int(blocks), "tracing": False},
                )
        if any(p.vram is not None for p in server.procs):
            instances = sorted(
                {p.gpu_instance for p in server.procs if p.vram is not None}, key=str
            )
            gpus = []
            for gi in instances:
                used = sum(r.used_mib or 0.0 for r in gpus_rows if r.gpu_instance_id == gi)
                gpus.append(
                    GpuMemory(
                        0,
                        server.gpu_total_mib,
                        used + 500.0,
                        server.gpu_total_mib - used - 500.0,
                        name="NVIDIA H200",
                        gpu_instance_id=gi,
                    )
                )
            yield GpuSample(
                t=t + 0.02, wall=wall + 0.02, source="nvml", gpus=gpus, processes=gpus_rows
            )
        yield {
            "kind": "host_memory",
            "t": t + 0.03,
            "wall": wall + 0.03,
            "available_mib": server.host_available_mib,
        }
        t += interval_s


def leak(per_request_mib: float, base: float = 500.0) -> Level:
    return lambda _t, n: base + per_request_mib * n


def converging(bound_mib: float, per_request_share: float, base: float = 500.0) -> Level:
    """Rises towards base + bound: each request fills `per_request_share` of what is left."""
    return lambda _t, n: base + bound_mib * (1.0 - (1.0 - per_request_share) ** n)


def in_time(mib_per_s: float, base: float = 500.0) -> Level:
    return lambda t, _n: base + mib_per_s * t


def flat(base: float = 500.0) -> Level:
    return lambda _t, _n: base
