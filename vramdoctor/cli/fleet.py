"""`vramdoctor fleet`: a ranked table of leaking servers from the history Prometheus stores."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from vramdoctor.cli import app
from vramdoctor.cli.watch import parse_duration
from vramdoctor.errors import ExitCode, InputError
from vramdoctor.render import console


@app.command("fleet")
def fleet_cmd(
    prometheus: str = typer.Option(
        ..., "--prometheus", metavar="URL", help="Prometheus base URL, e.g. http://prometheus:9090."
    ),
    since: str = typer.Option("7d", "--since", help="How far back to read (e.g. 36h, 7d)."),
    until: str | None = typer.Option(
        None, "--until", metavar="UNIX_TIME", help="End of the range (unix seconds; default now)."
    ),
    step: str = typer.Option(
        "5m", "--step", help="Resolution asked of Prometheus (each step's minimum)."
    ),
    block: str = typer.Option(
        "1h", "--block", help="Compare the quietest moment of each block this long."
    ),
    warmup: str = typer.Option(
        "2h", "--warmup", help="Left out after each process start or restart."
    ),
    match: list[str] = typer.Option(
        [],
        "--match",
        metavar='LABEL="VALUE"',
        help='Only series with this label matcher (repeat), e.g. cluster="prod".',
    ),
    virtual_gpus: bool = typer.Option(
        False,
        "--kubernetes-virtual-gpus",
        help="dcgm-exporter runs with --kubernetes-virtual-gpus: one series per pod sharing a GPU.",
    ),
    top: int = typer.Option(20, "--top", help="Rows in the table (0: all)."),
    charts: Path | None = typer.Option(
        None, "--charts", metavar="DIR", help="Write a PNG chart per leaking series into DIR."
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object (schema vramdoctor.fleet/1)."
    ),
) -> None:
    """Which of my servers is leaking, how fast, and when will it die? Reads days of GPU, process and KV memory history from Prometheus.

    Sources: dcgm-exporter (DCGM_FI_DEV_FB_USED/FREE), nvitop-exporter (process_gpu_memory_MiB, process_rss_memory_MiB), nvidia_gpu_exporter (nvidia_smi_compute_app_used_memory_bytes), SGLang/vLLM KV gauges at idle moments, and `vramdoctor watch`. Per series: cut at restarts, skip warm-up, compare the quietest moment of each block. See docs/fleet.md.

    Set VRAMDOCTOR_PROMETHEUS_TOKEN to send a bearer token.

    Exit code: 0 no leak, 1 a leak, 2 usage or input error (Prometheus unreachable).

    Examples:

      vramdoctor fleet --prometheus http://prometheus:9090

      vramdoctor fleet --prometheus http://prometheus:9090 --since 3d --match 'cluster="prod"' --charts leaks/

      vramdoctor fleet --prometheus http://prometheus:9090 --json | jq '.rows[] | select(.verdict=="LEAK")'
    """
    from vramdoctor.fleet import FleetConfig, run_fleet

    since_s = parse_duration(since, "--since")
    step_s = parse_duration(step, "--step")
    block_s = parse_duration(block, "--block")
    if since_s <= 0 or step_s <= 0 or block_s < step_s:
        raise InputError("--since and --step must be positive and --block at least one step")
    if top < 0:
        raise InputError("--top must be 0 (all) or more")
    try:
        end = float(until) if until else None
    except ValueError:
        raise InputError(f"--until wants unix seconds, not {until!r}") from None
    config = FleetConfig(
        block_s=block_s, warmup_s=parse_duration(warmup, "--warmup"), gap_s=max(900.0, 3 * step_s)
    )
    token = os.environ.get("VRAMDOCTOR_PROMETHEUS_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else None
    result = run_fleet(
        prometheus,
        days=since_s / 86400.0,
        end=end,
        step_s=step_s,
        matchers=list(match),
        virtual_gpus=virtual_gpus,
        config=config,
        headers=headers,
    )
    written = []
    if charts is not None:
        from vramdoctor.fleet.report import chart

        for row in result.leaks:
            try:
                written.append(str(chart(row, charts)))
            except OSError as exc:
                raise InputError(
                    f"--charts {charts}: cannot write ({exc.strerror or exc})"
                ) from None
    if json_out:
        doc = result.to_dict()
        doc["charts"] = written
        console.print_json(doc)
    else:
        from vramdoctor.fleet.report import render

        render(result, console.stdout(), top=top or None)
        for path in written:
            console.note(f"chart: {path}")
    raise typer.Exit(int(ExitCode.PROBLEM if result.leaks else ExitCode.OK))
