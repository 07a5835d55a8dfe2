"""The soak side of the agent protocol: which processes have an agent, ask them, collect answers.

Files in the agent directory (protocol 2; the agent is `pythonpath/vramdoctor_agent.py`):

- `agents/<host>-<pid>.json`: one per process with an agent (state "ready": host evidence only;
  "armed": CUDA allocator history on, snapshots possible; "stood-down" with its reason),
  rewritten every 30 s (a heartbeat).
- `session.json`: ours while a soak runs: its token, pid and start time. Agents accept only
  triggers with this token, and only while this process lives (when they can see it).
- `trigger.json`: ours: token, sequence number, round, window, expiry, what is wanted
  ("inside", "snapshot") and whether to trace Python allocations.
- `replies/<token>/<seq>-<host>-<pid>.json` (and `.pickle` for a snapshot, written before it).

vramdoctor may run as root and the directory may belong to the server's user: everything read
here is treated as hostile. Files are opened without following links, must be regular files
under a size cap, names must have the agent's shape, snapshots are moved by rename (or copied
from an fd opened without following links), and an answer's evidence is reduced to the fields
and types of `vramdoctor.samples.InsideSample` before it reaches a run file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramdoctor.agent.pythonpath import vramdoctor_agent as runtime
from vramdoctor.errors import InputError

__all__ = [
    "AGENT_STATES",
    "AgentInfo",
    "Controller",
    "Reply",
    "SnapshotFile",
    "clean_inside",
    "list_agents",
]

AGENT_STATES = ("ready", "armed", "stood-down")
# Caps on what is read from the directory (bytes).
STATUS_MAX_BYTES = 64 * 1024
REPLY_MAX_BYTES = 1024 * 1024
SNAPSHOT_MAX_BYTES = 1024 * 1024 * 1024
# A status file older than this (seconds) belongs to a process that is gone (heartbeat 30 s).
STALE_STATUS_S = 3 * runtime.HEARTBEAT_S
_REPLY_NAME = re.compile(r"^(\d{1,7})-([A-Za-z0-9._-]{1,64})-(\d{1,10})\.json$")
# Status files read per listing (live processes' first, stale files last: `_live_first`).
MAX_STATUS_FILES = 10_000
_STATUS_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}-\d{1,10}\.json$")
_O_READ = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


_O_DIR = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def _read_fd(fd: int, limit: int) -> bytes | None:
    """The bytes of the open file `fd` if it is a regular file of at most `limit` (else None)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        return None
    chunks: list[bytes] = []
    left = limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    return data if len(data) <= limit else None


