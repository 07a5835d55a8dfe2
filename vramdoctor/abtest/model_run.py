"""`ab-test --model MODEL`, run and reported: one worker process per variant, records streamed.

`run_abtest` runs every variant (`vramdoctor.abtest.runner`) and the IPC arm, appending each
record to the run file as it comes; `report_run` analyses a recorded run (`analysis.analyse`)
and prints its table or `--json` (schema `vramdoctor.abtest/1`); `gpus()` lists this host's
GPUs or says, in one line, why there are none.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from vramdoctor.errors import ExitCode, InputError, SourceUnavailable, VramdoctorError
from vramdoctor.record import Run, RunWriter
from vramdoctor.render import console
from vramdoctor.units import format_duration

__all__ = ["EXIT_TARGETS", "SCHEMA", "gpus", "records", "report_run", "run_abtest"]

# The JSON of an ab-test (`vramdoctor ab-test --json`, `vramdoctor report AB.jsonl --json`).
SCHEMA = "vramdoctor.abtest/1"
# The targets whose miss makes the exit code 1 (memory); the others (latency) are reported only.
EXIT_TARGETS = ("scoped_pool_within_8mib_of_context", "scoped_pool_bounded")


def records(run: Run) -> list[dict[str, Any]]:
    """The ab-test records of a run file (kinds "abtest.*"), as written."""
    return [
        r
        for r in run.records
        if isinstance(r, dict) and str(r.get("kind", "")).startswith("abtest.")
    ]


def report_run(run: Run, *, json_out: bool, report_file: Path | None) -> int:
    """Analyse an ab-test run file and print it (table or JSON); exit 1 when a variant failed
    or the scoped pool missed a memory target (`EXIT_TARGETS`) on this GPU; the latency target
    is reported, and does not decide the exit code."""
    from vramdoctor.abtest import report as render
    from vramdoctor.abtest.analysis import analyse

    if report_file is not None and report_file.suffix.lower() not in (".png", ".svg"):
        raise InputError(f"--report {report_file}: ab-test writes its chart as .png or .svg")
    found = records(run)
    result = analyse(found)
    if report_file is not None:
        requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in found:
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
    pool_ok = all(targets.get(k, True) for k in EXIT_TARGETS)
    return int(ExitCode.PROBLEM) if result["problem"] or not pool_ok else int(ExitCode.OK)


def gpus() -> list[dict[str, Any]]:
    """This host's GPUs (NVML); SourceUnavailable naming the missing driver or GPU."""
    try:
        from vramdoctor.sources.nvml import NvmlSource

        with NvmlSource() as source:
            return source.devices()
    except SourceUnavailable as exc:
        reason = str(exc).split(";")[0]
        raise SourceUnavailable(
            f"vramdoctor ab-test needs a CUDA GPU and its NVIDIA driver: {reason}"
        ) from None


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
