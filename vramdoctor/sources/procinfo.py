"""Name and command line of a PID that NVML reports, where this PID namespace can see it.

In a container NVML reports host PIDs; such a PID may not exist here, or may belong to an
unrelated process of the container. We keep every NVML row and say when it cannot be read.
Lookups are cached briefly: a 10 Hz sampler must not re-read /proc for every row.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

import psutil

from vramdoctor.redact import redact_argv


@dataclass(frozen=True)
class ProcInfo:
    """What this host can tell about a PID: its name and redacted command line, its owner
    (real uid and user name) and its parent pid, each None where it cannot be read."""

    visible: bool
    name: str | None = None
    cmdline: list[str] | None = None
    uid: int | None = None
    username: str | None = None
    ppid: int | None = None


def uses_nvidia_device(pid: int) -> bool | None:
    """Whether the process holds a /dev/nvidia* file open (every CUDA process does).

    None when its descriptors cannot be read (another user's process, no /proc).
    """
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except (PermissionError, FileNotFoundError, NotADirectoryError, OSError):
        return None
    for fd in sorted(fds, key=lambda x: int(x) if x.isdigit() else 1 << 30):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    return False


def lookup(pid: int, *, expect_gpu: bool = False) -> ProcInfo:
    """Read a PID's name and (redacted) command line; visible=False when it is not here.

    With `expect_gpu` (a PID that NVML reports), a process here that has no NVIDIA device
    open is someone else: in a container NVML's host PID can be a different local process.
    """
    try:
        proc = psutil.Process(pid)
        if expect_gpu and uses_nvidia_device(pid) is False:
            return ProcInfo(visible=False)
        with proc.oneshot():
            name = proc.name()
            try:
                cmdline: list[str] | None = redact_argv(proc.cmdline())
            except (psutil.AccessDenied, psutil.ZombieProcess):
                cmdline = None
            uid, username, ppid = _owner(proc)
        return ProcInfo(
            visible=True,
            name=name or None,
            cmdline=cmdline or None,
            uid=uid,
            username=username,
            ppid=ppid,
        )
    except psutil.NoSuchProcess:
        return ProcInfo(visible=False)
    except psutil.AccessDenied:
        return ProcInfo(visible=True)


def _owner(proc: psutil.Process) -> tuple[int | None, str | None, int | None]:
    """(real uid, user name, parent pid) of a process, None for what cannot be read."""
    uid: int | None = None
    username: str | None = None
    ppid: int | None = None
    with contextlib.suppress(psutil.Error, AttributeError, OSError):
        uid = int(proc.uids().real)
    with contextlib.suppress(psutil.Error, KeyError, OSError):
        username = proc.username() or None  # the uid as text when it has no passwd entry
    with contextlib.suppress(psutil.Error, OSError):
        ppid = int(proc.ppid())
    return uid, username, ppid


class ProcInfoCache:
    """`lookup` with a time-to-live, so repeated samples of the same PIDs stay cheap."""

    def __init__(self, ttl_s: float = 5.0, *, expect_gpu: bool = False) -> None:
        self.ttl_s = ttl_s
        self.expect_gpu = expect_gpu
        self._cache: dict[int, tuple[float, ProcInfo]] = {}

    def get(self, pid: int) -> ProcInfo:
        now = time.monotonic()
        hit = self._cache.get(pid)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        info = lookup(pid, expect_gpu=self.expect_gpu)
        self._cache[pid] = (now, info)
        if len(self._cache) > 4096:  # PIDs come and go over a long soak
            self._cache = {p: v for p, v in self._cache.items() if now - v[0] < self.ttl_s}
        return info


# Processes that start servers without being part of one: a group stops below them.
_BOUNDARY = frozenset(
    {
        "bash",
        "sh",
        "zsh",
        "fish",
        "dash",
        "ksh",
        "tmux",
        "tmux: server",
        "screen",
        "sshd",
        "systemd",
        "init",
        "tini",
        "docker-init",
        "dumb-init",
        "containerd-shim",
        "containerd-shim-runc-v2",
        "conmon",
        "su",
        "sudo",
        "login",
        "supervisord",
        "runsv",
        "nohup",
        "srun",
        "slurmstepd",
        "sshd-session",
        "code",
        "node",
        "jupyter-lab",
        "SCREEN",
        "launchd",
        "kthreadd",
        "runc",
        "catatonit",
        "s6-svscan",
        "s6-supervise",
    }
)


def server_groups(pids: list[int]) -> dict[int, int]:
    """Map each PID to the root of its process tree below the shell/launcher that started it.

    Processes of one server (SGLang's front-end and its schedulers, vLLM's engine and
    workers) share a root, so census can tell a server's main GPUs from a stray one.
    A PID this namespace cannot see is its own group.
    """
    groups: dict[int, int] = {}
    for pid in pids:
        root = pid
        try:
            proc: psutil.Process | None = psutil.Process(pid)
            for _ in range(64):
                parent = proc.parent() if proc is not None else None
                # PID 1 counts when it is the server itself (a container's entry point);
                # a host's init or a container's shell/tini is a boundary by name.
                if parent is None or parent.pid == 0 or parent.name() in _BOUNDARY:
                    break
                root = parent.pid
                proc = parent
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
        groups[pid] = root
    return groups
