"""Host RAM (RSS) of the server's processes, via psutil.

A host-RAM leak with image requests is a known vLLM failure (facts.md: vllm #15294, #15597);
it must be reported as host memory, not VRAM, so soak samples RSS next to the GPU. The set of
processes comes from a callable (re-discovered while the soak runs: servers spawn workers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import psutil

from ..model import MIB, HostProcessMemory, HostSample, now

PidRoles = Callable[[], dict[int, str]]


class HostSource:
    """RSS of a changing set of PIDs. `pids` maps pid -> role ("server", "child", "gpu-peer")."""

    name = "host"

    def __init__(self, pids: PidRoles | dict[int, str] | Iterable[int]) -> None:
        if callable(pids):
            self._pids: PidRoles = pids
        else:
            fixed = dict(pids) if isinstance(pids, dict) else {int(p): "server" for p in pids}
            self._pids = lambda: fixed
        self._procs: dict[int, psutil.Process] = {}

    def _proc(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None or not proc.is_running():
            proc = psutil.Process(pid)
            self._procs[pid] = proc
        return proc

    def sample(self) -> HostSample:
        t, wall = now()
        rows: list[HostProcessMemory] = []
        for pid, role in sorted(self._pids().items()):
            try:
                proc = self._proc(pid)
                with proc.oneshot():
                    rss = proc.memory_info().rss
                    name = proc.name()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                self._procs.pop(pid, None)
                continue
            except psutil.AccessDenied:
                continue
            rows.append(HostProcessMemory(pid=pid, rss_mib=rss / MIB, name=name, role=role))
        return HostSample(t=t, wall=wall, processes=rows)


def host_memory() -> dict[str, float]:
    """This host's RAM: total and available MiB (for the time to running out of host RAM)."""
    vm = psutil.virtual_memory()
    return {"total_mib": vm.total / MIB, "available_mib": vm.available / MIB}
