"""Which Python lines hold host memory that grows: tracemalloc's lines diffed across soak rounds.

The host-side twin of the GPU stack diff (`vramdoctor.attribution.analysis`). Input: one
process's `InsideSample` records of a `soak --trace-python` run (each `python.top` lists the
lines holding the most traced bytes and those that grew most since the record before, by
`file`/`line` with `bytes` and `count`), in round order, and the requests each round sent. A line
whose traced bytes grow in EVERY interval, by at least `min_total_growth_bytes` in all, in
proportion to the requests (each interval's bytes per request within a factor of `proportion` of
the median interval's), is the leak's address; a cache that fills and stops is not.

Each entry carries its allocation's frames (innermost first, up to 4): entries are grouped by the
same address as GPU memory (`vramdoctor.attribution.analysis.stack_of`): the innermost frame
outside PyTorch and the standard library and, inside another package (numpy's `ones`), its
callers up to the server's own line. A line missing from a record's `top` is unknown there (it
was neither among the largest nor among the fastest-growing), never read as zero: a line must be
in every record after the baseline to be judged. Pure: no I/O.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vramdoctor.attribution.analysis import Frame, Stack, Thresholds, stack_of
from vramdoctor.samples import InsideSample

__all__ = ["LineSeries", "PythonLines", "python_lines", "python_lines_of_run"]


@dataclass(frozen=True)
class LineSeries:
    """One allocation address's traced bytes at each record (None where it was not reported).

    `stack`: the address (frames innermost first: the line that allocates, then, from inside a
    package, its callers up to the server's code); `file`/`line`: its innermost frame."""

    stack: Stack
    bytes: tuple[int | None, ...]
    counts: tuple[int | None, ...]
    growing: bool
    bytes_per_request: float | None

    @property
    def file(self) -> str:
        return self.stack.frames[0].filename if self.stack.frames else "?"

    @property
    def line(self) -> int:
        return self.stack.frames[0].line if self.stack.frames else 0

    @property
    def growth_bytes(self) -> int:
        known = [b for b in self.bytes if b is not None]
        return known[-1] - known[0] if len(known) >= 2 else 0

    def describe(self) -> str:
        """`file:line`, then ` called from file:line` for each caller in the address."""
        parts = [f"{f.filename}:{f.line}" for f in self.stack.frames]
        return " called from ".join(parts) if parts else "?"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "frames": [[f.filename, f.line] for f in self.stack.frames],
            "bytes": list(self.bytes),
            "counts": list(self.counts),
            "growth_bytes": self.growth_bytes,
            "growing": self.growing,
            "bytes_per_request": self.bytes_per_request,
        }


@dataclass(frozen=True)
class PythonLines:
    """One process's traced Python lines over a run's rounds."""

    pid: int
    label: str
    rounds: tuple[int, ...]
    requests: tuple[int | None, ...]
    traced_bytes: tuple[int | None, ...]
    lines: tuple[LineSeries, ...]

    @property
    def growing(self) -> list[LineSeries]:
        return [s for s in self.lines if s.growing]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        changed = [s for s in self.lines if not s.growing and s.growth_bytes][:top]
        return {
            "pid": self.pid,
            "label": self.label,
            "rounds": list(self.rounds),
            "requests_per_interval": list(self.requests),
            "traced_bytes": list(self.traced_bytes),
            "growing": [s.to_dict() for s in self.growing],
            "other_changed": [s.to_dict() for s in changed],
        }


def _address(item: Mapping[str, Any]) -> Stack:
    """The attribution address of one `top` entry (its frames, or its file:line alone)."""
    raw = item.get("frames")
    frames = [
        Frame(str(fr[0]), int(fr[1]), "")
        for fr in (raw if isinstance(raw, list) else [])
        if isinstance(fr, (list, tuple)) and len(fr) == 2 and isinstance(fr[1], int)
    ]
    if not frames:
        frames = [Frame(str(item["file"]), int(item["line"]), "")]
    stack = stack_of(frames)
    return stack if stack.frames else Stack("code", (frames[0],))


