"""`vramdoctor census`: who holds GPU memory on which GPU, with the shapes that point at a cause.

`analysis` groups the processes NVML or an exporter reports and flags multi-GPU holders and
stray CUDA contexts (pure); `report` renders the table. Library use::

    from vramdoctor.census import census
    result = census(gpu_sample)        # a vramdoctor.samples.GpuSample
    result.flags, result.exit_code
"""

from __future__ import annotations

from vramdoctor.census.analysis import SCHEMA, Census, Flag, GpuRow, ProcessRow, census, role_of

__all__ = ["SCHEMA", "Census", "Flag", "GpuRow", "ProcessRow", "census", "role_of"]
