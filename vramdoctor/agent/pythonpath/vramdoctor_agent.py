"""vramdoctor's in-process agent: what the server's own allocators count, and allocator snapshots.

Loaded at interpreter start by the `sitecustomize.py` beside this file (put this directory first
on PYTHONPATH: `PYTHONPATH=$(vramdoctor agent-path)`) or by a `.pth` line
(`vramdoctor agent-path --pth`). It does nothing unless VRAMDOCTOR_AGENT_DIR is set. Standard
library only, and never imports torch: it waits for the process's own code to import torch and
initialise CUDA, so a CPU-only process never gets a CUDA context from it.

In each process (forked children restart it through `os.register_at_fork`; spawned children run
sitecustomize again, since they inherit the environment) a daemon thread polls every
VRAMDOCTOR_AGENT_POLL_S seconds (default 0.5):

1. at its first poll it checks the directory (below) and registers `agents/<host>-<pid>.json`,
   state "ready": inside evidence of the host side (glibc's `mallinfo2()`, Python's allocator,
   optionally `tracemalloc`) is available in every Python process, CPU-only ones included;
2. once `torch` is fully imported (a module still being imported is left alone) and
   `torch.cuda.is_initialized()` is true, it arms the allocator history in its cheapest useful
   setting, `torch.cuda.memory._record_memory_history(enabled="state", context="state",
   stacks="python")` (plus `record_pinned_host_memory=True` where torch has it, 2.14+), and the
   state becomes "armed";
3. it watches `trigger.json`, written by soak at the end of every idle window. A trigger names
   the running soak's token (the one in `session.json`), a sequence number, the round, an expiry
   time and what is wanted: "inside" (the allocators' counters, answered by every agent) and
   "snapshot" (`torch.cuda.memory._snapshot()`, answered by armed agents). The answer is
   `replies/<token>/<seq>-<host>-<pid>.json` (and `.pickle` for a snapshot, written first).

The directory is hostile until proven otherwise (docs/threat-model.md, "The agent"): the agent
refuses a directory that is a link, that it does not own (its effective uid), or that group or
others can write, and one whose path another user could redirect (a link of another user on the
way, an ancestor of another user or writable by others without the sticky bit: `check_parents`);
it removes at start the status files its host's dead processes left, and those of other PID
namespaces or hosts silent for FOREIGN_STALE_S (`_prune_stale`); it opens everything relative to
the directory it checked (no path is looked up twice), never follows a link (`O_NOFOLLOW`,
regular files only), reads at most TRIGGER_MAX_BYTES of a trigger or session file, accepts only
the token of a session whose soak is still alive (when that process is visible), handles each
sequence number once and in increasing order, and keeps at most MAX_PENDING answers of its own
that nobody collected. A malformed trigger is ignored (said once on stderr) and the agent stays
armed.

Never harms the server: a failure of torch or of the agent's own machinery (an unwritable
directory, a snapshot that raises, a torch without the API) logs ONE line on stderr, turns the
history and any tracing it started off again, writes state "stood-down" when it can, and the
agent's thread ends; the server's own threads are never touched. What it records: allocation
sizes, addresses, states, and for live blocks the Python stack (file paths, line numbers,
function names); counters of the allocators; with `trace_python`, file:line of the Python lines
holding most memory. No tensor contents, no arguments, no environment, no command line beyond the
program's file name.

Costs (docs/attribute.md, benchmarks/agent_overhead.py): allocator history ~1 us per allocation
and free; `torch.cuda.memory_stats` ~0.1 ms per device; `mallinfo2()` walks every free chunk of
every arena under that arena's lock (0.01 ms, up to ~190 ms on a badly fragmented heap: timed and
reported as `call_ms`); all of it only when a trigger asks, at the end of an idle window.

VRAMDOCTOR_AGENT_TEST_LEAK=module:qualname:KiB is for tests ONLY: once armed, every return from
that function keeps KiB of GPU memory alive (on Python >= 3.12 allocated from a sys.monitoring
callback, so the stack shows the function itself; before 3.12 through a wrapper, so the stack
shows its caller). Never set it on a production server.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import math
import os
import pickle
import re
import secrets
import socket
import stat
import sys
import threading
import time
from typing import Any

ENV_DIR = "VRAMDOCTOR_AGENT_DIR"
ENV_POLL = "VRAMDOCTOR_AGENT_POLL_S"
ENV_TEST_LEAK = "VRAMDOCTOR_AGENT_TEST_LEAK"
PROTOCOL = 2
TRIGGER_FILE = "trigger.json"
SESSION_FILE = "session.json"
AGENTS_DIR = "agents"
SNAPSHOTS_DIR = "snapshots"  # protocol 1's answers (read by older soaks only)
REPLIES_DIR = "replies"
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
HISTORY_SETTINGS = {"enabled": "state", "context": "state", "stacks": "python"}
# A trigger or session file is a few hundred bytes; anything larger is not ours.
TRIGGER_MAX_BYTES = 4096
MAX_SEQ = 1_000_000
# Answers of this process that no soak collected yet: beyond this, triggers wait.
MAX_PENDING = 16
WANTS = ("inside", "snapshot")
# tracemalloc: lines reported per answer (the largest and the fastest-growing, merged).
TRACE_TOP = 20
# tracemalloc records this many frames of each allocation (innermost first when reported): enough
# to reach the server's own line from inside a library (numpy's ones() called from the server).
TRACE_FRAMES = 4
# tracemalloc keeps ~50 bytes per live trace (measured: 50-60 on CPython 3.11); beyond
# TRACE_MAX_TRACES traces the per-line grouping (seconds with the GIL held) is skipped.
TRACE_BYTES_PER_TRACE = 50
TRACE_MAX_TRACES = 100_000
# The per-pool split of CUDA memory comes from a snapshot: skipped when the last one took longer.
POOLS_SNAPSHOT_MAX_MS = 50.0
# mallinfo2() walks every free chunk under each arena's lock (0.3 ms at 10,000 free chunks, 370 ms
# at 800,000 on a 2-core host: benchmarks/agent_overhead.py --host): one call slower than this is
# the last in the process. VRAMDOCTOR_AGENT_MALLINFO2_MAX_MS sets another limit (milliseconds).
MALLINFO2_MAX_MS = 1000.0
ENV_MALLINFO2_MAX_MS = "VRAMDOCTOR_AGENT_MALLINFO2_MAX_MS"
# The status file is rewritten this often (seconds): soak takes an older one for a dead process.
HEARTBEAT_S = 30.0
# Status files looked at, per agent start, for ones whose process died without a normal exit.
STALE_SCAN = 2000
# A status file of another PID namespace or host (a container's agent in a directory the host
# shares) cannot be checked against its process from here: it is stale when neither its mtime
# nor its recorded heartbeat (`updated_wall`) moved for this long (a live agent rewrites it
# every HEARTBEAT_S; a stood-down one stops, and is not seen from another namespace after 90 s).
FOREIGN_STALE_S = 24 * 3600.0
_STATUS_NAME = re.compile(r"([A-Za-z0-9._-]{1,64})-(\d{1,10})\.json")

_lock = threading.Lock()
_started_pid: int | None = None
_fork_hook = False
_current: Agent | None = None


def _log(message: str) -> None:
    try:
        sys.stderr.write(f"vramdoctor-agent[{os.getpid()}]: {message}\n")
        sys.stderr.flush()
    except Exception:  # stderr closed: nothing to do, and never raise into the server
        pass


def safe_host() -> str:
    """This host's name as used in file names ([A-Za-z0-9._-] only)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"