def _tops(rec: InsideSample) -> dict[Stack, tuple[int, int]]:
    """address -> (bytes, count) of one record, entries of one address summed."""
    py = rec.python or {}
    out: dict[Stack, tuple[int, int]] = {}
    for item in py.get("top") or []:
        if isinstance(item, Mapping) and isinstance(item.get("file"), str):
            try:
                key = _address(item)
                size, count = int(item["bytes"]), int(item.get("count") or 0)
            except (KeyError, TypeError, ValueError):
                continue
            had = out.get(key, (0, 0))
            out[key] = (had[0] + size, had[1] + count)
    return out


def _judge(
    values: Sequence[int | None], requests: Sequence[int | None], th: Thresholds
) -> tuple[bool, float | None]:
    """(growing, bytes per request) of one line's values after the baseline.

    values[i] is the line at record i (0 = the baseline, where tracing began: warm-up fills
    caches there, so the intervals judged start at record 1); requests[i] is what the server
    received between record i-1 and record i."""
    if len(values) < 3 or any(v is None for v in values[1:]):
        return False, None
    known = [int(v) for v in values[1:] if v is not None]
    growth = [b - a for a, b in itertools.pairwise(known)]
    reqs = list(requests[2:])
    if not growth or not all(g > th.min_interval_growth_bytes for g in growth):
        return False, None
    total = known[-1] - known[0]
    if total < th.min_total_growth_bytes:
        return False, None
    have = all(r for r in reqs) and len(reqs) == len(growth)
    rates = (
        [g / r for g, r in zip(growth, reqs, strict=True) if r]
        if have
        else [float(g) for g in growth]
    )
    mid = statistics.median(rates)
    proportional = mid > 0 and all(mid / th.proportion <= x <= mid * th.proportion for x in rates)
    per_request = total / sum(r for r in reqs if r) if have else None
    return proportional, per_request


def python_lines(
    records: Sequence[InsideSample],
    requests: Mapping[int, int] | None = None,
    *,
    th: Thresholds | None = None,
) -> PythonLines | None:
    """The traced lines of ONE process's records (any order: sorted by round here).

    requests: round -> requests that reached the server in it. None when no record was traced.
    The baseline (the first record: tracing starts there) is shown, not judged."""
    th = th or Thresholds()
    traced = sorted((r for r in records if (r.python or {}).get("tracing")), key=lambda r: r.round)
    if not traced:
        return None
    rounds = tuple(r.round for r in traced)
    reqs: list[int | None] = [None]
    for a, b in itertools.pairwise(rounds):
        reqs.append(sum((requests or {}).get(n, 0) for n in range(a + 1, b + 1)) or None)
    tops = [_tops(r) for r in traced]
    keys = sorted({k for t in tops for k in t})
    series = []
    for key in keys:
        values = tuple(t[key][0] if key in t else None for t in tops)
        counts = tuple(t[key][1] if key in t else None for t in tops)
        growing, per_request = _judge(values, reqs, th)
        series.append(LineSeries(key, values, counts, growing, per_request))
    series.sort(key=lambda s: (not s.growing, -abs(s.growth_bytes), s.stack))
    first = traced[0]
    return PythonLines(
        pid=first.pid,
        label=f"pid {first.pid} ({first.program or '?'})",
        rounds=rounds,
        requests=tuple(reqs[1:]),
        traced_bytes=tuple((r.python or {}).get("traced_bytes") for r in traced),
        lines=tuple(series),
    )


def python_lines_of_run(
    records: Sequence[Any], requests: Mapping[int, int] | None = None
) -> list[PythonLines]:
    """Every process's traced lines in a run's records (InsideSample among any others), by pid."""
    by_pid: dict[int, list[InsideSample]] = {}
    for rec in records:
        if isinstance(rec, InsideSample):
            by_pid.setdefault(rec.pid, []).append(rec)
    out = [python_lines(recs, requests) for _pid, recs in sorted(by_pid.items())]
    return [p for p in out if p is not None]
