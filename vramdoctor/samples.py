"""The sample types every source produces and every analysis reads.

One vocabulary for all sources: NVML on this host and a dcgm-exporter/nvitop-exporter on
another host both yield a `GpuSample`; a server's /metrics yields a `MetricsSample`; host
memory of the server's processes yields a `HostSample`. Each carries a monotonic timestamp
(for intervals and rates) and a wall-clock one (for humans and cross-host alignment).

Sizes are MiB as floats: NVML reports bytes, DCGM reports MiB, and reports print MiB.

Whose process (COMMON_CONTRACTS section 3): every per-process row (`ProcessGpuMemory`,
`HostProcessMemory`) says its `scope`: "server" (the port owner's process tree, plus --pid) or
"tenant" (anything else on the server's GPUs), None where the source was not told which
processes are the server's (old run files, census); with the process's `uid`, `username` and
parent pid `ppid` where this host can see them, and `title_role`, what the server's own
process title says it is ("vllm worker TP0"). MIG: a GPU row of a MIG slice carries its
`gpu_instance_id` / `compute_instance_id` (and profile); series are keyed by `GpuMemory.key`
/ `ProcessGpuMemory.key` = (gpu index, GPU instance, compute instance), which is the old
single-GPU key `(index, None, None)` when not MIG. These fields are left out of a run file
while they are None, so run files of sources that do not know them stay as they were.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

MIB = 1024 * 1024

# What one process's CUDA context alone holds on a GPU (MiB, low and high; driver, architecture
# and lazy module loading move it): a process whose GPU memory stays inside this band holds a
# context and nothing more. Census names such processes; the VRAM judge uses it for strays.
CONTEXT_MIB = (300.0, 700.0)


# Request outcomes (soak traffic) that mean the server received the request: it may hold memory
# for failed requests too, so leak rates are per request that reached it, not per success.
# "aborted": a streamed request the client closed after its first chunks (--abort-fraction).
REACHED_SERVER = frozenset({"ok", "aborted", "http_error", "timeout"})


def now() -> tuple[float, float]:
    """(monotonic, wall) timestamps taken together."""
    return time.monotonic(), time.time()


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


class _Record:
    """A run-file record: its `kind` tag and its fields; nested types override from_dict."""

    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        return _from_dict(cls, data)


# Fields added after run-file schema vramdoctor.run/2 was in use: written only when known.
_OMIT_WHEN_NONE = frozenset(
    {
        "scope",
        "uid",
        "username",
        "ppid",
        "title_role",
        "gpu_instance_id",
        "compute_instance_id",
        "mig_profile",
        "reachable_mib",
        "reachable_by",
        "soft_limit_mib",
    }
)

# The scopes of a per-process row.
SCOPE_SERVER = "server"
SCOPE_TENANT = "tenant"

GpuKey = tuple[int, "int | None", "int | None"]


def _compact(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if v is not None or k not in _OMIT_WHEN_NONE}


def _mig_label(index: int, gi: int | None, ci: int | None, profile: str | None = None) -> str:
    if gi is None:
        return f"GPU {index}"
    label = f"GPU {index} MIG" + (f" {profile}" if profile else "") + f" GI {gi}"
    return label + (f" CI {ci}" if ci is not None else "")


@dataclass
class GpuMemory:
    """One GPU's device-level memory at one instant."""

    index: int
    total_mib: float
    used_mib: float
    free_mib: float
    uuid: str | None = None
    name: str | None = None
    # NVML v2 memory info: memory the driver reserves (not usable by processes). Run files of
    # schema vramdoctor.run/1 called it `reserved_mib` (vramdoctor.record maps the old name).
    driver_reserved_mib: float | None = None
    host: str | None = None
    pod: str | None = None
    # MIG: this row is one slice of GPU `index` (None on a GPU without MIG). dcgm-exporter
    # labels GPU_I_ID/GPU_I_PROFILE (no compute-instance label); NVML MIG device handles.
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_profile: str | None = None
    # The most memory the processes here can hold on this GPU (or slice), MiB, and what that
    # rests on: an NVML hard limit of the cgroup (nvmlDeviceGetMemoryLimits_v1), else total
    # minus driver-reserved (memory info v2 reports a container's partition), else total.
    # Time to out of memory is counted to this, not to `total_mib`.
    reachable_mib: float | None = None
    reachable_by: str | None = None
    # The cgroup's soft limit (guaranteed before allocations may fail under pressure), MiB.
    soft_limit_mib: float | None = None

    @property
    def key(self) -> GpuKey:
        """(index, GPU instance, compute instance): a series key that keeps MIG slices apart."""
        return (self.index, self.gpu_instance_id, self.compute_instance_id)

    @property
    def label(self) -> str:
        """'GPU 0', or 'GPU 0 MIG 1g.10gb GI 3' for a slice."""
        return _mig_label(
            self.index, self.gpu_instance_id, self.compute_instance_id, self.mig_profile
        )


