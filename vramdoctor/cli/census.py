"""`vramdoctor census`: one look at every GPU and every process on it, with flags."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import typer

from vramdoctor.census.analysis import CONTEXT_MIB, Census, census
from vramdoctor.census.report import render
from vramdoctor.cli import app
from vramdoctor.cli._options import GPU_HELP, parse_gpu_indices
from vramdoctor.errors import ExitCode, InputError
from vramdoctor.record import Run, RunWriter, make_header
from vramdoctor.render import console
from vramdoctor.render.files import ReportMeta, write_report
from vramdoctor.samples import GpuSample, now
from vramdoctor.sources.leftovers import Leftovers


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


def take_sample(
    exporters: list[str], gpus: list[int] | None, *, need_gpu: bool = True
) -> tuple[GpuSample, dict[int, int], list[dict[str, Any]]]:
    """One GPU sample from NVML here or from the exporters, plus server groups where visible.

    `need_gpu=False` (census --only-leftovers): an empty sample (source "none") without
    touching NVML."""
    if not need_gpu:
        t, wall = now()
        return GpuSample(t=t, wall=wall, source="none"), {}, []
    if exporters:
        from vramdoctor.sources.exporter import ExporterSource

        with ExporterSource(exporters) as src:
            sample = src.sample()
        devices = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "total_mib": g.total_mib,
                "host": g.host,
            }
            for g in sample.gpus
        ]
        return sample, {}, devices
    from vramdoctor.sources.nvml import NvmlSource
    from vramdoctor.sources.procinfo import server_groups

    with NvmlSource(gpus) as src:
        sample = src.sample()
        devices = src.devices()
    groups = server_groups(sorted({p.pid for p in sample.processes if p.visible}))
    return sample, groups, devices


def take_leftovers(shm_dir: str, sample: GpuSample) -> Leftovers:
    """What crashes left on this host (the GPU sample's processes for orphaned GPU memory)."""
    from vramdoctor.sources.leftovers import scan

    return scan(shm_dir, gpu_sample=sample if sample.source == "nvml" else None)


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

      vramdoctor census --json | jq '.flags'

      vramdoctor census --gpu-metrics http://gpu-host:9400/metrics

      vramdoctor census --only-leftovers

      vramdoctor census --out runs/census.jsonl && vramdoctor report runs/census.jsonl
    """
    lo_hi = _parse_range(context_mib)
    wanted = parse_gpu_indices([*gpu, *([gpus_alias] if gpus_alias else [])])
    if report_file is not None:
        _report_suffix(report_file)  # refuse before measuring, not after printing
    if only_leftovers and (no_leftovers or gpu_exporter):
        raise InputError(
            "--only-leftovers looks at this host: it goes with neither --no-leftovers nor --gpu-metrics"
        )
    sample, groups, devices = take_sample(gpu_exporter, wanted, need_gpu=not only_leftovers)
    if wanted is not None and gpu_exporter:  # NVML filtered already; exporters report all
        sample.gpus = [g for g in sample.gpus if g.index in wanted]
        sample.processes = [p for p in sample.processes if p.gpu in wanted]
        devices = [d for d in devices if d["index"] in wanted]
    # Leftovers are this host's: not looked for when the GPUs are another host's (exporters).
    leftovers = None if no_leftovers or gpu_exporter else take_leftovers(shm_dir, sample)
    result = census(sample, groups=groups, context_mib=lo_hi, leftovers=leftovers)
    if out is not None:
        header = make_header(
            "census",
            target=", ".join(gpu_exporter) or None,
            gpus=devices,
            config={
                "context_mib": list(lo_hi),
                "groups": {str(k): v for k, v in groups.items()},
                "source": sample.source,
                **({"shm_dir": shm_dir} if leftovers is not None else {}),
            },
        )
        with RunWriter(out, header) as writer:
            writer.write(sample)
            writer.write({"kind": "result", "census": result.to_dict()})
    raise typer.Exit(_emit(result, json_out=json_out, report_file=report_file, run_file=out))


def report_run(run: Run, *, json_out: bool, report_file: Path | None) -> int:
    """Re-analyse a recorded census run (the analysis is pure; groups come from the header)."""
    samples = run.of(GpuSample)
    if not samples:
        raise InputError(f"{run.path}: the census run holds no GPU sample ({run.status})")
    config = run.header.get("config") or {}
    try:
        lo_hi = tuple(float(x) for x in config.get("context_mib", CONTEXT_MIB))
        groups = {int(k): int(v) for k, v in (config.get("groups") or {}).items()}
    except (TypeError, ValueError):
        raise InputError(f"{run.path}: damaged census settings in the header") from None
    leftovers = _recorded_leftovers(run)
    result = census(
        samples[-1], groups=groups, context_mib=(lo_hi[0], lo_hi[1]), leftovers=leftovers
    )
    return _emit(result, json_out=json_out, report_file=report_file, run_file=run.path)


def _recorded_leftovers(run: Run) -> Leftovers | None:
    """The leftovers a census run recorded (its result record), None when it looked at none."""
    for rec in run.raw("result"):
        data = (rec.get("census") or {}).get("leftovers")
        if isinstance(data, dict):
            try:
                return Leftovers.from_dict(data)
            except (TypeError, ValueError, KeyError):
                raise InputError(f"{run.path}: damaged leftovers in the census result") from None
    return None
