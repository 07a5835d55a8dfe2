"""Local GPUs through NVML: device memory and per-process memory, one `GpuSample` a call.

The one module that imports `pynvml` (provided by the official `nvidia-ml-py`). It uses the
newest call the driver has (memory info v2 with `reserved`; process lists v3, then v2, then
v1) and falls back once, not per sample. Every call newer than the oldest binding we support
(nvidia-ml-py 12.535) is looked up with getattr and its absence, or the driver's
NVMLError_FunctionNotFound, is a fallback, never a crash. Indices are NVML's (the order
nvidia-smi shows), which CUDA_VISIBLE_DEVICES does not change. Without NVML it raises
`SourceUnavailable` naming what is missing and the remote source to use instead.

- Memory partitions (driver R615 / nvidia-ml-py 13.615.71): inside a container whose cgroup
  has a GPU memory limit, `nvmlDeviceGetMemoryInfo_v2` reports the partition and
  `nvmlDeviceGetMemoryLimits_v1` (for the cgroup given as its sysfs path) its soft and hard
  limits; no limit is softLimit 0 and hardLimit NVML_DEVICE_MEMORY_LIMIT_MAX. Each GPU row
  carries `reachable_mib` (the most its processes can hold: the hard limit, else total minus
  driver-reserved) and `reachable_by` (which of those it is), read every `limits_ttl_s`.
  MIG handles have no limits (NVML: "MIG handles are not supported").
- MIG: a GPU in MIG mode is read through its MIG device handles; one GPU row per GPU
  instance (its compute instances share its memory) with `gpu_instance_id` and the profile,
  and each process row with the GPU and compute instance it runs on.
- Whose process: with `server_pids` (a callable giving the server's pids, e.g. the port
  owner's tree), each process row says scope "server" or "tenant"; uid, user name, parent pid
  and the server's own name for the process (`title_role`) are read where visible.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from vramdoctor import servers
from vramdoctor.errors import SourceUnavailable
from vramdoctor.samples import (
    MIB,
    SCOPE_SERVER,
    SCOPE_TENANT,
    GpuMemory,
    GpuSample,
    ProcessGpuMemory,
    now,
)
from vramdoctor.sources.procinfo import ProcInfoCache

REMOTE_HINT = (
    "for a GPU host elsewhere, read its exporter: --gpu-metrics "
    "http://HOST:9400/metrics (dcgm-exporter) or http://HOST:8000/metrics (nvitop-exporter)"
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


# NVML's "no limit" hard limit (pynvml NVML_DEVICE_MEMORY_LIMIT_MAX, 13.615.71).
LIMIT_MAX = 0xFFFFFFFFFFFFFFFF
# NVML reports 0xFFFFFFFF for a process's GPU/compute instance id on a GPU without MIG.
_NO_ID = 0xFFFFFFFF
_MIG_PROFILE = re.compile(r"MIG (\S+)")


def cgroup_path(
    pid: int | str = "self", proc: str = "/proc", root: str = "/sys/fs/cgroup"
) -> str | None:
    """The sysfs path of a process's cgroup (v2 unified hierarchy), for NVML's memory limits.

    `/proc/PID/cgroup` line `0::/kubepods/...` -> `/sys/fs/cgroup/kubepods/...`; None when the
    process has no v2 cgroup line or the file cannot be read."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "" and path.startswith("/"):
            return root.rstrip("/") + (path if path != "/" else "")
    return None


@dataclass(frozen=True)
class MemoryLimit:
    """A cgroup's GPU memory limits on one device, bytes (None = no limit of that kind)."""

    cgroup: str | None
    soft_bytes: int | None
    hard_bytes: int | None
    current_used_bytes: int | None


def read_memory_limit(pynvml: Any, handle: Any, cgroup: str | None) -> MemoryLimit | None:
    """`nvmlDeviceGetMemoryLimits_v1` for one device and cgroup, or None where the binding
    or the driver lacks it, or it fails (no partition, a MIG handle, permissions)."""
    fn = getattr(pynvml, "nvmlDeviceGetMemoryLimits_v1", None)
    struct = getattr(pynvml, "c_nvmlGetMemoryLimits_v1_t", None)
    if fn is None or struct is None:
        return None
    limits = struct()
    if cgroup is not None:
        limits.nameSpace = cgroup.encode()
    try:
        fn(handle, limits)
    except pynvml.NVMLError:
        return None
    soft, hard = int(limits.softLimit), int(limits.hardLimit)
    return MemoryLimit(
        cgroup=cgroup,
        soft_bytes=soft if soft > 0 else None,
        hard_bytes=hard if 0 < hard < LIMIT_MAX else None,
        current_used_bytes=int(limits.currentUsed),
    )