def start_ticks(pid: int | str = "self") -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None.

    The same number in every PID namespace: with the pid it names one process for good, across
    pid reuse and across a container's boundary."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        return None
    try:
        # the command name (field 2) is in parentheses and may hold spaces or ')'
        rest = raw[raw.rindex(b")") + 2 :].split()
        return int(rest[19])
    except (ValueError, IndexError):
        return None


def visible_processes() -> set[tuple[int, int]]:
    """(pid in its own PID namespace, start ticks) of every process this one can see in
    /proc (NSpid's last field: a container's process as its agent names itself)."""
    out: set[tuple[int, int]] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as fh:
                ns = next((line for line in fh if line.startswith(b"NSpid:")), None)
        except OSError:
            continue
        ticks = start_ticks(entry)
        inner = ns.split()[-1] if ns is not None else b""
        if ticks is not None and inner.isdigit():
            out.add((int(inner), ticks))
    return out


def boot() -> None:
    """Start the agent in this process when VRAMDOCTOR_AGENT_DIR is set (idempotent per pid)."""
    global _started_pid, _fork_hook, _current
    directory = os.environ.get(ENV_DIR, "").strip()
    if not directory:
        return
    try:
        if not os.path.isabs(directory):  # children that chdir elsewhere must find the same dir
            directory = os.environ[ENV_DIR] = os.path.abspath(directory)
        with _lock:
            if _started_pid == os.getpid():
                return
            _started_pid = os.getpid()
        if not _fork_hook and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork)
            _fork_hook = True
        _current = Agent(directory)
        _current.start()
    except Exception as exc:
        _log(f"not started: {type(exc).__name__}: {exc}")


def _after_fork() -> None:
    global _lock, _started_pid, _current
    _lock = threading.Lock()  # the parent's lock may have been held by another thread at fork
    _started_pid = None
    parent, _current = _current, None
    if parent is not None:
        parent.forget_after_fork()
    boot()


class _StandDown(Exception):
    """A fault of torch or of the agent's machinery: turn everything off and end the thread."""


class _Quiet(Exception):
    """Nothing to do in this process (vramdoctor's own): the thread ends without a word."""


class _Refused(Exception):
    """Input that is not ours (a malformed or foreign file): ignore it, stay armed.

    `quiet`: an ordinary case (expired, already handled) that is not worth a line on stderr."""

    def __init__(self, message: str, *, quiet: bool = False) -> None:
        super().__init__(message)
        self.quiet = quiet


# --- the directory, treated as hostile ---------------------------------------------------------
_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _check_dir_stat(st: os.stat_result, what: str) -> None:
    """A directory the agent may use: a real directory, ours, not writable by group or others."""
    if not stat.S_ISDIR(st.st_mode):
        raise _StandDown(f"{what} is not a directory")
    euid = os.geteuid()
    if st.st_uid != euid:
        raise _StandDown(
            f"{what} belongs to uid {st.st_uid}, not to this process's uid {euid}: "
            "another user could plant files in it"
        )
    if st.st_mode & 0o022:
        raise _StandDown(
            f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
            "give the agent a directory only its user can write (chmod go-w)"
        )


def check_parents(path: str) -> None:
    """Refuse (raise _StandDown) a path whose ancestors another user could change.

    Every existing component of the absolute path is looked at with lstat: a link must belong
    to root or to this process's uid (a link another user planted in a shared directory, as in
    `/tmp/shared/vd -> /root/x`, would make the agent create and write where that user chose;
    `/var/run -> /run` is root's and accepted). Every existing ancestor directory of where the
    path leads must belong to root or to this uid, and must not be writable by group or others
    unless it has the sticky bit (in `/tmp`, mode 1777, nobody can rename or replace another's
    entry). Components not created yet are checked by `open_agent_dir` as they are made.
    At most 40 links are followed (ELOOP's limit)."""
    euid = os.geteuid()
    trusted = (0, euid)
    pending = [c for c in os.path.abspath(path).split(os.sep) if c]
    done = "/"
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            done = os.path.dirname(done.rstrip("/")) or "/"
            continue
        nxt = os.path.join(done, part)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return  # the rest is created by the agent (0700, its own)
        except OSError as exc:
            raise _StandDown(f"cannot check {nxt}: {exc.strerror or exc}") from None
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in trusted:
                raise _StandDown(
                    f"{nxt} on the way to the agent directory is a link that belongs to uid "
                    f"{st.st_uid}: another user chose where it leads; give a directory of your "
                    "own (not under a link others made)"
                )
            hops += 1
            if hops > 40:
                raise _StandDown(f"too many links on the way to the agent directory {path}")
            target = os.readlink(nxt)
            rest = [c for c in target.split(os.sep) if c]
            pending[:0] = rest
            if target.startswith(os.sep):
                done = "/"
            continue
        if not stat.S_ISDIR(st.st_mode):
            return  # open_agent_dir says "not a directory"
        if pending:  # an ancestor: who could swap what lies below it
            if st.st_uid not in trusted:
                raise _StandDown(
                    f"{nxt}, above the agent directory, belongs to uid {st.st_uid}: that user "
                    "could replace what lies below it"
                )
            if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                raise _StandDown(
                    f"{nxt}, above the agent directory, is writable by group or others "
                    f"without the sticky bit (mode {stat.S_IMODE(st.st_mode):o}): another "
                    "user could replace what lies below it"
                )
        done = nxt


