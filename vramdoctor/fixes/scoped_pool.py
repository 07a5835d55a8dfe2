"""Request-scoped CUDA memory pool: temporary GPU memory of one block goes back to the driver.

A fast image processor running on the GPU allocates scratch tensors whose sizes follow the
images; PyTorch's caching allocator keeps every segment it ever needed, so the process's GPU
memory climbs with each new image size and never comes down (caching, not a leak, but it
still OOMs a co-located server). Routing the block's allocations into a private
`torch.cuda.MemPool` and dropping the pool afterwards returns that memory to the driver.

The danger (measured in ../shared/gpu-probe.md): a GPU tensor that outlives the pool pins
the pool's segments, and a dropped pool's segments are then never reused nor freed, a real
leak of ~19 MiB per request. So at exit we ask the allocator whether any block of the pool
is still allocated (`checkPoolLiveAllocations`, a walk over the live blocks in C++). When
one is, we count the escaped bytes, warn once, drop the pool (its free segments go back
now) and remember its id as an orphan: once the escaped tensors die, one `empty_cache()`
returns the segments they pinned.

Why not the pool's allocator snapshot: on torch 2.11 (H200, measured) taking pool snapshots
and dropping pools corrupts the allocator within a few hundred requests, and the next
snapshot or `torch.cuda.memory_stats()` segfaults the process. Nothing here snapshots.

Why the reserve: returning memory costs one cudaMalloc and one cudaFree per segment
(0.05-0.1 ms each on an H200); a resize/normalise block typically needs three segments.
Allocating, at entry, one block as large as the block's large-pool segments were in recent
requests and freeing it at once leaves one free segment that the block's large tensors
split, so the driver is asked once instead of several times. While escaped tensors are
alive there is no reserve, since an escape would pin the whole reserved segment.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.fixes._torch import cuda_usable, has_mem_pool, load_torch
from vramdoctor.units import MIB, format_bytes

log = logging.getLogger("vramdoctor.fixes")

# How many recent blocks the reserve remembers (the largest of them sets its size), and its
# cap: the counters are per device, so another thread's growth could inflate a reading.
RESERVE_WINDOW = 16
RESERVE_MAX_BYTES = 2 * 1024 * MIB
# Escapes older than one check are looked at again at most once per this many seconds.
ORPHAN_CHECK_INTERVAL_S = 1.0


class EscapedTensorWarning(RuntimeWarning):
    """GPU tensors allocated inside request_scoped_pool outlived it."""


@dataclass
class ScopeResult:
    """What one scope did; filled in when the block ends."""

    pooled: bool = False
    # Why the scope passed through without a pool (None when pooled).
    reason: str | None = None
    device: int | None = None
    # Bytes still allocated by the block when it ended (tensors that escaped it).
    escaped_bytes: int = 0
    # Bytes of the pool's segments at the end of the block (its high-water reservation).
    pool_reserved_bytes: int = 0
    # Bytes reserved up front in one segment (see the module's note on the reserve).
    reserve_bytes: int = 0


@dataclass
class _Orphan:
    pool_id: tuple[int, int]
    device: int


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    orphans: list[_Orphan] = field(default_factory=list)
    escaped_total: int = 0
    next_check: float = 0.0
    checked_count: int = 0
    escape_events: int = 0
    warned: bool = False
    # Per device: large-pool bytes the recent blocks reserved.
    recent_large: dict[int, deque[int]] = field(default_factory=dict)


_state = _State()


def escaped_bytes() -> int:
    """Total bytes that escaped request-scoped pools in this process (cumulative)."""
    return _state.escaped_total


def escape_events() -> int:
    """How many scopes ended with tensors still alive in their pool."""
    return _state.escape_events


def parked_pools() -> int:
    """Dropped pools whose segments stay pinned because tensors allocated in them live on."""
    with _state.lock:
        return len(_state.orphans)


def _pool_alive(torch: Any, device: int, pool_id: tuple[int, int]) -> bool:
    """Is a block allocated in this pool still referenced? False once the allocator forgot it."""
    try:
        return not torch._C._cuda_checkPoolLiveAllocations(device, pool_id, set())
    except RuntimeError:  # "Could not find pool of id": every segment went back
        return False


def _allocator_bytes(torch: Any, device: int) -> tuple[int, int, int]:
    """(allocated, reserved, large-pool reserved) bytes on the device, from the raw counters."""
    stats = torch._C._cuda_memoryStats(device)
    reserved = stats["reserved_bytes"]
    return (
        int(stats["allocated_bytes"]["all"]["current"]),
        int(reserved["all"]["current"]),
        int(reserved["large_pool"]["current"]),
    )


def release_parked(*, force: bool = True) -> int:
    """Release what escaped pools pinned once their tensors are gone; return bytes given back.

    Called at every scope entry (new escapes are checked at once, old ones once a second), and
    callable directly, e.g. on an idle tick.
    """
    with _state.lock:
        if not _state.orphans:
            return 0
        # New escapes are checked at the next scope; long-lived ones (a library's cached tensor)
        # only once per interval, so they cost nothing per request.
        if (
            not force
            and len(_state.orphans) <= _state.checked_count
            and time.monotonic() < _state.next_check
        ):
            return 0
        _state.next_check = time.monotonic() + ORPHAN_CHECK_INTERVAL_S
        torch = load_torch("request_scoped_pool")
        keep: list[_Orphan] = []
        freed: list[_Orphan] = []
        for o in _state.orphans:
            (keep if _pool_alive(torch, o.device, o.pool_id) else freed).append(o)
        _state.orphans = keep
        _state.checked_count = len(keep)
    if not freed:
        return 0
    total = 0
    for device in {o.device for o in freed}:
        before = _allocator_bytes(torch, device)[1]
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
        total += max(before - _allocator_bytes(torch, device)[1], 0)
    return total


def _warn_once(nbytes: int) -> None:
    if _state.warned:
        log.info("request_scoped_pool: %s escaped the scope", format_bytes(nbytes))
        return
    _state.warned = True
    message = (
        f"{format_bytes(nbytes)} of GPU tensors allocated inside request_scoped_pool() are still "
        "referenced after the block ended; vramdoctor releases that pool's segments once they "
        "are freed (otherwise it would leak). Fix: move the outputs to CPU inside the block "
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


def _take_reserve(torch: Any, index: int, nbytes: int) -> int:
    """Allocate and free one block of nbytes inside the active pool; 0 when it does not fit."""
    if nbytes <= 0:
        return 0
    try:
        block = torch.empty(nbytes, dtype=torch.uint8, device=index)
    except torch.cuda.OutOfMemoryError:
        return 0
    del block
    return nbytes


@contextlib.contextmanager
def request_scoped_pool(
    device: Any = None, *, enabled: bool = True, reserve: bool = True
) -> Iterator[ScopeResult]:
    """Route the block's CUDA allocations to a private pool returned to the driver at exit.

    Pass `enabled=False` when the block's outputs must stay on the GPU (CUDA IPC feature
    transport, a hash computed on the GPU after the block): the block then runs unchanged.
    It also passes through when `device` is not CUDA, no GPU is usable, or this torch lacks
    `MemPool`/`use_mem_pool`. The yielded ScopeResult says which, and after the block how
    many bytes escaped. `reserve=False` turns off the one-segment reserve.
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
    if _state.orphans:
        release_parked(force=False)
    result.pooled = True
    result.device = index
    if not torch.cuda.is_initialized():
        torch.cuda.init()  # the allocator's counters exist only once CUDA is initialised
    recent = _state.recent_large.setdefault(index, deque(maxlen=RESERVE_WINDOW))
    allocated0, reserved0, large0 = _allocator_bytes(torch, index)
    if index == torch.cuda.current_device():
        pool = torch.cuda.MemPool()
    else:  # a MemPool belongs to the device current when it is made, and is released there
        with torch.cuda.device(index):
            pool = torch.cuda.MemPool()
    pool_id = tuple(pool.id)
    try:
        with torch.cuda.use_mem_pool(pool, device=index):
            # No reserve while escaped tensors live: an escape would pin the whole segment.
            if reserve and recent and not _state.orphans:
                result.reserve_bytes = _take_reserve(
                    torch, index, min(max(recent), RESERVE_MAX_BYTES)
                )
            yield result
    finally:
        _, reserved1, large1 = _allocator_bytes(torch, index)
        result.pool_reserved_bytes = max(reserved1 - reserved0, 0)
        recent.append(max(large1 - large0, 0))
        # Checked before the drop too: afterwards a clean pool is gone, and asking about it
        # raises (a C++ error with a backtrace), too dear for every request.
        alive = _pool_alive(torch, index, pool_id)
        # Dropping the pool empties it: its free segments go back to the driver now.
        del pool
        if alive and _pool_alive(torch, index, pool_id):
            # Still allocated after the drop (not just frees waiting on stream events): escaped.
            escaped = max(_allocator_bytes(torch, index)[0] - allocated0, 1)
            result.escaped_bytes = escaped
            with _state.lock:
                _state.orphans.append(_Orphan(pool_id=pool_id, device=index))
                _state.escaped_total += escaped
                _state.escape_events += 1
            _warn_once(escaped)


@contextlib.contextmanager
def unguarded_scoped_pool(device: Any = None) -> Iterator[None]:
    """The plain pattern (a pool per block, dropped at exit) with no escape check.

    Exists only so `vramdoctor ab-test` can show what the guard prevents; do not use it.
    """
    torch = load_torch("unguarded_scoped_pool")
    index = _device_index(torch, device)[0]
    pool = torch.cuda.MemPool()
    try:
        with torch.cuda.use_mem_pool(pool, device=index):
            yield
    finally:
        del pool
