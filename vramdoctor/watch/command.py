"""`vramdoctor watch` as a library call: options in, the run, its report and its exit code out.

`watch_options(values, ...)` turns the command line's values (strings as typed: durations,
sizes) into bounded `WatchOptions` (InputError naming the flag for anything out of bounds:
'nan', 'inf', '1e300', a window of a million buckets). `run_watch(options, duration_s)` runs
until the duration, Ctrl-C or SIGTERM and prints the final report: stderr gets one line per
verdict change (the verdict and what it names, never a rate: the one rate and time to
out of memory of a run are the final report's), the notes
and every kind of source failure once; stdout the report (or `--json`). Exit code: 1 when a
leak was found (before an interrupt too), 130 when interrupted (Ctrl-C or SIGTERM) before,
else 0. `report_part(run)` re-analyses a recorded part (`vramdoctor report PART`).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramdoctor.errors import InputError, Interrupted
from vramdoctor.render import console
from vramdoctor.samples import Event
from vramdoctor.watch.config import (
    MAX_DURATION_S,
    WatchConfig,
    WatchOptions,
    check_seconds,
    max_buckets_of,
    parse_duration,
    rotate_bytes_of,
)

if TYPE_CHECKING:
    from vramdoctor.record import Run
    from vramdoctor.watch.result import WatchResult

__all__ = ["event_line", "report_part", "run_watch", "watch_options"]


def watch_options(
    o: Mapping[str, Any], *, launch: tuple[str, ...] | None, gpus: list[int] | None
) -> tuple[WatchOptions, float | None]:
    """(WatchOptions, --duration in seconds or None) from the command line's values."""
    from vramdoctor.watch.exporter import parse_listen

    listen_text = str(o.get("listen") or "127.0.0.1:9840")
    parse_listen(listen_text)  # a bad address is refused before anything is measured
    listen = None if o.get("no_exporter") else listen_text
    interval_s = parse_duration(str(o.get("interval", "5s")), "--interval")
    bucket_s = parse_duration(str(o.get("bucket", "1m")), "--bucket")
    window_s = parse_duration(str(o.get("window", "6h")), "--window")
    config = WatchConfig(
        bucket_s=bucket_s,
        max_buckets=max_buckets_of(window_s, bucket_s),
        warmup_s=parse_duration(str(o.get("warmup", "30m")), "--warmup"),
        min_idle_s=parse_duration(str(o.get("min_idle", "10s")), "--min-idle"),
        inside_every_s=parse_duration(str(o.get("inside_every", "60s")), "--inside-every"),
    ).check()
    duration_s = None
    if o.get("duration") is not None:
        duration_s = check_seconds(
            "--duration", parse_duration(str(o["duration"]), "--duration"), 0.01, MAX_DURATION_S
        )
    if launch and not o.get("server"):
        from vramdoctor.soak.launch import url_from_argv

        if url_from_argv(launch) is None:
            raise InputError("--launch: the command names no --port; give --server URL")
    options = WatchOptions(
        interval_s=interval_s,
        analyse_every_s=parse_duration(str(o.get("analyse_every", "30s")), "--analyse-every"),
        server_url=o.get("server"),
        metrics_url=o.get("metrics"),
        pids=list(o.get("pid") or []),
        gpu_metrics=list(o.get("gpu_metrics") or []),
        gpus=gpus,
        config=config,
        out_dir=o.get("out"),
        rotate_bytes=rotate_bytes_of(o.get("rotate_mib", 64)),
        keep_files=int(o.get("keep", 8)),
        listen=listen,
        launch=launch,
        startup_timeout_s=float(o.get("startup_timeout_s", 600.0)),
        stop_grace_s=float(o.get("stop_grace_s", 15.0)),
        agent=not o.get("agent", False) if "agent" in o else True,
        trace_python=bool(o.get("trace_python")),
    )
    return options.check(), duration_s


def event_line(ev: Event) -> str:
    """One stderr line for a life event (every field from outside on one line)."""
    d = ev.data
    if ev.name in ("server_replaced", "process_replaced"):
        what = d.get("name") or ("the server" if ev.name == "server_replaced" else "a process")
        return f"watch: {what} restarted: PID {d.get('old_pid')} -> {d.get('new_pid')}"
    if ev.name == "server_died":
        return f"watch: the server died ({d.get('reason') or 'gone'})"
    who = f"PID {d.get('pid')}" + (f" ({d['name']})" if d.get("name") else "")
    return f"watch: {who} {ev.name.replace('process_', '')}"