def reachable(
    total: int, reserved: int | None, limit: MemoryLimit | None
) -> tuple[float, str, float | None]:
    """(reachable MiB, what it rests on, soft limit MiB) for one GPU. Pure.

    The hard limit of the cgroup caps what the processes can hold; without one, what is left
    after the driver's reservation (memory info v2, which reports a container's partition),
    else the total (v1)."""
    usable = total - (reserved or 0)
    soft = None if limit is None or limit.soft_bytes is None else limit.soft_bytes / MIB
    if limit is not None and limit.hard_bytes is not None and limit.hard_bytes < usable:
        where = f" of cgroup {limit.cgroup}" if limit.cgroup else ""
        return (
            limit.hard_bytes / MIB,
            f"NVML hard memory limit{where} (nvmlDeviceGetMemoryLimits_v1)",
            soft,
        )
    if reserved is not None:
        return usable / MIB, "NVML memory info v2: total minus driver-reserved", soft
    return total / MIB, "NVML memory info: total", soft


@dataclass
class _Device:
    """One sampled device: a whole GPU, or one MIG device (a compute instance) of a GPU."""

    index: int
    handle: Any
    uuid: str | None
    name: str | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def mig_profile(self) -> str | None:
        m = _MIG_PROFILE.search(self.name or "") if self.gpu_instance_id is not None else None
        return m.group(1) if m else None


