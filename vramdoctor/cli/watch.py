"""`vramdoctor watch`: passive and continuous; a rolling verdict per process and a /metrics exporter."""

from __future__ import annotations

import re
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from vramdoctor.cli import app
from vramdoctor.cli._options import GPU_HELP, parse_gpu_indices
from vramdoctor.errors import ExitCode, InputError
from vramdoctor.render import console
from vramdoctor.samples import Event

if TYPE_CHECKING:  # imported where used: `vramdoctor --help` loads no numpy/scipy/psutil
    from vramdoctor.record import Run
    from vramdoctor.watch.runner import WatchOptions
    from vramdoctor.watch.state import WatchResult

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*([smhd]))+\s*$")


def parse_duration(text: str, what: str) -> float:
    """'90', '90s', '30m', '6h', '7d', '1h30m' -> seconds. Bad input is an InputError naming `what`."""
    value = text.strip().lower()
    try:
        return float(value)
    except ValueError:
        pass
    if not _DURATION.match(value):
        raise InputError(f"{what} wants a duration like 90s, 30m, 6h or 7d, not {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)\s*([smhd])", value))


def _gpus(gpu: list[str], alias: str | None) -> list[int] | None:
    return parse_gpu_indices([*gpu, *([alias] if alias else [])])


def _event_line(ev: Event) -> str:
    d = ev.data
    if ev.name == "server_replaced":
        return f"watch: {d.get('name') or 'process'} restarted: PID {d.get('old_pid')} -> {d.get('new_pid')}"
    who = f"PID {d.get('pid')}" + (f" ({d['name']})" if d.get("name") else "")
    return f"watch: {who} {ev.name.replace('process_', '')}"


