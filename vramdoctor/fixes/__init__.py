"""The memory fixes as a library: request-scoped CUDA pools and CUDA IPC device redirect.

Import works without torch; calling a fix without it raises MissingExtra with the install
line. torch is imported in one place, `vramdoctor.fixes._torch`, on first use.

    from vramdoctor.fixes import request_scoped_pool, outputs_to_cpu

    with request_scoped_pool("cuda:0"):
        out = outputs_to_cpu(processor(images=image, return_tensors="pt", device="cuda:0"))
"""

from __future__ import annotations

from vramdoctor.fixes.feature_pool import (
    FeatureBufferPool,
    PooledSlice,
    PoolFullWarning,
    open_slice,
    per_worker_bytes,
    to_transport,
)
from vramdoctor.fixes.ipc import (
    CudaIpcHandle,
    PeerAccessWarning,
    open_cuda_tensor,
    peer_access,
    share_cuda_tensor,
)
from vramdoctor.fixes.outputs import outputs_to_cpu
from vramdoctor.fixes.scoped_pool import (
    EscapedTensorWarning,
    ScopeResult,
    escape_events,
    escaped_bytes,
    parked_pools,
    release_parked,
    request_scoped_pool,
)

__all__ = [
    "CudaIpcHandle",
    "EscapedTensorWarning",
    "FeatureBufferPool",
    "PeerAccessWarning",
    "PoolFullWarning",
    "PooledSlice",
    "ScopeResult",
    "escape_events",
    "escaped_bytes",
    "open_cuda_tensor",
    "open_slice",
    "outputs_to_cpu",
    "parked_pools",
    "peer_access",
    "per_worker_bytes",
    "release_parked",
    "request_scoped_pool",
    "share_cuda_tensor",
    "to_transport",
]
