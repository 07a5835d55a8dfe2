"""What census measures and records: one GPU sample (NVML here or exporters), the process
groups where visible, the leftovers of crashes on this host; a run file and its re-analysis.

This is the part of census that touches the outside world (through `vramdoctor.sources`);
`vramdoctor.census.analysis` stays pure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vramdoctor.census.analysis import Census, census
from vramdoctor.errors import InputError
from vramdoctor.record import Run, RunWriter, make_header
from vramdoctor.samples import CONTEXT_MIB, GpuSample, now
from vramdoctor.sources.leftovers import Leftovers

__all__ = ["reanalyse", "record", "take_leftovers", "take_sample"]


def take_sample(
    exporters: list[str], gpus: list[int] | None, *, need_gpu: bool = True
) -> tuple[GpuSample, dict[int, int], list[dict[str, Any]]]:
    """One GPU sample from NVML here or from the exporters, plus server groups where visible.

    `need_gpu=False` (census --only-leftovers): an empty sample (source "none") without
    touching NVML."""
    if not need_gpu:
        t, wall = now()
        return GpuSample(t=t, wall=wall, source="none"), {}, []
    if exporters:
        from vramdoctor.sources.exporter import ExporterSource

        with ExporterSource(exporters) as src:
            sample = src.sample()
        devices = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "total_mib": g.total_mib,
                "host": g.host,
            }
            for g in sample.gpus
        ]
        return sample, {}, devices
    from vramdoctor.sources.nvml import NvmlSource
    from vramdoctor.sources.procinfo import server_groups

    with NvmlSource(gpus) as src:
        sample = src.sample()
        devices = src.devices()
    groups = server_groups(sorted({p.pid for p in sample.processes if p.visible}))
    return sample, groups, devices


def take_leftovers(shm_dir: str, sample: GpuSample) -> Leftovers:
    """What crashes left on this host (the GPU sample's processes for orphaned GPU memory)."""
    from vramdoctor.sources.leftovers import scan

    return scan(shm_dir, gpu_sample=sample if sample.source == "nvml" else None)


def record(
    out: Path,
    sample: GpuSample,
    result: Census,
    *,
    devices: list[dict[str, Any]],
    groups: dict[int, int],
    exporters: list[str],
    shm_dir: str,
    context_mib: tuple[float, float] = CONTEXT_MIB,
) -> None:
    """Write a census run file: the header (GPUs, settings, groups), the sample, the result
    (with its leftovers, which cannot be derived again from the sample)."""
    header = make_header(
        "census",
        target=", ".join(exporters) or None,
        gpus=devices,
        config={
            "context_mib": list(context_mib),
            "groups": {str(k): v for k, v in groups.items()},
            "source": sample.source,
            **({"shm_dir": shm_dir} if result.leftovers is not None else {}),
        },
    )
    with RunWriter(out, header) as writer:
        writer.write(sample)
        writer.write({"kind": "result", "census": result.to_dict()})


def reanalyse(run: Run) -> Census:
    """The census of a recorded run: its last GPU sample analysed again with the header's
    settings and groups, and the leftovers it recorded. InputError for a damaged run."""
    samples = run.of(GpuSample)
    if not samples:
        raise InputError(f"{run.path}: the census run holds no GPU sample ({run.status})")
    config = run.header.get("config") or {}
    try:
        lo_hi = tuple(float(x) for x in config.get("context_mib", CONTEXT_MIB))
        groups = {int(k): int(v) for k, v in (config.get("groups") or {}).items()}
    except (TypeError, ValueError):
        raise InputError(f"{run.path}: damaged census settings in the header") from None
    return census(
        samples[-1],
        groups=groups,
        context_mib=(lo_hi[0], lo_hi[1]),
        leftovers=_recorded_leftovers(run),
    )


def _recorded_leftovers(run: Run) -> Leftovers | None:
    """The leftovers a census run recorded (its result record), None when it looked at none."""
    for rec in run.raw("result"):
        data = (rec.get("census") or {}).get("leftovers")
        if isinstance(data, dict):
            try:
                return Leftovers.from_dict(data)
            except (TypeError, ValueError, KeyError):
                raise InputError(f"{run.path}: damaged leftovers in the census result") from None
    return None