class NvmlSource:
    """Samples all (or the chosen) local GPUs. Life cycle: open() -> sample()* -> close().

    Cheap per sample (a few NVML calls per GPU; process names are cached for `proc_ttl_s`,
    memory limits for `limits_ttl_s`). `server_pids()` (optional) gives the pids that are the
    server's at each sample (scope "server"; every other process row is a "tenant"); the
    memory limits are those of `limit_pid`'s cgroup (default: this process's). Not
    thread-safe: give each sampling thread its own source.
    """

    name = "nvml"

    def __init__(
        self,
        indices: Sequence[int] | None = None,
        *,
        processes: bool = True,
        proc_ttl_s: float = 5.0,
        server_pids: Callable[[], Collection[int]] | None = None,
        limit_pid: int | str = "self",
        limits_ttl_s: float = 30.0,
        expect_gpu_open: bool = True,
    ) -> None:
        self._want = list(indices) if indices is not None else None
        self.processes = processes
        # expect_gpu_open: a PID NVML reports is taken for the local process of that number
        # only when it holds /dev/nvidia* open (containers see host PIDs). False where the PIDs
        # are known to be this namespace's (no /dev/nvidia* visible, a stand-in driver).
        self._procs = ProcInfoCache(proc_ttl_s, expect_gpu=expect_gpu_open)
        self._nvml: Any = None
        self._handles: list[tuple[int, Any, str | None, str | None]] = []
        # Per GPU index: its MIG devices when the GPU is in MIG mode, else [].
        self._mig: dict[int, list[_Device]] = {}
        self._mem_v2: bool | None = None  # decided on first sample
        self.server_pids = server_pids
        self.limit_pid = limit_pid
        self.limits_ttl_s = limits_ttl_s
        self._limits: dict[int, MemoryLimit | None] = {}
        self._limits_at = -1e18
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
                self._mig[index] = self._mig_devices(index, handle)
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
            self._mig = {}

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

    def _mig_devices(self, index: int, handle: Any) -> list[_Device]:
        """The MIG devices of a GPU in MIG mode ([] otherwise, or where the binding or driver
        cannot tell)."""
        pynvml = self._nvml
        mode = getattr(pynvml, "nvmlDeviceGetMigMode", None)
        count = getattr(pynvml, "nvmlDeviceGetMaxMigDeviceCount", None)
        by_index = getattr(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", None)
        if mode is None or count is None or by_index is None:
            return []
        try:
            if int(mode(handle)[0]) != 1:  # NVML_DEVICE_MIG_ENABLE
                return []
            slots = int(count(handle))
        except pynvml.NVMLError:
            return []
        out: list[_Device] = []
        for slot in range(slots):
            try:
                mig = by_index(handle, slot)
            except pynvml.NVMLError:
                continue  # NVMLError_NotFound: an empty slot
            out.append(
                _Device(
                    index=index,
                    handle=mig,
                    uuid=self._safe(pynvml.nvmlDeviceGetUUID, mig),
                    name=self._safe(pynvml.nvmlDeviceGetName, mig),
                    gpu_instance_id=self._id(
                        getattr(pynvml, "nvmlDeviceGetGpuInstanceId", None), mig
                    ),
                    compute_instance_id=self._id(
                        getattr(pynvml, "nvmlDeviceGetComputeInstanceId", None), mig
                    ),
                )
            )
        return out

    def _id(self, fn: Any, handle: Any) -> int | None:
        if fn is None:
            return None
        try:
            value = int(fn(handle))
        except self._nvml.NVMLError:
            return None
        return None if value == _NO_ID else value

    def _limit(self, index: int, handle: Any) -> MemoryLimit | None:
        """The cgroup's memory limit on this GPU, re-read every `limits_ttl_s`."""
        t = now()[0]
        if t - self._limits_at >= self.limits_ttl_s:
            self._limits = {}
            self._limits_at = t
        if index not in self._limits:
            self._limits[index] = read_memory_limit(self._nvml, handle, cgroup_path(self.limit_pid))
        return self._limits[index]

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
        """One reading of every sampled GPU (or GPU instance) and, unless disabled, its
        processes."""
        self.open()
        t, wall = now()
        gpus: list[GpuMemory] = []
        procs: list[ProcessGpuMemory] = []
        server = set(self.server_pids()) if self.server_pids is not None else None
        for index, handle, uuid, name in self._handles:
            migs = self._mig.get(index) or []
            if migs:
                gpus.extend(self._mig_rows(index, migs))
                if self.processes:
                    for dev in migs:
                        procs.extend(self._processes(index, dev.handle, dev, server))
                continue
            total, used, free, reserved = self._read(index, handle)
            reach, reach_by, soft = reachable(total, reserved, self._limit(index, handle))
            gpus.append(
                GpuMemory(
                    index=index,
                    total_mib=total / MIB,
                    used_mib=used / MIB,
                    free_mib=free / MIB,
                    uuid=uuid,
                    name=name,
                    driver_reserved_mib=None if reserved is None else reserved / MIB,
                    reachable_mib=reach,
                    reachable_by=reach_by,
                    soft_limit_mib=soft,
                )
            )
            if self.processes:
                procs.extend(self._processes(index, handle, None, server))
        return GpuSample(t=t, wall=wall, source=self.name, gpus=gpus, processes=procs)

    def _read(self, index: int, handle: Any) -> tuple[int, int, int, int | None]:
        pynvml = self._nvml
        try:
            return self._memory(handle)
        except pynvml.NVMLError as exc:
            if type(exc).__name__ == "NVMLError_GpuIsLost":
                raise SourceUnavailable(
                    f"GPU {index} fell off the bus (NVML: GPU is lost)"
                ) from None
            raise SourceUnavailable(f"NVML failed reading GPU {index} memory: {exc}") from None

    def _mig_rows(self, index: int, migs: list[_Device]) -> list[GpuMemory]:
        """One row per GPU instance: its compute instances share its memory (and report the
        same figures), so each instance is counted once."""
        rows: dict[int | None, GpuMemory] = {}
        for dev in migs:
            if dev.gpu_instance_id in rows:
                continue
            total, used, free, reserved = self._read(index, dev.handle)
            usable = total - (reserved or 0)
            rows[dev.gpu_instance_id] = GpuMemory(
                index=index,
                total_mib=total / MIB,
                used_mib=used / MIB,
                free_mib=free / MIB,
                uuid=dev.uuid,
                name=dev.name,
                driver_reserved_mib=None if reserved is None else reserved / MIB,
                gpu_instance_id=dev.gpu_instance_id,
                mig_profile=dev.mig_profile,
                reachable_mib=usable / MIB,
                reachable_by="NVML memory info of the MIG device: the GPU instance's memory",
            )
        return list(rows.values())

    def _processes(
        self, index: int, handle: Any, dev: _Device | None, server: set[int] | None
    ) -> list[ProcessGpuMemory]:
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
                title = servers.title_of(info.name, info.cmdline) if info.visible else None
                gi, ci = _instance(entry, "gpuInstanceId"), _instance(entry, "computeInstanceId")
                if dev is not None:
                    gi, ci = dev.gpu_instance_id, dev.compute_instance_id
                rows[pid] = ProcessGpuMemory(
                    pid=pid,
                    gpu=index,
                    used_mib=used_mib,
                    name=info.name,
                    cmdline=info.cmdline,
                    kind=kind,
                    visible=info.visible,
                    scope=None
                    if server is None
                    else (SCOPE_SERVER if pid in server else SCOPE_TENANT),
                    uid=info.uid,
                    username=info.username,
                    ppid=info.ppid,
                    title_role=title.role if title else None,
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                )
        return list(rows.values())


def _instance(entry: Any, attr: str) -> int | None:
    """A process entry's GPU/compute instance id (v2+ structs), None without MIG."""
    value = getattr(entry, attr, None)
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return None if number == _NO_ID else number
