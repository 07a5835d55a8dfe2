"""The attribution in sentences: per process, the growing stack and where the growth went."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from vramdoctor.attribution.analysis import (
    GROWING,
    TOO_FEW_SNAPSHOTS,
    NvmlSplit,
    ProcessAttribution,
)
from vramdoctor.attribution.python_lines import PythonLines
from vramdoctor.attribution.snapshots import AttributionReport
from vramdoctor.render.wrap import Paragraph
from vramdoctor.units import format_bytes, format_percent

__all__ = [
    "render_attribution",
    "render_run_attribution",
    "run_attribution",
    "run_attribution_json",
]


def _size(n_bytes: float | None, *, signed: bool = False) -> str:
    """`format_bytes`, but nothing is "0 Bytes" beside MiB figures: zero is "0 MiB"."""
    if n_bytes == 0:
        return "0 MiB"
    return format_bytes(n_bytes, signed=signed)


def _line(out: Console, markup: str) -> None:
    """One sentence (rich markup; outside text escaped by the caller), wrapped between words
    with its indent kept on every line (`vramdoctor.render.wrap`), never cut."""
    out.print(Paragraph(Text.from_markup(markup)))


def _pinned_split_lines(split: NvmlSplit) -> list[str]:
    """The split of pinned host memory: what the host allocator holds is live or cached."""
    span = f"between snapshots {split.from_snapshot + 1} and {split.to_snapshot + 1}"
    rate = split.growth_per_request_bytes
    per = f" ({_size(rate, signed=True)} per request)" if rate is not None else ""
    return [
        f"pinned memory held by PyTorch's host allocator "
        f"{_size(split.reserved_growth_bytes, signed=True)}{per} {span}:",
        f"  live blocks of the growing stacks    {_size(split.growing_stacks_bytes, signed=True)}",
        f"  other live blocks                    {_size(split.other_live_bytes, signed=True)}",
        f"  cached free blocks                   {_size(split.slack_default_bytes, signed=True)}"
        "  (the host allocator keeps freed pinned memory for reuse)",
    ]


def _split_lines(split: NvmlSplit) -> list[str]:
    span = f"between snapshots {split.from_snapshot + 1} and {split.to_snapshot + 1}"
    whole = split.nvml_growth_bytes
    lines = []
    rate = split.growth_per_request_bytes
    per = f" ({_size(rate, signed=True)} per request)" if rate is not None else ""
    if whole is not None:
        lines.append(f"NVML growth {_size(whole, signed=True)}{per} {span}:")
    else:
        lines.append(
            f"PyTorch reserved growth {_size(split.reserved_growth_bytes, signed=True)}{per} {span} "
            "(no NVML figures: memory outside the allocator not measured):"
        )

    def share(n: float) -> str:
        base = whole if whole else split.reserved_growth_bytes
        return f" ({format_percent(n / base)})" if base and base > 0 else ""

    lines.append(
        f"  live tensors of the growing stacks   {_size(split.growing_stacks_bytes, signed=True)}"
        f"{share(split.growing_stacks_bytes)}"
    )
    lines.append(
        f"  other live tensors                   {_size(split.other_live_bytes, signed=True)}"
    )
    lines.append(
        f"  allocator slack, default pool        {_size(split.slack_default_bytes, signed=True)}"
    )
    lines.append(
        f"  allocator slack, private pools       {_size(split.slack_private_pool_bytes, signed=True)}"
        "  (dead request-scoped MemPools, CUDA graph pools)"
    )
    if split.outside_allocator_bytes is not None:
        lines.append(
            f"  outside the PyTorch allocator        {_size(split.outside_allocator_bytes, signed=True)}"
            "  (NVML growth - reserved growth: NCCL, CUDA graphs, extensions)"
        )
    return lines


def _process(p: ProcessAttribution, out: Console) -> None:
    if p.verdict == TOO_FEW_SNAPSHOTS:
        _line(out, f"{escape(p.label)}: {len(p.summaries)} snapshot: nothing to diff")
        return
    if p.verdict == GROWING:
        what = "pinned host memory" if p.memory == "pinned" else "memory"
        _line(out, f"[bold red]{escape(p.label)}: {what} held by a stack that grows every round[/]")
        for s in p.growing:
            rate = (
                f"{_size(s.bytes_per_request)} per request"
                if s.bytes_per_request is not None
                else f"{_size(s.growth_bytes, signed=True)} over {len(s.live_bytes) - 1} intervals"
            )
            _line(
                out,
                f"  {rate}, {_size(s.live_bytes[-1])} live in {s.blocks[-1]} blocks now; allocated at:",
            )
            for i, fr in enumerate(s.stack.frames):
                _line(out, f"    {'' if i == 0 else 'called from '}{escape(str(fr))}")
    else:
        reserved = [_size(s.reserved_bytes) for s in p.summaries]
        held = "pinned host memory held by PyTorch" if p.memory == "pinned" else "PyTorch reserved"
        _line(
            out,
            f"{escape(p.label)}: no growing stack ({held} at each snapshot: {', '.join(reserved)})",
        )
    if p.split is not None and (p.verdict == GROWING or (p.split.nvml_growth_bytes or 0) > 0):
        lines = _pinned_split_lines(p.split) if p.memory == "pinned" else _split_lines(p.split)
        for line in lines:
            _line(out, f"  {escape(line)}")
    for note in p.notes:
        _line(out, f"  note: {escape(note)}")


def _python_lines(p: PythonLines, out: Console) -> None:
    """One process's traced Python lines: those that grow every round, else the largest change."""
    if p.growing:
        _line(
            out,
            f"[bold red]{escape(p.label)}: Python allocations that grow every round "
            "(tracemalloc)[/]",
        )
        for s in p.growing[:5]:
            rate = (
                f"{_size(s.bytes_per_request)} per request"
                if s.bytes_per_request is not None
                else f"{_size(s.growth_bytes, signed=True)} in all"
            )
            now = s.bytes[-1]
            held = f", {_size(now)} held now" if now is not None else ""
            _line(out, f"  {rate}{held}, allocated at {escape(s.describe())}")
        return
    traced = [_size(t) if t is not None else "?" for t in p.traced_bytes]
    _line(
        out,
        f"{escape(p.label)}: no Python line grows every round (traced at each record: "
        f"{', '.join(traced)})",
    )


