"""Host RAM of the server's processes, by kind: anonymous, file-backed, shared; glibc arenas.

A host-RAM leak with image requests is a known vLLM failure (facts.md: vllm #15294, #15597);
it must be reported as host memory, not VRAM, so soak samples RSS next to the GPU. RSS alone
cannot tell a leak from caching, so each process's RSS is split by kind (`/proc/PID/status`):

- `RssAnon`: the heap (Python objects, malloc). glibc's per-thread arenas live here;
- `RssFile`: mapped libraries and files (page cache, moves with what is touched);
- `RssShmem`: shared memory. CUDA pinned host memory (cudaHostAlloc) is shared memory, and
  PyTorch's host allocator keeps it after the tensor dies: the host twin of VRAM caching.

and glibc's non-main malloc arenas are counted from `/proc/PID/maps` (see `malloc_heaps`).
`/dev/shm` use is sampled too (tensors moved to shared memory between processes land there).
The set of processes comes from a callable (re-discovered while the soak runs: servers spawn
workers). A process whose `/proc` files cannot be read (another user, a container) keeps its
psutil RSS and says in `unreadable` what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from vramdoctor import servers
from vramdoctor.samples import (
    MIB,
    SCOPE_SERVER,
    SCOPE_TENANT,
    HostProcessMemory,
    HostSample,
    now,
)
from vramdoctor.sources.procinfo import ProcInfoCache

PidRoles = Callable[[], dict[int, str]]

# glibc (malloc/arena.c): HEAP_MAX_SIZE = 2 * DEFAULT_MMAP_THRESHOLD_MAX = 2 * 4 * 1024 * 1024 *
# sizeof(long) = 64 MiB on 64-bit. Every heap of a non-main arena is one mapping of exactly
# this size at an address aligned to it (new_heap maps twice the size and trims to alignment,
# because heap_for_ptr finds a chunk's heap by masking the address); the part in use is
# read-write, the rest PROT_NONE until the heap grows.
HEAP_MAX_BYTES = 64 * MIB
PROC = "/proc"


@dataclass(frozen=True)
class MallocHeaps:
    """Heaps of glibc's non-main malloc arenas in one process's address space."""

    heaps: int
    reserved_bytes: int  # heaps x 64 MiB: the address space they hold
    writable_bytes: int  # the read-write part: what the arenas have grown to


def _maps_lines(text: str) -> Iterable[tuple[int, int, str, str]]:
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        try:
            lo, hi = (int(x, 16) for x in parts[0].split("-", 1))
        except ValueError:
            continue
        path = parts[5].strip() if len(parts) > 5 else ""
        yield lo, hi, parts[1], path


def malloc_heaps(maps_text: str, heap_bytes: int = HEAP_MAX_BYTES) -> MallocHeaps:
    """Count glibc arena heaps in the text of `/proc/PID/maps`.

    A heap is the address range [B - 64 MiB, B) for a 64 MiB-aligned B, mapped anonymous and
    private: read-write from its start, then PROT_NONE (`---p`) up to B. The kernel merges
    adjacent mappings with the same flags, so the read-write part may be joined to an
    anonymous mapping before it and the PROT_NONE tail to one after it (a thread stack's guard
    page): only the aligned end inside the tail and a read-write mapping reaching back to the
    heap's start are required. A heap grown to the full 64 MiB (no tail) is counted when it
    is one read-write mapping of exactly that size at an aligned address. Thread stacks (a
    4 KiB guard below 8 MiB of stack), Python's arenas and large malloc blocks (mmap'd one by
    one, page aligned, any size) do not have that shape.
    """
    rows = [r for r in _maps_lines(maps_text)]
    heaps = writable = 0
    for k, (lo, hi, perms, path) in enumerate(rows):
        if path or not perms.endswith("p"):
            continue
        if perms.startswith("---") and k > 0:
            plo, phi, pperms, ppath = rows[k - 1]
            if ppath or phi != lo or not pperms.startswith("rw") or not pperms.endswith("p"):
                continue
            end = (lo // heap_bytes + 1) * heap_bytes  # the first aligned address after the rw part
            if end <= hi and end - heap_bytes >= plo:
                heaps += 1
                writable += lo - (end - heap_bytes)
        elif perms.startswith("rw") and lo % heap_bytes == 0 and hi - lo == heap_bytes:
            nxt = rows[k + 1] if k + 1 < len(rows) else None
            if nxt is None or nxt[0] != hi or not nxt[2].startswith("---"):
                heaps += 1
                writable += heap_bytes
    return MallocHeaps(heaps, heaps * heap_bytes, writable)


def read_status_kinds(pid: int, proc: str = PROC) -> dict[str, int]:
    """RssAnon/RssFile/RssShmem (bytes) and Threads from /proc/PID/status. OSError if unreadable."""
    out: dict[str, int] = {}
    with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem", "VmRSS"):
                fields = rest.split()
                if fields:
                    out[key] = int(fields[0]) * 1024  # "kB" means KiB in /proc
            elif key == "Threads":
                out[key] = int(rest.strip() or 0)
    return out


def dev_shm_used_mib(path: str = "/dev/shm") -> float | None:
    """Used MiB of the /dev/shm tmpfs (None when there is none or it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize / MIB


def _why(exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, FileNotFoundError):
        return "not found"
    return exc.strerror or type(exc).__name__


def process_memory(
    pid: int,
    rss_bytes: int,
    *,
    name: str | None = None,
    role: str | None = None,
    proc: str = PROC,
    with_maps: bool = True,
) -> HostProcessMemory:
    """One process's host memory by kind; what could not be read is named in `unreadable`."""
    row = HostProcessMemory(pid=pid, rss_mib=rss_bytes / MIB, name=name, role=role)
    missing: list[str] = []
    try:
        kinds = read_status_kinds(pid, proc)
        if "RssAnon" in kinds:
            row.rss_anon_mib = kinds["RssAnon"] / MIB
            row.rss_file_mib = kinds.get("RssFile", 0) / MIB
            row.rss_shmem_mib = kinds.get("RssShmem", 0) / MIB
        else:  # kernels before 4.5 have no split
            missing.append(f"{proc}/{pid}/status: no RssAnon (kernel < 4.5)")
        row.threads = kinds.get("Threads")
    except (OSError, ValueError) as exc:
        missing.append(
            f"{proc}/{pid}/status: {_why(exc) if isinstance(exc, OSError) else 'unparsable'}"
        )
    if with_maps:
        try:
            with open(f"{proc}/{pid}/maps", encoding="ascii", errors="replace") as fh:
                heaps = malloc_heaps(fh.read())
            row.malloc_arenas = heaps.heaps
            row.malloc_arena_reserved_mib = heaps.reserved_bytes / MIB
            row.malloc_arena_writable_mib = heaps.writable_bytes / MIB
        except OSError as exc:
            missing.append(f"{proc}/{pid}/maps: {_why(exc)}")
    row.unreadable = "; ".join(missing) or None
    return row


# Roles of the host sampler (sources.discover.roles, soak's and watch's --pid "watched"):
# the server's own processes (the port owner's tree plus --pid) and other tenants of its GPUs.
# Any other role ("gpu-process": a GPU process while the server was not found) has no scope.
SERVER_ROLES = frozenset({"server", "child", "watched"})
TENANT_ROLES = frozenset({"gpu-peer", "tenant"})


class HostSource:
    """Host memory of a changing set of PIDs. `pids` maps pid -> role ("server", "child", ...).

    Each row says its scope: "server" for the roles in `SERVER_ROLES`, "tenant" for those in
    `TENANT_ROLES` (other processes on the server's GPUs), None for any other; with its uid,
    user name, parent pid and the server's name for it (`title_role`), read once per
    `proc_ttl_s`.

    `maps_every` reads /proc/PID/maps only every N-th sample (a large server has thousands of
    mappings; arenas change slowly); the samples in between repeat the last arena figures.
    """

    name = "host"

    def __init__(
        self,
        pids: PidRoles | dict[int, str] | Iterable[int],
        *,
        proc: str = PROC,
        maps_every: int = 1,
        dev_shm: str | None = "/dev/shm",
        proc_ttl_s: float = 5.0,
    ) -> None:
        if callable(pids):
            self._pids: PidRoles = pids
        else:
            fixed = dict(pids) if isinstance(pids, dict) else {int(p): "server" for p in pids}
            self._pids = lambda: fixed
        self._procs: dict[int, psutil.Process] = {}
        self.proc = proc
        self.maps_every = max(1, maps_every)
        self.dev_shm = dev_shm
        self._n = 0
        self._info = ProcInfoCache(proc_ttl_s)
        self._last_heaps: dict[int, tuple[int | None, float | None, float | None]] = {}

    def _proc(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None or not proc.is_running():
            proc = psutil.Process(pid)
            self._procs[pid] = proc
        return proc

    def sample(self) -> HostSample:
        t, wall = now()
        rows: list[HostProcessMemory] = []
        with_maps = self._n % self.maps_every == 0
        self._n += 1
        for pid, role in sorted(self._pids().items()):
            try:
                proc = self._proc(pid)
                with proc.oneshot():
                    rss = proc.memory_info().rss
                    name = proc.name()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                self._procs.pop(pid, None)
                self._last_heaps.pop(pid, None)
                continue
            except psutil.AccessDenied:  # not even its RSS: nothing to judge on
                continue
            row = process_memory(
                pid, rss, name=name, role=role, proc=self.proc, with_maps=with_maps
            )
            info = self._info.get(pid)
            title = servers.title_of(info.name, info.cmdline) if info.visible else None
            row.scope = (
                SCOPE_SERVER
                if role in SERVER_ROLES
                else SCOPE_TENANT
                if role in TENANT_ROLES
                else None
            )
            row.uid, row.username, row.ppid = info.uid, info.username, info.ppid
            row.title_role = title.role if title else None
            if with_maps:
                self._last_heaps[pid] = (
                    row.malloc_arenas,
                    row.malloc_arena_reserved_mib,
                    row.malloc_arena_writable_mib,
                )
            elif pid in self._last_heaps:
                (
                    row.malloc_arenas,
                    row.malloc_arena_reserved_mib,
                    row.malloc_arena_writable_mib,
                ) = self._last_heaps[pid]
            rows.append(row)
        shm = dev_shm_used_mib(self.dev_shm) if self.dev_shm else None
        return HostSample(t=t, wall=wall, processes=rows, dev_shm_used_mib=shm)


def host_memory() -> dict[str, float]:
    """This host's RAM: total and available MiB (for the time to running out of host RAM)."""
    vm = psutil.virtual_memory()
    return {"total_mib": vm.total / MIB, "available_mib": vm.available / MIB}
