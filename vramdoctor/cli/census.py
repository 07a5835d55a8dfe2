"""`vramdoctor census`: one look at every GPU and every process on it, with flags."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import typer

from vramdoctor.census.analysis import Census, census
from vramdoctor.census.collect import reanalyse, record, take_leftovers, take_sample
from vramdoctor.census.report import render
from vramdoctor.cli import app
from vramdoctor.cli._options import GPU_HELP, parse_gpu_indices
from vramdoctor.errors import ExitCode, InputError
from vramdoctor.record import Run
from vramdoctor.render import console
from vramdoctor.render.files import ReportMeta, write_report
from vramdoctor.samples import CONTEXT_MIB, GpuSample


def _parse_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.replace(":", "-").split("-", 1))
    except ValueError:
        raise InputError(
            f"--context-mib wants LOW-HIGH in MiB (e.g. 300-700), not {text!r}"
        ) from None
    if not 0 <= lo < hi:
        raise InputError(f"--context-mib: LOW must be below HIGH, got {text!r}")
    return lo, hi


def _report_suffix(report_file: Path) -> str:
    suffix = report_file.suffix.lower()
    if suffix not in (".html", ".htm", ".txt"):
        raise InputError(
            f"census writes --report as .html or .txt, not {suffix or 'a file without suffix'}"
        )
    return suffix


def _emit(
    result: Census, *, json_out: bool, report_file: Path | None, run_file: Path | None = None
) -> int:
    suffix = None if report_file is None else _report_suffix(report_file)  # refuse before printing
    if json_out:
        console.print_json(result.to_dict())
    else:
        render(result, console.stdout())
    if report_file is not None:
        rec = console.make_console(
            record=True,
            width=140,  # redacted and escaped like the terminal
            color_system=None if suffix == ".txt" else "truecolor",
            file=io.StringIO(),
        )
        meta = ReportMeta("census", run_file=str(run_file) if run_file else None)
        rec.print(meta.line(), markup=False, style="dim")
        render(result, rec)
        write_report(report_file, rec.export_text() if suffix == ".txt" else rec.export_html())
    return int(ExitCode.PROBLEM if result.problem else ExitCode.OK)


def _check_choices(
    report_file: Path | None, *, only_leftovers: bool, no_leftovers: bool, exporters: list[str]
) -> None:
    """Refuses (InputError) a report file census cannot write and --only-leftovers with an
    option it does not go with, before anything is measured; returns nothing."""
    if report_file is not None:
        _report_suffix(report_file)  # refuse before measuring, not after printing
    if only_leftovers and (no_leftovers or exporters):
        raise InputError(
            "--only-leftovers looks at this host: it goes with neither --no-leftovers nor --gpu-metrics"
        )


def _take_wanted(
    exporters: list[str], wanted: list[int] | None, *, need_gpu: bool
) -> tuple[GpuSample, dict[int, int], list[dict[str, Any]]]:
    """Returns one GPU sample (with its server groups and devices) of the GPUs asked for only:
    NVML filters them itself, the exporters' readings are filtered here."""
    sample, groups, devices = take_sample(exporters, wanted, need_gpu=need_gpu)
    if wanted is not None and exporters:  # NVML filtered already; exporters report all
        sample.gpus = [g for g in sample.gpus if g.index in wanted]
        sample.processes = [p for p in sample.processes if p.gpu in wanted]
        devices = [d for d in devices if d["index"] in wanted]
    return sample, groups, devices


def _take_census(
    exporters: list[str],
    wanted: list[int] | None,
    *,
    context_mib: tuple[float, float],
    shm_dir: str,
    no_leftovers: bool,
    only_leftovers: bool,
    out: Path | None,
) -> Census:
    """Returns the census of one GPU sample (and of what crashes left on this host), recorded
    as a run file when `out` is given."""
    sample, groups, devices = _take_wanted(exporters, wanted, need_gpu=not only_leftovers)
    # Leftovers are this host's: not looked for when the GPUs are another host's (exporters).
    leftovers = None if no_leftovers or exporters else take_leftovers(shm_dir, sample)
    result = census(sample, groups=groups, context_mib=context_mib, leftovers=leftovers)
    if out is not None:
        record(
            out,
            sample,
            result,
            devices=devices,
            groups=groups,
            exporters=exporters,
            shm_dir=shm_dir,
            context_mib=context_mib,
        )
    return result


