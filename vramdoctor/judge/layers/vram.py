"""The VRAM layer: each GPU and each process on it, as the driver charges memory (NVML).

PyTorch's caching allocator keeps freed blocks, so VRAM that rises in the first rounds and
stays is caching; VRAM that grows every round with the requests is a leak. Each process on
each GPU decides (NVML, nvitop-exporter), and so does each GPU's total (the only series a
dcgm-exporter gives; with processes listed it also catches what no single process shows, e.g.
workers that pile up, each flat on its own). A process present for fewer than two settled
rounds (a worker that started and exited, a compile helper) is reported and never decides;
the memory of processes that exited is taken out of their GPU's total before it is judged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vramdoctor.judge.results import (
    C_TENANTS_IN_DEVICE,
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    R_GREW_WITH_TIME,
    R_NO_LEVEL,
    R_TRANSIENT,
    RANK,
    STABLE,
    VRAM,
    X_STRAY_CONTEXT,
    Culprit,
    LayerResult,
    Projection,
    SeriesResult,
    Thresholds,
)
from vramdoctor.samples import CONTEXT_MIB, GpuSample
from vramdoctor.verdicts import Evidence

if TYPE_CHECKING:
    from vramdoctor.judge.inside import InsideEvidence
    from vramdoctor.judge.layers import LayerContext
    from vramdoctor.judge.series import Series


def _main_gpus(series: list[SeriesResult]) -> dict[int | None, int | None]:
    """pid -> the GPU where the process holds most memory (the first, on a tie)."""
    best: dict[int | None, tuple[int | None, float]] = {}
    for s in series:
        if (
            s.kind == "gpu_process"
            and s.last is not None
            and (s.pid not in best or s.last > best[s.pid][1])
        ):
            best[s.pid] = (s.gpu, s.last)
    return {pid: gpu for pid, (gpu, _) in best.items()}


def stray_contexts(
    series: list[SeriesResult], lo: float = CONTEXT_MIB[0], hi: float = CONTEXT_MIB[1]
) -> list[SeriesResult]:
    """Context-sized footprints of a process on a GPU that is not its main one."""
    main = _main_gpus(series)
    return [
        s
        for s in series
        if s.kind == "gpu_process"
        and s.last is not None
        and lo <= s.last <= hi
        and main.get(s.pid) is not None
        and main[s.pid] != s.gpu
    ]


def last_free_mib(
    records: list[Any], gpu: int | None, gpu_instance: int | None = None
) -> float | None:
    """The GPU's (or MIG slice's) free MiB at its last sample (any GPU's when `gpu` is None):
    up to what the processes can reach (`GpuMemory.reachable_mib`: a cgroup's limit, the
    driver's reserve taken out) where the source says it, else the free memory."""
    for r in reversed(records):
        if isinstance(r, GpuSample):
            for g in r.gpus:
                if gpu is not None and (
                    g.index != gpu or getattr(g, "gpu_instance_id", None) != gpu_instance
                ):
                    continue
                reach = getattr(g, "reachable_mib", None)
                if isinstance(reach, (int, float)) and math.isfinite(reach) and reach > 0:
                    return max(0.0, min(float(reach) - g.used_mib, g.free_mib))
                return g.free_mib
    return None


def time_driven_rate(lay: LayerResult, top: SeriesResult) -> None:
    """A leak that grows with time (also while idle): its rate per hour, and hours to the
    layer's capacity at it (time-driven, so no production request rate is needed); the
    projection in requests is dropped (the per-request rate is only an average at the soak's
    load)."""
    if top.reason != R_GREW_WITH_TIME or top.time_rate_per_s is None:
        return
    lay.rate_per_hour = top.time_rate_per_s * 3600.0
    if lay.projection is not None:
        left = lay.projection.capacity_left
        lay.projection.requests = None
        lay.projection.hours = (
            left / lay.rate_per_hour if left is not None and lay.rate_per_hour > 0 else None
        )


def worst(series: list[SeriesResult]) -> str | None:
    if not series:
        return None
    top = max(RANK.get(s.verdict, 2) for s in series)
    return next(k for k, v in RANK.items() if v == top)


def main_series(series: list[SeriesResult], verdict: str) -> SeriesResult | None:
    """The series that carries a verdict: the fastest-growing one (by rate for LEAK)."""
    cands = [s for s in series if s.verdict == verdict]
    if not cands:
        return None

    def size(s: SeriesResult) -> float:
        if verdict == LEAK and s.slope_per_request is not None:
            return s.slope_per_request
        return abs(s.growth or 0.0)

    # A process names a culprit better than a device total.
    pref = {"gpu_process": 0, "gpu": 1}
    return min(cands, key=lambda s: (pref.get(s.kind, 3), -size(s)))


def _inside_decides(
    mine: list[SeriesResult], inside: InsideEvidence | None, th: Thresholds
) -> set[str]:
    """Let the CUDA allocator's own counters decide each server process they cover (its main
    GPU's series); the keys of the series they decided."""
    if inside is None:
        return set()
    main = _main_gpus(mine)
    decided: set[str] = set()
    for s in mine:
        if s.kind != "gpu_process" or not s.decides or s.scope == "tenant":
            continue
        if inside.decide_vram(s, th, main_gpu=main.get(s.pid) == s.gpu):
            decided.add(s.key)
    return decided


def _explained_devices(mine: list[SeriesResult], decided: set[str], th: Thresholds) -> None:
    """A device total whose every server process was decided from inside as not leaking, and
    whose growth those processes' growth accounts for, is explained by them: evidence only.
    (Workers that pile up are new processes the agent did not cover: the total still decides.)"""
    for dev in (s for s in mine if s.kind == "gpu" and s.decides and s.verdict != STABLE):
        procs = [
            s
            for s in mine
            if s.kind == "gpu_process"
            and s.gpu == dev.gpu
            and s.gpu_instance == dev.gpu_instance
            and s.decides
            and s.scope != "tenant"
        ]
        if not procs or not all(p.key in decided and p.verdict != LEAK for p in procs):
            continue
        held = sum(p.growth or 0.0 for p in procs)
        if (dev.growth or 0.0) <= held + th.min_growth_mib:
            dev.decides = False
            dev.explanation = procs[0].explanation


def _tenants(mine: list[SeriesResult]) -> list[str]:
    """Other tenants' process series on the server's GPUs, the fastest-growing first."""
    ten = [s for s in mine if s.scope == "tenant" and s.kind == "gpu_process"]
    return [s.key for s in sorted(ten, key=lambda s: (-(s.growth or 0.0), s.key))]


def vram_layer(
    series: list[SeriesResult],
    records: list[Any],
    life: int,
    *,
    inside: InsideEvidence | None = None,
    th: Thresholds | None = None,
) -> LayerResult:
    """The VRAM verdict of one life from its judged series (series of other layers ignored).
    `inside`: the agent's counters (decide the processes they cover); other tenants'
    processes are listed (`LayerResult.tenants`) and never decide."""
    th = th or Thresholds()
    mine = [s for s in series if s.layer == VRAM and s.kind in ("gpu", "gpu_process")]
    if not mine:
        return LayerResult(VRAM, NOT_MEASURED, R_NO_LEVEL, "MiB", life=life)
    decided = _inside_decides(mine, inside, th)
    _explained_devices(mine, decided, th)
    if inside is not None:  # the agent's counters: evidence beside the outside series
        mine += [s for s in inside.series.values() if s.layer == VRAM]
    deciding = [s for s in mine if s.decides]
    strays = stray_contexts([s for s in mine if s.scope != "tenant"])
    verdict = worst(deciding)
    tenants = _tenants(mine)
    caveats = _device_caveats(mine)
    if verdict is None:
        mine.sort(key=_order)
        return LayerResult(
            VRAM,
            INCONCLUSIVE,
            R_TRANSIENT,
            "MiB",
            series=mine,
            life=life,
            stray_contexts=[s.key for s in strays],
            tenants=tenants,
            caveats=caveats,
        )
    top = main_series(deciding, verdict)
    assert top is not None
    lay = LayerResult(
        VRAM,
        verdict,
        top.reason,
        "MiB",
        growth=top.growth,
        stray_contexts=[s.key for s in strays],
        life=life,
        explanation=top.explanation,
        decided_by=top.decided_by or Evidence.ROUNDS,
        tenants=tenants,
        caveats=caveats,
    )
    lay.main_series = top.key
    if verdict == LEAK:
        _leak(lay, top, strays, records, inside)
    mine.sort(key=lambda s: (not s.decides, *_order(s)))
    lay.series = mine
    return lay


def _device_caveats(mine: list[SeriesResult]) -> list[str]:
    """A device total decides with no per-process rows to take other tenants out of it."""
    devices = [s for s in mine if s.kind == "gpu" and s.decides]
    procs = [s for s in mine if s.kind == "gpu_process"]
    return [C_TENANTS_IN_DEVICE] if devices and not procs else []


def _leak(
    lay: LayerResult,
    top: SeriesResult,
    strays: list[SeriesResult],
    records: list[Any],
    inside: InsideEvidence | None,
) -> None:
    """The culprit, rate and projection of a VRAM leak."""
    cause = (
        X_STRAY_CONTEXT
        if top in strays
        else "outside_allocator"
        if top.evidence_kind == "gpu_outside"
        else "allocator"
    )
    held = (
        [h.to_dict() for h in inside.held_by.get(top.pid, ()) if h.memory == "cuda"]
        if (inside is not None and top.pid is not None)
        else []
    )
    lay.culprit = Culprit(
        top.key,
        pid=top.pid,
        name=top.name,
        gpu=top.gpu,
        cause=cause,
        gpu_instance=top.gpu_instance,
        device=top.device,
        held_by=held,
    )
    lay.rate_per_request = top.slope_per_request
    lay.rate_ci = top.slope_ci
    lay.rate_mib_per_request = top.slope_per_request
    free = last_free_mib(records, top.gpu, top.gpu_instance)
    rate = top.slope_per_request
    lay.projection = Projection(
        capacity_left=free,
        capacity_of="gpu_free",
        requests=free / rate if free is not None and rate and rate > 0 else None,
    )
    time_driven_rate(lay, top)


def _order(s: SeriesResult) -> tuple[int, float, str]:
    order = {"gpu": 0, "gpu_process": 1}
    return (order.get(s.kind, 3), -(s.growth or 0.0), s.key)


class VramLayer:
    """The VRAM layer behind the registry's signature (`vramdoctor.judge.layers.Layer`)."""

    name = VRAM
    unit = "MiB"

    def extract(self, records: Sequence[Any]) -> dict[str, Series]:
        """None of its own: GPU series come from `judge.series.extract_series`."""
        return {}

    def judge(self, ctx: LayerContext) -> LayerResult:
        return vram_layer(ctx.series, list(ctx.records), ctx.life, inside=ctx.inside, th=ctx.th)


LAYER = VramLayer()
