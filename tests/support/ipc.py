"""A host-memory stand-in for CUDA IPC, to drive the IPC arm's real orchestration on the CPU.

Kept apart from the tests so the processes the arm spawns import only this (and the stdlib,
psutil and vramdoctor.samples), not the test module's imports. A consumer's "CUDA context on GPU g"
is a 4 MiB file it maps for as long as it lives; the shared "tensor" is a 2 MiB file the producer
fills and every consumer maps and checksums. Opened "without the redirect", a consumer also maps
a context on the producer's GPU, as torch's own IPC rebuild does. `host_census` reads which
process maps which file from /proc/PID/maps, so it sees exactly what the processes hold at that
instant.
"""

from __future__ import annotations

import mmap
import os
import re
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from vramdoctor.samples import MIB

CONTEXT_MIB = 4
DATA_MIB = 2
_HELD: list[mmap.mmap] = []  # a fake consumer's own "context": mapped until the process exits
_NAME = re.compile(r"(ctx|data)-(\d+)-dev(\d+)$")


def _map(path: str, size: int, *, create: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class HostShmPayload:
    """CUDA IPC's shape with files in `root` (see the module docstring).

    fail: consumer GPU -> "prepare" (raises creating its context), "open" (raises opening the
    handle), "crash" (exits with 139 while opening, saying nothing, like a segfault), "hang"
    (never returns from opening) or "bad-data" (reads back a wrong checksum). Consumer g waits g x open_delay_s before opening,
    so they open at different times."""

    root: str
    fail: dict[int, str] = field(default_factory=dict)
    open_delay_s: float = 0.0

    def _context(self, gpu: int) -> mmap.mmap:
        mm = _map(f"{self.root}/ctx-{os.getpid()}-dev{gpu}", CONTEXT_MIB * MIB, create=True)
        mm[:8] = b"context!"  # touched: a context is memory in use
        return mm

    def share(self, gpu: int) -> tuple[dict[str, Any], dict[str, Any], Any]:
        ctx = self._context(gpu)
        path = f"{self.root}/data-{os.getpid()}-dev{gpu}"
        data = _map(path, DATA_MIB * MIB, create=True)
        data[:] = bytes(range(256)) * (DATA_MIB * MIB // 256)
        message = {"path": path, "size": DATA_MIB * MIB, "expected": zlib.crc32(data)}
        facts = {"uuid": f"FAKE-{gpu}", "pool_bytes": DATA_MIB * MIB, "oversize_went_cpu": True}
        return message, facts, (ctx, data)

    def prepare(self, gpu: int, producer_gpu: int) -> dict[str, Any]:
        if self.fail.get(gpu) == "prepare":
            raise RuntimeError(f"CUDA error: invalid device ordinal {gpu}")
        _HELD.append(self._context(gpu))
        return {"peer_access": True, "uuid": f"FAKE-{gpu}"}

    def open(
        self, message: dict[str, Any], gpu: int, producer_gpu: int, redirect: bool
    ) -> tuple[dict[str, Any], Any]:
        time.sleep(gpu * self.open_delay_s)
        how = self.fail.get(gpu)
        if how == "open":
            raise RuntimeError("cudaIpcOpenMemHandle: invalid argument")
        if how == "crash":
            os._exit(139)
        if how == "hang":
            time.sleep(3600)
        held = [_map(message["path"], message["size"], create=False)]
        if not redirect:  # torch's way: the handle is opened on the producer's device
            held.append(self._context(producer_gpu))
        ok = zlib.crc32(held[0]) == message["expected"] and how != "bad-data"
        return {
            "tensor_device": gpu if redirect else producer_gpu,
            "redirect_applied": redirect and gpu != producer_gpu,
            "slice_correct": ok,
            "tensor_correct": ok,
            "warnings": [],
        }, held

    def release(self, held: Any) -> None:
        for mm in held:
            mm.close()


def host_census(
    root: str,
    gpus: int,
    *,
    nvml_offset: int = 0,
    delay_s: float = 0.0,
    calls: list[float] | None = None,
) -> Callable[[], dict[str, Any]]:
    """A census in GpuSample's shape of what this process's children map under root, now.

    Fake GPU g is NVML index g + nvml_offset (as with CUDA_VISIBLE_DEVICES=2,3,...), matched
    through its UUID. A mapped data file counts only for the process that made it: IPC memory
    is charged to the allocating process (docs/gpu-results.md)."""

    def census() -> dict[str, Any]:
        used: dict[tuple[int, int], float] = defaultdict(float)
        for child in psutil.Process().children(recursive=True):
            try:
                maps = Path(f"/proc/{child.pid}/maps").read_text()
            except OSError:
                continue
            for line in maps.splitlines():
                parts = line.split()
                if len(parts) < 6 or not parts[5].startswith(root):
                    continue
                m = _NAME.search(parts[5])
                if m is None or int(m.group(2)) != child.pid:
                    continue
                start, end = (int(x, 16) for x in parts[0].split("-"))
                used[(child.pid, int(m.group(3)) + nvml_offset)] += (end - start) / MIB
        time.sleep(delay_s)
        if calls is not None:
            calls.append(time.monotonic())
        return {
            "t": time.monotonic(),
            "wall": time.time(),
            "source": "host-maps",
            "gpus": [
                {
                    "index": g + nvml_offset,
                    "uuid": f"FAKE-{g}",
                    "used_mib": sum(v for (_, gg), v in used.items() if gg == g + nvml_offset),
                }
                for g in range(gpus)
            ],
            "processes": [
                {"pid": pid, "gpu": g, "used_mib": v} for (pid, g), v in sorted(used.items())
            ],
        }

    return census