@app.command("census")
def census_cmd(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    gpu_exporter: list[str] = typer.Option(
        [],
        "--gpu-metrics",
        "--gpu-exporter",
        metavar="URL",
        help="Read GPUs from dcgm-exporter or nvitop-exporter on another host instead of NVML here "
        "(repeat for several hosts).",
    ),
    gpu: list[str] = typer.Option([], "--gpu", metavar="N", help=GPU_HELP),
    gpus_alias: str | None = typer.Option(
        None, "--gpus", hidden=True, help="Old spelling of --gpu."
    ),
    context_mib: str = typer.Option(
        f"{CONTEXT_MIB[0]:g}-{CONTEXT_MIB[1]:g}",
        "--context-mib",
        metavar="LOW-HIGH",
        help="What counts as a context-sized footprint, in MiB.",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Also record the census as a run file (JSON lines)."
    ),
    report_file: Path | None = typer.Option(
        None, "--report", help="Also write the report to FILE.html or FILE.txt."
    ),
    shm_dir: str = typer.Option(
        "/dev/shm",
        "--shm-dir",
        metavar="DIR",
        help="Where to look for what crashed servers left (shared memory, semaphores).",
    ),
    no_leftovers: bool = typer.Option(
        False, "--no-leftovers", help="Do not look for what crashes left on this host."
    ),
    only_leftovers: bool = typer.Option(
        False,
        "--only-leftovers",
        help="Only look for what crashes left on this host (no GPU source needed).",
    ),
) -> None:
    """Every GPU and every process on it, grouped by process; flags stray CUDA contexts.

    Flags a process holding memory on more than one GPU, a context-sized footprint (300-700 MiB) on a GPU other than its main one (a TP rank's CUDA IPC context on the producer's GPU), and a server's small helper process on a GPU its model does not use (SGLang's tokenizer running the fast image processor on GPU 0).

    On this host it also lists what crashed servers left behind: /dev/shm segments and semaphores of the servers' and their runtimes' families (SGLang, vLLM, NCCL, loky, Python, torch) with size, creator and whether anyone still holds them, and GPU memory held by a server's workers whose server is gone. The clean-up command is printed, never run.

    Exit code: 0 nothing flagged, 1 a problem flagged (an orphan included), 2 no GPU source or bad input.

    Examples:

      vramdoctor census

      vramdoctor census --json | jq -e '.flags'

      vramdoctor census --gpu-metrics http://gpu-host:9400/metrics

      vramdoctor census --only-leftovers

      vramdoctor census --out runs/census.jsonl && vramdoctor report runs/census.jsonl
    """
    lo_hi = _parse_range(context_mib)
    wanted = parse_gpu_indices([*gpu, *([gpus_alias] if gpus_alias else [])])
    _check_choices(
        report_file,
        only_leftovers=only_leftovers,
        no_leftovers=no_leftovers,
        exporters=gpu_exporter,
    )
    result = _take_census(
        gpu_exporter,
        wanted,
        context_mib=lo_hi,
        shm_dir=shm_dir,
        no_leftovers=no_leftovers,
        only_leftovers=only_leftovers,
        out=out,
    )
    raise typer.Exit(_emit(result, json_out=json_out, report_file=report_file, run_file=out))


def report_run(run: Run, *, json_out: bool, report_file: Path | None) -> int:
    """Re-analyse a recorded census run (the analysis is pure; groups come from the header)."""
    return _emit(reanalyse(run), json_out=json_out, report_file=report_file, run_file=run.path)
