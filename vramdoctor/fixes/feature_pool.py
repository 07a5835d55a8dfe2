"""A pooled GPU feature buffer for CUDA IPC transport, split across tokenizer workers.

Allocating a fresh CUDA tensor per shared feature means a fresh IPC handle, and an
`cudaIpcOpenMemHandle` per tensor on the consumer; one buffer reserved up front and shared
once is cheaper and its size is fixed (constant, not a leak). The total budget is split
across workers, each getting max(total // workers, 128 MiB) (SGLang 0.5.15's rule; before it
every worker reserved the whole budget). A tensor that does not fit goes by CPU instead,
with a one-time warning naming the knob.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any

from vramdoctor.fixes._torch import load_torch
from vramdoctor.fixes.ipc import CudaIpcHandle, open_cuda_tensor, share_cuda_tensor
from vramdoctor.samples import MIB
from vramdoctor.units import format_bytes

MIN_WORKER_BYTES = 128 * MIB
_ALIGN = 512


class PoolFullWarning(RuntimeWarning):
    """A feature tensor did not fit the pooled buffer and went by CPU."""


def per_worker_bytes(total_bytes: int, workers: int) -> int:
    """Each worker's share of the budget: max(total // workers, 128 MiB)."""
    if workers < 1:
        raise ValueError("workers must be >= 1")
    return max(total_bytes // workers, MIN_WORKER_BYTES)


@dataclass(frozen=True)
class PooledSlice:
    """A feature placed in the pooled buffer: the buffer's handle plus where the bytes are."""

    buffer: CudaIpcHandle
    byte_offset: int
    nbytes: int
    dtype: str
    size: tuple[int, ...]


class _FreeList:
    """First-fit allocator over [0, capacity) with coalescing on free (pure, no torch)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[tuple[int, int]] = [(0, capacity)]  # (start, length), sorted
        self._used: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int | None:
        need = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        for i, (start, length) in enumerate(self._free):
            if length >= need:
                if length == need:
                    self._free.pop(i)
                else:
                    self._free[i] = (start + need, length - need)
                self._used[start] = need
                return start
        return None

    def free(self, start: int) -> None:
        length = self._used.pop(start)
        self._free.append((start, length))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for s, n in self._free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self._free = merged

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())


class FeatureBufferPool:
    """One worker's fixed GPU buffer; `put()` copies a tensor in and returns a shareable slice."""

    def __init__(self, total_bytes: int, workers: int = 1, device: int | str | None = None) -> None:
        torch = load_torch("FeatureBufferPool")
        self.capacity = per_worker_bytes(total_bytes, workers)
        dev = (
            torch.device("cuda", torch.cuda.current_device())
            if device is None
            else torch.device(device)
        )
        if dev.type != "cuda":
            raise ValueError("FeatureBufferPool needs a CUDA device")
        self.device = dev
        self._buffer = torch.empty(self.capacity, dtype=torch.uint8, device=dev)
        self._handle = share_cuda_tensor(self._buffer)
        self._alloc = _FreeList(self.capacity)
        self._lock = threading.Lock()
        self._warned = False
        self.fallbacks = 0

    @property
    def handle(self) -> CudaIpcHandle:
        return self._handle

    def put(self, tensor: Any) -> PooledSlice | None:
        """Copy `tensor` into the buffer; None (and a one-time warning) when it does not fit."""
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            start = self._alloc.alloc(nbytes)
        if start is None:
            self.fallbacks += 1
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"the pooled GPU feature buffer has no free chunk for a {format_bytes(nbytes)} "
                    f"tensor (buffer {format_bytes(self.capacity)} per worker); sending it through "
                    "CPU instead. Raise the total budget or lower the worker count.",
                    PoolFullWarning,
                    stacklevel=2,
                )
            return None
        view = self._buffer[start : start + nbytes]
        view.view(tensor.dtype).view(tensor.shape).copy_(tensor.contiguous())
        return PooledSlice(
            buffer=self._handle,
            byte_offset=start,
            nbytes=nbytes,
            dtype=str(tensor.dtype).removeprefix("torch."),
            size=tuple(tensor.shape),
        )

    def release(self, piece: PooledSlice) -> None:
        """The consumer is done with `piece`: its bytes can be reused."""
        with self._lock:
            self._alloc.free(piece.byte_offset)

    @property
    def used_bytes(self) -> int:
        return self._alloc.used_bytes


def to_transport(pool: FeatureBufferPool | None, tensor: Any) -> PooledSlice | Any:
    """A feature ready to send: a pooled slice, or the tensor on CPU when it does not fit."""
    if pool is not None:
        piece = pool.put(tensor)
        if piece is not None:
            return piece
    return tensor.to("cpu")


_opened: dict[tuple[bytes, int, bool], Any] = {}


def open_slice(piece: PooledSlice, device: int | None = None, *, redirect: bool = True) -> Any:
    """Consumer side: a tensor view of `piece` (the buffer is opened once per process)."""
    torch = load_torch("FeatureBufferPool")
    key = (piece.buffer.storage_handle, -1 if device is None else device, redirect)
    buffer = _opened.get(key)
    if buffer is None:
        buffer = open_cuda_tensor(piece.buffer, device, redirect=redirect)
        _opened[key] = buffer
    raw = buffer[piece.byte_offset : piece.byte_offset + piece.nbytes]
    return raw.view(getattr(torch, piece.dtype)).view(piece.size)


def forget_opened() -> None:
    """Drop this process's mappings of producers' buffers (before exit, so the producers'
    IPC reference counts drop and they can free the memory cleanly)."""
    _opened.clear()