def open_agent_dir(path: str, *, create: bool = True) -> int | None:
    """An fd of the agent directory after the checks above (raises _StandDown with the reason);
    None when it does not exist and `create` is false.

    The directory itself must not be a link; links above it must be root's or this uid's, and
    no ancestor may be replaceable by another user (`check_parents`)."""
    if not (_O_NOFOLLOW and os.open in os.supports_dir_fd):
        raise _StandDown(
            "this platform lacks O_NOFOLLOW/dir_fd: the agent cannot use a directory safely"
        )
    check_parents(path)
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise _StandDown(
                f"cannot create the agent directory {path}: {exc.strerror or exc}"
            ) from None
    try:
        fd = os.open(path, _O_DIR | _O_NOFOLLOW)
    except FileNotFoundError:
        if not create:
            return None
        raise _StandDown(f"the agent directory {path} vanished while it was opened") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _StandDown(f"the agent directory {path} is a link or not a directory") from None
        raise _StandDown(f"cannot open the agent directory {path}: {exc.strerror or exc}") from None
    try:
        _check_dir_stat(os.fstat(fd), f"the agent directory {path}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_subdir(parent: int, name: str, *, create: bool, what: str) -> int | None:
    """An fd of `parent/name` (made 0700 when `create`), same checks; None when absent."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
    try:
        fd = os.open(name, _O_DIR | _O_NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _StandDown(
                f"{what} is a link or not a directory: refusing to write through it"
            ) from None
        raise
    try:
        _check_dir_stat(os.fstat(fd), what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small(dirfd: int, name: str, limit: int = TRIGGER_MAX_BYTES) -> bytes | None:
    """The content of a small regular file in `dirfd`, or None when absent.

    Never follows a link and never blocks on a FIFO; a file that is not regular, not owned by
    this uid or root, or larger than `limit` raises _Refused."""
    try:
        fd = os.open(
            name,
            os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
            dir_fd=dirfd,
        )
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Refused(f"{name} is a symbolic link") from None
        raise _Refused(f"{name}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(f"{name} is not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise _Refused(f"{name} belongs to uid {st.st_uid}")
        if st.st_size > limit:
            raise _Refused(f"{name} has {st.st_size} bytes (at most {limit})")
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise _Refused(f"{name} is larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


def write_atomic(dirfd: int, name: str, payload: bytes, mode: int = 0o600) -> None:
    """Write `name` in `dirfd` through a new temporary file and a rename: readers never see half
    a file, and a name planted there (a link) is replaced, never written through."""
    tmp = f".vd-{secrets.token_hex(6)}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
        mode,
        dir_fd=dirfd,
    )
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.close(fd)
        fd = -1
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dirfd)
        raise


# --- triggers and sessions ---------------------------------------------------------------------
def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _whole(value: Any, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if low <= value <= high else None


def parse_trigger(raw: bytes) -> dict[str, Any]:
    """A trigger file's content, checked field by field (raises _Refused with the reason).

    Shape: {"token": str, "seq": int 0..MAX_SEQ, "expires_wall": finite number, "round": int,
    "window": str, "want": ["inside", "snapshot"], "trace_python": bool}. Protocol 1 triggers
    (no "want") ask for a snapshot."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _Refused("not JSON") from None
    if not isinstance(data, dict):
        raise _Refused("not a JSON object")
    token = data.get("token")
    if not isinstance(token, str) or not TOKEN_RE.fullmatch(token):
        raise _Refused("no valid token")
    seq = _whole(data.get("seq"), 0, MAX_SEQ)
    if seq is None:
        raise _Refused(f"seq must be a whole number from 0 to {MAX_SEQ}")
    expires = _finite(data.get("expires_wall"))
    if expires is None:
        raise _Refused("expires_wall must be a finite number")
    want = data.get("want", ["snapshot"])
    if not isinstance(want, list) or not want or not all(w in WANTS for w in want):
        raise _Refused(f"want must list some of {', '.join(WANTS)}")
    round_ = _whole(data.get("round", seq), 0, MAX_SEQ)
    window = data.get("window", "idle_end")
    if round_ is None or not isinstance(window, str) or not re.fullmatch(r"[a-z_]{1,32}", window):
        raise _Refused("round or window malformed")
    trace = data.get("trace_python", False)
    if not isinstance(trace, bool):
        raise _Refused("trace_python must be true or false")
    return {
        "token": token,
        "seq": seq,
        "expires_wall": expires,
        "want": sorted(set(want)),
        "round": round_,
        "window": window,
        "trace_python": trace,
    }


def parse_session(raw: bytes) -> dict[str, Any]:
    """A session file: {"token": str, "pid": int, "start_ticks": int | null, "host": str,
    "pid_ns": str | null} (raises _Refused)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _Refused("session file is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        raise _Refused("session file has no token")
    if not TOKEN_RE.fullmatch(data["token"]):
        raise _Refused("session token malformed")
    pid = _whole(data.get("pid"), 1, 2**31)
    ticks = data.get("start_ticks")
    ticks = _whole(ticks, 0, 2**62) if ticks is not None else None
    host = data.get("host")
    ns = data.get("pid_ns")
    return {
        "token": data["token"],
        "pid": pid,
        "start_ticks": ticks,
        "host": host if isinstance(host, str) else None,
        "pid_ns": ns if isinstance(ns, str) and len(ns) < 64 else None,
    }


def pid_namespace() -> str | None:
    """This process's PID namespace (`pid:[4026531836]`), or None where it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def session_alive(session: dict[str, Any], host: str) -> bool | None:
    """Whether the soak that wrote the session still runs: True/False when its process is
    visible from here (same host name, same PID namespace), None when this cannot tell (then
    the trigger's expiry is what ends it)."""
    pid = session.get("pid")
    if pid is None or session.get("host") != host:
        return None
    ticks = start_ticks(pid)
    if ticks is not None:  # visible: the same process only if it started at the same tick
        want = session.get("start_ticks")
        return want is None or ticks == want
    if os.path.isdir("/proc/self"):
        # not visible: ended, if it wrote the session from our own PID namespace; otherwise
        # (a soak on the host, the server in a hostNetwork pod) this cannot tell
        ns = session.get("pid_ns")
        return False if ns is not None and ns == pid_namespace() else None
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


# --- inside evidence ---------------------------------------------------------------------------
def _imported_torch() -> Any:
    """The torch module once fully imported (None while absent or still being imported)."""
    for name in ("torch", "torch.cuda"):
        mod = sys.modules.get(name)
        if mod is None:
            return None
        spec = getattr(mod, "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            return None  # half-imported: another thread is executing its module body
    return sys.modules["torch"]


_MALLINFO2_FIELDS = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)


class Glibc:
    """glibc's `mallinfo2()` through ctypes, or why it cannot be read (`self.why`)."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.version: str | None = None
        self._fn: Any = None
        try:
            limit = float(os.environ.get(ENV_MALLINFO2_MAX_MS, "") or MALLINFO2_MAX_MS)
        except ValueError:
            limit = MALLINFO2_MAX_MS
        self.max_ms = limit if math.isfinite(limit) and limit >= 0 else MALLINFO2_MAX_MS
        try:
            self._load()
        except Exception as exc:  # ctypes missing, a strange libc: no glibc evidence
            self._fn = None
            self.why = self.why or f"mallinfo2 unavailable: {type(exc).__name__}: {exc}"

    def _load(self) -> None:
        try:
            libc_version = os.confstr("CS_GNU_LIBC_VERSION")
        except (ValueError, OSError, AttributeError):
            libc_version = None
        if not libc_version or not libc_version.startswith("glibc "):
            self.why = "the C library is not glibc (no mallinfo2)"
            return
        self.version = libc_version.split()[1]
        try:
            major, minor = (int(x) for x in self.version.split(".")[:2])
        except ValueError:
            major, minor = 0, 0
        if (major, minor) < (2, 33):
            self.why = f"glibc {self.version} has no mallinfo2 (glibc 2.33 or later)"
            return
        import ctypes

        class Mallinfo2(ctypes.Structure):
            _fields_ = [(f, ctypes.c_size_t) for f in _MALLINFO2_FIELDS]

        libc = ctypes.CDLL("libc.so.6")
        process = ctypes.CDLL(None)
        fn = libc.mallinfo2
        fn.restype = Mallinfo2
        fn.argtypes = []
        own = ctypes.cast(libc.malloc, ctypes.c_void_p).value
        used = ctypes.cast(process.malloc, ctypes.c_void_p).value
        # Different addresses do not prove a replacement: in a non-PIE executable the process's
        # `malloc` symbol is its own PLT stub, which calls libc's. What decides is behaviour:
        # the malloc the process calls hands out memory that glibc's counters see.
        if own != used and not _glibc_counts(process, fn):
            where = _mapping_of(used) or "another library"
            self.why = (
                f"malloc is replaced by {where} (LD_PRELOAD or linked in): glibc's counters "
                "do not see the memory it hands out"
            )
            return
        self._fn = fn

    def read(self) -> dict[str, Any] | None:
        """{in_use_bytes, free_kept_bytes, mmap_bytes, arena_bytes, keepcost, call_ms} or None.

        A call that took longer than MALLINFO2_MAX_MS (a heap of millions of free chunks: the
        server's allocations in an arena wait while it is walked) is the last one: later reads
        give None and `why` says so."""
        if self._fn is None:
            return None
        t0 = time.perf_counter()
        info = self._fn()
        took = (time.perf_counter() - t0) * 1000.0
        if took > self.max_ms:
            self._fn = None
            self.why = (
                f"mallinfo2 took {took:.0f} ms ({int(info.ordblks) + int(info.smblks):,} free "
                "chunks walked under the arena locks): not called again in this process"
            )
        return {
            "in_use_bytes": int(info.uordblks) + int(info.hblkhd),
            "free_kept_bytes": int(info.fordblks),
            "mmap_bytes": int(info.hblkhd),
            "arena_bytes": int(info.arena),
            "keepcost": int(info.keepcost),
            "free_chunks": int(info.ordblks) + int(info.smblks),
            "call_ms": round(took, 4),
            "glibc": self.version,
        }


_PROBE_BYTES = 64 * 1024  # under glibc's mmap threshold (128 KiB): counted in uordblks


def _glibc_counts(process: Any, mallinfo2: Any) -> bool:
    """Whether the process's own `malloc` is glibc's: three 64 KiB allocations through it, each
    seen in glibc's in-use bytes (another thread's work can move the count: two of three
    decide). Freed at once; nothing else is touched."""
    import ctypes

    malloc, free = process.malloc, process.free
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    seen = 0
    for _ in range(3):
        before = int(mallinfo2().uordblks)
        ptr = malloc(_PROBE_BYTES)
        after = int(mallinfo2().uordblks)
        if ptr:
            free(ptr)
        seen += after - before >= _PROBE_BYTES
    return seen >= 2


def _mapping_of(address: int | None) -> str | None:
    """The file mapped at `address` in this process (/proc/self/maps), by its base name."""
    if not address:
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                lo, _, hi = parts[0].partition("-")
                if int(lo, 16) <= address < int(hi, 16) and len(parts) >= 6:
                    return os.path.basename(parts[5])
    except (OSError, ValueError, IndexError):
        return None
    return None


class PythonTrace:
    """Python's allocators: pymalloc's block count always; tracemalloc by line when asked.

    Tracing is started at the first trigger that asks for it (unless the process traces already:
    then it is read, never stopped) and stopped when a trigger no longer asks or the session
    ends: its cost (every Python allocation recorded) lasts only while a soak wants it."""

    def __init__(self) -> None:
        self.started_by_us = False
        self.previous: dict[tuple[tuple[str, int], ...], int] = {}

    def read(self, trace: bool) -> dict[str, Any]:
        import tracemalloc

        out: dict[str, Any] = {"allocated_blocks": int(sys.getallocatedblocks())}
        if trace and not tracemalloc.is_tracing():
            tracemalloc.start(TRACE_FRAMES)
            self.started_by_us = True
            self.previous = {}
        elif not trace and self.started_by_us:
            self.stop()
        out["tracing"] = tracemalloc.is_tracing()
        if not out["tracing"] or not trace:
            return out
        t0 = time.perf_counter()
        traced, peak = tracemalloc.get_traced_memory()
        overhead = int(tracemalloc.get_tracemalloc_memory())
        estimate = overhead // TRACE_BYTES_PER_TRACE
        out.update(
            {"traced_bytes": int(traced), "peak_bytes": int(peak), "overhead_bytes": overhead}
        )
        if estimate > TRACE_MAX_TRACES:
            # grouping that many traces by line holds the GIL for seconds (a Python loop, every
            # step of it traced too): the server's own threads would wait. Totals only.
            out["traces_estimate"] = estimate
            return out
        snap = tracemalloc.take_snapshot()
        own = (tracemalloc.__file__, __file__)
        # key: the allocation's frames, innermost first (tracemalloc lists the oldest first)
        now: dict[tuple[tuple[str, int], ...], tuple[int, int]] = {}
        for stat_ in snap.statistics("traceback"):
            frames = tuple((f.filename, f.lineno) for f in reversed(list(stat_.traceback)))
            if frames and frames[0][0] not in own:
                now[frames] = (int(stat_.size), int(stat_.count))
        del snap
        largest = sorted(now, key=lambda k: -now[k][0])[:TRACE_TOP]
        growing = sorted(
            (k for k in now if now[k][0] > self.previous.get(k, 0)),
            key=lambda k: -(now[k][0] - self.previous.get(k, 0)),
        )[:TRACE_TOP]
        top = sorted(set(largest) | set(growing), key=lambda k: -now[k][0])
        out.update(
            {
                "lines": len(now),
                "top": [
                    {
                        "file": k[0][0],
                        "line": k[0][1],
                        "frames": [list(f) for f in k],
                        "bytes": now[k][0],
                        "count": now[k][1],
                        "bytes_diff": now[k][0] - self.previous.get(k, 0),
                    }
                    for k in top
                ],
                "call_ms": round((time.perf_counter() - t0) * 1000.0, 3),
            }
        )
        self.previous = {k: v[0] for k, v in now.items()}
        return out

    def stop(self) -> None:
        if self.started_by_us:
            import tracemalloc

            with contextlib.suppress(Exception):
                tracemalloc.stop()
            self.started_by_us = False
            self.previous = {}


def _stat(stats: Any, key: str) -> int:
    try:
        value = stats.get(key, 0)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
    except Exception:
        return 0


def _pools(snapshot: Any) -> dict[int, list[dict[str, Any]]]:
    """device -> [{pool_id, reserved_bytes, allocated_bytes, segments}] from a snapshot's segments."""
    found: dict[tuple[int, tuple[int, int]], dict[str, Any]] = {}
    segments = snapshot.get("segments") if isinstance(snapshot, dict) else None
    for seg in segments if isinstance(segments, list) else []:
        if not isinstance(seg, dict):
            continue
        try:
            device = int(seg.get("device", 0) or 0)
            raw_pool = seg.get("segment_pool_id") or (0, 0)
            pool = (int(raw_pool[0]), int(raw_pool[1]))
            total = int(seg.get("total_size", 0) or 0)
            live = int(seg.get("allocated_size", 0) or 0)
        except (TypeError, ValueError, IndexError):
            continue
        entry = found.setdefault(
            (device, pool),
            {"pool_id": list(pool), "reserved_bytes": 0, "allocated_bytes": 0, "segments": 0},
        )
        entry["reserved_bytes"] += total
        entry["allocated_bytes"] += live
        entry["segments"] += 1
    out: dict[int, list[dict[str, Any]]] = {}
    for (device, _pool), entry in sorted(found.items()):
        out.setdefault(device, []).append(entry)
    return out


def cuda_counters(torch: Any, snapshot: Any = None) -> list[dict[str, Any]]:
    """Per device this process uses: the CUDA caching allocator's own counters (bytes).

    Only called once the process initialised CUDA itself; `memory_stats(d)` reads the
    allocator's host-side counters (no CUDA call, no context). Devices with nothing reserved and
    nothing allocated are left out, the current device excepted. `snapshot`: a
    `torch.cuda.memory._snapshot()` dict for the per-pool split, when one was taken."""
    cuda = torch.cuda
    count = int(cuda.device_count())
    current = int(cuda.current_device())
    pools = _pools(snapshot) if snapshot is not None else {}
    out: list[dict[str, Any]] = []
    for device in range(count):
        stats = cuda.memory_stats(device)
        entry: dict[str, Any] = {
            "device": device,
            "allocated_bytes": _stat(stats, "allocated_bytes.all.current"),
            "reserved_bytes": _stat(stats, "reserved_bytes.all.current"),
            "active_bytes": _stat(stats, "active_bytes.all.current"),
            "inactive_split_bytes": _stat(stats, "inactive_split_bytes.all.current"),
            "requested_bytes": _stat(stats, "requested_bytes.all.current"),
            "segments": _stat(stats, "segment.all.current"),
            "allocations": _stat(stats, "allocation.all.current"),
            "alloc_retries": _stat(stats, "num_alloc_retries"),
            "ooms": _stat(stats, "num_ooms"),
        }
        if not (entry["reserved_bytes"] or entry["allocated_bytes"]) and device != current:
            continue
        if snapshot is not None:
            entry["pools"] = pools.get(device, [])
        out.append(entry)
    return out


def pinned_counters(torch: Any) -> dict[str, Any] | None:
    """The pinned (host) memory PyTorch's caching host allocator holds, or None (no such API).

    torch >= 2.14 documents `allocated_bytes` as the blocks the allocator owns (handed out and
    cached) and `active_bytes` as those handed out; older releases name them `reserved_bytes`
    and `allocated_bytes`. `held_bytes` (owned) and `in_use_bytes` (handed out) are the same
    two numbers under either naming."""
    fn = getattr(torch.cuda, "host_memory_stats", None)
    if not callable(fn):
        return None
    stats = fn()
    if not isinstance(stats, dict):
        return None
    if "active_bytes.current" in stats:
        return {
            "held_bytes": _stat(stats, "allocated_bytes.current"),
            "in_use_bytes": _stat(stats, "active_bytes.current"),
            "naming": "2.14",
        }
    return {
        "held_bytes": _stat(stats, "reserved_bytes.current"),
        "in_use_bytes": _stat(stats, "allocated_bytes.current"),
        "naming": "pre-2.14",
    }


class Agent:
    """One process's agent: see the module docstring."""

    def __init__(self, directory: str) -> None:
        self.dir = os.path.abspath(directory)
        try:
            poll = float(os.environ.get(ENV_POLL, "0.5"))
        except ValueError:
            poll = 0.5
        self.poll_s = min(60.0, max(0.02, poll)) if math.isfinite(poll) else 0.5
        self.pid = os.getpid()
        self.host = safe_host()
        self.ticks = start_ticks()
        self.pid_ns = pid_namespace()
        self.torch: Any = None
        self.armed = False
        self.history: dict[str, Any] = {}
        self.root: int | None = None
        self.fds: dict[str, int] = {}
        self.trigger_key: tuple[int, int, int] | None = None
        self.last_seq: dict[str, int] = {}
        self.told: set[str] = set()
        self.glibc: Glibc | None = None
        self.python = PythonTrace()
        self.cuda_fault: str | None = None
        self.last_snapshot_ms: float | None = None
        self.snapshots_taken = 0  # the first one in a process is slow once (see _slow_snapshots)
        self.status_wall = 0.0
        self.trace_until = 0.0  # wall time: the last trigger asking for tracing expires then
        self.stop = threading.Event()
        self.leak_spec = os.environ.get(ENV_TEST_LEAK, "").strip()
        self.leaked: list[Any] = []
        self.leak_installed = False

    def start(self) -> None:
        threading.Thread(target=self._run, name="vramdoctor-agent", daemon=True).start()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's agent does not run here; close its fds."""
        self.stop.set()
        self._close_dir()

    # --- life cycle ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._register()
            last_check = time.monotonic()
            while not self.stop.wait(self.poll_s):
                if not self.armed:
                    torch = _imported_torch()
                    if torch is not None and self._cuda_initialised(torch):
                        self._arm(torch)
                if self.armed and self.leak_spec and not self.leak_installed:
                    self._install_test_leak()
                self._check_trigger()
                if time.monotonic() - last_check > 5.0:
                    last_check = time.monotonic()
                    self._housekeeping()
        except _Quiet:
            self.forget_after_fork()
        except _StandDown as exc:
            self._stand_down(str(exc))
        except Exception as exc:  # a bug of ours must not reach the server
            self._stand_down(f"{type(exc).__name__}: {exc}")

    def _stand_down(self, reason: str) -> None:
        if self.armed:
            with contextlib.suppress(Exception):
                self.torch.cuda.memory._record_memory_history(enabled=None)
        self.armed = False
        self.python.stop()
        _log(f"standing down, the server is not affected: {reason}")
        with contextlib.suppress(Exception):
            self._write_status("stood-down", reason=reason)
        self.forget_after_fork()

    def _say_once(self, kind: str, message: str) -> None:
        if kind not in self.told:
            self.told.add(kind)
            _log(message)

    @staticmethod
    def _cuda_initialised(torch: Any) -> bool:
        cuda = getattr(torch, "cuda", None)
        probe = getattr(cuda, "is_initialized", None)
        if not callable(probe):
            raise _StandDown(
                f"torch {getattr(torch, '__version__', '?')} has no torch.cuda.is_initialized"
            )
        try:
            return bool(probe())
        except Exception as exc:
            raise _StandDown(
                f"torch.cuda.is_initialized() raised {type(exc).__name__}: {exc}"
            ) from None

    # --- files --------------------------------------------------------------------------------
    def _open(self) -> int:
        if self.root is None:
            self.root = open_agent_dir(self.dir)
            if self.root is None:  # pragma: no cover - create=True never gives None
                raise _StandDown(f"the agent directory {self.dir} cannot be opened")
        return self.root

    def _close_dir(self) -> None:
        for fd in [*self.fds.values(), *([self.root] if self.root is not None else [])]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        self.root = None
        self.trigger_key = None

    def _sub(self, name: str, *, create: bool = True) -> int | None:
        fd = self.fds.get(name)
        if fd is None:
            fd = open_subdir(self._open(), name, create=create, what=f"{self.dir}/{name}")
            if fd is not None:
                self.fds[name] = fd
        return fd

    def _status_name(self) -> str:
        return f"{self.host}-{self.pid}.json"

    def _identity(self) -> dict[str, Any]:
        argv0 = sys.argv[0] if getattr(sys, "argv", None) else ""
        return {
            "protocol": PROTOCOL,
            "pid": self.pid,
            "ppid": os.getppid(),
            "host": self.host,
            "start_ticks": self.ticks,
            "pid_ns": self.pid_ns,
            "uid": os.geteuid(),
            "program": os.path.basename(argv0) or "python",
            "python": sys.version.split()[0],
            "torch": str(getattr(self.torch, "__version__", "?"))
            if self.torch is not None
            else None,
        }

    def _write_status(self, state: str, **extra: Any) -> None:
        agents = self._sub(AGENTS_DIR)
        assert agents is not None
        payload = {
            **self._identity(),
            "state": state,
            "cuda": self.armed,
            "updated_wall": time.time(),
            **extra,
        }
        write_atomic(agents, self._status_name(), json.dumps(payload).encode("utf-8"))
        self.status_wall = payload["updated_wall"]

    def _register(self) -> None:
        time.sleep(self.poll_s)  # a process that lives less than one poll never registers
        if "vramdoctor.cli" in sys.modules:
            # vramdoctor's own command (a .pth agent in its interpreter, VRAMDOCTOR_AGENT_DIR
            # exported in the shell): the soak side is not a server; nothing to report
            raise _Quiet
        try:
            self._write_status("ready")
        except OSError as exc:
            raise _StandDown(
                f"cannot write to the agent directory {self.dir}: {exc.strerror or exc}"
            ) from None
        atexit.register(self._at_exit)
        with contextlib.suppress(Exception):  # tidying is best effort: never a stand-down
            self._prune_stale()

    def _prune_stale(self) -> int:
        """Remove status files whose agent is gone, so they do not pile up with worker churn
        (os._exit, SIGKILL, a crash) nor hide a live agent from soak. Returns how many.

        Only what an agent like this one wrote is ever removed: a name of the status shape, a
        regular file (never a link) of this uid, at most 64 KiB of JSON whose host and pid are
        the name's. Two kinds qualify:

        - of this host and PID namespace (its pid_ns is ours): its pid does not run here with
          the recorded start time;
        - any other (another PID namespace or host, or from before pid_ns was written), whose
          process cannot be seen from here: neither its mtime nor its `updated_wall` moved for
          FOREIGN_STALE_S (24 h; a live agent rewrites its file every HEARTBEAT_S). One whose
          process is seen from here (a container on this host: NSpid and the start time in
          /proc) is kept however old: a stood-down agent stops its heartbeat.

        At most STALE_SCAN names are looked at per start (mtime first: a recent foreign file is
        never read)."""
        agents = self.fds.get(AGENTS_DIR)
        if agents is None:
            return 0
        mine, uid = self._status_name(), os.geteuid()
        removed = 0
        visible: set[tuple[int, int]] | None = None  # read once, when first needed
        for name in os.listdir(agents)[:STALE_SCAN]:
            shape = _STATUS_NAME.fullmatch(name)
            if name == mine or shape is None:
                continue
            host, pid = shape.group(1), int(shape.group(2))
            try:
                st = os.stat(name, dir_fd=agents, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                continue
            old = time.time() - st.st_mtime > FOREIGN_STALE_S
            if host != self.host and not old:
                continue  # another host's or namespace's, heard from lately: never read
            try:
                raw = read_small(agents, name, limit=65536)
                d = json.loads(raw) if raw is not None else None
            except (_Refused, OSError, ValueError, RecursionError):
                continue
            if not isinstance(d, dict) or d.get("pid") != pid or d.get("host") != host:
                continue
            ticks = d.get("start_ticks")
            if isinstance(ticks, bool) or not isinstance(ticks, int):
                ticks = None
            ours = host == self.host and self.pid_ns is not None and d.get("pid_ns") == self.pid_ns
            if ours and ticks is not None and self.ticks is not None:
                stale = start_ticks(pid) != ticks
            else:
                beat = d.get("updated_wall")
                beat = beat if isinstance(beat, (int, float)) and not isinstance(beat, bool) else 0
                stale = old and time.time() - beat > FOREIGN_STALE_S
                if stale and ticks is not None:  # a process seen from here that runs: kept
                    if visible is None:
                        visible = visible_processes()
                    stale = (pid, ticks) not in visible and start_ticks(pid) != ticks
            if not stale:
                continue
            try:
                again = os.stat(name, dir_fd=agents, follow_symlinks=False)
                if (again.st_ino, again.st_dev) != (st.st_ino, st.st_dev):
                    continue  # replaced since it was read
                os.unlink(name, dir_fd=agents)
                removed += 1
            except OSError:
                continue
        return removed

    def _at_exit(self) -> None:
        """A process that exits normally removes its status file (the directory stays tidy)."""
        if os.getpid() != self.pid:
            return
        with contextlib.suppress(Exception):
            agents = self.fds.get(AGENTS_DIR)
            if agents is not None:
                os.unlink(self._status_name(), dir_fd=agents)

    def _housekeeping(self) -> None:
        """Follow the directory if it was removed (and come back when it reappears, checked
        again); stop tracing nobody asks for any more (the soak that wanted it ended)."""
        if self.root is not None:
            try:
                gone = os.fstat(self.root).st_nlink == 0
            except OSError:
                gone = True
            if gone:
                self._close_dir()
        if self.root is None:
            self.root = open_agent_dir(self.dir, create=False)
            if self.root is None:
                self.python.stop()
                return
            self._write_status("armed" if self.armed else "ready", history=self.history or None)
        if time.time() - self.status_wall > HEARTBEAT_S:  # soak tells a dead agent by its age
            self._write_status("armed" if self.armed else "ready", history=self.history or None)
        if not self.python.started_by_us:
            return
        try:
            raw = read_small(self.root, SESSION_FILE)
            session = parse_session(raw) if raw is not None else None
        except (_Refused, OSError):
            session = None
        expired = time.time() > self.trace_until
        alive = session_alive(session, self.host) if session is not None else False
        if alive is False or (alive is None and expired):
            self.python.stop()

    # --- arming -------------------------------------------------------------------------------
    def _arm(self, torch: Any) -> None:
        self.torch = torch
        memory = getattr(getattr(torch, "cuda", None), "memory", None)
        record = getattr(memory, "_record_memory_history", None)
        snapshot = getattr(memory, "_snapshot", None)
        if not callable(record) or not callable(snapshot):
            raise _StandDown(
                f"torch {getattr(torch, '__version__', '?')} has no allocator history "
                "(torch.cuda.memory._record_memory_history/_snapshot need torch >= 2.1)"
            )
        settings: dict[str, Any] = dict(HISTORY_SETTINGS)
        if _accepts(record, "record_pinned_host_memory"):  # torch 2.14+: pinned host memory too
            settings["record_pinned_host_memory"] = True
        t0 = time.perf_counter()
        try:
            record(**settings)
        except Exception as exc:
            raise _StandDown(
                f"arming the allocator history failed: {type(exc).__name__}: {exc}"
            ) from None
        self.armed = True
        self.history = settings
        took = time.perf_counter() - t0
        try:
            self._write_status("armed", armed_wall=time.time(), arm_s=took, history=settings)
        except OSError as exc:
            raise _StandDown(
                f"cannot write to the agent directory {self.dir}: {exc.strerror or exc}"
            ) from None
        _log(f"armed (allocator history: state, Python stacks); answers in {self.dir}")

    # --- triggers -----------------------------------------------------------------------------
    def _check_trigger(self) -> None:
        if self.root is None:
            return  # the directory was removed: housekeeping looks for it again
        root = self.root
        try:
            st = os.stat(TRIGGER_FILE, dir_fd=root, follow_symlinks=False)
        except OSError:
            return
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self.trigger_key:
            return
        self.trigger_key = key
        try:
            raw = read_small(root, TRIGGER_FILE)
            if raw is None:
                return
            trig = parse_trigger(raw)
            self._accept(root, trig)
        except _Refused as exc:
            if not exc.quiet:
                self._say_once("refused", f"ignored a trigger ({exc}); staying ready (said once)")
            return
        self.last_seq[trig["token"]] = trig["seq"]
        if trig["trace_python"]:
            self.trace_until = trig["expires_wall"]
        self._answer(trig)

    def _accept(self, root: int, trig: dict[str, Any]) -> None:
        """Raise _Refused unless the trigger is the running soak's, new, and not expired."""
        if time.time() > trig["expires_wall"]:
            raise _Refused("expired", quiet=True)
        raw = read_small(root, SESSION_FILE)
        if raw is None:
            raise _Refused("no session file: not from a running soak", quiet=True)
        session = parse_session(raw)
        if session["token"] != trig["token"]:
            raise _Refused("its token is not the running soak's")
        if session_alive(session, self.host) is False:
            raise _Refused("the soak that wrote the session has ended", quiet=True)
        if trig["seq"] <= self.last_seq.get(trig["token"], -1):
            raise _Refused("a sequence number already handled", quiet=True)
        if len(self.last_seq) > 64:  # bounded memory: forget the oldest sessions
            for old in list(self.last_seq)[:-32]:
                del self.last_seq[old]

    def _pending(self, dirfd: int) -> int:
        mine = f"-{self.host}-{self.pid}.json"
        try:
            return sum(1 for name in os.listdir(dirfd) if name.endswith(mine))
        except OSError:
            return 0

    def _answer(self, trig: dict[str, Any]) -> None:
        token, seq = trig["token"], trig["seq"]
        replies = self._sub(REPLIES_DIR)
        assert replies is not None
        tok_fd = open_subdir(replies, token, create=True, what=f"{self.dir}/{REPLIES_DIR}/{token}")
        assert tok_fd is not None
        try:
            if self._pending(tok_fd) >= MAX_PENDING:
                self._say_once(
                    "pending",
                    f"{MAX_PENDING} answers nobody collected are waiting in {self.dir}: "
                    "skipping triggers until they are (said once)",
                )
                return
            base = f"{seq:07d}-{self.host}-{self.pid}"
            wall = time.time()
            snap: Any = None
            reply: dict[str, Any] = {
                **self._identity(),
                "token": token,
                "seq": seq,
                "round": trig["round"],
                "window": trig["window"],
                "wall": wall,
                "armed": self.armed,
            }
            if "snapshot" in trig["want"] and self.armed:
                snap, reply["snapshot"] = self._take_snapshot(tok_fd, base)
            if "inside" in trig["want"]:
                reply["inside"] = self._inside(snap, trig["trace_python"])
            try:
                write_atomic(tok_fd, f"{base}.json", json.dumps(reply).encode("utf-8"))
            except OSError as exc:
                raise _StandDown(
                    f"cannot write the answer to {self.dir}: {exc.strerror or exc}"
                ) from None
        finally:
            os.close(tok_fd)

    def _take_snapshot(self, tok_fd: int, base: str) -> tuple[Any, dict[str, Any]]:
        t0 = time.perf_counter()
        try:
            snap = self.torch.cuda.memory._snapshot()
        except Exception as exc:
            raise _StandDown(
                f"taking the allocator snapshot raised {type(exc).__name__}: {exc}"
            ) from None
        took = time.perf_counter() - t0
        self.last_snapshot_ms = took * 1000.0
        self.snapshots_taken += 1
        try:
            write_atomic(tok_fd, f"{base}.pickle", pickle.dumps(snap, protocol=4))
        except OSError as exc:
            raise _StandDown(
                f"cannot write the snapshot to {self.dir}: {exc.strerror or exc}"
            ) from None
        return snap, {
            "file": f"{base}.pickle",
            "snapshot_s": took,
            "write_s": time.perf_counter() - t0 - took,
        }

    def _slow_snapshots(self) -> bool:
        """Snapshots cost too much to take for the per-pool split: the last one took longer
        than POOLS_SNAPSHOT_MAX_MS. The first of a process does not count: with the history
        armed it took 5.1-5.5 s on an H200 (torch 2.11; other Python threads kept waiting
        about 160 ms), the next ones 1-6 ms (scripts/gpu_first_snapshot.py, 2026-12-02)."""
        if self.snapshots_taken < 2:
            return False
        return (self.last_snapshot_ms or 0.0) > POOLS_SNAPSHOT_MAX_MS

    def _inside(self, snap: Any, trace_python: bool) -> dict[str, Any]:
        """The allocators' own counters now; each part None with its reason when missing."""
        errors: list[str] = []
        out: dict[str, Any] = {"cuda": None, "pinned": None, "glibc": None, "python": None}
        torch = self.torch if self.armed else None
        if torch is None:
            found = _imported_torch()
            if found is not None and self._cuda_initialised(found):
                torch = found
        if torch is not None and self.cuda_fault is None:
            t0 = time.perf_counter()
            try:
                if snap is None and not self._slow_snapshots():
                    t1 = time.perf_counter()
                    snap = torch.cuda.memory._snapshot()
                    self.last_snapshot_ms = (time.perf_counter() - t1) * 1000.0
                    self.snapshots_taken += 1
                out["cuda"] = cuda_counters(torch, snap)
                out["pinned"] = pinned_counters(torch)
            except Exception as exc:
                raise _StandDown(
                    f"reading the CUDA allocator's counters raised {type(exc).__name__}: {exc}"
                ) from None
            out["cuda_ms"] = round((time.perf_counter() - t0) * 1000.0, 3)
            if snap is None:
                errors.append(
                    f"CUDA pools not split: the last snapshot took {self.last_snapshot_ms:.0f} ms"
                )
        elif torch is None:
            errors.append("no CUDA in this process (the agent never creates a context to find out)")
        if self.glibc is None:
            self.glibc = Glibc()
        out["glibc"] = self.glibc.read()
        if out["glibc"] is None and self.glibc.why:
            errors.append(self.glibc.why)
        try:
            out["python"] = self.python.read(trace_python)
        except Exception as exc:  # tracemalloc out of memory, a strange interpreter
            self.python.stop()
            errors.append(f"python: {type(exc).__name__}: {exc}")
        estimate = (out["python"] or {}).get("traces_estimate")
        if estimate:
            errors.append(
                f"python lines not grouped: ~{estimate:,} live traced allocations (more than "
                f"{TRACE_MAX_TRACES:,}: grouping them would hold the GIL for seconds); totals only"
            )
        out["error"] = "; ".join(errors) or None
        return out

    # --- test-only leak ------------------------------------------------------------------------
    def _install_test_leak(self) -> None:
        """VRAMDOCTOR_AGENT_TEST_LEAK=module:qualname:KiB (tests only; see the module docstring)."""
        try:
            module_name, qualname, kib = self.leak_spec.split(":")
            n_bytes = int(float(kib) * 1024)
        except ValueError:
            self.leak_installed = True
            _log(f"{ENV_TEST_LEAK}: expected module:qualname:KiB, got {self.leak_spec!r}; ignored")
            return
        module = sys.modules.get(module_name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            return  # not imported (yet) by the server: try again at the next poll
        owner: Any = module
        parts = qualname.split(".")
        try:
            for part in parts[:-1]:
                owner = getattr(owner, part)
            func = getattr(owner, parts[-1])
        except AttributeError:
            self.leak_installed = True
            _log(f"{ENV_TEST_LEAK}: {module_name} has no {qualname}; ignored")
            return
        func = getattr(func, "__func__", func)
        self.leak_installed = True
        torch = self.torch
        leaked = self.leaked

        def leak() -> None:
            try:
                device = torch.cuda.current_device()
                leaked.append(torch.empty(n_bytes, dtype=torch.uint8, device=f"cuda:{device}"))
            except Exception as exc:
                _log(f"test leak failed: {type(exc).__name__}: {exc}")

        monitoring = getattr(sys, "monitoring", None)
        code = getattr(func, "__code__", None)
        if monitoring is not None and code is not None:
            tool = next((i for i in range(5, 0, -1) if monitoring.get_tool(i) is None), None)
            if tool is not None:
                monitoring.use_tool_id(tool, "vramdoctor-agent-test-leak")

                def on_return(_code: Any, _offset: int, _retval: Any) -> None:
                    leak()

                monitoring.register_callback(tool, monitoring.events.PY_RETURN, on_return)
                monitoring.set_local_events(tool, code, monitoring.events.PY_RETURN)
                _log(
                    f"TEST-ONLY leak of {kib} KiB per return from {module_name}.{qualname} installed"
                )
                return
        import functools

        original = func

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                leak()

        setattr(owner, parts[-1], wrapper)
        _log(
            f"TEST-ONLY leak of {kib} KiB per call of {module_name}.{qualname} installed (wrapper)"
        )


def _accepts(fn: Any, name: str) -> bool:
    """Whether callable `fn` takes a keyword argument `name` (False when it cannot be told)."""
    try:
        import inspect

        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