def render_attribution(report: AttributionReport, out: Console, *, gap: bool = True) -> None:
    """Print the attribution section (terminal or piped text); `gap`: a blank line first, to
    part it from the report above it (`vramdoctor attribute` prints it alone: no gap)."""
    if gap:
        out.print()
    if not report.processes and report.python:
        _line(out, "[bold]Attribution[/] (Python allocations by line, tracemalloc in the server)")
        for lines in report.python:
            _python_lines(lines, out)
        for note in report.notes:
            _line(out, f"  note: {escape(note)}")
        return
    _line(
        out, f"[bold]Attribution[/] (PyTorch allocator snapshots, source: {escape(report.source)})"
    )
    if report.covered:
        _line(out, f"  covers: {escape(', '.join(report.covered))}")
    if report.not_covered:
        _line(out, f"  not covered: {escape(', '.join(report.not_covered))}")
    if not report.processes:
        _line(out, "  no snapshots were collected")
    for p in report.processes:
        _process(p, out)
    for lines in report.python:
        _python_lines(lines, out)
    for note in report.notes:
        _line(out, f"  note: {escape(note)}")


def run_attribution(run: Any) -> AttributionReport | None:
    """The attribution of a recorded soak run (`record.Run`), when its folder of snapshots exists
    (`runs/soak-X.attribution/` beside `runs/soak-X.jsonl`); None otherwise."""
    from vramdoctor.attribution.snapshots import attribute_run, attribution_dir

    path = getattr(run, "path", None)
    if path is None:
        return None
    return attribute_run(run.records, attribution_dir(Path(path)))


def run_attribution_json(run: Any) -> dict[str, Any] | None:
    """`run_attribution(run)` as JSON (schema vramdoctor.attribution/1), or None."""
    report = run_attribution(run)
    return report.to_dict() if report is not None else None


def render_run_attribution(run: Any, out: Console) -> None:
    """Print the attribution section of a recorded soak run, if it has snapshots."""
    report = run_attribution(run)
    if report is not None:
        render_attribution(report, out)
