"""Render an ab-test analysis: a terminal table, a PNG chart, or one JSON object."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.text import Text

from vramdoctor._optional import require
from vramdoctor.abtest.analysis import above_context_mib
from vramdoctor.render import console
from vramdoctor.render.files import write_report
from vramdoctor.render.table import Table
from vramdoctor.units import format_count, format_mib


def _f(value: Any, fmt: str = "{:.0f}", dash: str = "-") -> str:
    if value is None:
        return dash
    return fmt.format(value)


def _escaped(mib: float) -> str:
    if not mib:
        return "0"
    return f"{mib * 1024:.0f} KiB" if mib < 1 else f"{mib:.0f}"


def _levels(rounds: list[dict[str, Any]], key: str) -> str:
    return ", ".join(_f(r.get(key)) for r in rounds) or "-"


def variants_table(result: dict[str, Any]) -> Table:
    table = Table(
        title="Image-processor memory per variant (MiB; NVML is above the process's CUDA context)"
    )
    # (header, justify, priority): when narrow, the highest priority is left out first (and
    # named under the table); the variant, its growth, its cost and its verdict always show.
    for col, justify, priority in (
        ("variant", "left", 0),
        ("PyTorch reserved per round", "right", 2),
        ("NVML per round", "right", 3),
        ("growth/round", "right", 0),
        ("held after idle", "right", 1),
        ("escaped", "right", 1),
        ("p50 ms", "right", 0),
        ("p99 ms", "right", 2),
        ("vs baseline", "right", 0),
        ("verdict", "left", 0),
    ):
        table.add_column(col, justify=justify, priority=priority)  # type: ignore[arg-type]
    for v in result["variants"]:
        verdict = (
            v["verdict"] if v["status"] == "ok" else f"{v['status']}: {v.get('message') or ''}"
        )
        style = {"grows": "red", "bounded": "green"}.get(v["verdict"], "yellow")
        table.add_row(
            v["variant"],
            _levels(v["rounds"], "torch_reserved_mib"),
            _levels(v["rounds"], "nvml_above_context_mib"),
            _f(v["growth_per_round_mib"], "{:+.1f}"),
            _f(v["held_after_idle_mib"]),
            _escaped(v["escaped_mib"]),
            _f(v["p50_ms"], "{:.2f}"),
            _f(v["p99_ms"], "{:.2f}"),
            _f(v["overhead_pct"], "{:+.1f}%"),
            Text(verdict, style=style),
        )
    return table


def ipc_table(result: dict[str, Any]) -> Table | None:
    rows = result.get("ipc") or []
    if not rows:
        return None
    table = Table(
        title="CUDA IPC: consumers on other GPUs (NVML census while they hold the shared memory)"
    )
    for col in (
        "mode",
        "producer GPU",
        "consumer GPU",
        "peer access",
        "redirect applied",
        "consumer MiB on producer GPU",
        "consumer MiB on own GPU",
        "data correct",
    ):
        table.add_column(col)  # every column counts: narrow terminals get stacked rows
    for arm in rows:
        if arm.get("error") and not arm["consumers"]:
            table.add_row(
                arm["mode"],
                str(arm["producer_gpu"]),
                "-",
                "-",
                "-",
                "-",
                "-",
                f"error: {arm['error']}",
            )
            continue
        for c in arm["consumers"]:
            data = "yes" if c["correct"] else "NO"
            if c.get("error"):
                data = f"error: {c['error']}"
            table.add_row(
                arm["mode"],
                str(arm["producer_gpu"]),
                str(c["gpu"]),
                str(c["peer_access"]),
                str(c["redirect_applied"]),
                _f(c["on_producer_gpu_mib"]),
                _f(c["on_own_gpu_mib"]),
                data,
            )
    return table


def ipc_extra_line(arm: dict[str, Any]) -> str | None:
    """One arm's extra memory on the producer's GPU: per consumer, in all, and in CUDA contexts."""
    per = arm.get("extra_on_producer_gpu_per_consumer_mib")
    if per is None:
        return None
    rows = [c for c in arm["consumers"] if c.get("on_producer_gpu_mib") is not None]
    each = ", ".join(format_mib(c["on_producer_gpu_mib"], 0) for c in rows)
    total = arm.get("extra_on_producer_gpu_total_mib")
    line = (
        f"{arm['mode']}: {format_mib(per, 0)} extra on producer GPU {arm['producer_gpu']} per consumer "
        f"({each}), {format_mib(total, 0)} in all over {format_count(len(rows), 'consumer(s)')}"
    )
    if arm.get("extra_on_producer_gpu_contexts") is not None:
        line += (
            f" = {arm['extra_on_producer_gpu_contexts']:.1f} x a consumer's own CUDA context "
            f"({format_mib(arm['consumer_context_mib'], 0)})"
        )
    return line


def render(result: dict[str, Any], header: dict[str, Any] | None = None) -> None:
    out = console.stdout()
    if header:
        _print_setup(out, header)
    out.print(variants_table(result))
    _print_memory_basis(out, result)
    noise = result.get("latency_noise_pct")
    if noise is not None:
        out.print(
            f"Latency drift in this run: the baseline's p50 moved {noise:.1f}% between the first and the last "
            "process; overheads smaller than that are not measured differences "
            "(benchmarks/fixes_scope_overhead.py compares ways side by side in one process).",
            markup=False,
        )
    rec = result["recommendation"]
    if rec.get("variant"):
        out.print(
            f"Recommended for this model on this GPU: [bold]{rec['variant']}[/bold] ({rec['title']}): {rec['reason']}"
        )
    else:
        out.print(f"No recommendation: {rec['reason']}", markup=False)
    _print_targets(out, result)
    table = ipc_table(result)
    if table is not None:
        out.print(table)
        for arm in result["ipc"]:
            _print_ipc_arm(out, arm)
    for note in result.get("ipc_notes", []):
        out.print(f"  {note}", markup=False)


def _print_setup(out: console.SafeConsole, header: dict[str, Any]) -> None:
    """Prints the run's workload, model note and GPU from its header; returns nothing."""
    cfg = header.get("config", {})
    if cfg.get("workload_text"):
        out.print(f"Workload: {cfg['workload_text']}", markup=False)
    if cfg.get("model_note"):
        out.print(f"Model: {cfg['model_note']}", markup=False)
    gpus = header.get("gpus") or []
    if gpus:
        g = gpus[int(cfg.get("gpu", 0))] if int(cfg.get("gpu", 0)) < len(gpus) else gpus[0]
        out.print(
            f"GPU: {g.get('name')} ({len(gpus)} visible), driver {g.get('driver')}",
            markup=False,
        )