@dataclass
class ProcessGpuMemory:
    """One process's memory on one GPU, as the driver charges it (context included)."""

    pid: int
    gpu: int
    used_mib: float | None
    name: str | None = None
    cmdline: list[str] | None = None
    # "compute" or "graphics" (the NVML process list it came from).
    kind: str = "compute"
    # False when the PID NVML reports does not exist in our PID namespace (containers):
    # the row is kept, but name and command line cannot be read here.
    visible: bool = True
    host: str | None = None
    # Whose process: "server" or "tenant" (see the module docstring); None = not known.
    scope: str | None = None
    uid: int | None = None
    username: str | None = None
    ppid: int | None = None
    title_role: str | None = None
    # MIG: the slice of GPU `gpu` the process runs on (None without MIG).
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def key(self) -> GpuKey:
        """(gpu index, GPU instance, compute instance) of the memory this row counts."""
        return (self.gpu, self.gpu_instance_id, self.compute_instance_id)

    @property
    def label(self) -> str:
        return _mig_label(self.gpu, self.gpu_instance_id, self.compute_instance_id)


@dataclass
class GpuSample(_Record):
    """All GPUs and their processes at one instant, from one source."""

    kind: ClassVar[str] = "gpu"
    t: float
    wall: float
    source: str
    gpus: list[GpuMemory] = field(default_factory=list)
    processes: list[ProcessGpuMemory] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["gpus"] = [_compact(g) for g in d["gpus"]]
        d["processes"] = [_compact(p) for p in d["processes"]]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSample:
        return cls(
            t=data["t"],
            wall=data["wall"],
            source=data.get("source", "nvml"),
            gpus=[_from_dict(GpuMemory, g) for g in data.get("gpus", [])],
            processes=[_from_dict(ProcessGpuMemory, p) for p in data.get("processes", [])],
        )


@dataclass
class MetricsSample(_Record):
    """A server's /metrics at one instant.

    `values` holds the series that matter for memory under stable names (see
    `vramdoctor.sources.server_metrics`), aggregated over label sets; `raw` keeps every
    series scraped, unknown ones included, as "name{labels}" -> value.
    """

    kind: ClassVar[str] = "metrics"
    t: float
    wall: float
    flavour: str | None
    values: dict[str, float] = field(default_factory=dict)
    raw: dict[str, float] = field(default_factory=dict)
    # KV pools in tokens, one entry per pool the server exposes (SGLang 0.5.23+: full, swa,
    # mamba; vLLM: one pool). Empty when the server exports no usable KV gauge.
    kv: list[KvPoolSample] = field(default_factory=list)
    # The server's own cumulative count of finished requests (SGLang/vLLM request counters),
    # None when it exports none: used to estimate the production request rate.
    requests_total: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricsSample:
        return cls(
            t=data["t"],
            wall=data["wall"],
            flavour=data.get("flavour"),
            values=dict(data.get("values") or {}),
            raw=dict(data.get("raw") or {}),
            kv=[_from_dict(KvPoolSample, k) for k in data.get("kv") or []],
            requests_total=data.get("requests_total"),
        )


