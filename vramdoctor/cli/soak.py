"""`vramdoctor soak --url`: is this server leaking, only caching, or stable; how fast; where.

Thin: parse options, identify the server, wire the sources into the collector and the run
file, run the protocol (vramdoctor.load.protocol), analyse (vramdoctor.analysis.soak, pure),
print (vramdoctor.report.soak). `report_run` re-renders a recorded run for `vramdoctor report`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..errors import ExitCode, InputError, SourceUnavailable
from ..load.client import LoadClient
from ..load.images import generate_images, load_image_dir, parse_image_size
from ..load.protocol import Protocol, ProtocolConfig
from ..load.workload import build_requests
from ..model import Event, GpuSample, now
from ..record import Run, RunWriter, make_header, read_run
from ..redact import redact_url
from ..report import console
from ..sources.collector import Collector
from ..sources.discover import discover_server, gpu_peers, roles
from ..sources.host import HostSource, host_memory
from ..sources.server_info import base_url, identify
from . import app

# scipy (analysis) and matplotlib (report) are imported when used: `vramdoctor --help` and the
# other commands should not pay a second of imports for them.
if TYPE_CHECKING:
    from ..analysis.soak import SoakResult

DEFAULT_SIZES = ["448x448", "896x672"]
MIN_GROWTH_MIB = 2.0  # vramdoctor.analysis.soak.Thresholds.min_growth_mib
INTERRUPTED = 130


def _api_key(option: str | None) -> str | None:
    return option or os.environ.get("OPENAI_API_KEY") or os.environ.get("VRAMDOCTOR_API_KEY") or None


def _default_out() -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"soak-{stamp}.jsonl"


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise InputError(message)


def _check_report_suffix(report_file: Path | None) -> None:
    """Before any work: a report name we cannot write is a usage error (exit 2)."""
    if report_file is not None and report_file.suffix.lower() not in (".html", ".htm", ".png"):
        raise InputError(f"--report {report_file}: use a .html or .png file name")
    if report_file is not None and report_file.is_dir():  # found now, not after a long soak
        raise InputError(f"--report {report_file} is a directory: give a file name")
    if report_file is not None and any(p.exists() and not p.is_dir() for p in report_file.parents):
        raise InputError(f"--report {report_file}: a part of its directory is a file")


def _gpu_source(gpu_metrics: str | None, gpus: list[int] | None, remote: bool) -> tuple[Any, str | None]:
    """(source or None, note). --gpu-metrics wins; else NVML when the server is on this host."""
    if gpu_metrics:
        from ..sources.exporter import ExporterSource

        src = ExporterSource(gpu_metrics)
        src.sample()  # fail now, with its one line, if it is not an exporter
        return src, None
    if remote:
        return None, ("server is on another host and no --gpu-metrics was given: GPU memory is "
                      "not measured (pass --gpu-metrics http://HOST:9400/metrics)")
    try:
        from ..sources.nvml import NvmlSource

        return NvmlSource(gpus).open(), None
    except SourceUnavailable as exc:
        return None, f"no GPU memory from NVML: {exc}"


class _Roles:
    """pid -> role for the host sampler, re-discovered every few seconds (servers spawn workers)."""

    def __init__(self, url: str, extra_pids: list[int], every_s: float = 5.0) -> None:
        self.url, self.extra = url, extra_pids
        self.every_s = every_s
        self._at = -1e9
        self._roles: dict[int, str] = {}
        self.found = discover_server(url)
        self.peers: dict[int, str] = {}
        self.last_gpu_sample: Any = None

    def on_sample(self, _name: str, record: Any) -> None:
        if isinstance(record, GpuSample):
            self.last_gpu_sample = record

    def __call__(self) -> dict[int, str]:
        if time.monotonic() - self._at >= self.every_s:
            self._at = time.monotonic()
            found = self.found if self.found.remote else discover_server(self.url)
            if found.found:
                self.found = found
            if self.last_gpu_sample is not None:
                # Not found (a container behind a port forwarder): every process on the GPUs.
                self.peers = gpu_peers(self.last_gpu_sample, self.found.tree)
            self._roles = roles(self.found, self.peers)
            for pid in self.extra:
                self._roles.setdefault(pid, "watched")
        return self._roles


def _emit(result: SoakResult, *, json_out: bool, report_file: Path | None,
          target: str | None, run_path: Path | None) -> int:
    from ..analysis.soak import LEAK
    from ..report.soak import render, write_report_file

    if report_file is not None:
        try:
            write_report_file(result, report_file, target=target)
        except InputError as exc:  # the measurement stands; only the extra file is missing
            console.error(str(exc))
            report_file = None
    if json_out:
        d = result.to_dict()
        d["run_file"] = str(run_path) if run_path else None
        d["report_file"] = str(report_file) if report_file else None
        console.print_json(d)
    else:
        render(result, console.stdout())
        if run_path is not None:
            console.note(f"run file: {run_path}  (re-analyse: vramdoctor report {run_path})")
        if report_file is not None:
            console.note(f"report: {report_file}")
    return int(ExitCode.PROBLEM) if result.verdict == LEAK else int(ExitCode.OK)


def report_run(run: Run, *, json_out: bool, report_file: Path | None, run_path: Path | None = None) -> int:
    """A soak run's analysis and report from its run file: at the end of `soak` (which passes
    the run's path) and offline in `vramdoctor report RUN.jsonl`."""
    from ..analysis.soak import Thresholds, analyse

    _check_report_suffix(report_file)
    cfg = run.header.get("config", {})
    th = Thresholds(min_growth_mib=float(cfg.get("min_growth_mib", MIN_GROWTH_MIB)))
    result = analyse(run.records, header=run.header, raw_host=run.raw("host_memory"),
                     status=run.status, th=th)
    if run.torn_tail:
        result.notes.append("the run file's last line was torn (the writer was killed); it was skipped")
    return _emit(result, json_out=json_out, report_file=report_file,
                 target=run.header.get("target"), run_path=run_path)


