"""`vramdoctor report RUN.jsonl`: analyse a recorded run again, offline.

The analysis is pure over the run file, so a run recorded on a GPU host can be re-analysed
anywhere. Each measuring command provides `report_run(run, json_out=..., report_file=...)`
in its CLI module; this command only reads the file and dispatches on the header's command.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import typer

from vramdoctor.cli import app
from vramdoctor.errors import InputError
from vramdoctor.record import interrupts_held, read_run

# header "command" -> module providing report_run(run, *, json_out, report_file) -> int
_RENDERERS = {
    "soak": "vramdoctor.soak.report",
    "census": "vramdoctor.cli.census",
    "ab-test": "vramdoctor.cli.abtest",
    "watch": "vramdoctor.cli.watch",
}


@app.command("report")
def report_cmd(
    run_file: Path = typer.Argument(..., help="A run file written by soak, census or ab-test."),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object instead of the report."
    ),
    report_file: Path | None = typer.Option(
        None,
        "--report",
        help="Also write the report as FILE.html or FILE.png (where the command has charts).",
    ),
    production_rate: float | None = typer.Option(
        None,
        "--production-rate",
        metavar="REQ_PER_S",
        help="soak runs: the request rate production sees; time to out of memory is then also given in hours.",
    ),
) -> None:
    """Re-analyse a recorded run offline and print its report.

    Examples:

      vramdoctor report runs/soak-20261130-0812.jsonl

      vramdoctor report run.jsonl --json | jq .verdict

      vramdoctor report run.jsonl --report leak.html

      vramdoctor report run.jsonl --production-rate 2.5
    """
    run = read_run(run_file)
    module_name = _RENDERERS.get(run.command)
    if module_name is None:
        raise InputError(f"{run_file}: no report for runs of command {run.command!r}")
    extra: dict[str, float] = {}
    if production_rate is not None:
        if run.command != "soak":
            raise InputError("--production-rate applies to soak runs only")
        if not (production_rate > 0 and production_rate < float("inf")):
            raise InputError("--production-rate must be a positive number of requests per second")
        extra["production_rate_rps"] = production_rate
    # held: a Ctrl-C inside numpy's C import makes it print a traceback and fail with ImportError;
    # held, it is raised once the import is done (one line, exit 130)
    with interrupts_held():
        module = importlib.import_module(module_name)
    code = module.report_run(run, json_out=json_out, report_file=report_file, **extra)
    raise typer.Exit(code)
