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

from typing import Any

from vramdoctor.census.analysis import CONTEXT_MIB
from vramdoctor.judge.results import (
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    R_GREW_WITH_TIME,
    R_NO_LEVEL,
    R_TRANSIENT,
    RANK,
    VRAM,
    X_STRAY_CONTEXT,
    Culprit,
    LayerResult,
    Projection,
    SeriesResult,
)
from vramdoctor.samples import GpuSample


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


def last_free_mib(records: list[Any], gpu: int | None) -> float | None:
    """The GPU's free MiB at its last sample (any GPU's when `gpu` is None)."""
    for r in reversed(records):
        if isinstance(r, GpuSample):
            for g in r.gpus:
                if gpu is None or g.index == gpu:
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


def vram_layer(series: list[SeriesResult], records: list[Any], life: int) -> LayerResult:
    """The VRAM verdict of one life from its judged series (series of other layers ignored)."""
    mine = [s for s in series if s.layer == VRAM]
    if not mine:
        return LayerResult(VRAM, NOT_MEASURED, R_NO_LEVEL, "MiB", life=life)
    deciding = [s for s in mine if s.decides]
    strays = stray_contexts(mine)
    verdict = worst(deciding)
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
    )
    lay.main_series = top.key
    if verdict == LEAK:
        cause = X_STRAY_CONTEXT if top in strays else "allocator"
        lay.culprit = Culprit(top.key, pid=top.pid, name=top.name, gpu=top.gpu, cause=cause)
        lay.rate_per_request = top.slope_per_request
        lay.rate_ci = top.slope_ci
        lay.rate_mib_per_request = top.slope_per_request
        free = last_free_mib(records, top.gpu)
        rate = top.slope_per_request
        lay.projection = Projection(
            capacity_left=free,
            capacity_of="gpu_free",
            requests=free / rate if free is not None and rate and rate > 0 else None,
        )
        time_driven_rate(lay, top)
    mine.sort(key=lambda s: (not s.decides, *_order(s)))
    lay.series = mine
    return lay


def _order(s: SeriesResult) -> tuple[int, float, str]:
    order = {"gpu": 0, "gpu_process": 1}
    return (order.get(s.kind, 3), -(s.growth or 0.0), s.key)
