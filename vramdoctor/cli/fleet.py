"""`vramdoctor fleet`: a ranked table of leaking servers from the history Prometheus stores."""

from __future__ import annotations

import math
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from vramdoctor.cli import app
from vramdoctor.cli.watch import parse_duration
from vramdoctor.errors import ExitCode, InputError
from vramdoctor.render import console

if TYPE_CHECKING:
    from vramdoctor.fleet.analysis import FleetResult

_MS_THRESHOLD = 1e11  # unix seconds pass this in the year 5138; unix milliseconds since 1973


def _duration(text: str, what: str, lo: float, hi: float) -> float:
    """A duration option in seconds, finite and within [lo, hi] (InputError otherwise)."""
    try:
        value = parse_duration(text, what)
    except InputError as exc:  # 'nan', 'inf': said as the bounds, like any number outside
        try:
            value = float(text)
        except ValueError:
            raise exc from None
    if not math.isfinite(value) or not lo <= value <= hi:
        raise InputError(f"{what} must be between {_words(lo)} and {_words(hi)}, not {text!r}")
    return value


def _words(seconds: float) -> str:
    from vramdoctor.units import format_duration

    return "0 seconds" if seconds == 0 else format_duration(seconds)


def _until(text: str | None) -> float | None:
    """--until: unix seconds or an ISO 8601 time (UTC unless it says otherwise)."""
    if text is None:
        return None
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        try:
            when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise InputError(
                f"--until wants unix seconds or an ISO 8601 time like 2026-11-30T12:00Z, not {text!r}"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        value = when.timestamp()
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"--until wants a time after 1970, not {text!r}")
    if value > _MS_THRESHOLD:
        raise InputError(
            f"--until {text} looks like milliseconds: give unix seconds ({value / 1000:.0f})"
        )
    if value > time.time() + 3600:
        raise InputError(f"--until {text} is in the future: there is no history there yet")
    return value


