"""`vramdoctor attribute SNAP1.pickle SNAP2.pickle ...`: diff allocator snapshots you already have.

The files are one process's `torch.cuda.memory._snapshot()` pickles (from
`torch.cuda.memory._dump_snapshot`, SGLang's `/stop_profile`, or vramdoctor's agent) in time
order, ideally taken at idle after identical rounds of traffic. Exit 1 when a stack grows in
every interval, 0 when none does, 2 on bad input.
"""

from __future__ import annotations

from pathlib import Path

import typer

from vramdoctor.attribution.analysis import Thresholds
from vramdoctor.attribution.report import render_attribution
from vramdoctor.attribution.snapshots import attribute_files
from vramdoctor.cli import app
from vramdoctor.errors import ExitCode, InputError
from vramdoctor.render import console
from vramdoctor.units import MIB


@app.command("attribute")
def attribute_cmd(
    snapshots: list[Path] = typer.Argument(
        ..., help="Two or more snapshot pickles of one process, oldest first."
    ),
    requests_n: list[int] | None = typer.Option(
        None,
        "--requests",
        help="Requests served between snapshots: once for all intervals, or once per interval.",
    ),
    min_growth_mib: float = typer.Option(
        1.0, "--min-growth-mib", help="Smallest total growth (MiB) of a stack that counts."
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object (schema vramdoctor.attribution/1)."
    ),
) -> None:
    """Name the allocation stack whose live GPU memory grows between snapshots.

    Examples:

      vramdoctor attribute round1.pickle round2.pickle round3.pickle --requests 50

      vramdoctor attribute /tmp/prof/*-TP-0-memory.pickle --json | jq '.processes[0].growing'
    """
    if len(snapshots) < 2:
        raise InputError(
            "give at least two snapshot files (three or more tell a leak from a cache that fills once)"
        )
    if any(n < 0 for n in requests_n or []):
        raise InputError("--requests must not be negative")
    if min_growth_mib < 0:
        raise InputError("--min-growth-mib must not be negative")
    report = attribute_files(
        snapshots,
        requests=requests_n or None,
        th=Thresholds(min_total_growth_bytes=int(min_growth_mib * MIB)),
    )
    if json_out:
        console.print_json(report.to_dict())
    else:
        render_attribution(report, console.stdout(), gap=False)
    raise typer.Exit(int(ExitCode.PROBLEM) if report.growing else int(ExitCode.OK))
