"""`vramdoctor ab-test --model MODEL`: measure the memory mitigations live on this GPU."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import typer

from vramdoctor.cli import app
from vramdoctor.errors import ExitCode, InputError, MissingExtra, SourceUnavailable, VramdoctorError
from vramdoctor.record import Run, RunWriter, make_header, read_run
from vramdoctor.render import console
from vramdoctor.units import format_duration

# The JSON of an ab-test (`vramdoctor ab-test --json`, `vramdoctor report AB.jsonl --json`).
SCHEMA = "vramdoctor.abtest/1"


def _records(run: Run) -> list[dict[str, Any]]:
    return [
        r
        for r in run.records
        if isinstance(r, dict) and str(r.get("kind", "")).startswith("abtest.")
    ]


def report_run(run: Run, *, json_out: bool, report_file: Path | None) -> int:
    """Analyse an ab-test run file and print it (table or JSON); exit 1 when a variant failed
    or the scoped pool missed its memory targets on this GPU."""
    from vramdoctor.abtest import report as render
    from vramdoctor.abtest.analysis import analyse

    if report_file is not None and report_file.suffix.lower() not in (".png", ".svg"):
        raise InputError(f"--report {report_file}: ab-test writes its chart as .png or .svg")
    records = _records(run)
    result = analyse(records)
    if report_file is not None:
        requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in records:
            if r["kind"] == "abtest.request":
                requests[r["variant"]].append(r)
        try:
            render.write_chart(result, requests, report_file)
        except OSError as exc:
            raise InputError(f"cannot write chart {report_file}: {exc.strerror or exc}") from None
    if json_out:
        out = {"schema": SCHEMA, **result}
        out["run"] = {
            "path": str(run.path),
            "status": run.status,
            "config": run.header.get("config", {}),
        }
        if report_file is not None:
            out["chart"] = str(report_file)
        console.print_json(out)
    else:
        render.render(result, run.header)
        if run.status != "complete":
            console.note(f"run status: {run.status} (partial results)")
        if report_file is not None:
            console.note(f"chart: {report_file}")
    targets = result.get("targets", {})
    pool_ok = all(
        targets.get(k, True) for k in ("scoped_pool_within_8mib_of_context", "scoped_pool_bounded")
    )
    return int(ExitCode.PROBLEM) if result["problem"] or not pool_ok else int(ExitCode.OK)


def _gpus() -> list[dict[str, Any]]:
    try:
        from vramdoctor.sources.nvml import NvmlSource

        with NvmlSource() as source:
            return source.devices()
    except SourceUnavailable as exc:
        reason = str(exc).split(";")[0]
        raise SourceUnavailable(
            f"vramdoctor ab-test needs a CUDA GPU and its NVIDIA driver: {reason}"
        ) from None


@app.command("ab-test")
def abtest_cmd(
    model: str = typer.Option(
        ...,
        "--model",
        "-m",
        help="Model id or local directory whose image processor to test (offline).",
    ),
    images: Path | None = typer.Option(
        None, "--images", help="Replay your own images from DIR instead of random ones."
    ),
    count: int = typer.Option(40, "--count", help="Requests (one image each) per round."),
    rounds: int = typer.Option(4, "--rounds", help="Rounds each variant replays."),
    min_side: int = typer.Option(
        256, "--min-side", help="Smallest image side (px) of random images."
    ),
    max_side: int = typer.Option(
        2048, "--max-side", help="Largest image side (px) of random images."
    ),
    distribution: str = typer.Option(
        "uniform", "--distribution", help="Side distribution: uniform, loguniform, fixed."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random workload."),
    same_images: bool = typer.Option(
        False,
        "--same-images",
        help="Replay the same images every round (default: new sizes each round).",
    ),
    variants: str | None = typer.Option(
        None, "--variants", help="Comma-separated subset (baseline always runs)."
    ),
    gpu: int = typer.Option(0, "--gpu", help="GPU index for the variants."),
    idle: float = typer.Option(
        3.0, "--idle", help="Seconds idle after the last round before 'held after idle'."
    ),
    ipc: bool = typer.Option(
        True,
        "--ipc/--no-ipc",
        help="Also A/B-test the CUDA IPC device redirect (needs 2 GPUs; 1 GPU: round trip only).",
    ),
    ipc_gpus: int | None = typer.Option(
        None,
        "--ipc-gpus",
        help="GPUs for the IPC arm: producer on GPU 0, one consumer on each other (default: every visible GPU).",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Results file (run-record JSONL). Default runs/ab-test-TIME.jsonl."
    ),
    report_file: Path | None = typer.Option(
        None,
        "--report",
        metavar="FILE",
        help="Also write the chart to FILE.png or FILE.svg (needs the charts extra).",
    ),
    chart: Path | None = typer.Option(
        None, "--chart", hidden=True, help="Old spelling of --report."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds allowed per variant."),
) -> None:
    """Measure each memory mitigation for MODEL's fast image processor on this GPU.

    Each variant runs in its own process: baseline, scoped pool (vramdoctor.fixes), empty_cache
    after each request, expandable_segments, CPU preprocessing, and a GPU output escaping the
    pool with and without vramdoctor's guard. Exit 1 when a variant failed or the scoped pool
    missed its targets.

    Examples:

      vramdoctor ab-test --model Qwen/Qwen2.5-VL-7B-Instruct

      vramdoctor ab-test --model /models/glm-4v --images ./samples --rounds 3 --report ab.png

      vramdoctor ab-test --model gemma3 --variants scoped_pool,cpu --no-ipc --json
    """
    from vramdoctor.abtest.models import resolve_model
    from vramdoctor.abtest.variants import select
    from vramdoctor.abtest.workload import WorkloadSpec, describe
    from vramdoctor.fixes._torch import torch_available

    spec = WorkloadSpec(
        count=count,
        rounds=rounds,
        min_side=min_side,
        max_side=max_side,
        distribution=distribution,
        seed=seed,
        new_sizes_each_round=not same_images,
        images_dir=str(images) if images is not None else None,
    ).validate()
    chosen = select([v.strip() for v in variants.split(",") if v.strip()] if variants else None)
    if ipc_gpus is not None and ipc_gpus < 1:
        raise InputError(
            f"--ipc-gpus {ipc_gpus}: give 1 or more GPUs (1: the same-GPU round trip only)"
        )
    chart = report_file or chart
    if chart is not None and chart.suffix.lower() not in (".png", ".svg"):
        raise InputError(f"--report {chart}: ab-test writes its chart as .png or .svg")
    choice = resolve_model(model)
    if not torch_available():
        raise MissingExtra("vramdoctor ab-test", "torch")
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise MissingExtra("vramdoctor ab-test", "transformers")
    devices = _gpus()
    if not 0 <= gpu < len(devices):
        raise VramdoctorError(f"--gpu {gpu}: this host has {len(devices)} GPU(s)")
    out = out or Path("runs") / f"ab-test-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    config = {
        "model": choice.to_dict(),
        "workload": spec.to_dict(),
        "gpu": gpu,
        "idle_s": idle,
    }
    header = make_header(
        "ab-test",
        gpus=devices,
        config={
            **config,
            "variants": [v.name for v in chosen],
            "ipc": ipc,
            "ipc_gpus": ipc_gpus,
            "workload_text": describe(spec),
            "model_note": choice.note,
        },
    )
    try:
        run_abtest(
            out,
            header,
            config,
            chosen,
            ipc=ipc,
            gpu_count=len(devices),
            timeout_s=timeout,
            ipc_gpus=ipc_gpus,
        )
    except KeyboardInterrupt:
        console.error("interrupted: partial results follow")
        report_run(read_run(out), json_out=json_out, report_file=chart)
        raise typer.Exit(130) from None
    code = report_run(read_run(out), json_out=json_out, report_file=chart)
    if not json_out:
        console.note(f"results: {out}  (again: vramdoctor report {out})")
    raise typer.Exit(code)


def run_abtest(
    out: Path,
    header: dict[str, Any],
    config: dict[str, Any],
    chosen: list[Any],
    *,
    ipc: bool,
    gpu_count: int,
    timeout_s: float,
    ipc_gpus: int | None = None,
) -> None:
    """Run every variant (and the IPC arm), appending each record to the run file as it comes."""
    from vramdoctor.abtest.ipc_arm import run_ipc_subprocess
    from vramdoctor.abtest.runner import run_variants

    console.note(f"model: {header['config']['model_note']}")
    started = time.monotonic()
    with RunWriter(out, header) as writer:
        outcomes = run_variants(
            chosen,
            config,
            writer.write,
            timeout_s=timeout_s,
            on_start=lambda v: console.note(
                f"[{time.monotonic() - started:5.0f}s] {v.name}: {v.title}"
            ),
        )
        first = outcomes[0] if outcomes else None
        if first is not None and first.usage_error:
            writer.close("failed", error="usage")
            raise VramdoctorError(first.message or "ab-test could not run")
        if ipc:
            n = gpu_count if ipc_gpus is None else min(gpu_count, ipc_gpus)
            console.note(
                f"[{time.monotonic() - started:5.0f}s] IPC arm (up to {n} of {gpu_count} GPU(s))"
            )
            run_ipc_subprocess(gpu_count, writer.write, max_gpus=ipc_gpus)
        writer.close("complete", elapsed_s=round(time.monotonic() - started, 1))
    console.note(f"ab-test took {format_duration(time.monotonic() - started)}")
