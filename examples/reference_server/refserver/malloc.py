"""glibc malloc, from inside the process: tuning at start, and its own counters as the truth.

`mallinfo2()` (glibc >= 2.33) is a struct of ten `size_t`: arena, ordblks, smblks, hblks,
hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost. Bytes in use = uordblks + hblkhd (heap
chunks in use plus mmap'd chunks); bytes glibc keeps free = fordblks. A leak grows the in-use
bytes; allocator retention grows what glibc holds (arena, fordblks, RSS) with in-use flat. The
call walks every free chunk of every arena under that arena's lock (0.01 ms to ~200 ms,
facts.md): the reference server calls it only when asked (`GET /reference/info`).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import time
from typing import Any

_FIELDS = (
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


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


LIBC = _libc()


def tune_malloc() -> None:
    """Make host RSS track live data: glibc otherwise raises its mmap threshold after the first
    large free and keeps later large buffers in per-thread arenas (a few MiB of allocator caching
    in the first round). Fixing the threshold returns every large buffer to the OS on free."""
    if LIBC is None:
        return
    try:
        LIBC.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: fixed, no dynamic growth
        LIBC.mallopt(-8, 2)  # M_ARENA_MAX: few arenas for the handler threads
        LIBC.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    except AttributeError:
        pass


def mallinfo2() -> dict[str, Any] | None:
    """glibc's counters now, in bytes: in_use_bytes, free_kept_bytes, mmap_bytes, arena_bytes,
    keepcost_bytes, call_ms; None where there is no glibc >= 2.33."""
    if LIBC is None or not hasattr(LIBC, "mallinfo2"):
        return None
    fn = LIBC.mallinfo2
    fn.restype = _Mallinfo2
    t0 = time.perf_counter()
    mi = fn()
    ms = (time.perf_counter() - t0) * 1000.0
    return {
        "in_use_bytes": int(mi.uordblks + mi.hblkhd),
        "free_kept_bytes": int(mi.fordblks),
        "mmap_bytes": int(mi.hblkhd),
        "arena_bytes": int(mi.arena),
        "keepcost_bytes": int(mi.keepcost),
        "call_ms": round(ms, 3),
    }


_STATUS_KEYS = {
    "RssAnon": "rss_anon_bytes",
    "RssFile": "rss_file_bytes",
    "RssShmem": "rss_shmem_bytes",
}
_HEAP = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) rw-p 00000000 00:00 0\s*$")


def proc_status(pid: int | None = None) -> dict[str, int]:
    """RssAnon/RssFile/RssShmem of `pid` (default: this process) in bytes, from /proc."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid or os.getpid()}/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in _STATUS_KEYS:
                    out[_STATUS_KEYS[key]] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def arena_heaps(pid: int | None = None) -> int | None:
    """Anonymous mappings of exactly 64 MiB reserved span or a multiple aligned to it: glibc's
    non-main arena heaps (HEAP_MAX_SIZE = 64 MiB on 64-bit) as /proc/PID/maps shows them."""
    try:
        with open(f"/proc/{pid or os.getpid()}/maps") as fh:
            lines = fh.readlines()
    except OSError:
        return None
    span = 64 * 1024 * 1024
    starts: set[int] = set()
    for line in lines:
        parts = line.split()
        if len(parts) < 5 or parts[4] != "0" or len(parts) > 5:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo % span == 0 and hi - lo <= span:
            starts.add(lo)
    return len(starts)