@app.command("soak")
def soak_cmd(
    url: str = typer.Option(..., "--url", help="The server's base URL, e.g. http://127.0.0.1:30000"),
    gpu_metrics: str | None = typer.Option(
        None, "--gpu-metrics", "--gpu-exporter",
        help="dcgm-exporter or nvitop-exporter URL when the server's GPUs are on another host."),
    gpus: list[int] | None = typer.Option(None, "--gpu", help="Only these GPU indices (NVML). Repeatable."),
    rounds: int = typer.Option(4, "--rounds", help="Rounds of identical traffic."),
    requests_n: int = typer.Option(50, "--requests", help="Requests per round."),
    concurrency: int = typer.Option(4, "--concurrency", help="Requests in flight at once."),
    idle: float = typer.Option(10.0, "--idle", help="Idle seconds after each round (and the baseline)."),
    baseline: float | None = typer.Option(None, "--baseline", help="Idle seconds before the first round (default: --idle)."),
    image_size: list[str] | None = typer.Option(
        None, "--image-size", help="Generated image size WxH (repeatable). Default: 448x448 and 896x672."),
    image_dir: Path | None = typer.Option(None, "--image-dir", help="Send these images instead (sorted by name)."),
    text_only: bool = typer.Option(False, "--text-only", help="No images: text prompts only."),
    api: str = typer.Option("chat", "--api", help="chat (/v1/chat/completions) or completions (/v1/completions, text)."),
    model: str | None = typer.Option(None, "--model", help="Model name to send (default: the server's first /v1/models id)."),
    max_tokens: int = typer.Option(16, "--max-tokens", help="max_tokens of each request."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated images (same seed, same bytes)."),
    out: Path | None = typer.Option(None, "--out", help="Run file (default: runs/soak-<UTC time>.jsonl)."),
    report_file: Path | None = typer.Option(None, "--report", help="Also write FILE.html or FILE.png."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    max_requests: int | None = typer.Option(None, "--max-requests", help="Never send more requests than this in total."),
    duration: float | None = typer.Option(None, "--duration", help="Never run longer than this many seconds."),
    api_key: str | None = typer.Option(
        None, "--api-key", help="Bearer key (default: $OPENAI_API_KEY or $VRAMDOCTOR_API_KEY). Never printed or recorded."),
    interval: float = typer.Option(0.5, "--interval", help="Seconds between memory samples."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for one answer."),
    min_growth_mib: float = typer.Option(
        MIN_GROWTH_MIB, "--min-growth-mib", help="Smallest change (MiB) that counts as growth."),
    pids: list[int] | None = typer.Option(None, "--pid", help="Also sample this PID's host RSS (repeatable)."),
) -> None:
    """Replay identical traffic in rounds with idle windows and tell LEAK from CACHING.

    Caching (PyTorch's allocator, a bounded cache) rises in the first round or two and then
    stays flat; a leak grows every round in proportion to the requests. Exit 1 on LEAK.

    Examples:

      vramdoctor soak --url http://127.0.0.1:30000

      vramdoctor soak --url http://gpu-host:8000 --gpu-metrics http://gpu-host:9400/metrics --report soak.html

      vramdoctor soak --url http://127.0.0.1:8000 --rounds 6 --requests 30 --idle 20 --image-size 1024x1024 --json
    """
    # --- options ----------------------------------------------------------------------------
    _check(rounds >= 1, "--rounds must be at least 1")
    _check(requests_n >= 1, "--requests must be at least 1")
    _check(1 <= concurrency <= 1024, "--concurrency must be between 1 and 1024")
    _check(idle >= 0 and (baseline is None or baseline >= 0), "--idle/--baseline must not be negative")
    _check(max_tokens >= 1, "--max-tokens must be at least 1")
    _check(interval >= 0.05, "--interval must be at least 0.05 s")
    _check(timeout > 0, "--timeout must be positive")
    _check(max_requests is None or max_requests >= 1, "--max-requests must be at least 1")
    _check(duration is None or duration > 0, "--duration must be positive")
    _check(api in ("chat", "completions"), "--api must be chat or completions")
    _check(min_growth_mib >= 0, "--min-growth-mib must not be negative")
    _check(not (text_only and image_dir), "--text-only and --image-dir contradict each other")
    _check_report_suffix(report_file)
    key = _api_key(api_key)
    secrets = [key] if key else []
    headers = {"Authorization": f"Bearer {key}"} if key else None
    sizes = [parse_image_size(s) for s in (image_size or DEFAULT_SIZES)]
    images = [] if text_only or api == "completions" else (
        load_image_dir(image_dir) if image_dir else generate_images(sizes, seed))
    run_path = out or _default_out()
    if run_path.exists():
        raise InputError(f"run file {run_path} already exists; choose another --out")

    # --- what is the server (before sending anything) ---------------------------------------
    base = base_url(url)
    info = identify(base, headers)
    err = console.stderr()
    console.note(f"server: {info.describe()} at {redact_url(base)}")
    send_model = model or info.model or "default"
    plan = build_requests(requests_n, model=send_model, images=images, max_tokens=max_tokens,
                          text_only=text_only, api=api)

    # --- sources ----------------------------------------------------------------------------
    roles_fn = _Roles(base, list(pids or []))
    remote = roles_fn.found.remote
    gpu_src, gpu_note = _gpu_source(gpu_metrics, gpus, remote)
    if gpu_note:
        console.note(gpu_note)
    if roles_fn.found.found:
        names = ", ".join(f"{p} ({n})" for p, n in sorted(roles_fn.found.tree.items()))
        console.note(f"server processes: {names}")
    elif roles_fn.found.reason:
        console.note(f"server processes not found: {roles_fn.found.reason}")
    sources: dict[str, Any] = {}
    if gpu_src is not None:
        sources["gpu"] = gpu_src
    if roles_fn.found.found or pids or (gpu_src is not None and not remote):
        sources["host"] = HostSource(roles_fn)
    if not sources:
        raise SourceUnavailable(
            "nothing to measure: no GPU source and the server's processes are not on this host; "
            "pass --gpu-metrics http://HOST:9400/metrics (dcgm-exporter or nvitop-exporter)")
    metrics_note = None
    try:
        from ..sources.server_metrics import ServerMetricsSource

        msrc = ServerMetricsSource(base, headers=headers)
        msrc.sample()
        sources["metrics"] = msrc
    except SourceUnavailable as exc:
        metrics_note = f"server /metrics not used ({exc}); going on with memory only"
        console.note(metrics_note)

    devices: list[dict[str, Any]] = []
    if gpu_src is not None and hasattr(gpu_src, "devices"):
        with contextlib.suppress(Exception):
            devices = gpu_src.devices()
    config = {
        "rounds": rounds, "requests": requests_n, "concurrency": concurrency, "idle_s": idle,
        "baseline_s": baseline if baseline is not None else idle, "api": api, "model": send_model,
        "max_tokens": max_tokens, "images": [img.label for img in images], "seed": seed,
        "max_requests": max_requests, "duration_s": duration, "interval_s": interval,
        "min_growth_mib": min_growth_mib, "sources": sorted(sources),
        "server": info.to_dict(), "server_pids": roles_fn.found.root_pids,
        "server_tree": {str(k): v for k, v in roles_fn.found.tree.items()},
        "notes": [n for n in (gpu_note, metrics_note, roles_fn.found.reason) if n],
    }
    # Imported before the run file exists: scipy takes a second to import, and a Ctrl-C in that
    # second must land inside the try below (partial report, run file closed), not before it.
    from ..analysis import soak as _analysis  # noqa: F401  (imported early, see above)
    from ..report.soak import LiveView

    header = make_header("soak", target=base, gpus=devices, config=config, secrets=secrets)
    writer = RunWriter(run_path, header)

    def host_extra() -> list[Any]:
        mono, wall = now()
        return [{"kind": "host_memory", "t": mono, "wall": wall, **host_memory()}]

    ticks = [0]

    def extra() -> list[Any]:
        ticks[0] += 1
        return host_extra() if ticks[0] % 20 == 1 else []

    collector = Collector(writer, sources, interval=interval, extra=extra)
    collector.add_listener(roles_fn.on_sample)
    client = LoadClient(base, key, timeout=timeout)
    proto_cfg = ProtocolConfig(rounds=rounds, concurrency=concurrency, idle_s=idle, baseline_s=baseline,
                               max_requests=max_requests, duration_s=duration)
    live = LiveView(err, rounds, len(plan)) if console.interactive() and not json_out else None
    protocol = Protocol(proto_cfg, client=client, plan=plan, writer=writer,
                        on_result=live.on_result if live else None,
                        progress=live.on_state if live else _plain_progress(len(plan), rounds))
    if live is not None:
        collector.add_listener(live.on_sample)
    status = "complete"
    previous_term = _term_as_interrupt()
    try:
        collector.tick()  # one sample before anything else: the first point of every series
        collector.start()
        if live is not None:
            with live:
                protocol.run()
        else:
            protocol.run()
    except KeyboardInterrupt:
        status = "interrupted"
        console.note("interrupted: stopped sending; reporting on what was measured")
    finally:
        protocol.stop.set()
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        collector.stop()
        with contextlib.suppress(Exception):
            collector.tick()
        stopped = protocol.state.stopped_by
        if stopped and stopped != "interrupt":
            writer.write(Event(*now(), name="stopped", data={"by": stopped}))
        writer.close(status, stopped_by=stopped)
        for src in sources.values():
            with contextlib.suppress(Exception):
                src.close()
    if protocol.state.stopped_by == "server-gone":
        console.note("the server stopped answering: remaining rounds skipped")
    code = report_run(read_run(run_path), json_out=json_out, report_file=report_file, run_path=run_path)
    raise typer.Exit(INTERRUPTED if status == "interrupted" else code)


def _term_as_interrupt() -> Any:
    """SIGTERM (e.g. `timeout`, a container stop) ends the soak like Ctrl-C: partial report,
    run file closed as interrupted. Returns the previous handler (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def _plain_progress(per_round: int, rounds: int) -> Any:
    """Non-interactive progress: one line per phase change on stderr."""
    seen: set[tuple[str, int]] = set()

    def progress(state: Any) -> None:
        key = (state.phase, state.round)
        if key in seen:
            return
        seen.add(key)
        if state.phase == "load":
            console.note(f"round {state.round}/{rounds}: sending {per_round} requests")
        elif state.phase == "idle" and state.results:
            r = state.results[-1]
            errs = r.sent - r.ok
            console.note(f"round {state.round}/{rounds}: {r.sent} sent, {errs} failed; idle")
        elif state.phase == "baseline":
            console.note("baseline: idle")

    return progress
