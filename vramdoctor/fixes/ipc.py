"""CUDA IPC with consumer-device redirect: share GPU memory without a second context.

torch's own IPC rebuild (`torch.multiprocessing`) opens a shared CUDA allocation on the
*producer's* device index. A consumer process that runs on another GPU therefore creates a
full CUDA context (~500 MiB) on the producer's GPU just to map the handle (SGLang PR #22662:
~1.6 GiB at TP=4). Rewriting the device index in the handle to the consumer's own device
opens the memory through peer access from the consumer's context instead. Without peer
access between the two GPUs that cannot work: we say so and rebuild the old way.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

from vramdoctor.fixes._torch import load_torch

log = logging.getLogger("vramdoctor.fixes")


class PeerAccessWarning(RuntimeWarning):
    """The consumer's GPU cannot map the producer's memory; the redirect was not applied."""


@dataclass(frozen=True)
class CudaIpcHandle:
    """Everything a consumer needs to rebuild a tensor shared from another process (picklable)."""

    device: int  # the producer's device index
    storage_handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes | None
    event_sync_required: bool
    dtype: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # tensor offset in its storage, in elements

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n * _itemsize(self.dtype)


def _itemsize(dtype_name: str) -> int:
    torch = load_torch("CUDA IPC")
    return int(getattr(torch, dtype_name).itemsize)


def share_cuda_tensor(tensor: Any) -> CudaIpcHandle:
    """Export a CUDA tensor (or a view/slice of one) for another process.

    The producer must keep `tensor` alive until every consumer is done with it.
    """
    torch = load_torch("CUDA IPC")
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
        raise ValueError("share_cuda_tensor needs a CUDA tensor")
    (
        device,
        handle,
        size_bytes,
        offset_bytes,
        ref_handle,
        ref_offset,
        event_handle,
        event_sync,
    ) = tensor.untyped_storage()._share_cuda_()
    return CudaIpcHandle(
        device=int(device),
        storage_handle=handle,
        storage_size_bytes=int(size_bytes),
        storage_offset_bytes=int(offset_bytes),
        ref_counter_handle=ref_handle,
        ref_counter_offset=int(ref_offset),
        event_handle=event_handle,
        event_sync_required=bool(event_sync),
        dtype=str(tensor.dtype).removeprefix("torch."),
        size=tuple(tensor.size()),
        stride=tuple(tensor.stride()),
        offset=int(tensor.storage_offset()),
    )


def peer_access(consumer: int, producer: int) -> bool:
    """Can `consumer`'s GPU map memory that lives on `producer`'s GPU? (same GPU: yes)"""
    torch = load_torch("CUDA IPC")
    if consumer == producer:
        return True
    try:
        return bool(torch.cuda.can_device_access_peer(consumer, producer))
    except (RuntimeError, AssertionError):
        return False


_warned_no_peer: set[tuple[int, int]] = set()


def open_cuda_tensor(
    handle: CudaIpcHandle, device: int | None = None, *, redirect: bool = True
) -> Any:
    """Rebuild a shared tensor in this process.

    With `redirect` (the fix) the handle is opened on `device` (default: the current
    device), so no context is created on the producer's GPU. Without it, or when `device`
    has no peer access to the producer's GPU (warned once per pair), it is opened on the
    producer's device index, as torch.multiprocessing does.
    """
    torch = load_torch("CUDA IPC")
    consumer = int(torch.cuda.current_device()) if device is None else int(device)
    target = handle.device
    if redirect and consumer != handle.device:
        if peer_access(consumer, handle.device):
            target = consumer
        else:
            pair = (consumer, handle.device)
            if pair not in _warned_no_peer:
                _warned_no_peer.add(pair)
                warnings.warn(
                    f"GPU {consumer} has no peer access to GPU {handle.device}: the CUDA IPC "
                    "redirect cannot apply, so this process opens the handle on the producer's "
                    "GPU (one extra CUDA context there). Use CPU transport to avoid it.",
                    PeerAccessWarning,
                    stacklevel=2,
                )
    with torch.cuda.device(target):
        storage = torch.UntypedStorage._new_shared_cuda(
            target,
            handle.storage_handle,
            handle.storage_size_bytes,
            handle.storage_offset_bytes,
            handle.ref_counter_handle,
            handle.ref_counter_offset,
            handle.event_handle,
            handle.event_sync_required,
        )
    dtype = getattr(torch, handle.dtype)
    out = torch.empty((0,), dtype=dtype, device=storage.device)
    out.set_(storage, handle.offset, handle.size, handle.stride)
    return out
