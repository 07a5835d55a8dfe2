"""A stand-in NVIDIA driver library under the REAL pynvml binding (nvidia-ml-py).

pynvml calls the driver through `getattr(pynvml.nvmlLib, "nvmlSomething")(ctypes args)`. This
module installs, as `pynvml.nvmlLib`, an object whose attributes are Python functions with the
driver's C signatures: they read and fill the binding's own ctypes structures (memory info v1
and v2, process info v3, memory limits v1, MIG handles) and return NVML status codes. So the
binding's real code runs (struct versions, the two-call process list, error classes) against
drivers of different ages: a symbol the driver lacks is an attribute the object lacks, which
pynvml turns into NVMLError_FunctionNotFound as it does for a real old driver. A binding that
lacks a function (older nvidia-ml-py) is tested by removing it from the module (monkeypatch).

Only what vramdoctor's NVML source calls is here; sizes are bytes, as NVML gives them.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pynvml

SUCCESS = 0
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_ID = 0xFFFFFFFF
LIMIT_MAX = 0xFFFFFFFFFFFFFFFF
GIB = 1 << 30
MIB = 1 << 20


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None  # None: the driver cannot say (NVML_VALUE_NOT_AVAILABLE)


@dataclass
class FakeMig:
    """One MIG device (a compute instance of a GPU instance)."""

    gpu_instance_id: int
    compute_instance_id: int
    total: int
    used: int
    reserved: int = 0
    profile: str = "1g.18gb"
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeGpu:
    total: int
    used: int
    reserved: int = 615 * MIB
    name: str = "NVIDIA H200"
    processes: list[FakeProcess] = field(default_factory=list)
    migs: list[FakeMig] | None = None  # None: MIG mode off
    # (soft, hard, current used) for nvmlDeviceGetMemoryLimits_v1; None: no partition set
    limits: tuple[int, int, int] | None = None
    # the cgroup path NVML was asked about last (nameSpace)
    asked_cgroups: list[str | None] = field(default_factory=list)


def _out(arg: Any) -> Any:
    """The ctypes object behind a byref() argument."""
    return getattr(arg, "_obj", arg)


def _set_handle(arg: Any, value: int) -> None:
    target = _out(arg)
    ctypes.cast(ctypes.pointer(target), ctypes.POINTER(ctypes.c_void_p))[0] = value


def _handle(arg: Any) -> int:
    return int(ctypes.cast(arg, ctypes.c_void_p).value or 0)


class FakeDriver:
    """The driver's symbols for `gpus`. `missing` names symbols this driver does not export."""

    def __init__(self, gpus: list[FakeGpu], *, missing: tuple[str, ...] = ()) -> None:
        self.gpus = gpus
        self.calls: list[str] = []
        self._devices: dict[int, tuple[FakeGpu, FakeMig | None]] = {}
        for i, gpu in enumerate(gpus):
            self._devices[0x1000 + i * 0x100] = (gpu, None)
            for j, mig in enumerate(gpu.migs or []):
                self._devices[0x1000 + i * 0x100 + j + 1] = (gpu, mig)
        self._symbols: dict[str, Callable[..., Any]] = {
            name[4:]: getattr(self, name) for name in dir(self) if name.startswith("sym_")
        }
        for name in missing:
            self._symbols.pop(name, None)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        symbols = self.__dict__.get("_symbols", {})
        if name not in symbols:
            raise AttributeError(name)
        fn = symbols[name]

        def call(*args: Any) -> Any:
            self.calls.append(name)
            return fn(*args)

        return call

    def _device(self, handle: Any) -> tuple[FakeGpu, FakeMig | None]:
        return self._devices[_handle(handle)]

    # -- the driver's symbols (sym_<C name>) -------------------------------------------------
    def sym_nvmlInitWithFlags(self, flags: Any) -> int:
        return SUCCESS

    def sym_nvmlInit_v2(self) -> int:
        return SUCCESS

    def sym_nvmlShutdown(self) -> int:
        return SUCCESS

    def sym_nvmlErrorString(self, code: Any) -> bytes:
        return f"fake NVML error {int(getattr(code, 'value', code))}".encode()

    def sym_nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = b"615.18.01"
        return SUCCESS

    def sym_nvmlDeviceGetCount_v2(self, count: Any) -> int:
        _out(count).value = len(self.gpus)
        return SUCCESS

    def sym_nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        i = int(getattr(index, "value", index))
        if not 0 <= i < len(self.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _set_handle(device, 0x1000 + i * 0x100)
        return SUCCESS

    def sym_nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        gpu, mig = self._device(handle)
        i = self.gpus.index(gpu)
        text = f"GPU-0000000{i}-1111-2222-3333-444455556666"
        if mig is not None:
            text = f"MIG-0000000{i}-{mig.gpu_instance_id:04d}-{mig.compute_instance_id:04d}"
        buf.value = text.encode()
        return SUCCESS

    def sym_nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        gpu, mig = self._device(handle)
        buf.value = (gpu.name + (f" MIG {mig.profile}" if mig else "")).encode()
        return SUCCESS

    def _mem(self, handle: Any) -> tuple[int, int, int]:
        gpu, mig = self._device(handle)
        if mig is not None:
            return mig.total, mig.used, mig.reserved
        return gpu.total, gpu.used, gpu.reserved

    def sym_nvmlDeviceGetMemoryInfo(self, handle: Any, mem: Any) -> int:
        total, used, reserved = self._mem(handle)
        m = _out(mem)
        # v1 counts the driver's reservation as used
        m.total, m.used, m.free = total, used + reserved, total - used - reserved
        return SUCCESS

    def sym_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, mem: Any) -> int:
        total, used, reserved = self._mem(handle)
        m = _out(mem)
        if m.version != pynvml.nvmlMemory_v2:
            return getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25)
        m.total, m.reserved, m.used, m.free = total, reserved, used, total - used - reserved
        return SUCCESS

    def _procs(self, handle: Any, count: Any, array: Any) -> int:
        gpu, mig = self._device(handle)
        rows: list[tuple[FakeProcess, int, int]] = []
        if mig is not None:
            rows = [(p, mig.gpu_instance_id, mig.compute_instance_id) for p in mig.processes]
        elif gpu.migs:  # the parent handle of a MIG GPU lists every instance's processes
            rows = [
                (p, m.gpu_instance_id, m.compute_instance_id) for m in gpu.migs for p in m.processes
            ]
        else:
            rows = [(p, NO_ID, NO_ID) for p in gpu.processes]
        c = _out(count)
        if array is None:
            c.value = len(rows)
            return INSUFFICIENT_SIZE if rows else SUCCESS
        for k, (p, gi, ci) in enumerate(rows):
            array[k].pid = p.pid
            array[k].usedGpuMemory = (
                pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                if p.used_bytes is None
                else p.used_bytes
            )
            array[k].gpuInstanceId = gi
            array[k].computeInstanceId = ci
        c.value = len(rows)
        return SUCCESS

    def sym_nvmlDeviceGetComputeRunningProcesses_v3(
        self, handle: Any, count: Any, array: Any
    ) -> int:
        return self._procs(handle, count, array)

    def sym_nvmlDeviceGetGraphicsRunningProcesses_v3(
        self, handle: Any, count: Any, array: Any
    ) -> int:
        _out(count).value = 0
        return SUCCESS

    def sym_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu, mig = self._device(handle)
        if mig is not None:
            return NOT_SUPPORTED
        _out(current).value = _out(pending).value = 1 if gpu.migs is not None else 0
        return SUCCESS

    def sym_nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> int:
        gpu, _ = self._device(handle)
        _out(count).value = 7 if gpu.migs is not None else 0
        return SUCCESS

    def sym_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, mig: Any) -> int:
        gpu, _ = self._device(handle)
        i = int(getattr(index, "value", index))
        if gpu.migs is None or i >= len(gpu.migs):
            return NOT_FOUND
        _set_handle(mig, _handle(handle) + i + 1)
        return SUCCESS

    def sym_nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> int:
        _, mig = self._device(handle)
        _out(out).value = NO_ID if mig is None else mig.gpu_instance_id
        return SUCCESS

    def sym_nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> int:
        _, mig = self._device(handle)
        _out(out).value = NO_ID if mig is None else mig.compute_instance_id
        return SUCCESS

    def sym_nvmlDeviceGetMemoryLimits_v1(self, handle: Any, limits: Any) -> int:
        gpu, mig = self._device(handle)
        if mig is not None:
            return NOT_SUPPORTED  # "MIG handles are not supported"
        lim = _out(limits)
        space = lim.nameSpace  # the binding's structs give char* fields back as str
        gpu.asked_cgroups.append(space.decode() if isinstance(space, bytes) else space or None)
        soft, hard, current = gpu.limits if gpu.limits is not None else (0, LIMIT_MAX, gpu.used)
        lim.softLimit, lim.hardLimit, lim.currentUsed = soft, hard, current
        return SUCCESS


@contextlib.contextmanager
def installed(driver: FakeDriver) -> Iterator[FakeDriver]:
    """Make the real pynvml binding talk to `driver` until the block ends."""
    old_lib = pynvml.nvmlLib
    old_cache = dict(pynvml._nvmlGetFunctionPointer_cache)
    pynvml.nvmlLib = driver
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield driver
    finally:
        pynvml.nvmlLib = old_lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(old_cache)