def _headers(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or any(c in item for c in "\r\n"):
            raise InputError(
                f"--header wants 'Name: value' on one line, e.g. 'X-Scope-OrgID: team-a', not {item!r}"
            )
        out[name.strip()] = value.strip()
    token = os.environ.get("VRAMDOCTOR_PROMETHEUS_TOKEN")
    if token:
        out.setdefault("Authorization", f"Bearer {token}")
    return out


# The command's options, one constant each (typer reads them as the parameters' defaults).
_PROMETHEUS = typer.Option(
    ...,
    "--prometheus",
    metavar="URL",
    help="Base URL of Prometheus (or VictoriaMetrics, Thanos Querier, Mimir's .../prometheus).",
)
_SINCE = typer.Option("7d", "--since", help="How far back to read (e.g. 36h, 7d; 4h to 400d).")
_UNTIL = typer.Option(
    None,
    "--until",
    metavar="TIME",
    help="End of the range: unix seconds or ISO 8601 (default now).",
)
_STEP = typer.Option(
    "5m", "--step", help="Resolution of charts and of --strategy pull (each step's minimum)."
)
_BLOCK = typer.Option(
    "1h", "--block", help="Compare the floor (least memory) of each block this long."
)
_WARMUP = typer.Option("2h", "--warmup", help="Left out after each process start or restart.")
_MATCH = typer.Option(
    [],
    "--match",
    metavar='LABEL="VALUE"',
    help='Only series with this label matcher (repeat), e.g. cluster="prod".',
)
_HEADER = typer.Option(
    [],
    "--header",
    metavar="'NAME: VALUE'",
    help="Send this HTTP header (repeat), e.g. 'X-Scope-OrgID: team-a' for Mimir.",
)
_VIRTUAL_GPUS = typer.Option(
    False,
    "--kubernetes-virtual-gpus",
    help="dcgm-exporter runs with --kubernetes-virtual-gpus: one row per pod sharing a GPU.",
)
_TOP = typer.Option(20, "--top", help="Rows in the table (0: all).")
_CHARTS = typer.Option(
    None, "--charts", metavar="DIR", help="Write a PNG chart per leaking row into DIR."
)
_JSON = typer.Option(False, "--json", help="Print one JSON object (schema vramdoctor.fleet/2).")
_QUERY_TIMEOUT = typer.Option(
    "60s", "--query-timeout", help="Total time one query may take, to its last byte."
)
_MAX_ANSWER_MIB = typer.Option(
    64.0, "--max-answer-mib", help="The largest answer read from the database, in MiB."
)
_MAX_CANDIDATES = typer.Option(
    5000, "--max-candidates", help="Series pulled after the screen, at most."
)
_STRATEGY = typer.Option(
    "screen",
    "--strategy",
    help="screen: the database screens every series, only candidates are pulled; pull: every series is pulled.",
)


@app.command("fleet")
def fleet_cmd(
    prometheus: str = _PROMETHEUS,
    since: str = _SINCE,
    until: str | None = _UNTIL,
    step: str = _STEP,
    block: str = _BLOCK,
    warmup: str = _WARMUP,
    match: list[str] = _MATCH,
    header: list[str] = _HEADER,
    virtual_gpus: bool = _VIRTUAL_GPUS,
    top: int = _TOP,
    charts: Path | None = _CHARTS,
    json_out: bool = _JSON,
    query_timeout: str = _QUERY_TIMEOUT,
    max_answer_mib: float = _MAX_ANSWER_MIB,
    max_candidates: int = _MAX_CANDIDATES,
    strategy: str = _STRATEGY,
) -> None:
    """Which of my servers is leaking, how fast, and when will it die? Reads days of GPU, process and KV memory history from Prometheus.

    The database screens every series (how much its hourly floor moved, whether it grows now); only the candidates' floors are pulled and judged: restarts are identity changes or counter resets, a leak that starts inside the range is found as a change point, and its rate and time to OOM come from after it. Sources: dcgm-exporter, nvitop-exporter, nvidia_gpu_exporter, vramdoctor watch, SGLang/vLLM KV at idle. See docs/fleet.md.

    Credentials: user and password in the URL (Basic auth), VRAMDOCTOR_PROMETHEUS_TOKEN (a bearer token) or --header; all are masked in every output.

    Exit code: 0 no live leak, 1 a live leak, 2 usage or input error (database unreachable, refusing, or answering malformed data; no series to judge, e.g. a --match that matches nothing).

    Examples:

      vramdoctor fleet --prometheus http://prometheus:9090

      vramdoctor fleet --prometheus http://prometheus:9090 --since 3d --match 'cluster="prod"' --charts leaks/

      vramdoctor fleet --prometheus http://prometheus:9090 --json | jq '.rows[] | select(.verdict=="LEAK")'
    """
    from vramdoctor.fleet import STRATEGIES, FleetConfig, run_fleet

    since_s = _duration(since, "--since", 4 * 3600.0, 400 * 86400.0)
    step_s = _duration(step, "--step", 1.0, 86400.0)
    block_s = _duration(block, "--block", 60.0, since_s / 4)
    warmup_s = _duration(warmup, "--warmup", 0.0, since_s)
    deadline_s = _duration(query_timeout, "--query-timeout", 1.0, 3600.0)
    if block_s < step_s:
        raise InputError("--block must be at least one --step")
    if not (math.isfinite(max_answer_mib) and 0.01 <= max_answer_mib <= 16384):
        raise InputError("--max-answer-mib must be between 0.01 and 16384")
    if top < 0:
        raise InputError("--top must be 0 (all) or more")
    if not 1 <= max_candidates <= 1_000_000:
        raise InputError("--max-candidates must be between 1 and 1000000")
    if strategy not in STRATEGIES:
        raise InputError(f"--strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    end = _until(until)
    config = FleetConfig(block_s=block_s, warmup_s=warmup_s, stale_s=max(900.0, 3 * step_s))
    result = run_fleet(
        prometheus,
        since_s=since_s,
        end=end,
        step_s=step_s,
        matchers=list(match),
        virtual_gpus=virtual_gpus,
        config=config,
        headers=_headers(list(header)),
        timeout_s=deadline_s,
        max_answer_bytes=int(max_answer_mib * 1024 * 1024),
        strategy=strategy,
        max_candidates=max_candidates,
    )
    if not result.rows:  # nothing to judge is not healthy: a typo in --match must not read as 0
        raise _nothing_to_judge(result, match)
    written, chart_error = _write_charts(result, charts) if charts is not None else ([], None)
    _print_fleet(result, written, chart_error, json_out=json_out, top=top)
    raise typer.Exit(int(ExitCode.PROBLEM if result.leaks else ExitCode.OK))


def _nothing_to_judge(result: FleetResult, match: list[str]) -> InputError:
    """The error for a range without a series to judge: what was looked for, over which span."""
    from vramdoctor.fleet.report import span_words

    scope = (
        "no series matches " + " ".join(f"--match {m!r}" for m in match)
        if match
        else "no GPU, process or KV series of a known exporter"
    )
    return InputError(
        f"fleet: {scope} in the {span_words(result)} up to "
        f"{datetime.fromtimestamp(result.end, timezone.utc):%Y-%m-%d %H:%M} UTC: nothing to judge"
        + ("; check the label's name and value" if match else "")
    )


def _write_charts(result: FleetResult, charts: Path) -> tuple[list[str], str | None]:
    """--charts: a PNG per leaking row into `charts`; the paths written, and why the rest were
    not (None when all were). A failed chart stops the charts, never the verdicts."""
    from vramdoctor.errors import VramdoctorError
    from vramdoctor.fleet.report import chart

    written: list[str] = []
    for row in result.leaks:
        try:
            written.append(str(chart(row, charts)))
        except OSError as exc:
            return written, (
                f"--charts {charts}: cannot write a chart ({exc.strerror or exc}); "
                "the verdicts stand"
            )
        except VramdoctorError as exc:
            return written, f"--charts {charts}: cannot write a chart ({exc}); the verdicts stand"
    return written, None


def _print_fleet(
    result: FleetResult, written: list[str], chart_error: str | None, *, json_out: bool, top: int
) -> None:
    """The JSON document (with the charts) or the table and the charts' paths; then any
    chart error as a note."""
    if json_out:
        doc = result.to_dict()
        doc["charts"] = written
        doc["charts_error"] = chart_error
        console.print_json(doc)
    else:
        from vramdoctor.fleet.report import render

        render(result, console.stdout(), top=top or None)
        for path in written:
            console.note(f"chart: {path}")
    if chart_error:
        console.note(chart_error)