@app.command("watch")
def watch_cmd(
    server: str | None = typer.Option(
        None,
        "--server",
        metavar="URL",
        help="The inference server (SGLang/vLLM) base URL: its /metrics is read and, on this host, its processes found.",
    ),
    metrics: str | None = typer.Option(
        None, "--metrics", metavar="URL", help="The server's /metrics URL, when not SERVER/metrics."
    ),
    pid: list[int] = typer.Option(
        [], "--pid", help="Also watch this process's host memory (repeat)."
    ),
    gpu_metrics: list[str] = typer.Option(
        [],
        "--gpu-metrics",
        metavar="URL",
        help="Read GPUs from dcgm-exporter or nvitop-exporter instead of NVML here (repeat).",
    ),
    gpu: list[str] = typer.Option([], "--gpu", metavar="N", help=GPU_HELP),
    gpus: str | None = typer.Option(None, "--gpus", hidden=True, help="Old spelling of --gpu."),
    interval: str = typer.Option("5s", "--interval", help="Time between samples."),
    window: str = typer.Option("6h", "--window", help="Length of the rolling analysis window."),
    bucket: str = typer.Option(
        "1m", "--bucket", help="History resolution: one bucket (min, max, mean) per this long."
    ),
    warmup: str = typer.Option(
        "30m", "--warmup", help="Left out of the analysis after each process start."
    ),
    analyse_every: str = typer.Option(
        "30s", "--analyse-every", help="How often the verdicts are recomputed."
    ),
    listen: str = typer.Option(
        "127.0.0.1:9840",
        "--listen",
        metavar="HOST:PORT",
        help="Serve /metrics here (0.0.0.0:PORT to reach it from other hosts).",
    ),
    no_exporter: bool = typer.Option(False, "--no-exporter", help="Do not serve /metrics."),
    out: Path | None = typer.Option(
        None, "--out", metavar="DIR", help="Record samples into rotating run files in DIR."
    ),
    rotate_mib: float = typer.Option(
        64.0, "--rotate-mib", help="Start a new run file past this size."
    ),
    keep: int = typer.Option(8, "--keep", help="Keep this many run files (oldest deleted)."),
    duration: str | None = typer.Option(
        None, "--duration", help="Stop after this long (default: until Ctrl-C or SIGTERM)."
    ),
    json_out: bool = typer.Option(
        False, "--json", help="At the end, print the result as one JSON object."
    ),
) -> None:
    """Watch one GPU host passively (no traffic): a rolling leak/caching verdict per process and layer, served as Prometheus /metrics.

    Samples NVML per GPU and process (or --gpu-metrics exporters), host memory per process by kind, and the server's /metrics. Growth is compared only at moments of comparable work (the quietest quarter of the window, against the requests the server served), after each process's warm-up. See docs/watch.md.

    Exit code (when it stops): 0 no leak, 1 a leak, 2 usage or input error.

    Examples:

      vramdoctor watch --server http://127.0.0.1:30000

      vramdoctor watch --server http://127.0.0.1:8000 --out /var/lib/vramdoctor --listen 0.0.0.0:9840

      vramdoctor watch --gpu-metrics http://gpu-host:9400/metrics --duration 1h --json
    """
    from vramdoctor.watch.exporter import parse_listen
    from vramdoctor.watch.runner import WatchOptions
    from vramdoctor.watch.state import WatchConfig

    parse_listen(listen)  # refuse a bad address before measuring anything
    interval_s = parse_duration(interval, "--interval")
    window_s = parse_duration(window, "--window")
    bucket_s = parse_duration(bucket, "--bucket")
    if interval_s <= 0 or bucket_s <= 0 or window_s < 2 * bucket_s:
        raise InputError(
            "--interval and --bucket must be positive and --window at least two buckets"
        )
    if rotate_mib <= 0 or keep < 1:
        raise InputError("--rotate-mib must be positive and --keep at least 1")
    config = WatchConfig(
        bucket_s=bucket_s,
        max_buckets=int(window_s // bucket_s),
        warmup_s=parse_duration(warmup, "--warmup"),
    )
    options = WatchOptions(
        interval_s=interval_s,
        analyse_every_s=parse_duration(analyse_every, "--analyse-every"),
        server_url=server,
        metrics_url=metrics,
        pids=list(pid),
        gpu_metrics=list(gpu_metrics),
        gpus=_gpus(gpu, gpus),
        config=config,
        out_dir=out,
        rotate_bytes=int(rotate_mib * 1024 * 1024),
        keep_files=keep,
        listen=None if no_exporter else listen,
    )
    stop_s = parse_duration(duration, "--duration") if duration else None
    raise typer.Exit(run_watch(options, stop_s, json_out=json_out))


def run_watch(options: WatchOptions, duration_s: float | None, *, json_out: bool) -> int:
    """Run until Ctrl-C, SIGTERM or `duration_s`; print the final report; return the exit code."""
    from vramdoctor.watch.runner import Watcher

    stop = threading.Event()
    last_verdict: dict[str, Any] = {"v": None}

    def on_result(res: WatchResult) -> None:
        if res.verdict != last_verdict["v"]:
            last_verdict["v"] = res.verdict
            from vramdoctor.watch.report import sentence

            console.note(f"watch: {res.verdict}: {sentence(res)}")

    def on_event(ev: Event) -> None:
        console.note(_event_line(ev))

    watcher = Watcher(options, on_event=on_event)
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    status = "complete"
    try:
        watcher.open()
        for note in watcher.notes:
            console.note(f"watch: {note}")
        if watcher.exporter is not None:
            console.note(f"watch: serving /metrics on {watcher.exporter.url}")
        if watcher.writer is not None:
            console.note(f"watch: recording to {watcher.writer.path}")
        try:
            result = watcher.run(stop, duration_s, on_result=on_result)
        except KeyboardInterrupt:
            status = "interrupted"
            console.note("watch: interrupted; the report below covers what was sampled")
            result = watcher.analyse()
    finally:
        watcher.close(status)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
    if json_out:
        console.print_json(result.to_dict())
    else:
        from vramdoctor.watch.report import render

        render(result, console.stdout())
    return int(ExitCode.PROBLEM if result.verdict == "LEAK" else ExitCode.OK)


def report_run(run: Run, *, json_out: bool, report_file: Path | None) -> int:
    """Re-run the rolling analysis over a recorded watch run file (one rotated part at a time)."""
    from vramdoctor.watch.state import WatchConfig, replay

    if report_file is not None:
        raise InputError("watch reports have no file form: use --json, or the exporter's metrics")
    config = run.header.get("config") or {}
    try:
        wc = WatchConfig(
            bucket_s=float(config.get("bucket_s", 60.0)),
            max_buckets=int(config.get("max_buckets", 360)),
            warmup_s=float(config.get("warmup_s", 1800.0)),
        )
        if not (0 < wc.bucket_s < 1e9 and 2 <= wc.max_buckets <= 10**7 and wc.warmup_s >= 0):
            raise ValueError("out of range")  # (bucket_s 0 divided by zero in the replay)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{run.path}: damaged watch settings in the header") from None
    if not run.records:
        raise InputError(f"{run.path}: the watch run holds no sample ({run.status})")
    result = replay(run.records, wc)
    if json_out:
        console.print_json(result.to_dict())
    else:
        from vramdoctor.watch.report import render

        render(result, console.stdout())
    return int(ExitCode.PROBLEM if result.verdict == "LEAK" else ExitCode.OK)
