"""Per-process GPU memory as the driver charges it, through vramdoctor.sources.nvml.

The worker asks "how much does *this* process hold on its GPU" after every request; the IPC
arm asks for every process on every GPU. Both go through NvmlSource (the one module that
talks to NVML).
"""

from __future__ import annotations

import os
from typing import Any

from vramdoctor.samples import GpuSample


class ProcessMemory:
    """NVML used MiB of one process on one GPU (None where NVML cannot attribute it)."""

    def __init__(self, gpu: int, pid: int | None = None) -> None:
        from vramdoctor.sources.nvml import NvmlSource

        self.gpu = gpu
        self.pid = os.getpid() if pid is None else pid
        self._source = NvmlSource([gpu]).open()

    def read(self) -> tuple[float | None, float]:
        """(this process's MiB on the GPU or None, the GPU's used MiB)."""
        sample = self._source.sample()
        return process_mib(sample, self.pid, self.gpu), sample.gpus[0].used_mib

    def close(self) -> None:
        self._source.close()


def process_mib(sample: GpuSample, pid: int, gpu: int) -> float | None:
    for row in sample.processes:
        if row.pid == pid and row.gpu == gpu:
            return row.used_mib
    return None


def census() -> dict[str, Any]:
    """Every process on every GPU, now (a GpuSample as a dict)."""
    from vramdoctor.sources.nvml import NvmlSource

    with NvmlSource() as source:
        return source.sample().to_dict()
