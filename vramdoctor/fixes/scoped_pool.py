"""Request-scoped CUDA memory pool: temporary GPU memory of one block goes back to the driver.

A fast image processor running on the GPU allocates scratch tensors whose sizes follow the
images; PyTorch's caching allocator keeps every segment it ever needed, so the process's GPU
memory climbs with each new image size and never comes down (caching, not a leak, but it
still OOMs a co-located server). Routing the block's allocations into a private
`torch.cuda.MemPool` and dropping the pool afterwards returns that memory to the driver.

The danger (measured in ../shared/gpu-probe.md): a GPU tensor that outlives the pool pins
the pool's segments, and a dropped pool's segments are then never reused nor freed, a real
leak of ~19 MiB per request. So at exit we read the pool's snapshot; when blocks are still
active we keep ("park") the pool, count the escaped bytes, warn once, and release it later
once those tensors are gone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ._torch import cuda_usable, has_mem_pool, load_torch

log = logging.getLogger("vramdoctor.fixes")

MIB = 1024 * 1024


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
    pool: Any
    device: int
    escaped_bytes: int


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    parked: list[_Parked] = field(default_factory=list)
    escaped_total: int = 0
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


def release_parked() -> int:
    """Drop parked pools whose escaped tensors are gone; return the bytes given back.

    Called at every scope entry and exit, and callable directly (e.g. on an idle tick). A
    pool destroyed with nothing alive returns its segments; where the allocator keeps them
    cached anyway, one global `empty_cache()` returns them (measured in gpu-probe.md).
    """
    with _state.lock:
        if not _state.parked:
            return 0
        torch = load_torch("request_scoped_pool")
        keep: list[_Parked] = []
        freed: list[tuple[_Parked, int]] = []
        for entry in _state.parked:
            active, reserved = pool_usage(entry.pool)
            if active == 0:
                freed.append((entry, reserved))
            else:
                keep.append(entry)
        _state.parked = keep
    if not freed:
        return 0
    total = 0
    for device in {entry.device for entry, _ in freed}:
        before = torch.cuda.memory_reserved(device)
        expected = sum(r for e, r in freed if e.device == device)
        for entry, _ in freed:
            if entry.device == device:
                entry.pool = None
        freed_now = before - torch.cuda.memory_reserved(device)
        if freed_now < expected:
            with torch.cuda.device(device):
                torch.cuda.empty_cache()
            freed_now = before - torch.cuda.memory_reserved(device)
        total += max(freed_now, 0)
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
    release_parked()
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
        if active:
            with _state.lock:
                _state.parked.append(_Parked(pool=pool, device=index, escaped_bytes=active))
                _state.escaped_total += active
                _state.escape_events += 1
            _warn_once(active)
        del pool
        release_parked()


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
