"""Which code holds the GPU memory that grows: PyTorch allocator snapshots diffed by stack.

Pure core (`analysis`): `attribute(snapshots, requests=..., nvml_used_bytes=...)` over two or more
`torch.cuda.memory._snapshot()` dicts of one process -> `ProcessAttribution` (the growing stacks,
their rate per request, and the split of the growth: live tensors by stack, allocator slack in
the default pool and in private pools, memory outside the allocator); `memory="pinned"` does the
same for pinned host memory (`host_segments`, torch 2.14+), and `attribute_memories` both. Files (`snapshots`): safe
pickle loading, a soak run's attribution folder, the offline diff. Soak hooks (`hooks`): the
agent and SGLang's own profiler. Text (`render`).
"""

from __future__ import annotations

from vramdoctor.attribution.analysis import (
    GROWING,
    NO_GROWING_STACK,
    TOO_FEW_SNAPSHOTS,
    Frame,
    NvmlSplit,
    ProcessAttribution,
    SnapshotError,
    SnapshotSummary,
    Stack,
    StackSeries,
    Thresholds,
    attribute,
    frame_origin,
    has_device,
    has_pinned,
    stack_of,
    summarise,
)
from vramdoctor.attribution.snapshots import (
    SCHEMA,
    AttributionReport,
    SnapshotMeta,
    attribute_files,
    attribute_memories,
    attribute_run,
    attribution_dir,
    load_snapshot,
)

__all__ = [
    "GROWING",
    "NO_GROWING_STACK",
    "SCHEMA",
    "TOO_FEW_SNAPSHOTS",
    "AttributionReport",
    "Frame",
    "NvmlSplit",
    "ProcessAttribution",
    "SnapshotError",
    "SnapshotMeta",
    "SnapshotSummary",
    "Stack",
    "StackSeries",
    "Thresholds",
    "attribute",
    "attribute_files",
    "attribute_memories",
    "attribute_run",
    "attribution_dir",
    "frame_origin",
    "has_device",
    "has_pinned",
    "load_snapshot",
    "stack_of",
    "summarise",
]