def _print_memory_basis(out: console.SafeConsole, result: dict[str, Any]) -> None:
    """Prints which variants fell back to PyTorch's reserved memory and the CUDA context the
    'NVML' columns are above; returns nothing."""
    ctx = [v for v in result["variants"] if v.get("context_mib")]
    fallback = [
        v["variant"]
        for v in result["variants"]
        if v.get("memory_basis") == "pytorch-reserved" and v["requests"]
    ]
    if fallback:
        out.print(
            f"NVML could not attribute memory to the worker process ({', '.join(fallback)}: another PID "
            "namespace?); those rows use PyTorch reserved memory, which leaves out the CUDA context.",
            markup=False,
        )
    if ctx:
        bare = ctx[0].get("bare_context_mib")
        out.print(
            f"CUDA context: {format_mib(ctx[0]['context_mib'], 0)} after a warm-up request with caches emptied "
            f"(kernels loaded; {format_mib(bare, 0)} before any kernel ran). 'NVML' columns are above it."
            if bare
            else f"CUDA context: {format_mib(ctx[0]['context_mib'], 0)}.",
            markup=False,
        )


def _print_targets(out: console.SafeConsole, result: dict[str, Any]) -> None:
    """Prints each target met or missed and whether it decides the exit code; returns
    nothing."""
    from vramdoctor.abtest.model_run import EXIT_TARGETS

    for key, ok in result.get("targets", {}).items():
        decides = "decides the exit code" if key in EXIT_TARGETS else "reported only"
        out.print(
            f"  target {key.replace('_', ' ')}: {'met' if ok else 'MISSED'} ({decides})",
            markup=False,
        )


def _print_ipc_arm(out: console.SafeConsole, arm: dict[str, Any]) -> None:
    """Prints one IPC mode's lines under the IPC table (extra memory, data read back, error,
    census per GPU, the same-GPU round trip); returns nothing."""
    extra = ipc_extra_line(arm)
    if extra is not None:
        good = sum(1 for c in arm["consumers"] if c["correct"])
        out.print(f"  {extra}", markup=False)
        out.print(
            f"  {arm['mode']}: data read back {'correct' if arm['all_correct'] else 'WRONG'} on {good} "
            f"of {format_count(len(arm['consumers']), 'consumer(s)')}",
            markup=False,
        )
    if arm.get("error") and arm["consumers"]:
        out.print(f"  {arm['mode']}: error: {arm['error']}", markup=False)
    for g in arm.get("census", []):
        procs = (
            ", ".join(
                f"{p['role']} {p['pid']} {format_mib(p['used_mib'], 0)}" for p in g["processes"]
            )
            or "no process"
        )
        out.print(
            f"    census GPU {g['gpu']}: {format_mib(g['used_mib'], 0)} used; {procs}",
            markup=False,
        )
    if arm.get("mode") == "same-gpu" and not arm.get("error"):
        out.print(
            f"  same-GPU round trip: data read back {'correct' if arm['all_correct'] else 'WRONG'}",
            markup=False,
        )


def write_chart(
    result: dict[str, Any], requests: dict[str, list[dict[str, Any]]], path: Path
) -> Path:
    """PNG: memory above the CUDA context after every request, and p50 latency per variant.

    Needs matplotlib (the `charts` extra): raises MissingExtra without it."""
    matplotlib = require("matplotlib", what="the ab-test chart (--report)", extra="charts")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_mem, ax_lat) = plt.subplots(
        1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2.2, 1]}
    )
    by = {v["variant"]: v for v in result["variants"]}
    for name, recs in requests.items():
        v = by.get(name, {})
        context = float(v.get("context_mib") or 0.0) if v.get("memory_basis") == "nvml" else None
        ys = [above_context_mib(r, context) for r in recs]
        ax_mem.plot(range(1, len(ys) + 1), ys, label=name, linewidth=1.4)
    ax_mem.set_yscale("symlog", linthresh=16)
    ax_mem.set_xlabel("request")
    ax_mem.set_ylabel("MiB above the CUDA context (NVML)")
    ax_mem.set_title("GPU memory after each request")
    ax_mem.legend(fontsize=8)
    ax_mem.grid(alpha=0.3)
    names = [v["variant"] for v in result["variants"] if v["p50_ms"] is not None]
    p50 = [v["p50_ms"] for v in result["variants"] if v["p50_ms"] is not None]
    ax_lat.barh(names, p50, color="#4c72b0")
    ax_lat.invert_yaxis()
    ax_lat.set_xlabel("p50 ms per request")
    ax_lat.set_title("Latency")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return write_report(path, png.getvalue())  # a temp file + rename: never through a link
