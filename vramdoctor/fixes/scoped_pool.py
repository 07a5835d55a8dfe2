"""Request-scoped CUDA memory pool: temporary GPU memory of one block goes back to the driver.

A fast image processor running on the GPU allocates scratch tensors whose sizes follow the
images; PyTorch's caching allocator keeps every segment it ever needed, so the process's GPU
memory climbs with each new image size and never comes down (caching, not a leak, but it
still OOMs a co-located server). Routing the block's allocations into a private
`torch.cuda.MemPool` and dropping the pool afterwards returns that memory to the driver.

The danger (measured in ../shared/gpu-probe.md): a GPU tensor that outlives the pool pins
the pool's segments, and a dropped pool's segments are then never reused nor freed, a real
leak of ~19 MiB per request. So at exit we read the pool's snapshot; when blocks are still
active we count the escaped bytes, warn once, drop the pool and empty the cache (its free
segments go back now), and remember the pool as an orphan: once the escaped tensors die, one
`empty_cache()` returns the segments they pinned. Where the allocator snapshot does not say
which pool a segment belongs to (older torch), the pool object is kept ("parked") instead and
dropped once nothing in it is alive.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..model import MIB
from ._torch import cuda_usable, has_mem_pool, load_torch

log = logging.getLogger("vramdoctor.fixes")



class EscapedTensorWarning(RuntimeWarning):
    """GPU tensors allocated inside request_scoped_pool outlived it."""


@dataclass
class ScopeResult:
    """What one scope did; filled in when the block ends."""

    pooled: bool = False
    # Why the scope passed through without a pool (None when pooled).
    reason: str | None = None
    device: int | None = None
    # Bytes still active in the pool when the block ended (tensors that escaped it).
    escaped_bytes: int = 0
    # Bytes of the pool's segments at the end of the block (its high-water reservation).
    pool_reserved_bytes: int = 0


@dataclass
class _Parked:
    # The MemPool itself (older torch: parked) or None once dropped (orphan tracked by id).
    pool: Any
    pool_id: tuple[int, int]
    device: int
    escaped_bytes: int


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    parked: list[_Parked] = field(default_factory=list)
    escaped_total: int = 0
    # Orphan checks need a global allocator snapshot: at most once per this many seconds.
    next_check: float = 0.0
    checked_count: int = 0
    escape_events: int = 0
    released_parked: int = 0
    warned: bool = False


_state = _State()


def escaped_bytes() -> int:
    """Total bytes that escaped request-scoped pools in this process (cumulative)."""
    return _state.escaped_total


def escape_events() -> int:
    """How many scopes ended with tensors still alive in their pool."""
    return _state.escape_events


def parked_pools() -> int:
    """Pools kept alive because tensors allocated in them are still referenced."""
    with _state.lock:
        return len(_state.parked)


def _segments(snapshot: Any) -> list[dict[str, Any]]:
    if isinstance(snapshot, dict):
        return list(snapshot.get("segments", []))
    return list(snapshot or [])


def pool_usage(pool: Any) -> tuple[int, int]:
    """(active bytes, reserved bytes) of a MemPool, from its allocator snapshot."""
    try:
        snap = pool.snapshot(include_traces=False)
    except TypeError:  # torch versions without the include_traces argument
        snap = pool.snapshot()
    active = reserved = 0
    for seg in _segments(snap):
        active += int(seg.get("active_size", 0))
        reserved += int(seg.get("total_size", 0))
    return active, reserved


ORPHAN_CHECK_INTERVAL_S = 1.0


def _orphan_active(torch: Any, entries: list[_Parked]) -> dict[int, int]:
    """Active bytes per orphan (by index into entries) from one global allocator snapshot."""
    wanted = {tuple(e.pool_id): i for i, e in enumerate(entries)}
    active = dict.fromkeys(range(len(entries)), 0)
    for seg in _segments(torch.cuda.memory_snapshot()):
        pid = seg.get("segment_pool_id")
        if pid is not None and tuple(pid) in wanted:
            active[wanted[tuple(pid)]] += int(seg.get("active_size", 0))
    return active


def release_parked(*, force: bool = True) -> int:
    """Release what escaped pools pinned once their tensors are gone; return bytes given back.

    Called at every scope entry (new escapes are checked at once, old ones once a second), and
    callable directly, e.g. on an idle tick.
    """
    import time

    with _state.lock:
        if not _state.parked:
            return 0
        # New escapes are checked at the next scope; long-lived ones (a library's cached tensor)
        # only once per interval, so they cost nothing per request.
        if not force and len(_state.parked) <= _state.checked_count and time.monotonic() < _state.next_check:
            return 0
        _state.next_check = time.monotonic() + ORPHAN_CHECK_INTERVAL_S
        torch = load_torch("request_scoped_pool")
        orphans = [e for e in _state.parked if e.pool is None]
        orphan_active = _orphan_active(torch, orphans) if orphans else {}
        keep: list[_Parked] = []
        freed: list[_Parked] = []
        for entry in _state.parked:
            if entry.pool is None:
                alive = orphan_active[orphans.index(entry)]
            else:
                alive = pool_usage(entry.pool)[0]
            (keep if alive else freed).append(entry)
        _state.parked = keep
        _state.checked_count = len(keep)
    if not freed:
        return 0
    total = 0
    for device in {entry.device for entry in freed}:
        before = torch.cuda.memory_reserved(device)
        for entry in freed:
            if entry.device == device:
                entry.pool = None
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
        total += max(before - torch.cuda.memory_reserved(device), 0)
    _state.released_parked += len(freed)
    return total


def _warn_once(nbytes: int) -> None:
    if _state.warned:
        log.info("request_scoped_pool: %.1f MiB escaped the scope", nbytes / MIB)
        return
    _state.warned = True
    message = (
        f"{nbytes / MIB:.1f} MiB of GPU tensors allocated inside request_scoped_pool() are still "
        "referenced after the block ended; vramdoctor keeps that pool until they are freed "
        "(otherwise it would leak). Fix: move the outputs to CPU inside the block "
        "(vramdoctor.fixes.outputs_to_cpu) or drop the references before it ends. "
        "Escaped bytes so far: vramdoctor.fixes.escaped_bytes()."
    )
    warnings.warn(message, EscapedTensorWarning, stacklevel=4)


def _device_index(torch: Any, device: Any) -> tuple[int | None, str | None]:
    """(CUDA device index, None) or (None, reason this is not a CUDA device)."""
    if device is None:
        return int(torch.cuda.current_device()), None
    if isinstance(device, int):
        return device, None
    dev = torch.device(device)
    if dev.type != "cuda":
        return None, f"device {dev} is not CUDA"
    return (dev.index if dev.index is not None else int(torch.cuda.current_device())), None


@contextlib.contextmanager
def request_scoped_pool(device: Any = None, *, enabled: bool = True) -> Iterator[ScopeResult]:
    """Route the block's CUDA allocations to a private pool returned to the driver at exit.

    Pass `enabled=False` when the block's outputs must stay on the GPU (CUDA IPC feature
    transport, a hash computed on the GPU after the block): the block then runs unchanged.
    It also passes through when `device` is not CUDA, no GPU is usable, or this torch has no
    `MemPool`/`use_mem_pool`. The yielded ScopeResult says which, and after the block how
    many bytes escaped.
    """
    result = ScopeResult()
    if not enabled:
        result.reason = "disabled by the caller (outputs stay on the GPU)"
        yield result
        return
    torch = load_torch("request_scoped_pool")
    if not cuda_usable(torch):
        result.reason = "no CUDA GPU usable"
        yield result
        return
    if not has_mem_pool(torch):
        result.reason = f"torch {torch.__version__} has no torch.cuda.MemPool/use_mem_pool"
        yield result
        return
    index, reason = _device_index(torch, device)
    if index is None:
        result.reason = reason
        yield result
        return
    release_parked(force=False)
    result.pooled = True
    result.device = index
    pool = torch.cuda.MemPool()
    try:
        with torch.cuda.use_mem_pool(pool, device=index):
            yield result
    finally:
        # Frees of the block's tensors are queued on streams; wait so the snapshot is true.
        torch.cuda.synchronize(index)
        active, reserved = pool_usage(pool)
        result.escaped_bytes = active
        result.pool_reserved_bytes = reserved
        if not active:
            del pool  # nothing alive: its segments go back to the driver now
        else:
            by_id = _snapshot_names_pools(torch)
            entry = _Parked(pool=None if by_id else pool, pool_id=tuple(pool.id), device=index, escaped_bytes=active)
            with _state.lock:
                _state.parked.append(entry)
                _state.escaped_total += active
                _state.escape_events += 1
            _warn_once(active)
            del pool
            if by_id:
                # The pool is gone; its free segments go back now, the pinned ones once the
                # escaped tensors die (release_parked).
                with torch.cuda.device(index):
                    torch.cuda.empty_cache()


_names_pools: bool | None = None


def _snapshot_names_pools(torch: Any) -> bool:
    """Does this torch's allocator snapshot say which pool each segment belongs to?"""
    global _names_pools
    if _names_pools is None:
        segs = _segments(torch.cuda.memory_snapshot())
        _names_pools = bool(segs) and all("segment_pool_id" in seg for seg in segs)
    return _names_pools


@contextlib.contextmanager
def unguarded_scoped_pool(device: Any = None) -> Iterator[None]:
    """The plain pattern (a pool per block, dropped at exit) with no escape check.

    Exists only so `vramdoctor ab-test` can show what the guard prevents; do not use it.
    """
    torch = load_torch("unguarded_scoped_pool")
    index = int(torch.cuda.current_device()) if device is None else torch.device(device).index or 0
    pool = torch.cuda.MemPool()
    try:
        with torch.cuda.use_mem_pool(pool, device=index):
            yield
    finally:
        del pool