@dataclass
class KvPoolSample:
    """One KV-cache pool at one instant, in tokens (the pool's real resolution).

    `used_tokens` follows the server's own accounting: SGLang used = total - available -
    evictable (radix-cached prefixes are evictable, not used); vLLM v1 usage x pool size
    (freed prefix-cached blocks sit in the free queue, not used). A healthy idle server
    (0 running, 0 queued) holds 0 used tokens.
    """

    pool: str  # "full", "swa", "mamba", or "kv" when the server has one unnamed pool
    used_tokens: float | None
    total_tokens: float | None = None
    evictable_tokens: float | None = None
    running_requests: float | None = None
    queued_requests: float | None = None
    # Tokens per page (SGLang page_size, vLLM block_size) and bytes of KV per token, when known.
    page_size_tokens: int | None = None
    bytes_per_token: float | None = None
    # Where used_tokens came from, e.g. "sglang:num_used_tokens" or
    # "vllm:kv_cache_usage_perc*num_gpu_blocks*block_size".
    source: str | None = None


@dataclass
class HostProcessMemory:
    """One server process's host memory at one instant (MiB).

    The kinds come from `/proc/PID/status` (None where it cannot be read: another user, a
    container): `RssAnon` (heap: Python objects, malloc arenas), `RssFile` (mapped libraries
    and files), `RssShmem` (shared memory, CUDA pinned host memory included). The glibc arena
    fields come from `/proc/PID/maps`: heap regions of non-main malloc arenas.
    """

    pid: int
    rss_mib: float
    name: str | None = None
    role: str | None = None
    rss_anon_mib: float | None = None
    rss_file_mib: float | None = None
    rss_shmem_mib: float | None = None
    threads: int | None = None
    # glibc malloc: number of non-main arenas seen in /proc/PID/maps and the address space
    # they reserve (each arena heap is reserved in 64 MiB units). None when maps is unreadable.
    malloc_arenas: int | None = None
    malloc_arena_reserved_mib: float | None = None
    # The read-write part of those heaps: what the arenas have grown to (<= reserved).
    malloc_arena_writable_mib: float | None = None
    # What could not be read for this process, e.g. "status: permission denied".
    unreadable: str | None = None
    # Whose process: "server" or "tenant" (a `role` of "gpu-peer"); None = not known.
    scope: str | None = None
    uid: int | None = None
    username: str | None = None
    ppid: int | None = None
    title_role: str | None = None


@dataclass
class HostSample(_Record):
    """Host RAM (RSS) of the server's processes: a host-RAM leak is not a VRAM leak."""

    kind: ClassVar[str] = "host"
    t: float
    wall: float
    processes: list[HostProcessMemory] = field(default_factory=list)
    # Used bytes of /dev/shm (tmpfs) in MiB, None where it cannot be read.
    dev_shm_used_mib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["processes"] = [_compact(p) for p in d["processes"]]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostSample:
        return cls(
            t=data["t"],
            wall=data["wall"],
            processes=[_from_dict(HostProcessMemory, p) for p in data.get("processes", [])],
            dev_shm_used_mib=data.get("dev_shm_used_mib"),
        )


# Event names every producer and the analysis share (Event.name). Soak's protocol marks
# (round/idle start and end, request outcomes) are named in vramdoctor.soak.traffic.schedule.
PROCESS_APPEARED = "process_appeared"  # data: pid, name, gpu (optional), role
PROCESS_EXITED = "process_exited"  # data: pid, name, exit_code (optional)
SERVER_DIED = "server_died"  # data: reason ("connection refused", "process gone"), pid
SERVER_REPLACED = "server_replaced"  # data: old_pid, new_pid (a new pid owns the port)
# data: pid, status, successor: the launched process exited after another pid took over its
# port (a handover); not a death, the run goes on with the successor
LAUNCHED_HANDOVER = "launched_handover"
SOURCE_ERROR = "source_error"  # data: source, error (recorded once per kind of error)
SOURCE_ERROR_COUNT = (
    "source_error_count"  # data: source, error, count, first_t, last_t (at the end)
)
COLLECTOR_FAILED = "collector_failed"  # data: error; the run's status becomes "failed"
# data: LeftoverChange.to_dict() (sources.leftovers): /dev/shm files of known families that
# appeared or became orphaned, GPU processes left by a server that is gone, during the run.
LEFTOVERS_CHANGED = "leftovers_changed"