def _print(result: WatchResult, json_out: bool) -> None:
    if json_out:
        console.print_json(result.to_dict())
    else:
        from vramdoctor.watch.report import render

        render(result, console.stdout())


def run_watch(options: WatchOptions, duration_s: float | None, *, json_out: bool) -> int:
    """Run until Ctrl-C, SIGTERM or `duration_s`; print the final report; return the exit code."""
    from vramdoctor.record import interrupts_held
    from vramdoctor.watch.config import check_pids

    check_pids(options.pids)  # bad input is refused before seconds of imports
    try:
        with interrupts_held():  # numpy's and scipy's imports turn a Ctrl-C into ImportError
            import scipy.stats  # noqa: F401  (seconds on a busy host: before sampling starts)

            from vramdoctor.soak import analysis as _analysis  # noqa: F401
            from vramdoctor.watch.report import change_line
            from vramdoctor.watch.runner import Watcher
    except KeyboardInterrupt:
        raise Interrupted("interrupted before watching: nothing was recorded") from None
    stop = threading.Event()
    interrupted = threading.Event()
    last: dict[str, str | None] = {"line": None}

    def on_result(res: WatchResult) -> None:
        line = change_line(res)
        if line != last["line"]:
            last["line"] = line
            console.note(f"watch: {time.strftime('%H:%M:%S')} {line}")

    def on_term(*_: Any) -> None:
        interrupted.set()
        stop.set()

    watcher = Watcher(
        options,
        on_event=lambda ev: console.note(event_line(ev)),
        on_note=lambda m: console.note(f"watch: {m}"),
    )
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    if main:
        signal.signal(signal.SIGTERM, on_term)
    status = "complete"
    result: WatchResult | None = None
    try:
        try:
            watcher.open()
            if watcher.exporter is not None:
                console.note(f"watch: serving /metrics on {watcher.exporter.url}")
            if watcher.writer is not None and watcher.writer.path is not None:
                console.note(f"watch: recording to {watcher.writer.path}")
            result = watcher.run(stop, duration_s, on_result=on_result)
        except KeyboardInterrupt:
            interrupted.set()
        if interrupted.is_set():
            status = "interrupted"
            result = watcher.analyse() if watcher.state.samples else result
    finally:
        try:
            watcher.close(status)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
    if result is None:
        raise Interrupted("interrupted before anything was sampled")
    if not watcher.watched_anything():
        why = next(iter(watcher.failing.values()), "no source answered")
        if interrupted.is_set():  # one line, exit 130: no report follows
            raise Interrupted(f"interrupted; nothing was watched: {why}")
        raise InputError(f"nothing was watched in the whole run: {why}")
    if interrupted.is_set():
        console.interrupted("interrupted; the report below covers what was sampled")
    result.interrupted = interrupted.is_set()
    _print(result, json_out)
    return result.exit_code


def report_part(run: Run, *, json_out: bool, report_file: Path | None) -> int:
    """Re-run the rolling analysis over a recorded watch part; the exit code as watch's."""
    from vramdoctor.watch.state import replay

    if report_file is not None:
        raise InputError("watch reports have no file form: use --json, or the exporter's metrics")
    config = run.header.get("config") or {}
    try:
        wc = WatchConfig(
            bucket_s=float(config.get("bucket_s", 60.0)),
            max_buckets=int(config.get("max_buckets", 360)),
            warmup_s=float(config.get("warmup_s", 1800.0)),
            min_idle_s=float(config.get("min_idle_s", 10.0)),
            settle_s=float(config["settle_s"]) if config.get("settle_s") is not None else None,
            max_rounds=int(config.get("max_rounds", 24)),
        ).check()
    except (TypeError, ValueError, OverflowError, InputError):
        raise InputError(f"{run.path}: damaged watch settings in the header") from None
    if not run.records:
        raise InputError(f"{run.path}: the watch run holds no sample ({run.status})")
    result = replay(run.records, wc, header=config)
    result.interrupted = run.status == "interrupted"
    _print(result, json_out)
    return result.exit_code
