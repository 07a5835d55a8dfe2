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


def _frames(raw: Any) -> list[Frame]:
    out: list[Frame] = []
    for fr in raw or []:
        if not isinstance(fr, Mapping):
            continue
        out.append(
            Frame(
                str(fr.get("filename", "?")), int(fr.get("line", 0) or 0), str(fr.get("name", "?"))
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
    """One snapshot reduced to sizes (bytes) and live bytes per stack."""

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
        return any(int(x) != 0 for x in pool_id)
    except (TypeError, ValueError):
        return False


def summarise(snapshot: Mapping[str, Any]) -> SnapshotSummary:
    """Reduce a `torch.cuda.memory._snapshot()` dict. Raises SnapshotError when it is not one."""
    if not isinstance(snapshot, Mapping) or not isinstance(snapshot.get("segments"), list):
        raise SnapshotError("not a PyTorch allocator snapshot (no 'segments' list)")
    reserved = live = pp_reserved = pp_live = expandable = 0
    pools: set[Any] = set()
    devices: set[int] = set()
    by_stack: dict[Stack, int] = {}
    count: dict[Stack, int] = {}
    cache: dict[tuple[tuple[str, int, str], ...], Stack] = {}
    for seg in snapshot["segments"]:
        if not isinstance(seg, Mapping):
            raise SnapshotError("a segment is not a dict")
        total = int(seg.get("total_size", 0) or 0)
        private = _is_private(seg.get("segment_pool_id"))
        reserved += total
        if private:
            pp_reserved += total
            pools.add(tuple(seg["segment_pool_id"]))
        if seg.get("is_expandable"):
            expandable += 1
        if seg.get("device") is not None:
            devices.add(int(seg["device"]))
        for blk in seg.get("blocks") or []:
            if not isinstance(blk, Mapping) or blk.get("state") != "active_allocated":
                continue
            size = int(blk.get("size", 0) or 0)
            live += size
            if private:
                pp_live += size
            raw = blk.get("frames") or []
            key = tuple(
                (str(f.get("filename")), int(f.get("line", 0) or 0), str(f.get("name")))
                for f in raw
                if isinstance(f, Mapping)
            )
            stack = cache.get(key)
            if stack is None:
                stack = cache[key] = stack_of(_frames(raw))
            by_stack[stack] = by_stack.get(stack, 0) + size
            count[stack] = count.get(stack, 0) + 1
    return SnapshotSummary(
        reserved,
        live,
        pp_reserved,
        pp_live,
        len(pools),
        len(snapshot["segments"]),
        expandable,
        sorted(devices),
        by_stack,
        count,
    )


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

    @property
    def growing(self) -> list[StackSeries]:
        return [s for s in self.stacks if s.growing]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        changed = [s for s in self.stacks if not s.growing and s.growth_bytes != 0][:top]
        return {
            "label": self.label,
            "pid": self.pid,
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


def attribute(
    snapshots: Sequence[Mapping[str, Any]],
    *,
    requests: Sequence[int | None] | None = None,
    nvml_used_bytes: Sequence[float | None] | None = None,
    label: str = "process",
    pid: int | None = None,
    th: Thresholds | None = None,
) -> ProcessAttribution:
    """Diff one process's snapshots (time order) by allocation stack.

    requests: requests served in each interval between consecutive snapshots (len = n - 1);
    without them rates are per interval, not per request. nvml_used_bytes: the process's NVML
    usage at each snapshot (len = n), for the split's outside-the-allocator part.
    The split spans the second to the last snapshot when there are 3 or more (the first
    interval holds warm-up and caches filling), else all. Raises SnapshotError on bad input.
    """
    th = th or Thresholds()
    summaries = [summarise(s) for s in snapshots]
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
    first, last = summaries[a], summaries[-1]
    growing_bytes = sum(s.live_bytes[-1] - s.live_bytes[a] for s in series if s.growing)
    live_growth = last.live_bytes - first.live_bytes
    nvml_growth = outside = None
    if (
        nvml_used_bytes is not None
        and nvml_used_bytes[a] is not None
        and nvml_used_bytes[-1] is not None
    ):
        nvml_growth = float(nvml_used_bytes[-1]) - float(nvml_used_bytes[a])  # type: ignore[arg-type]
        outside = nvml_growth - (last.reserved_bytes - first.reserved_bytes)
    split = NvmlSplit(
        from_snapshot=a,
        to_snapshot=n - 1,
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
    no_frames = last.live_by_stack.get(Stack("no-frames"), 0)
    if no_frames:
        notes.append(
            f"{format_bytes(no_frames)} live in blocks without a stack (allocated before history "
            "was armed); they cannot be attributed"
        )
    verdict = GROWING if any(s.growing for s in series) else NO_GROWING_STACK
    return ProcessAttribution(label, verdict, summaries, reqs, series, split, pid, notes)
