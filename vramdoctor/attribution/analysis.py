"""Which Python stack holds the GPU memory that grows: a pure diff of PyTorch allocator snapshots.

Input: two or more `torch.cuda.memory._snapshot()` dicts of ONE process, in time order (taken at
the end of identical soak rounds' idle windows, or any snapshots a user has), optionally with the
requests served between them and the process's NVML usage at each. Output: typed results.

What a snapshot holds (torch >= 2.1): `segments`, each with `total_size` (reserved bytes),
`segment_pool_id` (a private pool when not (0, 0): a `torch.cuda.MemPool`, a CUDA graph),
`is_expandable`, and `blocks` with `size` (allocator-rounded bytes), `state`
("active_allocated", "active_pending_free", "inactive") and `frames` (innermost first:
`filename`, `line`, `name`; empty for blocks allocated before history was armed).

The rule: live blocks (`active_allocated`) are grouped by their allocation stack, cut to the
frames that say whose code it is: the innermost frame outside PyTorch and the standard library,
and its callers up to the first frame of a different package or of the server's own code.
PyTorch and the standard library are recognised by their package roots (`site-packages/torch/`,
`lib/python3.X/`), never by a bare `/torch/` substring: virtual environments live under paths
like `/opt/torch/.venv/`. A stack whose live bytes grow in every interval, in proportion to the
requests served, is the leak's address; a cache that fills and stops (the allocator's or the
server's own) is not.

No I/O here: reading pickles is `vramdoctor.attribution.snapshots`.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.units import MIB, format_bytes

__all__ = [
    "GROWING",
    "NO_GROWING_STACK",
    "TOO_FEW_SNAPSHOTS",
    "Frame",
    "NvmlSplit",
    "ProcessAttribution",
    "SnapshotError",
    "SnapshotSummary",
    "Stack",
    "StackSeries",
    "Thresholds",
    "attribute",
    "frame_origin",
    "has_device",
    "has_pinned",
    "stack_of",
    "summarise",
]

GROWING = "growing-stack"
NO_GROWING_STACK = "no-growing-stack"
TOO_FEW_SNAPSHOTS = "too-few-snapshots"

# Packages that are PyTorch itself (their frames never name whose code holds memory).
_TORCH_PACKAGES = frozenset(
    {"torch", "torchvision", "torchaudio", "triton", "functorch", "torchgen"}
)
# The last `site-packages/<pkg>` (or `dist-packages`) in a path; <pkg> may be a single file module.
_PACKAGE_RE = re.compile(r"/(?:site|dist)-packages/([^/]+?)(?:\.py)?(?:/|$)")
# The standard library: `.../lib/python3.X/<not site-packages>` (CPython, venv base, uv, conda).
_STDLIB_RE = re.compile(r"/lib(?:64)?/python3(?:\.\d+)?t?/(?!(?:site|dist)-packages/)")
# Code PyTorch generates at run time (torch.compile's Inductor, Triton's kernel cache).
_GENERATED_RE = re.compile(r"/torchinductor_[^/]*/|/\.triton/cache/")
# vramdoctor's own agent (its test-only leak hook allocates from a callback inside the target).
_AGENT_FILE = "vramdoctor_agent.py"
_MAX_CHAIN = 8


class SnapshotError(ValueError):
    """A snapshot that is not a PyTorch allocator snapshot dict (no `segments` list)."""


@dataclass(frozen=True, order=True)
class Frame:
    """One Python frame of an allocation stack."""

    filename: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line} {self.function}"

    def to_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "line": self.line, "function": self.function}


@dataclass(frozen=True, order=True)
class Stack:
    """The part of an allocation stack that says whose code holds the block.

    kind: "code" (frames outside PyTorch and the standard library, innermost first),
    "no-frames" (allocated before history was armed), "library-only" (only PyTorch or
    standard-library frames; `frames` then holds the innermost one).
    """

    kind: str
    frames: tuple[Frame, ...] = ()

    def describe(self) -> str:
        if self.kind == "no-frames":
            return "no stack (allocated before allocator history was armed)"
        if self.kind == "library-only" and self.frames:
            return f"only PyTorch/standard-library frames, innermost {self.frames[0]}"
        if not self.frames:
            return "no Python frames"
        return str(self.frames[0])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "frames": [f.to_dict() for f in self.frames]}


def frame_origin(filename: str) -> tuple[str, str | None]:
    """(origin, package) of a frame's file.

    origin: "torch" (PyTorch, its own packages, code torch.compile generated), "stdlib", "agent" (vramdoctor's agent),
    "package" (another installed package, named), "code" (anything else: the server's own code,
    an editable install). Matches package roots, not substrings: `/opt/torch/.venv/app.py` is code.
    """
    path = filename.replace("\\", "/")
    if path.startswith("<"):  # <frozen importlib._bootstrap>, <string>: the interpreter's own
        return "stdlib", None
    if path.endswith("/" + _AGENT_FILE) or path == _AGENT_FILE:
        return "agent", None
    if _GENERATED_RE.search(
        path
    ):  # code torch.compile / Triton generated: PyTorch's, not the server's
        return "torch", "torch"
    found = list(_PACKAGE_RE.finditer(path))
    if found:
        package = found[-1].group(1)
        if package in _TORCH_PACKAGES:
            return "torch", package
        return "package", package
    if _STDLIB_RE.search(path):
        return "stdlib", None
    return "code", None


def _line(value: Any) -> int:
    """A frame's line number as an int (0 for anything that is not a plausible one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    try:
        line = int(value)
    except (OverflowError, ValueError):
        return 0
    return line if 0 <= line < 2**31 else 0


def _frames(raw: Any) -> list[Frame]:
    """The first MAX_FRAMES frames (innermost first) of a block's `frames` list."""
    out: list[Frame] = []
    if not isinstance(raw, (list, tuple)):
        return out
    for fr in raw[:MAX_FRAMES]:
        if not isinstance(fr, Mapping):
            continue
        out.append(
            Frame(
                str(fr.get("filename", "?"))[:_MAX_NAME],
                _line(fr.get("line")),
                str(fr.get("name", "?"))[:_MAX_NAME],
            )
        )
    return out


def stack_of(frames: Sequence[Frame]) -> Stack:
    """The attribution stack of one block's frames (innermost first)."""
    if not frames:
        return Stack("no-frames")
    origins = [frame_origin(f.filename) for f in frames]
    first = next((i for i, (o, _) in enumerate(origins) if o in ("package", "code")), None)
    if first is None:
        inner = next(
            (f for f, (o, _) in zip(frames, origins, strict=True) if o != "agent"), frames[0]
        )
        return Stack("library-only", (inner,))
    chain = [frames[first]]
    home = origins[first]
    if home[0] == "package":
        for f, o in zip(frames[first + 1 :], origins[first + 1 :], strict=True):
            if o[0] not in ("package", "code"):
                continue
            chain.append(f)
            if o != home or len(chain) >= _MAX_CHAIN:
                break  # reached the caller outside that package (the server's code), or enough
    return Stack("code", tuple(chain))


@dataclass
class SnapshotSummary:
    """One snapshot reduced to sizes (bytes) and live bytes per stack.

    `memory`: "cuda" (the device allocator's `segments`) or "pinned" (the pinned host
    allocator's `host_segments`, torch 2.14+)."""

    reserved_bytes: int
    live_bytes: int
    private_pool_reserved_bytes: int
    private_pool_live_bytes: int
    private_pools: int
    segments: int
    expandable_segments: int
    devices: list[int]
    live_by_stack: dict[Stack, int]
    blocks_by_stack: dict[Stack, int]
    memory: str = "cuda"

    @property
    def slack_bytes(self) -> int:
        """Reserved but not live: the allocator's cache, free space in private pools."""
        return self.reserved_bytes - self.live_bytes

    @property
    def private_pool_slack_bytes(self) -> int:
        return self.private_pool_reserved_bytes - self.private_pool_live_bytes


def _is_private(pool_id: Any) -> bool:
    if pool_id is None:
        return False
    try:
        return any(int(x) != 0 for x in list(pool_id)[:4])
    except (TypeError, ValueError, OverflowError):
        return False


def _size(value: Any) -> int:
    """A byte count as an int (0 for anything that is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    try:
        n = int(value)
    except (OverflowError, ValueError):
        return 0
    return n if 0 <= n < 2**60 else 0


# Work caps per snapshot (a hostile pickle can make every block share one huge stack through
# the pickle memo, or list one block a million times): at most MAX_FRAMES frames of a stack are
# read (innermost first: the frames that name the code), each distinct frames list is read once
# (by identity), and a snapshot with more than MAX_BLOCKS blocks is refused.
MAX_FRAMES = 256
MAX_BLOCKS = 2_000_000
_MAX_NAME = 1000


class _Walk:
    """Live bytes per stack over blocks, with the caps above."""

    def __init__(self) -> None:
        self.by_stack: dict[Stack, int] = {}
        self.count: dict[Stack, int] = {}
        self.by_list: dict[int, tuple[Any, Stack]] = {}
        self.by_key: dict[tuple[tuple[str, int, str], ...], Stack] = {}
        self.blocks = 0

    def stack(self, raw: Any) -> Stack:
        if not raw:
            return _NO_FRAMES
        hit = self.by_list.get(id(raw))
        if hit is not None and hit[0] is raw:
            return hit[1]
        frames = _frames(raw)
        key = tuple((f.filename, f.line, f.function) for f in frames)
        stack = self.by_key.get(key)
        if stack is None:
            stack = self.by_key[key] = stack_of(frames)
        self.by_list[id(raw)] = (raw, stack)  # keeps `raw` alive: ids stay unique
        return stack

    def add(self, size: int, raw_frames: Any) -> None:
        stack = self.stack(raw_frames)
        self.by_stack[stack] = self.by_stack.get(stack, 0) + size
        self.count[stack] = self.count.get(stack, 0) + 1

    def tick(self, n: int = 1) -> None:
        self.blocks += n
        if self.blocks > MAX_BLOCKS:
            raise SnapshotError(
                f"more than {MAX_BLOCKS:,} blocks in one snapshot: refused (work cap)"
            )


_NO_FRAMES = Stack("no-frames")


def summarise(snapshot: Mapping[str, Any], memory: str = "cuda") -> SnapshotSummary:
    """Reduce a `torch.cuda.memory._snapshot()` dict. Raises SnapshotError when it is not one.

    memory: "cuda" reads `segments` (GPU memory); "pinned" reads `host_segments` (torch 2.14+,
    `record_pinned_host_memory=True`), or replays `host_traces` when the snapshot holds traces
    but no host segments. A snapshot taken with `record_cuda=False` has an empty `segments`."""
    if not isinstance(snapshot, Mapping):
        raise SnapshotError("not a PyTorch allocator snapshot (not a dict)")
    key = "segments" if memory == "cuda" else "host_segments"
    segments = snapshot.get(key)
    if memory == "cuda" and not isinstance(segments, list):
        if not isinstance(snapshot.get("host_segments"), list):
            raise SnapshotError("not a PyTorch allocator snapshot (no 'segments' list)")
        segments = []  # record_cuda=False: host memory only
    if not isinstance(segments, list):
        segments = []
    if memory == "pinned" and not segments and isinstance(snapshot.get("host_traces"), list):
        return _replay(snapshot["host_traces"])
    reserved = live = pp_reserved = pp_live = expandable = 0
    pools: set[tuple[int, ...]] = set()
    devices: set[int] = set()
    walk = _Walk()
    for seg in segments:
        walk.tick()
        if not isinstance(seg, Mapping):
            raise SnapshotError("a segment is not a dict")
        total = _size(seg.get("total_size"))
        pool_id = seg.get("segment_pool_id")
        private = _is_private(pool_id)
        reserved += total
        if private:
            pp_reserved += total
            pools.add(tuple(int(x) for x in list(pool_id or ())[:4]))
        if seg.get("is_expandable") is True:
            expandable += 1
        device = seg.get("device")
        if isinstance(device, int) and not isinstance(device, bool) and 0 <= device < 4096:
            devices.add(device)
        blocks = seg.get("blocks")
        if not isinstance(blocks, list):
            continue
        walk.tick(len(blocks))
        for blk in blocks:
            if not isinstance(blk, Mapping) or blk.get("state") != "active_allocated":
                continue
            size = _size(blk.get("size"))
            live += size
            if private:
                pp_live += size
            walk.add(size, blk.get("frames"))
    return SnapshotSummary(
        reserved,
        live,
        pp_reserved,
        pp_live,
        len(pools),
        len(segments),
        expandable,
        sorted(devices),
        walk.by_stack,
        walk.count,
        memory,
    )


_ALLOC_ACTIONS = frozenset({"alloc"})
_FREE_ACTIONS = frozenset({"free_completed", "free_requested", "free"})


def _replay(traces: list[Any]) -> SnapshotSummary:
    """Live pinned blocks from a trace (alloc/free events with address, size, frames): what is
    allocated and not freed at the snapshot's end. Reserved = live (traces hold no cache)."""
    walk = _Walk()
    alive: dict[int, tuple[int, Any]] = {}
    entries = traces
    if traces and all(isinstance(t, list) for t in traces):  # per device, like device_traces
        entries = [e for t in traces for e in t]
    walk.tick(len(entries))
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        action = entry.get("action")
        addr = entry.get("addr")
        if not isinstance(addr, int) or isinstance(addr, bool):
            continue
        if action in _ALLOC_ACTIONS:
            alive[addr] = (_size(entry.get("size")), entry.get("frames"))
        elif action in _FREE_ACTIONS:
            alive.pop(addr, None)
    live = 0
    for size, frames in alive.values():
        live += size
        walk.add(size, frames)
    return SnapshotSummary(live, live, 0, 0, 0, 0, 0, [], walk.by_stack, walk.count, "pinned")


def has_pinned(snapshot: Mapping[str, Any]) -> bool:
    """Whether a snapshot carries pinned host memory (non-empty `host_segments`/`host_traces`)."""
    return any(
        isinstance(snapshot.get(k), list) and bool(snapshot.get(k))
        for k in ("host_segments", "host_traces")
    )


def has_device(snapshot: Mapping[str, Any]) -> bool:
    """Whether a snapshot carries GPU memory (False for one taken with `record_cuda=False`)."""
    segments = snapshot.get("segments")
    return isinstance(segments, list) and bool(segments)


@dataclass(frozen=True)
class Thresholds:
    """min_interval_growth_bytes: a stack must grow by more than this in EVERY interval.
    min_total_growth_bytes: and by at least this in all. proportion: each interval's bytes per
    request within this factor of the median interval's (a leak scales with the traffic)."""

    min_interval_growth_bytes: int = 0
    min_total_growth_bytes: int = MIB
    proportion: float = 2.0


@dataclass
class StackSeries:
    """One stack's live bytes at each snapshot, and whether it is the leak's address."""

    stack: Stack
    live_bytes: list[int]
    blocks: list[int]
    grows_every_interval: bool
    proportional: bool
    bytes_per_request: float | None
    growing: bool

    @property
    def growth_bytes(self) -> int:
        return self.live_bytes[-1] - self.live_bytes[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack.to_dict(),
            "describe": self.stack.describe(),
            "live_bytes": self.live_bytes,
            "blocks": self.blocks,
            "growth_bytes": self.growth_bytes,
            "grows_every_interval": self.grows_every_interval,
            "proportional": self.proportional,
            "bytes_per_request": self.bytes_per_request,
            "growing": self.growing,
        }


@dataclass
class NvmlSplit:
    """Where a process's growth went, between the split's first and last snapshots (bytes).

    reserved = growing stacks + other live + slack (default pool) + slack (private pools);
    NVML growth = reserved growth + outside the allocator (NCCL, CUDA graphs' driver memory,
    extensions, cuBLAS workspaces). NVML fields are None when no NVML figures were given.
    """

    from_snapshot: int
    to_snapshot: int
    reserved_growth_bytes: int
    growing_stacks_bytes: int
    other_live_bytes: int
    slack_default_bytes: int
    slack_private_pool_bytes: int
    nvml_growth_bytes: float | None = None
    outside_allocator_bytes: float | None = None
    requests: int | None = None  # served between from_snapshot and to_snapshot, when known

    @property
    def growth_per_request_bytes(self) -> float | None:
        """NVML growth (reserved growth without NVML) per request over the split's span."""
        whole = (
            self.nvml_growth_bytes
            if self.nvml_growth_bytes is not None
            else self.reserved_growth_bytes
        )
        return whole / self.requests if self.requests else None

    @property
    def explained_fraction(self) -> float | None:
        """The growing stacks' share of the NVML growth (of reserved growth without NVML)."""
        whole = (
            self.nvml_growth_bytes
            if self.nvml_growth_bytes is not None
            else self.reserved_growth_bytes
        )
        if not whole or whole <= 0:
            return None
        return self.growing_stacks_bytes / whole

    def to_dict(self) -> dict[str, Any]:
        return {
            "from_snapshot": self.from_snapshot,
            "to_snapshot": self.to_snapshot,
            "reserved_growth_bytes": self.reserved_growth_bytes,
            "growing_stacks_bytes": self.growing_stacks_bytes,
            "other_live_bytes": self.other_live_bytes,
            "slack_default_bytes": self.slack_default_bytes,
            "slack_private_pool_bytes": self.slack_private_pool_bytes,
            "nvml_growth_bytes": self.nvml_growth_bytes,
            "outside_allocator_bytes": self.outside_allocator_bytes,
            "requests": self.requests,
            "growth_per_request_bytes": self.growth_per_request_bytes,
            "explained_fraction": self.explained_fraction,
        }


@dataclass
class ProcessAttribution:
    """The diff of one process's snapshots."""

    label: str
    verdict: str
    summaries: list[SnapshotSummary]
    requests: list[int | None]
    stacks: list[StackSeries]
    split: NvmlSplit | None
    pid: int | None = None
    notes: list[str] = field(default_factory=list)
    # "cuda" (GPU memory, the device allocator) or "pinned" (pinned host memory, torch 2.14+)
    memory: str = "cuda"

    @property
    def growing(self) -> list[StackSeries]:
        return [s for s in self.stacks if s.growing]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        changed = [s for s in self.stacks if not s.growing and s.growth_bytes != 0][:top]
        return {
            "label": self.label,
            "pid": self.pid,
            "memory": self.memory,
            "verdict": self.verdict,
            "snapshots": len(self.summaries),
            "requests_per_interval": self.requests,
            "reserved_bytes": [s.reserved_bytes for s in self.summaries],
            "live_bytes": [s.live_bytes for s in self.summaries],
            "private_pools": [s.private_pools for s in self.summaries],
            "expandable_segments": [s.expandable_segments for s in self.summaries],
            "growing": [s.to_dict() for s in self.growing],
            "other_changed": [s.to_dict() for s in changed],
            "split": self.split.to_dict() if self.split else None,
            "notes": self.notes,
        }


def _series(
    stack: Stack,
    summaries: Sequence[SnapshotSummary],
    requests: Sequence[int | None],
    th: Thresholds,
) -> StackSeries:
    live = [s.live_by_stack.get(stack, 0) for s in summaries]
    blocks = [s.blocks_by_stack.get(stack, 0) for s in summaries]
    growth = [b - a for a, b in itertools.pairwise(live)]
    every = bool(growth) and all(g > th.min_interval_growth_bytes for g in growth)
    known = all(r is not None and r > 0 for r in requests) and len(requests) == len(growth)
    rates = (
        [g / r for g, r in zip(growth, requests, strict=False) if r]
        if known
        else [float(g) for g in growth]
    )
    proportional = False
    if every and rates:
        mid = statistics.median(rates)
        proportional = mid > 0 and all(
            mid / th.proportion <= x <= mid * th.proportion for x in rates
        )
    total = live[-1] - live[0]
    per_request = total / sum(r for r in requests if r) if known and total else None
    growing = (
        every and proportional and total >= th.min_total_growth_bytes and stack.kind != "no-frames"
    )
    return StackSeries(stack, live, blocks, every, proportional, per_request, growing)


def _split(
    summaries: Sequence[SnapshotSummary],
    series: Sequence[StackSeries],
    reqs: Sequence[int | None],
    nvml_used_bytes: Sequence[float | None] | None,
    a: int,
) -> NvmlSplit:
    """Where the growth between snapshot `a` and the last went (see NvmlSplit)."""
    first, last = summaries[a], summaries[-1]
    growing_bytes = sum(s.live_bytes[-1] - s.live_bytes[a] for s in series if s.growing)
    live_growth = last.live_bytes - first.live_bytes
    nvml_growth = outside = None
    if nvml_used_bytes is not None:
        start, end = nvml_used_bytes[a], nvml_used_bytes[-1]
        if start is not None and end is not None:
            nvml_growth = float(end) - float(start)
            outside = nvml_growth - (last.reserved_bytes - first.reserved_bytes)
    return NvmlSplit(
        from_snapshot=a,
        to_snapshot=len(summaries) - 1,
        reserved_growth_bytes=last.reserved_bytes - first.reserved_bytes,
        growing_stacks_bytes=growing_bytes,
        other_live_bytes=live_growth - growing_bytes,
        slack_default_bytes=(last.slack_bytes - last.private_pool_slack_bytes)
        - (first.slack_bytes - first.private_pool_slack_bytes),
        slack_private_pool_bytes=last.private_pool_slack_bytes - first.private_pool_slack_bytes,
        nvml_growth_bytes=nvml_growth,
        outside_allocator_bytes=outside,
        requests=sum(r for r in reqs[a:] if r) if all(r for r in reqs[a:]) else None,
    )


def attribute(
    snapshots: Sequence[Mapping[str, Any]],
    *,
    requests: Sequence[int | None] | None = None,
    nvml_used_bytes: Sequence[float | None] | None = None,
    label: str = "process",
    pid: int | None = None,
    th: Thresholds | None = None,
    memory: str = "cuda",
) -> ProcessAttribution:
    """Diff one process's snapshots (time order) by allocation stack.

    requests: requests served in each interval between consecutive snapshots (len = n - 1);
    without them rates are per interval, not per request. nvml_used_bytes: the process's NVML
    usage at each snapshot (len = n), for the split's outside-the-allocator part.
    The split spans the second to the last snapshot when there are 3 or more (the first
    interval holds warm-up and caches filling), else all. memory: "cuda" (GPU memory, the
    snapshots' `segments`) or "pinned" (pinned host memory, `host_segments` of torch 2.14+;
    give no NVML figures then). Raises SnapshotError on bad input.
    """
    th = th or Thresholds()
    summaries = [summarise(s, memory) for s in snapshots]
    n = len(summaries)
    reqs: list[int | None] = list(requests) if requests is not None else [None] * max(0, n - 1)
    if len(reqs) != max(0, n - 1):
        raise ValueError(f"requests: {len(reqs)} values for {n - 1} intervals")
    if nvml_used_bytes is not None and len(nvml_used_bytes) != n:
        raise ValueError(f"nvml_used_bytes: {len(nvml_used_bytes)} values for {n} snapshots")
    notes: list[str] = []
    if n < 2:
        return ProcessAttribution(
            label,
            TOO_FEW_SNAPSHOTS,
            summaries,
            reqs,
            [],
            None,
            pid,
            ["one snapshot: nothing to diff (need 2, better 3 or more)"],
            memory,
        )
    stacks: set[Stack] = set()
    for s in summaries:
        stacks.update(s.live_by_stack)
    series = [_series(st, summaries, reqs, th) for st in stacks]
    series.sort(key=lambda s: (not s.growing, -abs(s.growth_bytes), s.stack))
    if n == 2:
        notes.append(
            "two snapshots: one interval, so growth was seen once; 3 or more snapshots "
            "tell a leak from a cache that fills once"
        )
    a = 1 if n >= 3 else 0
    split = _split(summaries, series, reqs, nvml_used_bytes, a)
    last = summaries[-1]
    no_frames = last.live_by_stack.get(Stack("no-frames"), 0)
    if no_frames:
        notes.append(
            f"{format_bytes(no_frames)} live in blocks without a stack (allocated before history "
            "was armed); they cannot be attributed"
        )
    verdict = GROWING if any(s.growing for s in series) else NO_GROWING_STACK
    return ProcessAttribution(label, verdict, summaries, reqs, series, split, pid, notes, memory)