@dataclass
class Event(_Record):
    """A protocol mark (round start/end, idle window, request outcome, error, note)."""

    kind: ClassVar[str] = "event"
    t: float
    wall: float
    name: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class InsideSample(_Record):
    """What one server process's own allocators count, read by the in-process agent.

    Written by soak (through `vramdoctor.agent.control`) at the end of the baseline and of every
    idle window, one record per armed server process; read by the judge, where it decides
    between a leak (live bytes grow) and caching (only reserved, kept or slack bytes grow).
    Every byte count is an integer number of bytes (the judge converts to MiB).

    `cuda`: one dict per device the process uses, from `torch.cuda.memory_stats(device)`:
    ``device`` (int), ``allocated_bytes`` (live tensors), ``reserved_bytes`` (segments the
    caching allocator holds), ``active_bytes`` (allocated plus blocks awaiting free),
    ``inactive_split_bytes`` (free pieces of split segments: fragmentation), and optionally
    ``pools``: ``[{pool_id, reserved_bytes, allocated_bytes}]`` per private pool (CUDA graphs,
    `torch.cuda.MemPool`), from the snapshot's segments. None = no CUDA in that process (the
    agent never creates a context to find out).
    `glibc`: `mallinfo2()` (glibc >= 2.33): ``in_use_bytes`` (uordblks + hblkhd),
    ``free_kept_bytes`` (fordblks), ``mmap_bytes`` (hblkhd), ``arena_bytes`` (arena),
    ``keepcost`` (bytes at the top of the main heap that `malloc_trim` could return), ``call_ms`` (how long the call took: it walks every free
    chunk under each arena's lock). None = not glibc, or glibc < 2.33.
    `python`: with `soak --trace-python`, tracemalloc: ``traced_bytes``, ``peak_bytes``,
    ``top``: ``[{file, line, bytes, count}]`` (the lines holding most, largest first).
    `error`: one line saying why a part is missing (None when nothing is).
    `pid` is the process as this host sees it (the agent's own pid inside a container differs:
    `agent_pid`). `python` also carries, whether or not tracing is on, ``allocated_blocks``
    (`sys.getallocatedblocks()`: live blocks of Python's own allocator, whose arenas are mmap'd
    outside glibc's counters) and ``tracing`` (bool); the traced fields only with tracing.
    `glibc` also has ``free_chunks`` (ordblks + smblks: what the call walks) and ``glibc`` (its
    version).
    """

    kind: ClassVar[str] = "inside"
    t: float
    wall: float
    pid: int
    round: int = 0  # 0 = the baseline, before the first round
    window: str = "idle_end"
    cuda: list[dict[str, Any]] | None = None
    glibc: dict[str, Any] | None = None
    python: dict[str, Any] | None = None
    error: str | None = None
    # The agent's host (file-name-safe) and program name, as its status file says.
    host: str | None = None
    program: str | None = None
    # Pinned host memory PyTorch's caching host allocator holds: held_bytes (handed out and
    # cached), in_use_bytes (handed out); None without CUDA or without the API.
    pinned: dict[str, Any] | None = None
    # How long reading the CUDA counters took in the process (ms; glibc and python carry their
    # own call_ms). The pid the agent saw when it differs from `pid` (inside a container).
    cuda_ms: float | None = None
    agent_pid: int | None = None


SAMPLE_TYPES: dict[str, Any] = {
    cls.kind: cls for cls in (GpuSample, MetricsSample, HostSample, InsideSample, Event)
}
