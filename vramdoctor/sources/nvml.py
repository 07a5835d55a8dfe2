"""Local GPUs through NVML: device memory and per-process memory, one `GpuSample` a call.

The one module that imports `pynvml` (provided by the official `nvidia-ml-py`). It uses the
newest call the driver has (memory info v2 with `reserved`; process lists v3, then v2, then
v1) and falls back once, not per sample. Indices are NVML's (the order nvidia-smi shows),
which CUDA_VISIBLE_DEVICES does not change. Without NVML it raises `SourceUnavailable`
naming what is missing and the remote source to use instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from vramdoctor.errors import SourceUnavailable
from vramdoctor.samples import MIB, GpuMemory, GpuSample, ProcessGpuMemory, now
from vramdoctor.sources.procinfo import ProcInfoCache

REMOTE_HINT = (
    "watch a GPU host remotely with --gpu-metrics http://HOST:9400/metrics (dcgm-exporter) "
    "or http://HOST:8000/metrics (nvitop-exporter)"
)

_PROCESS_CALLS = {
    "compute": (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ),
    "graphics": (
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ),
}


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise SourceUnavailable(
            "the NVML binding is not installed (pip install nvidia-ml-py); or " + REMOTE_HINT
        ) from None
    if not hasattr(pynvml, "nvmlDeviceGetMemoryInfo"):
        raise SourceUnavailable(
            "the installed `pynvml` module is not NVIDIA's binding: "
            "pip uninstall pynvml && pip install --force-reinstall nvidia-ml-py"
        )
    return pynvml


def _init_failure(pynvml: Any, exc: Exception) -> SourceUnavailable:
    """Turn an nvmlInit failure into one line: what is missing, and what to use instead."""
    kind = type(exc).__name__
    if kind == "NVMLError_LibraryNotFound":
        what = "NVML is not available here: the NVIDIA driver library (libnvidia-ml.so.1) was not found, so this machine has no usable NVIDIA driver"
    elif kind == "NVMLError_DriverNotLoaded":
        what = "NVML is not available here: the NVIDIA kernel driver is not loaded"
    elif kind == "NVMLError_NoPermission":
        what = "NVML refused access to the GPUs (no permission on /dev/nvidia*)"
    elif kind == "NVMLError_LibRmVersionMismatch":
        what = "NVML cannot start: the NVIDIA driver and its library differ in version (reboot after a driver update)"
    else:
        what = f"NVML could not start ({exc})"
    return SourceUnavailable(f"{what}; {REMOTE_HINT}")


def nvml_status() -> tuple[bool, str]:
    """(usable, reason): whether NVML starts here. For skipping tests and for `census` hints."""
    try:
        pynvml = _import_pynvml()
    except SourceUnavailable as exc:
        return False, str(exc)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return False, str(_init_failure(pynvml, exc))
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    return (count > 0, f"{count} GPU(s)" if count else "NVML works but sees no GPU")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Samples all (or the chosen) local GPUs. Life cycle: open() -> sample()* -> close().

    Cheap per sample (a few NVML calls per GPU; process names are cached for `proc_ttl_s`).
    Not thread-safe: give each sampling thread its own source.
    """

    name = "nvml"

    def __init__(
        self,
        indices: Sequence[int] | None = None,
        *,
        processes: bool = True,
        proc_ttl_s: float = 5.0,
    ) -> None:
        self._want = list(indices) if indices is not None else None
        self.processes = processes
        self._procs = ProcInfoCache(proc_ttl_s, expect_gpu=True)
        self._nvml: Any = None
        self._handles: list[tuple[int, Any, str | None, str | None]] = []
        self._mem_v2: bool | None = None  # decided on first sample
        self._proc_calls: dict[str, list[str]] = {k: list(v) for k, v in _PROCESS_CALLS.items()}
        self.driver_version: str | None = None

    # -- life cycle ---------------------------------------------------------------------
    def open(self) -> NvmlSource:
        if self._nvml is not None:
            return self
        pynvml = _import_pynvml()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise _init_failure(pynvml, exc) from None
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            wanted = self._want if self._want is not None else list(range(count))
            bad = [i for i in wanted if not 0 <= i < count]
            if bad:
                raise SourceUnavailable(
                    f"no GPU with index {', '.join(map(str, bad))}: NVML sees {count} GPU(s) (0-{count - 1})"
                )
            for index in wanted:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                self._handles.append(
                    (
                        index,
                        handle,
                        self._safe(pynvml.nvmlDeviceGetUUID, handle),
                        self._safe(pynvml.nvmlDeviceGetName, handle),
                    )
                )
            self.driver_version = self._safe(pynvml.nvmlSystemGetDriverVersion)
        except pynvml.NVMLError as exc:
            self.close()
            raise SourceUnavailable(
                f"NVML failed while listing GPUs: {exc}; {REMOTE_HINT}"
            ) from None
        except SourceUnavailable:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self._nvml = None
            self._handles = []

    def __enter__(self) -> NvmlSource:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ------------------------------------------------------------------------
    def _safe(self, fn: Any, *args: Any) -> str | None:
        try:
            return _text(fn(*args))
        except self._nvml.NVMLError:
            return None

    def devices(self) -> list[dict[str, Any]]:
        """Static description of the sampled GPUs, for a run header."""
        self.open()
        out = []
        for index, handle, uuid, name in self._handles:
            total = self._memory(handle)[0]
            out.append(
                {
                    "index": index,
                    "uuid": uuid,
                    "name": name,
                    "total_mib": round(total / MIB, 1),
                    "driver": self.driver_version,
                }
            )
        return out

    def _memory(self, handle: Any) -> tuple[int, int, int, int | None]:
        """(total, used, free, reserved or None) in bytes, v2 where the driver has it."""
        pynvml = self._nvml
        if self._mem_v2 is not False:
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
                self._mem_v2 = True
                return mem.total, mem.used, mem.free, mem.reserved
            except (
                pynvml.NVMLError_FunctionNotFound,
                pynvml.NVMLError_NotSupported,
                pynvml.NVMLError_InvalidArgument,
                getattr(
                    pynvml, "NVMLError_ArgumentVersionMismatch", pynvml.NVMLError_InvalidArgument
                ),
                AttributeError,
                TypeError,
            ):
                # Old driver or old binding: no v2 struct. Remember and use v1 from now on.
                self._mem_v2 = False
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return mem.total, mem.used, mem.free, None

    def _process_list(self, handle: Any, kind: str) -> list[Any]:
        pynvml = self._nvml
        calls = self._proc_calls[kind]
        while calls:
            fn = getattr(pynvml, calls[0], None)
            if fn is None:
                calls.pop(0)
                continue
            try:
                return list(fn(handle))
            except pynvml.NVMLError_FunctionNotFound:
                calls.pop(0)  # the driver lacks this version; try the older one
            except pynvml.NVMLError_NotSupported:
                return []  # e.g. graphics lists on some vGPU / MIG setups
        return []

    def sample(self) -> GpuSample:
        """One reading of every sampled GPU and, unless disabled, its processes."""
        self.open()
        pynvml = self._nvml
        t, wall = now()
        gpus: list[GpuMemory] = []
        procs: list[ProcessGpuMemory] = []
        for index, handle, uuid, name in self._handles:
            try:
                total, used, free, reserved = self._memory(handle)
            except pynvml.NVMLError as exc:
                if type(exc).__name__ == "NVMLError_GpuIsLost":
                    raise SourceUnavailable(
                        f"GPU {index} fell off the bus (NVML: GPU is lost)"
                    ) from None
                raise SourceUnavailable(f"NVML failed reading GPU {index} memory: {exc}") from None
            gpus.append(
                GpuMemory(
                    index=index,
                    total_mib=total / MIB,
                    used_mib=used / MIB,
                    free_mib=free / MIB,
                    uuid=uuid,
                    name=name,
                    driver_reserved_mib=None if reserved is None else reserved / MIB,
                )
            )
            if self.processes:
                procs.extend(self._processes(index, handle))
        return GpuSample(t=t, wall=wall, source=self.name, gpus=gpus, processes=procs)

    def _processes(self, index: int, handle: Any) -> list[ProcessGpuMemory]:
        rows: dict[int, ProcessGpuMemory] = {}
        for kind in ("compute", "graphics"):
            try:
                entries = self._process_list(handle, kind)
            except self._nvml.NVMLError:
                continue
            for entry in entries:
                pid = int(entry.pid)
                used = entry.usedGpuMemory
                used_mib = None if used is None else used / MIB
                if pid in rows:  # a process in both lists ("C+G"): one row
                    row = rows[pid]
                    row.kind = "compute+graphics"
                    if row.used_mib is None:
                        row.used_mib = used_mib
                    continue
                info = self._procs.get(pid)
                rows[pid] = ProcessGpuMemory(
                    pid=pid,
                    gpu=index,
                    used_mib=used_mib,
                    name=info.name,
                    cmdline=info.cmdline,
                    kind=kind,
                    visible=info.visible,
                )
        return list(rows.values())