def read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of a regular file, never through a link, at most `limit` (None otherwise)."""
    try:
        fd = os.open(path, _O_READ)
    except OSError:
        return None
    try:
        return _read_fd(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _json(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _json_file(path: Path, limit: int) -> dict[str, Any] | None:
    return _json(read_regular(path, limit))


class AgentDir:
    """The agent directory opened once: every later read and write is relative to this
    descriptor and never follows a link, so a link swapped in above it, or planted inside it,
    changes nothing. Names are one path component each."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: Path, *, create: bool, owner_uid: int | None = None) -> AgentDir:
        """Open (and with `create`, make 0700) the directory. Raises InputError when it is a
        link or not a directory, when group or others can write it, or, with `owner_uid`, when
        another user owns it (a directory named by a server process must be its own)."""
        if create:
            try:
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(
                    f"agent directory {path}: cannot create it ({exc.strerror})"
                ) from None
        try:
            fd = os.open(path, _O_DIR)
        except FileNotFoundError:
            raise InputError(f"agent directory {path} does not exist") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise InputError(
                    f"agent directory {path} is a link or not a directory: give its real path"
                ) from None
            raise InputError(f"agent directory {path}: {exc.strerror}") from None
        st = os.fstat(fd)
        problem = None
        if st.st_mode & 0o022:
            problem = (
                f"agent directory {path} is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):o}); the agents refuse it: chmod go-w {path}"
            )
        elif owner_uid is not None and st.st_uid != owner_uid:
            problem = (
                f"agent directory {path} belongs to uid {st.st_uid}, not to the server "
                f"process's uid {owner_uid}: not used"
            )
        elif not os.access(fd if os.access in os.supports_fd else path, os.W_OK | os.X_OK):
            problem = f"agent directory {path}: not writable by this user"
        if problem:
            os.close(fd)
            raise InputError(problem)
        return cls(path, fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def _walk(self, names: tuple[str, ...]) -> int | None:
        """A descriptor of the subdirectory `names` (each opened without following a link), or
        None when a part is missing or not a real directory; the caller closes it."""
        fd = os.dup(self.fd)
        for name in names:
            try:
                nxt = os.open(name, _O_DIR, dir_fd=fd)
            except OSError:
                os.close(fd)
                return None
            os.close(fd)
            fd = nxt
        return fd

    def listdir(self, *names: str) -> list[str]:
        fd = self._walk(names)
        if fd is None:
            return []
        try:
            return os.listdir(fd)
        except OSError:
            return []
        finally:
            os.close(fd)

    def mtimes(self, *names: str) -> dict[str, float]:
        """Each regular file of the subdirectory `names` (links and the rest left out) and its
        mtime (lstat: never through a link)."""
        fd = self._walk(names)
        if fd is None:
            return {}
        out: dict[str, float] = {}
        try:
            for name in os.listdir(fd):
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        out[name] = st.st_mtime
        except OSError:
            pass
        finally:
            os.close(fd)
        return out

    def read(self, *names: str, limit: int) -> bytes | None:
        """A regular file `names[-1]` in the subdirectory `names[:-1]`, at most `limit` bytes."""
        fd = self._walk(names[:-1])
        if fd is None:
            return None
        try:
            f = os.open(names[-1], _O_READ, dir_fd=fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return _read_fd(f, limit)
        except OSError:
            return None
        finally:
            os.close(f)

    def read_json(self, *names: str, limit: int) -> dict[str, Any] | None:
        return _json(self.read(*names, limit=limit))

    def write(self, name: str, data: bytes, mode: int = 0o644) -> None:
        runtime.write_atomic(self.fd, name, data, mode=mode)

    def unlink(self, *names: str) -> None:
        fd = self._walk(names[:-1])
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                os.unlink(names[-1], dir_fd=fd)
        finally:
            os.close(fd)

    def rmdir(self, *names: str) -> None:
        fd = self._walk(names[:-1])
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                os.rmdir(names[-1], dir_fd=fd)
        finally:
            os.close(fd)

    def move_out(self, names: tuple[str, ...], dest: Path, limit: int) -> bool:
        """Move the regular file `names` (never a link, at most `limit` bytes) to `dest`: a
        rename, or on another file system a copy from a descriptor opened without following
        links, then the original removed. False when it is not such a file."""
        fd = self._walk(names[:-1])
        if fd is None:
            return False
        try:
            try:
                st = os.stat(names[-1], dir_fd=fd, follow_symlinks=False)
            except OSError:
                return False
            if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
                return False
            try:
                os.rename(names[-1], dest, src_dir_fd=fd)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    return False
                data = None
                with contextlib.suppress(OSError):
                    f = os.open(names[-1], _O_READ, dir_fd=fd)
                    try:
                        data = _read_fd(f, limit)
                    finally:
                        os.close(f)
                if data is None:
                    return False
                dest.write_bytes(data)
                with contextlib.suppress(OSError):
                    os.unlink(names[-1], dir_fd=fd)
            # what arrived must be what was checked (a swap between the check and the rename)
            arrived = os.lstat(dest)
            if not stat.S_ISREG(arrived.st_mode):
                with contextlib.suppress(OSError):
                    os.unlink(dest)
                return False
            return True
        finally:
            os.close(fd)


def _int(value: Any, low: int = 0, high: int = 2**62) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    value = int(value)
    return value if low <= value <= high else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and abs(value) < 1e15 else None


def _text(value: Any, limit: int = 300) -> str | None:
    if not isinstance(value, str):
        return None
    return value[:limit]


@dataclass(frozen=True)
class AgentInfo:
    """One process's agent as its status file says (times are wall-clock seconds).

    `local_pid`: the process's pid as this host sees it (inside a container the agent's own pid
    differs: matched through /proc/PID/status NSpid and the start time), None when it is not
    visible from here (another host, another PID namespace)."""

    pid: int
    host: str
    program: str
    state: str
    reason: str | None
    torch: str | None
    updated_wall: float
    start_ticks: int | None = None
    local_pid: int | None = None
    cuda: bool = False

    @property
    def local(self) -> bool:
        return self.local_pid is not None or self.host == runtime.safe_host()

    def alive(self) -> bool | None:
        """True/False for a process visible from here; for another host's (or namespace's),
        whether its heartbeat is fresh (None when its status gives no time at all)."""
        if self.local_pid is not None:
            ticks = runtime.start_ticks(self.local_pid)
            if ticks is None:
                return False
            return self.start_ticks is None or ticks == self.start_ticks
        if self.host == runtime.safe_host() and self.start_ticks is None:
            return os.path.isdir(f"/proc/{self.pid}")  # an agent from before start times
        if not self.updated_wall:
            return None
        return time.time() - self.updated_wall < STALE_STATUS_S

    def label(self) -> str:
        where = "" if self.local else f"@{self.host}"
        shown = self.local_pid if self.local_pid is not None else self.pid
        inner = f", pid {self.pid} inside its container" if shown != self.pid else ""
        return f"pid {shown}{where} ({self.program}{inner})"


def _ns_pids() -> dict[tuple[int, int], int]:
    """(innermost pid, start ticks) -> host pid, for every process whose /proc entry is readable."""
    out: dict[tuple[int, int], int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8", errors="replace") as fh:
                ns = next((line for line in fh if line.startswith("NSpid:")), None)
        except OSError:
            continue
        ticks = runtime.start_ticks(entry)
        if ns is None or ticks is None:
            continue
        inner = ns.split()[-1]
        if inner.isdigit():
            out[(int(inner), ticks)] = int(entry)
    return out


def _locate(
    pid: int, host: str, ticks: int | None, ns: dict[tuple[int, int], int] | None
) -> int | None:
    """The host pid of the agent's process (see AgentInfo.local_pid)."""
    if ticks is None:
        return pid if host == runtime.safe_host() and os.path.isdir(f"/proc/{pid}") else None
    if runtime.start_ticks(pid) == ticks and host == runtime.safe_host():
        return pid
    if ns is None:
        return None
    return ns.get((pid, ticks))


def list_agents(agent_dir: Path | AgentDir) -> list[AgentInfo]:
    """Every status file in the agent directory (unreadable or foreign ones skipped), by pid."""
    opened = agent_dir if isinstance(agent_dir, AgentDir) else _open_quietly(Path(agent_dir))
    if opened is None:
        return []
    try:
        return _agents_in(opened)
    finally:
        if opened is not agent_dir:
            opened.close()


def _open_quietly(path: Path) -> AgentDir | None:
    try:
        return AgentDir(path, os.open(path, _O_DIR))
    except OSError:
        return None


def _live_first(files: dict[str, float]) -> list[str]:
    """Status file names (name -> mtime) in the order they are read, at most MAX_STATUS_FILES:

    1. this host's whose pid runs now;
    2. any other that changed within STALE_STATUS_S (a live agent rewrites its file every
       HEARTBEAT_S: another PID namespace's, a container's, another host's), newest first;
    3. the stale rest, newest first: read only while room is left, so that no number of
       files of processes that died without a normal exit (os._exit, SIGKILL), here or in a
       container, can hide a live agent. A stood-down agent stops its heartbeat
       and is in this group too, seen while there is room.

    A name is `HOST-PID.json`; what the file says is checked afterwards, this is only the order."""
    here = runtime.safe_host() + "-"
    now = time.time()
    ranked = []
    for name, mtime in files.items():
        if not _STATUS_NAME.fullmatch(name):
            continue
        pid = name[: -len(".json")].rsplit("-", 1)[1]
        if name.startswith(here) and os.path.isdir(f"/proc/{int(pid)}"):
            rank = 0
        else:
            rank = 1 if now - mtime < STALE_STATUS_S else 2
        ranked.append((rank, -mtime if rank else 0.0, name))
    ranked.sort()
    return [name for _, _, name in ranked[:MAX_STATUS_FILES]]


def _agents_in(folder: AgentDir) -> list[AgentInfo]:
    out: list[AgentInfo] = []
    ns: dict[tuple[int, int], int] | None = None
    for name in _live_first(folder.mtimes(runtime.AGENTS_DIR)):
        d = folder.read_json(runtime.AGENTS_DIR, name, limit=STATUS_MAX_BYTES)
        if d is None:
            continue
        pid, host = _int(d.get("pid"), 1, 2**31), _text(d.get("host"), 64)
        state = _text(d.get("state"), 32) or "?"
        if pid is None or host is None:
            continue
        ticks = _int(d.get("start_ticks"))
        local = _locate(pid, host, ticks, ns)
        if local is None and ticks is not None and ns is None:
            ns = _ns_pids()  # only when an agent is not where its pid says: a container
            local = _locate(pid, host, ticks, ns)
        out.append(
            AgentInfo(
                pid,
                host,
                _text(d.get("program"), 120) or "?",
                state,
                _text(d.get("reason"), 500),
                _text(d.get("torch"), 64),
                _float(d.get("updated_wall")) or 0.0,
                ticks,
                local,
                d.get("cuda") is True or state == "armed",
            )
        )
    return sorted(out, key=lambda a: (a.host, a.pid))


@dataclass(frozen=True)
class SnapshotFile:
    """One collected snapshot: its pickle and the agent's metadata."""

    pickle_path: Path
    seq: int
    pid: int
    host: str
    program: str
    wall: float
    snapshot_s: float | None

    @classmethod
    def from_meta(cls, meta_path: Path) -> SnapshotFile:
        """Read a snapshot's `.json` (raises ValueError/KeyError/TypeError/OSError when bad)."""
        d = _json_file(meta_path, STATUS_MAX_BYTES)
        if d is None:
            raise ValueError(f"{meta_path.name}: not a readable snapshot description")
        return cls(
            meta_path.with_suffix(".pickle"),
            int(d["seq"]),
            int(d["pid"]),
            str(d["host"]),
            str(d.get("program", "?")),
            float(d["wall"]),
            float(d["snapshot_s"]) if d.get("snapshot_s") is not None else None,
        )

    def meta(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "pid": self.pid,
            "host": self.host,
            "program": self.program,
            "wall": self.wall,
            "snapshot_s": self.snapshot_s,
            "source": "agent",
        }


# --- the inside evidence, reduced to InsideSample's fields ------------------------------------
_CUDA_KEYS = (
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
    "segments",
    "allocations",
    "alloc_retries",
    "ooms",
)
_GLIBC_KEYS = (
    "in_use_bytes",
    "free_kept_bytes",
    "mmap_bytes",
    "arena_bytes",
    "keepcost",
    "free_chunks",
)
_PYTHON_KEYS = (
    "allocated_blocks",
    "traced_bytes",
    "peak_bytes",
    "overhead_bytes",
    "lines",
    "traces_estimate",
)
_MAX_DEVICES = 64
_MAX_POOLS = 256
_MAX_TOP = 50
_MAX_FRAMES = 16


def _numbers(src: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        value = _int(src.get(key))
        if value is not None:
            out[key] = value
    return out


def _clean_pool(pool: dict[str, Any]) -> dict[str, Any]:
    raw = pool.get("pool_id")
    ident = (
        [int(x) for x in raw[:2] if _int(x, -(2**62)) is not None] if isinstance(raw, list) else []
    )
    return {"pool_id": ident, **_numbers(pool, ("reserved_bytes", "allocated_bytes", "segments"))}


def _clean_cuda(raw: Any) -> list[dict[str, Any]] | None:
    if not isinstance(raw, list):
        return None
    out: list[dict[str, Any]] = []
    for dev in raw[:_MAX_DEVICES]:
        if not isinstance(dev, dict) or _int(dev.get("device"), 0, 1024) is None:
            continue
        entry: dict[str, Any] = {"device": int(dev["device"]), **_numbers(dev, _CUDA_KEYS)}
        if isinstance(dev.get("pools"), list):
            entry["pools"] = [
                _clean_pool(p) for p in dev["pools"][:_MAX_POOLS] if isinstance(p, dict)
            ]
        out.append(entry)
    return out


def _clean_glibc(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    out = _numbers(raw, _GLIBC_KEYS)
    call = _float(raw.get("call_ms"))
    if call is not None:
        out["call_ms"] = call
    version = _text(raw.get("glibc"), 16)
    if version:
        out["glibc"] = version
    return out


def _clean_line(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get("file"), str):
        return None
    line, size = _int(item.get("line"), 0, 10**9), _int(item.get("bytes"))
    if line is None or size is None:
        return None
    frames = []
    raw_frames = item.get("frames")
    for fr in raw_frames if isinstance(raw_frames, list) else []:
        if isinstance(fr, list) and len(fr) == 2 and isinstance(fr[0], str):
            n = _int(fr[1], 0, 10**9)
            if n is not None:
                frames.append([fr[0][:500], n])
        if len(frames) >= _MAX_FRAMES:
            break
    return {
        "file": item["file"][:500],
        "line": line,
        "frames": frames,
        "bytes": size,
        "count": _int(item.get("count")) or 0,
        "bytes_diff": _int(item.get("bytes_diff"), -(2**62)) or 0,
    }


def _clean_python(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    out = _numbers(raw, _PYTHON_KEYS)
    out["tracing"] = raw.get("tracing") is True
    call = _float(raw.get("call_ms"))
    if call is not None:
        out["call_ms"] = call
    if isinstance(raw.get("top"), list):
        lines = (_clean_line(item) for item in raw["top"][:_MAX_TOP])
        out["top"] = [line for line in lines if line is not None]
    return out


def clean_inside(raw: Any) -> dict[str, Any]:
    """An answer's `inside` part with only InsideSample's fields, each of its type and bounded:
    {cuda, pinned, glibc, python, cuda_ms, error} (a part absent or not of its shape is None).
    The answer comes from a directory another user may control: nothing else passes."""
    src = raw if isinstance(raw, dict) else {}
    pinned = src.get("pinned")
    return {
        "cuda": _clean_cuda(src.get("cuda")),
        "pinned": _numbers(pinned, ("held_bytes", "in_use_bytes"))
        if isinstance(pinned, dict)
        else None,
        "glibc": _clean_glibc(src.get("glibc")),
        "python": _clean_python(src.get("python")),
        "cuda_ms": _float(src.get("cuda_ms")),
        "error": _text(src.get("error"), 500),
    }


@dataclass(frozen=True)
class Reply:
    """One process's answer to one trigger: its inside evidence and, when asked, a snapshot."""

    pid: int
    host: str
    program: str
    seq: int
    round: int
    window: str
    wall: float
    local_pid: int | None
    inside: dict[str, Any] | None
    snapshot: SnapshotFile | None
    path: Path = field(compare=False)

    @property
    def label(self) -> str:
        shown = self.local_pid if self.local_pid is not None else self.pid
        return f"pid {shown} ({self.program})"


class Controller:
    """Ask every agent of a directory for inside evidence and snapshots; collect the answers.

    token: this run's own (random by default); a trigger expires after `expires_s`, so one left
    behind by a killed soak does nothing to a later server. `open_session()` makes this soak the
    directory's one soak (agents then accept its token only); `close()` ends it.
    `create`: make the directory (0700) when it does not exist (a directory the user named);
    `owner_uid`: the uid that must own it (a directory named in a server process's
    environment must be that process's user's: a server cannot point a root soak at /etc).
    Every file is read and written relative to the directory opened by `check()`.
    """

    def __init__(
        self,
        agent_dir: Path,
        *,
        token: str | None = None,
        expires_s: float = 120.0,
        clock: Callable[[], float] = time.time,
        create: bool = True,
        owner_uid: int | None = None,
    ) -> None:
        self.dir = Path(agent_dir)
        self.token = token or secrets.token_hex(8)
        if not runtime.TOKEN_RE.fullmatch(self.token):
            raise InputError(f"agent token {self.token!r}: use 1-64 letters, digits, '-' or '_'")
        self.expires_s = expires_s
        self.clock = clock
        self.create = create
        self.owner_uid = owner_uid
        self.session_open = False
        self._dir: AgentDir | None = None

    # --- the directory -------------------------------------------------------------------------
    def check(self) -> None:
        """Open the directory (made 0700 when `create` and missing): a real directory, not a
        link, that this user can write and that group and others cannot (the agents refuse such
        a directory), owned by `owner_uid` when given. Raises InputError with the reason."""
        if self._dir is None:
            self._dir = AgentDir.open(self.dir, create=self.create, owner_uid=self.owner_uid)

    @property
    def folder(self) -> AgentDir:
        self.check()
        assert self._dir is not None
        return self._dir

    def _write(self, name: str, data: dict[str, Any]) -> None:
        """Write a file of ours atomically, readable by the agents (a root soak, a user server)."""
        self.folder.write(name, json.dumps(data).encode("utf-8"), mode=0o644)

    def open_session(self) -> None:
        """Make this soak the directory's soak: raises InputError when another live soak is."""
        d = self.folder.read_json(runtime.SESSION_FILE, limit=runtime.TRIGGER_MAX_BYTES)
        if d is not None and d.get("token") != self.token:
            with contextlib.suppress(Exception):
                other = runtime.parse_session(json.dumps(d).encode("utf-8"))
                if runtime.session_alive(other, runtime.safe_host()):
                    raise InputError(
                        f"another soak (pid {other['pid']}) is using the agent directory "
                        f"{self.dir}; one soak per agent directory at a time"
                    )
        self._write(
            runtime.SESSION_FILE,
            {
                "protocol": runtime.PROTOCOL,
                "token": self.token,
                "pid": os.getpid(),
                "start_ticks": runtime.start_ticks(),
                "host": runtime.safe_host(),
                "pid_ns": runtime.pid_namespace(),
                "created_wall": self.clock(),
            },
        )
        self.session_open = True

    # --- agents ----------------------------------------------------------------------------------
    def agents(self) -> list[AgentInfo]:
        """Every agent of the directory whose process is alive (or, elsewhere, heard lately)."""
        return [a for a in list_agents(self.folder) if a.alive() is not False]

    def ready(self) -> list[AgentInfo]:
        """Live agents that answer for inside evidence ("ready" or "armed")."""
        return [a for a in self.agents() if a.state in ("ready", "armed")]

    def armed(self) -> list[AgentInfo]:
        """Live agents whose CUDA allocator history is armed (they can take snapshots)."""
        return [a for a in self.agents() if a.state == "armed"]

    def stood_down(self) -> list[AgentInfo]:
        return [a for a in self.agents() if a.state == "stood-down"]

    # --- triggers --------------------------------------------------------------------------------
    def trigger(
        self,
        seq: int,
        *,
        round_index: int | None = None,
        want: Iterable[str] = ("snapshot",),
        window: str = "idle_end",
        trace_python: bool = False,
    ) -> None:
        """Write trigger.json atomically (agents pick it up at their next poll)."""
        if not self.session_open:
            self.open_session()
        now = self.clock()
        self._write(
            runtime.TRIGGER_FILE,
            {
                "protocol": runtime.PROTOCOL,
                "token": self.token,
                "seq": int(seq),
                "round": int(seq if round_index is None else round_index),
                "window": window,
                "want": sorted(set(want)),
                "trace_python": bool(trace_python),
                "created_wall": now,
                "expires_wall": now + self.expires_s,
            },
        )

    def _replies(self, seq: int) -> dict[tuple[str, int], str]:
        found: dict[tuple[str, int], str] = {}
        for name in self.folder.listdir(runtime.REPLIES_DIR, self.token)[:100_000]:
            m = _REPLY_NAME.fullmatch(name)
            if m and int(m.group(1)) == seq:
                found[(m.group(2), int(m.group(3)))] = name
        return found

    def collect(
        self,
        seq: int,
        *,
        round_index: int | None = None,
        want: Iterable[str] = ("inside",),
        trace_python: bool = False,
        timeout_s: float = 10.0,
        min_agents: int = 0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> tuple[list[Reply], list[AgentInfo]]:
        """Trigger `seq` and wait until every live agent that should answer did, or `timeout_s`.

        Returns (the answers, read and reduced; the agents that did not answer in time).
        Agents answer "inside" when ready or armed, "snapshot" only when armed. `min_agents`:
        also wait (within `timeout_s`) until at least that many agents are live and answered
        (a server just started may not have registered its agent yet: with 0, no agent yet
        means no answer to wait for)."""
        wanted = sorted(set(want))
        self.trigger(seq, round_index=round_index, want=wanted, trace_python=trace_python)
        deadline = time.monotonic() + timeout_s
        while True:
            agents = self.ready() if "inside" in wanted else self.armed()
            found = self._replies(seq)
            missing = [a for a in agents if (a.host, a.pid) not in found]
            if (not missing and len(found) >= min_agents) or time.monotonic() >= deadline:
                break
            sleep(0.05)
        by_key = {(a.host, a.pid): a for a in list_agents(self.folder)}
        replies = []
        for key, name in sorted(found.items()):
            reply = self._read_reply(name, by_key.get(key))
            if reply is not None:
                replies.append(reply)
        return replies, missing

    def _read_reply(self, name: str, agent: AgentInfo | None) -> Reply | None:
        d = self.folder.read_json(runtime.REPLIES_DIR, self.token, name, limit=REPLY_MAX_BYTES)
        if d is None:
            return None
        pid, host = _int(d.get("pid"), 1, 2**31), _text(d.get("host"), 64)
        seq = _int(d.get("seq"), 0, runtime.MAX_SEQ)
        wall = _float(d.get("wall"))
        if pid is None or host is None or seq is None or wall is None:
            return None
        program = _text(d.get("program"), 120) or "?"
        path = self.dir / runtime.REPLIES_DIR / self.token / name
        snapshot = None
        snap = d.get("snapshot")
        if isinstance(snap, dict) and snap.get("file") == path.with_suffix(".pickle").name:
            snapshot = SnapshotFile(
                path.with_suffix(".pickle"),
                seq,
                pid,
                host,
                program,
                wall,
                _float(snap.get("snapshot_s")),
            )
        local = agent.local_pid if agent is not None else None
        if local is None:
            local = _locate(pid, host, _int(d.get("start_ticks")), None)
        return Reply(
            pid=pid,
            host=host,
            program=program,
            seq=seq,
            round=_int(d.get("round"), 0, runtime.MAX_SEQ) or 0,
            window=_text(d.get("window"), 32) or "idle_end",
            wall=wall,
            local_pid=local,
            inside=clean_inside(d["inside"]) if "inside" in d else None,
            snapshot=snapshot,
            path=path,
        )

    def snapshot(
        self, seq: int, *, timeout_s: float = 10.0, sleep: Callable[[float], None] = time.sleep
    ) -> tuple[list[SnapshotFile], list[AgentInfo]]:
        """Trigger a snapshot `seq` and wait for every armed agent (see `collect`).

        Returns (snapshots written for this token and seq, armed agents that did not answer).
        The answers' files stay in the directory until `move` (or `discard`)."""
        replies, missing = self.collect(seq, want=("snapshot",), timeout_s=timeout_s, sleep=sleep)
        return [r.snapshot for r in replies if r.snapshot is not None], missing

    def _names(self, path: Path) -> tuple[str, ...]:
        return (runtime.REPLIES_DIR, self.token, path.name)

    def discard(self, replies: Iterable[Reply]) -> None:
        """Remove answers read and not moved (their pickles too)."""
        for r in replies:
            for path in (r.path, r.path.with_suffix(".pickle")):
                self.folder.unlink(*self._names(path))

    def move(self, files: Iterable[SnapshotFile], dest: Path) -> list[SnapshotFile]:
        """Move collected snapshots into `dest` (the run's attribution folder): the pickle by
        rename (copied from a descriptor opened without following links when the folder is on
        another file system), its description written anew by us; the answer file removed."""
        dest.mkdir(parents=True, exist_ok=True)
        out: list[SnapshotFile] = []
        for f in files:
            target = dest / f.pickle_path.name
            if not self.folder.move_out(self._names(f.pickle_path), target, SNAPSHOT_MAX_BYTES):
                continue
            moved = SnapshotFile(target, f.seq, f.pid, f.host, f.program, f.wall, f.snapshot_s)
            meta = target.with_suffix(".json")
            try:
                meta.write_text(json.dumps(moved.meta()), encoding="utf-8")
            except OSError:
                continue
            self.folder.unlink(*self._names(f.pickle_path.with_suffix(".json")))
            out.append(moved)
        return out

    def close(self) -> None:
        """End the session: remove our trigger and session (if still ours), our answers and
        their folder, and close the directory."""
        if self._dir is None:
            return
        folder = self._dir
        for name in (runtime.TRIGGER_FILE, runtime.SESSION_FILE):
            d = folder.read_json(name, limit=runtime.TRIGGER_MAX_BYTES)
            if d is not None and d.get("token") == self.token:
                folder.unlink(name)
        for name in folder.listdir(runtime.REPLIES_DIR, self.token):
            if _REPLY_NAME.fullmatch(name) or name.endswith(".pickle"):
                folder.unlink(runtime.REPLIES_DIR, self.token, name)
        folder.rmdir(runtime.REPLIES_DIR, self.token)
        self.session_open = False
        folder.close()
        self._dir = None

    clear = close  # the name of protocol 1
