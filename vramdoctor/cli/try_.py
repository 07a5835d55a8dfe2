"""`vramdoctor try watch|fleet`: see watch or fleet work in a minute, no GPU, no production."""

from __future__ import annotations

from pathlib import Path

import typer

from vramdoctor.cli import app
from vramdoctor.errors import InputError
from vramdoctor.render import console
from vramdoctor.units import format_duration


@app.command("try")
def try_cmd(
    what: str = typer.Argument(..., metavar="watch|fleet", help="The command to try."),
    healthy: bool = typer.Option(
        False, "--healthy", help="watch: the reference server's caching twin (keeps nothing)."
    ),
    duration: float = typer.Option(
        45.0, "--duration", metavar="SECONDS", help="watch: how long watch runs.", min=10, max=3600
    ),
    keep: bool = typer.Option(
        False, "--keep", help="fleet: keep Prometheus running after fleet, until Ctrl-C."
    ),
    days: float = typer.Option(
        3.0, "--days", help="fleet: days of history to generate.", min=1, max=30
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Give the command --json: its result as one JSON object."
    ),
    run_dir: Path | None = typer.Option(
        None, "--dir", metavar="DIR", help="Keep the trial's files here (default: removed)."
    ),
) -> None:
    """Try watch or fleet on this machine in about a minute: no GPU, no production needed.

    watch: the reference server (examples/reference_server, on the CPU) keeping 1 MiB per
    request, real traffic in bursts, and watch with short settings; it ends with LEAK at about
    1.0 MiB per served request (exit 1), or no leak with --healthy (exit 0). fleet: three days
    of exporter history with known leaks backfilled into a local Prometheus (needs prometheus
    and promtool: apt-get install prometheus), then fleet over it (exit 1: leaks found). Each
    prints the exact command it runs. Runs from a clone of the source tree.

    Examples:

      vramdoctor try watch
      vramdoctor try watch --healthy
      vramdoctor try fleet
      vramdoctor try fleet --keep --dir /tmp/fleet-trial
    """
    from vramdoctor import trial

    if what == "watch":
        spec = trial.WatchTrial(healthy=healthy, duration_s=duration, json_out=json_out)
        console.note(f"try watch takes about {format_duration(duration + 5)}.")
        raise typer.Exit(trial.watch_trial(spec, say=console.note, run_dir=run_dir))
    if what == "fleet":
        spec_f = trial.FleetTrial(days=days, keep=keep, json_out=json_out)
        raise typer.Exit(trial.fleet_trial(spec_f, say=console.note, run_dir=run_dir))
    raise InputError(f"try {what!r}: give watch or fleet (vramdoctor try watch)")
