"""What crashed servers leave behind: shared memory, semaphores, and GPU memory of orphans.

When an inference server dies uncleanly its /dev/shm segments stay (tmpfs: they hold host RAM
until unlinked, and a full /dev/shm makes the next start fail: SGLang #40723, 852 segments /
18 GiB in five minutes; vLLM #54002, a 17 GB offload region per crash), and its worker
processes may live on, reparented, holding GPU memory. `scan()` looks at both:

- every file of a known family in /dev/shm (the server kinds' families from
  `vramdoctor.servers`, and the runtimes' in `RUNTIME_FAMILIES`: NCCL, loky, Python
  multiprocessing, torch, CUDA IPC, joblib, DeepSpeed): its size (what tmpfs holds for it),
  owner, the creator pid where the name carries it and whether that process is alive (a live
  pid started after the file was made is a reused pid: the creator is gone), and the
  processes that hold it open (/proc/PID/fd) or mapped (/proc/PID/maps);
- processes with GPU memory whose title says they are a server's engine or worker
  (`VLLM::Worker_TP0`, `sglang::scheduler_TP1`) but whose parent is not a process of that
  server any more (reparented to init or a subreaper): the server they belonged to is gone.

A segment is "orphaned" when nobody here holds it and its creator is gone (pid-stamped
names), or when nobody holds it and every process of this host could be inspected (names
without a pid); "unknown" when processes that might hold it could not be read; "in use" or
"kept by its creator" otherwise. Only the same PID namespace can tell: run it on the host, or
in the servers' container. The clean-up is given as text (`cleanup_commands`), never run.

`LeftoverWatch` compares the state at a run's start and end (soak, watch): what appeared or
became orphaned during the run.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from vramdoctor import servers
from vramdoctor.samples import MIB, GpuSample
from vramdoctor.servers.base import ShmFamily

__all__ = [
    "RUNTIME_FAMILIES",
    "LeftoverChange",
    "LeftoverWatch",
    "Leftovers",
    "OrphanProcess",
    "ShmEntry",
    "cleanup_commands",
    "compare",
    "family_of",
    "holders_of",
    "orphan_gpu_processes",
    "scan",
]

SHM_DIR = "/dev/shm"
PROC = "/proc"

RUNTIME_FAMILIES: tuple[ShmFamily, ...] = (
    ShmFamily(
        "nccl",
        re.compile(r"nccl-.+"),
        "NCCL shared-memory transport and proxy buffers (pid-less)",
        "NVIDIA/nccl src/os/linux.cc mkstemp('/dev/shm/nccl-XXXXXX'); src/transport/shm.cc",
    ),
    ShmFamily(
        "loky semaphore",
        re.compile(r"sem\.loky-(?P<pid>\d+)-\w+"),
        "joblib/loky semaphore",
        "joblib/loky loky/backend/synchronize.py '/loky-{pid}-{rand}'",
        semaphore=True,
    ),
    ShmFamily(
        "python shared_memory",
        re.compile(r"psm_[0-9a-f]{8}"),
        "Python multiprocessing.shared_memory segment (unnamed: vLLM's broadcast queues, "
        "SGLang 0.5.9's multimodal features; pid-less)",
        "CPython Lib/multiprocessing/shared_memory.py '/psm_' + token_hex(4)",
    ),
    ShmFamily(
        "python semaphore",
        re.compile(r"sem\.mp-\w+"),
        "Python multiprocessing semaphore (pid-less)",
        "CPython Lib/multiprocessing/synchronize.py '/mp-' + random",
        semaphore=True,
    ),
    ShmFamily(
        "torch shared tensor",
        re.compile(r"torch_(?P<pid>\d+)_\d+_\d+"),
        "PyTorch tensor shared with the file_system strategy",
        "pytorch aten/src/ATen/MapAllocator.cpp NewProcessWideShmHandle '/torch_{pid}_{rand}_{n}'",
    ),
    ShmFamily(
        "cuda ipc",
        re.compile(r"cuda\.shm\..+"),
        "CUDA IPC segments (pid-less; naming as SGLang's orphan sweep lists it)",
        "sglang/srt/utils/stale_shm_cleanup.py _ORPHAN_PREFIXES (0.5.19+)",
    ),
    ShmFamily(
        "joblib memmap folder",
        re.compile(r"joblib_memmapping_folder_(?P<pid>\d+)_.+"),
        "joblib's memory-mapped arrays folder",
        "joblib/_memmapping_reducer.py 'joblib_memmapping_folder_{pid}_{id}_{context}'",
    ),
    ShmFamily(
        "deepspeed allreduce buffer",
        re.compile(r"deepspeed_allreduce_buffer_.+"),
        "DeepSpeed shared-memory allreduce buffer (pid-less; sglang #38638)",
        "sglang #38638",
    ),
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

State = Literal["in use", "kept by its creator", "orphaned", "unknown"]


def family_of(filename: str) -> tuple[str | None, ShmFamily] | None:
    """(server kind name or None for a runtime family, family) of a /dev/shm file name."""
    found = servers.shm_family(filename)
    if found is not None:
        return found[0].name, found[1]
    for family in RUNTIME_FAMILIES:
        if family.match(filename):
            return None, family
    return None


@dataclass
class ShmEntry:
    """One file of a known family in /dev/shm."""

    name: str
    path: str
    family: str
    server: str | None  # the server kind whose family it is; None = a runtime's
    type: Literal["segment", "semaphore", "directory"]
    size_bytes: int  # what tmpfs holds for it (allocated blocks; a folder: all its files)
    owner_uid: int
    owner: str | None
    mtime: float
    creator_pid: int | None  # from the name, where it carries one
    creator_alive: bool | None  # None: the name carries no pid
    holders: list[int] = field(default_factory=list)  # pids with it open or mapped
    state: State = "unknown"
    why: str = ""  # what the state rests on

    @property
    def orphaned(self) -> bool:
        return self.state == "orphaned"


@dataclass
class OrphanProcess:
    """A process with GPU memory whose title says it belongs to a server that is gone."""

    pid: int
    role: str
    kind: str
    gpu_mib: dict[int, float | None]
    ppid: int | None
    parent: str | None  # the parent's name
    why: str


@dataclass
class Leftovers:
    """The state of one host: known-family /dev/shm files, GPU orphans, and how much of the
    host could be inspected."""

    t: float
    wall: float
    shm_dir: str
    entries: list[ShmEntry] = field(default_factory=list)
    orphan_processes: list[OrphanProcess] = field(default_factory=list)
    other_files: int = 0  # files of no known family
    other_bytes: int = 0
    shm_used_bytes: int | None = None
    shm_total_bytes: int | None = None
    processes_inspected: int = 0
    processes_uninspectable: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def orphaned(self) -> list[ShmEntry]:
        return [e for e in self.entries if e.orphaned]

    @property
    def problem(self) -> bool:
        """Orphaned segments or orphaned GPU processes were found."""
        return bool(self.orphaned or self.orphan_processes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shm_dir": self.shm_dir,
            "t": self.t,
            "wall": self.wall,
            "problem": self.problem,
            "entries": [asdict(e) for e in self.entries],
            "orphan_processes": [
                {**asdict(p), "gpu_mib": {str(k): v for k, v in p.gpu_mib.items()}}
                for p in self.orphan_processes
            ],
            "other_files": self.other_files,
            "other_bytes": self.other_bytes,
            "shm_used_bytes": self.shm_used_bytes,
            "shm_total_bytes": self.shm_total_bytes,
            "processes_inspected": self.processes_inspected,
            "processes_uninspectable": self.processes_uninspectable,
            "orphaned_bytes": sum(e.size_bytes for e in self.orphaned),
            "cleanup": cleanup_commands(self),
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Leftovers:
        """Read back what `to_dict` wrote (a census run file's result record)."""
        entries = [ShmEntry(**e) for e in data.get("entries") or []]
        orphans = [
            OrphanProcess(
                **{
                    **p,
                    "gpu_mib": {int(k): v for k, v in (p.get("gpu_mib") or {}).items()},
                }
            )
            for p in data.get("orphan_processes") or []
        ]
        return cls(
            t=float(data.get("t") or 0.0),
            wall=float(data.get("wall") or 0.0),
            shm_dir=str(data.get("shm_dir") or SHM_DIR),
            entries=entries,
            orphan_processes=orphans,
            other_files=int(data.get("other_files") or 0),
            other_bytes=int(data.get("other_bytes") or 0),
            shm_used_bytes=data.get("shm_used_bytes"),
            shm_total_bytes=data.get("shm_total_bytes"),
            processes_inspected=int(data.get("processes_inspected") or 0),
            processes_uninspectable=int(data.get("processes_uninspectable") or 0),
            notes=list(data.get("notes") or []),
        )


# --- reading /proc ------------------------------------------------------------------------


def _pids(proc: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(proc) if n.isdigit())
    except OSError:
        return []


Inode = tuple[int, int]  # (st_dev, st_ino)


def holders_of(shm_dir: str, proc: str = PROC) -> tuple[dict[Inode, set[int]], int, int]:
    """((device, inode) of a file in shm_dir -> pids holding it open or mapped, inspected,
    uninspectable).

    Matched by inode, not by name: glibc's sem_open maps a temporary file and links it into
    place, so a semaphore's mapping is named after a file that no longer exists. A process
    whose fd directory or maps cannot be read counts as uninspectable; one that exits during
    the scan is skipped."""
    prefixes = {os.path.realpath(shm_dir).rstrip("/") + "/", shm_dir.rstrip("/") + "/"}
    try:
        shm_dev = os.stat(shm_dir).st_dev
    except OSError:
        return {}, 0, 0
    held: dict[Inode, set[int]] = {}
    inspected = uninspectable = 0
    me = os.getpid()
    for pid in _pids(proc):
        if pid == me:
            continue  # our own scan holds nothing of /dev/shm
        ok = True
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except FileNotFoundError:
            continue
        except OSError:
            ok, fds = False, []
        for fd in fds:
            link = f"{proc}/{pid}/fd/{fd}"
            try:
                target = os.readlink(link)
                if not target.startswith(tuple(prefixes)):
                    continue
                st = os.stat(link)
            except OSError:
                continue
            held.setdefault((st.st_dev, st.st_ino), set()).add(pid)
        try:
            with open(f"{proc}/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    parts = line.split(None, 5)
                    if len(parts) < 6 or not parts[5].startswith(tuple(prefixes)):
                        continue
                    major, _, minor = parts[3].partition(":")
                    try:
                        dev = os.makedev(int(major, 16), int(minor, 16))
                        ino = int(parts[4])
                    except ValueError:
                        continue
                    if ino:
                        held.setdefault((dev if dev else shm_dev, ino), set()).add(pid)
        except FileNotFoundError:
            continue
        except OSError:
            ok = False
        if ok:
            inspected += 1
        else:
            uninspectable += 1
    return held, inspected, uninspectable


def _owner(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _creator_alive(pid: int, made_at: float) -> tuple[bool, str]:
    """Whether the process that made a file made at `made_at` (epoch s) still runs."""
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False, f"its creator PID {pid} is a zombie"
        started = p.create_time()
    except psutil.NoSuchProcess:
        return False, f"its creator PID {pid} is gone"
    except psutil.AccessDenied:
        return True, f"its creator PID {pid} runs (another user's)"
    if started > made_at + 2.0:
        return False, f"its creator PID {pid} is gone (that PID now belongs to a newer process)"
    return True, f"its creator PID {pid} runs"


def _du(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            total += st.st_blocks * 512
    return total


def _state(entry: ShmEntry, pid_why: str | None, uninspectable: int) -> tuple[State, str]:
    if entry.holders:
        pids = ", ".join(map(str, entry.holders[:5])) + (" ..." if len(entry.holders) > 5 else "")
        return "in use", f"open or mapped by PID {pids}"
    if entry.creator_pid is not None:
        if entry.creator_alive:
            return "kept by its creator", f"{pid_why}; no process has it open or mapped now"
        if uninspectable:
            return (
                "orphaned",
                f"{pid_why} and no process that could be inspected has it open or mapped "
                f"({uninspectable} could not be)",
            )
        return "orphaned", f"{pid_why} and no process has it open or mapped"
    if uninspectable:
        return (
            "unknown",
            f"its name carries no pid and {uninspectable} process(es) could not be inspected",
        )
    return "orphaned", "its name carries no pid and no process has it open or mapped"


def scan(
    shm_dir: str = SHM_DIR,
    proc: str = PROC,
    *,
    gpu_sample: GpuSample | None = None,
) -> Leftovers:
    """The leftovers of this host now: known-family files in `shm_dir` and (with a GPU sample
    of this host) the orphaned GPU processes. Never raises for what it cannot read: it says
    so in `notes` and in each entry's `why`."""
    t0, wall = time.monotonic(), time.time()
    out = Leftovers(t=t0, wall=wall, shm_dir=shm_dir)
    try:
        names = sorted(os.listdir(shm_dir))
    except OSError as exc:
        out.notes.append(f"{shm_dir} cannot be read ({exc.strerror or type(exc).__name__})")
        names = []
    held, out.processes_inspected, out.processes_uninspectable = holders_of(shm_dir, proc)
    if out.processes_uninspectable:
        hint = "" if os.geteuid() == 0 else ": run as root to see who holds what"
        out.notes.append(
            f"{out.processes_uninspectable} process(es) could not be inspected (their open files "
            f"or mappings are not readable here{hint}), so a file whose name carries no pid "
            "cannot be called orphaned"
        )
    hostile = 0
    for name in names:
        path = os.path.join(shm_dir, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue  # gone meanwhile
        size = _du(path) if stat.S_ISDIR(st.st_mode) else st.st_blocks * 512
        if _CONTROL.search(name):
            # A name no server makes; shown or pasted it could move the terminal's cursor or
            # split a command line: counted, never printed.
            out.other_files += 1
            out.other_bytes += size
            hostile += 1
            continue
        found = family_of(name)
        if found is None or stat.S_ISLNK(st.st_mode):
            out.other_files += 1
            out.other_bytes += size
            continue
        out.entries.append(
            _shm_entry(name, path, st, size, found, held, out.processes_uninspectable)
        )
    if hostile:
        out.notes.append(
            f"{hostile} file(s) in {shm_dir} have control characters in their names: counted with "
            "the other files, not shown (no server makes such names)"
        )
    _shm_usage(out, shm_dir)
    if gpu_sample is not None:
        out.orphan_processes = orphan_gpu_processes(gpu_sample)
    return out


def _shm_entry(
    name: str,
    path: str,
    st: os.stat_result,
    size: int,
    found: tuple[str | None, ShmFamily],
    held: dict[Inode, set[int]],
    uninspectable: int,
) -> ShmEntry:
    """Returns the entry of one known-family file: what it is, who made it and holds it, and
    its state (whether its creator still runs, whether anyone has it open or mapped)."""
    kind, family = found
    match = family.match(name)
    creator = int(match.group("pid")) if match is not None and family.pid_stamped else None
    entry = ShmEntry(
        name=name,
        path=path,
        family=family.family,
        server=kind,
        type="directory"
        if stat.S_ISDIR(st.st_mode)
        else "semaphore"
        if family.semaphore
        else "segment",
        size_bytes=size,
        owner_uid=st.st_uid,
        owner=_owner(st.st_uid),
        mtime=st.st_mtime,
        creator_pid=creator,
        creator_alive=None,
        holders=sorted(held.get((st.st_dev, st.st_ino), set())),
    )
    pid_why: str | None = None
    if creator is not None:
        entry.creator_alive, pid_why = _creator_alive(creator, min(st.st_mtime, st.st_ctime))
    entry.state, entry.why = _state(entry, pid_why, uninspectable)
    return entry


def _shm_usage(out: Leftovers, shm_dir: str) -> None:
    """Sets how much of the shared-memory file system is used, of its size, when it can be
    read; returns nothing."""
    try:
        vfs = os.statvfs(shm_dir)
        out.shm_total_bytes = vfs.f_blocks * vfs.f_frsize
        out.shm_used_bytes = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
    except OSError:
        pass


def orphan_gpu_processes(
    sample: GpuSample, parent_of: Callable[[int], tuple[int, str, list[str]] | None] | None = None
) -> list[OrphanProcess]:
    """Processes with GPU memory that a server's title names as its engine or worker, whose
    parent is not a process of that server: the server they belonged to is gone.

    `parent_of(pid)` -> (ppid, parent name, parent command line) or None when unreadable
    (default: psutil). Frontends (API servers, tokenizer managers) are the server itself and
    never orphans; titles marked `orphan_check=False` (Ray workers, whose parent is Ray's) are
    not judged; rows from another PID namespace cannot be."""
    parent_of = parent_of or _parent
    rows: dict[int, OrphanProcess] = {}
    for p in sample.processes:
        if not p.visible or p.host:
            continue
        found = servers.title_of(p.name, p.cmdline)
        if found is None or found.title.part == "frontend" or not found.title.orphan_check:
            continue
        if p.pid in rows:
            rows[p.pid].gpu_mib[p.gpu] = p.used_mib
            continue
        parent = parent_of(p.pid)
        if parent is None:
            continue
        ppid, pname, pcmd = parent
        pfound = servers.title_of(pname, pcmd)
        if pfound is not None and pfound.kind == found.kind:
            continue
        rows[p.pid] = OrphanProcess(
            pid=p.pid,
            role=found.role,
            kind=found.kind,
            gpu_mib={p.gpu: p.used_mib},
            ppid=ppid,
            parent=pname,
            why=f"its parent is PID {ppid} ({pname or '?'}), not a {servers.display_name(found.kind)} "
            "process: the server it belonged to is gone",
        )
    return sorted(rows.values(), key=lambda o: o.pid)


def _parent(pid: int) -> tuple[int, str, list[str]] | None:
    import psutil

    try:
        parent = psutil.Process(pid).parent()
        if parent is None:
            return 0, "", []
        try:
            cmd = parent.cmdline()
        except (psutil.AccessDenied, psutil.ZombieProcess):
            cmd = []
        return parent.pid, parent.name(), cmd
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def cleanup_commands(leftovers: Leftovers) -> list[str]:
    """Shell lines that would remove what is orphaned: TEXT ONLY, vramdoctor never runs them.
    One `rm` per family (paths quoted), one `kill` for orphaned GPU processes."""
    lines: list[str] = []
    by_family: dict[str, list[ShmEntry]] = {}
    for e in leftovers.orphaned:
        by_family.setdefault(e.family, []).append(e)
    for family, entries in by_family.items():
        paths = " ".join(shlex.quote(e.path) for e in entries)
        flag = "-rf" if any(e.type == "directory" for e in entries) else "-f"
        lines.append(f"rm {flag} -- {paths}   # {family}: {len(entries)} orphaned")
    if leftovers.orphan_processes:
        pids = " ".join(str(p.pid) for p in leftovers.orphan_processes)
        lines.append(f"kill {pids}   # GPU memory held by processes of a server that is gone")
    return lines


# --- during a run ---------------------------------------------------------------------------


@dataclass
class LeftoverChange:
    """What changed between a run's start and now: files of known families that appeared (and
    their bytes), files that became orphaned, GPU processes that became orphans."""

    appeared: list[ShmEntry] = field(default_factory=list)
    newly_orphaned: list[ShmEntry] = field(default_factory=list)
    new_orphan_processes: list[OrphanProcess] = field(default_factory=list)
    shm_used_delta_bytes: int | None = None

    @property
    def found(self) -> bool:
        return bool(self.newly_orphaned or self.new_orphan_processes or self.appeared)

    def sentence(self) -> str:
        """One line for a report: what appeared and what is orphaned now, with sizes."""
        parts: list[str] = []
        if self.appeared:
            mib = sum(e.size_bytes for e in self.appeared) / MIB
            fams = sorted({e.family for e in self.appeared})
            parts.append(
                f"{len(self.appeared)} shared-memory file(s) appeared during the run "
                f"({mib:,.1f} MiB; {', '.join(fams)})"
            )
        if self.newly_orphaned:
            mib = sum(e.size_bytes for e in self.newly_orphaned) / MIB
            parts.append(f"{len(self.newly_orphaned)} became orphaned ({mib:,.1f} MiB)")
        if self.new_orphan_processes:
            pids = ", ".join(str(p.pid) for p in self.new_orphan_processes)
            parts.append(f"GPU memory is held by orphaned server processes (PID {pids})")
        return "; ".join(parts) if parts else "no shared-memory leftovers changed during the run"

    def to_dict(self) -> dict[str, Any]:
        return {
            "appeared": [asdict(e) for e in self.appeared],
            "newly_orphaned": [asdict(e) for e in self.newly_orphaned],
            "new_orphan_processes": [
                {**asdict(p), "gpu_mib": {str(k): v for k, v in p.gpu_mib.items()}}
                for p in self.new_orphan_processes
            ],
            "shm_used_delta_bytes": self.shm_used_delta_bytes,
            "sentence": self.sentence(),
        }


def compare(before: Leftovers, after: Leftovers) -> LeftoverChange:
    """The change from `before` to `after` (two scans of one host). Pure."""
    old = {e.name: e for e in before.entries}
    appeared = [e for e in after.entries if e.name not in old]
    newly = [e for e in after.orphaned if e.name not in old or not old[e.name].orphaned]
    old_pids = {p.pid for p in before.orphan_processes}
    delta = (
        None
        if before.shm_used_bytes is None or after.shm_used_bytes is None
        else after.shm_used_bytes - before.shm_used_bytes
    )
    return LeftoverChange(
        appeared=appeared,
        newly_orphaned=newly,
        new_orphan_processes=[p for p in after.orphan_processes if p.pid not in old_pids],
        shm_used_delta_bytes=delta,
    )


class LeftoverWatch:
    """Leftovers at a run's start and end. `start()` takes the first scan; `check()` scans
    again and returns the change since the start (call it at the end, or at any round).

    `gpu_sample()` (optional) gives the latest GPU sample of this host, for orphaned GPU
    processes. Scans read every process's fd and maps: call at start and end (or once a
    round), not in a sampling loop."""

    def __init__(
        self,
        shm_dir: str = SHM_DIR,
        proc: str = PROC,
        gpu_sample: Callable[[], GpuSample | None] | None = None,
    ) -> None:
        self.shm_dir = shm_dir
        self.proc = proc
        self.gpu_sample = gpu_sample
        self.first: Leftovers | None = None
        self.last: Leftovers | None = None

    def _scan(self) -> Leftovers:
        sample = self.gpu_sample() if self.gpu_sample is not None else None
        return scan(self.shm_dir, self.proc, gpu_sample=sample)

    def start(self) -> Leftovers:
        self.first = self.last = self._scan()
        return self.first

    def check(self) -> LeftoverChange:
        if self.first is None:
            self.start()
        assert self.first is not None
        self.last = self._scan()
        return compare(self.first, self.last)
