"""Run a soak from a `SoakConfig`: identify the server, wire the sources into the collector
and the run file, watch the server's life, run the protocol (with adaptive rounds), analyse.

Library code: nothing is printed; what a user should know goes through `notify` (the CLI
prints it on stderr). Ctrl-C (KeyboardInterrupt) stops sending, closes the run file as
`interrupted` and still analyses what was measured.
"""

from __future__ import annotations

import contextlib
import os
import secrets as _secrets
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from typing import Protocol as TypingProtocol

from vramdoctor.errors import ExitCode, InputError, Interrupted, SourceUnavailable
from vramdoctor.record import RunWriter, interrupts_held, make_header
from vramdoctor.redact import redact_url, register_secret
from vramdoctor.samples import SERVER_DIED, Event, GpuSample, MetricsSample, now
from vramdoctor.soak.analyse import analyse_run, undecided_layers
from vramdoctor.soak.config import INTERRUPTED, SoakConfig
from vramdoctor.soak.traffic.client import LoadClient, Outcome
from vramdoctor.soak.traffic.images import (
    PromptImage,
    generate_images,
    load_image_dir,
    parse_image_size,
)
from vramdoctor.soak.traffic.schedule import Protocol, ProtocolConfig, ProtocolState
from vramdoctor.soak.traffic.workload import PlannedRequest, build_requests
from vramdoctor.sources.collector import Collector
from vramdoctor.sources.discover import ServerWatch, discover_server, gpu_peers, roles
from vramdoctor.sources.host import HostSource, host_memory
from vramdoctor.sources.server_info import ServerInfo, base_url, identify


class RoundHook(TypingProtocol):
    """Called at the END of each idle window (round 0 = the baseline) with the round index and
    the run directory (the run file's folder), on the protocol's thread; a hook that raises is
    recorded as a `source_error` event and the soak goes on. E.g. allocator snapshots."""

    def __call__(self, round_index: int, run_dir: Path) -> None: ...


Notify = Callable[[str], None]


@dataclass
class SoakOutcome:
    """What a soak run gave: where its data is, how it ended, and the analysis.

    `status`: complete, interrupted or failed (the run file's end mark). `stopped_by`: why the
    protocol stopped early (interrupt, duration, max-requests, max-rounds, server-died) or None.
    `server_died`: the SERVER_DIED data (reason, pid, round) when the server died. `analysis`:
    the soak analysis of the run file (`vramdoctor.judge`).
    """

    run_path: Path
    status: str
    stopped_by: str | None
    rounds: int
    server: ServerInfo
    server_died: dict[str, Any] | None = None
    undecided: list[tuple[str, str]] = field(default_factory=list)
    production_rate_rps: float | None = None
    notes: list[str] = field(default_factory=list)
    analysis: Any = None

    @property
    def exit_code(self) -> int:
        """The analysis's exit code (`SoakAnalysis.exit_code`, README "Exit codes"): 1 when a
        layer leaks, the server died, sampling failed or no request succeeded; 2 when the
        server refused the requests as unauthorized; 130 when interrupted before any of these
        was found; else 0. Without an analysis: 130 interrupted, 1 failed, else 0."""
        if self.analysis is not None and hasattr(self.analysis, "exit_code"):
            return int(self.analysis.exit_code)
        if self.status == "interrupted":
            return INTERRUPTED
        if self.server_died is not None or self.status == "failed":
            return int(ExitCode.PROBLEM)
        return int(ExitCode.OK)


def default_run_path(now_utc: datetime | None = None) -> Path:
    """runs/soak-<UTC time>-<pid>-<random>.jsonl: two soaks started in the same second (one
    script soaking several servers) never pick the same name; the file is created exclusively."""
    stamp = (now_utc or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"soak-{stamp}-{os.getpid()}-{_secrets.token_hex(3)}.jsonl"


def prompt_images(cfg: SoakConfig) -> list[PromptImage]:
    if cfg.text_only or cfg.api == "completions":
        return []
    if cfg.image_dir:
        return load_image_dir(cfg.image_dir)
    return generate_images([parse_image_size(s) for s in cfg.image_sizes], cfg.seed)


def _gpu_source(cfg: SoakConfig, remote: bool) -> tuple[Any, str | None]:
    """(source or None, note). --gpu-metrics wins; else NVML when the server is on this host."""
    if cfg.gpu_metrics:
        from vramdoctor.sources.exporter import ExporterSource

        src = ExporterSource(cfg.gpu_metrics)
        src.sample()  # fail now, with its one line, if it is not an exporter
        return src, None
    if remote:
        return None, (
            "server is on another host and no --gpu-metrics was given: GPU memory is "
            "not measured (pass --gpu-metrics http://HOST:9400/metrics)"
        )
    try:
        from vramdoctor.sources.nvml import NvmlSource

        return NvmlSource(list(cfg.gpus) if cfg.gpus else None).open(), None
    except SourceUnavailable as exc:
        return None, f"no GPU memory from NVML: {exc}"


def _malloc_arena_max(pids: list[int]) -> int | None:
    """MALLOC_ARENA_MAX from the server's environment (None when unset or unreadable)."""
    import psutil

    for pid in pids:
        try:
            value = psutil.Process(pid).environ().get("MALLOC_ARENA_MAX")
        except (psutil.Error, OSError):
            continue
        if value and value.strip().isdigit():
            return int(value.strip())
    return None


class _Roles:
    """pid -> role for the host sampler: the watched server tree, GPU peers, --pid extras."""

    def __init__(self, watch: ServerWatch, found: Any, extra_pids: Iterable[int]) -> None:
        self.watch = watch
        self.found = found
        self.extra = list(extra_pids)
        self.peers: dict[int, str] = {}
        self.last_gpu_sample: GpuSample | None = None
        self._lock = threading.Lock()

    def on_sample(self, _name: str, record: Any) -> None:
        if isinstance(record, GpuSample):
            self.last_gpu_sample = record

    def __call__(self) -> dict[int, str]:
        with self._lock:
            self.found.root_pids = list(self.watch.roots)
            self.found.tree = dict(self.watch.tree)
            if self.last_gpu_sample is not None:
                # Not found (a container behind a port forwarder): every process on the GPUs.
                self.peers = gpu_peers(self.last_gpu_sample, self.found.tree)
            out = roles(self.found, self.peers)
        for pid in self.extra:
            out.setdefault(pid, "watched")
        return out


class _BaselineTraffic:
    """The server's own request counter during the baseline (before soak sends anything):
    the production rate projections use when the user gives none."""

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []
        self.open = True

    def on_sample(self, _name: str, record: Any) -> None:
        if self.open and isinstance(record, MetricsSample) and record.requests_total is not None:
            self.points.append((record.t, record.requests_total))

    def rate(self) -> tuple[float | None, dict[str, Any]]:
        self.open = False
        if len(self.points) < 2:
            return None, {"samples": len(self.points)}
        (t0, n0), (t1, n1) = self.points[0], self.points[-1]
        data = {"samples": len(self.points), "requests": n1 - n0, "seconds": t1 - t0}
        if t1 - t0 <= 0 or n1 < n0:  # a counter reset (restart) says nothing about the rate
            return None, data
        rate = (n1 - n0) / (t1 - t0)
        data["rate_rps"] = rate
        return (rate if rate > 0 else None), data


# Why the traffic stopped when the first round showed the requests cannot work (the run's
# `stopped` event and end mark; the analysis reads it: exit 2 for auth, 1 for a failing server).
STOPPED_AUTH = "auth-failed"
STOPPED_FAILING = "requests-failed"
AUTH_SHARE = 0.9  # above this share of 401/403 answers in round 1, the key is wrong or missing


class _FirstRoundCheck:
    """Round 1's outcomes as they come: when the round is over and no request succeeded (or
    more than `AUTH_SHARE` were refused with 401/403), sending more rounds measures nothing.
    `verdict()` then gives (stopped_by, one line for the user); else None."""

    def __init__(self, round_size: int, key_given: bool) -> None:
        self.round_size = max(1, round_size)
        self.key_given = key_given
        self.done = 0
        self.ok = 0
        self.refused = 0
        self.statuses: dict[str, int] = {}
        self.first_error: str | None = None
        self.checked = False
        self._lock = threading.Lock()

    def add(self, outcome: Outcome) -> tuple[str, str] | None:
        """Count one round-1 outcome; the stop decision once the round is complete."""
        with self._lock:
            if self.checked:
                return None
            self.done += 1
            if outcome.kind in ("ok", "aborted"):
                self.ok += 1
            else:
                what = f"HTTP {outcome.status}" if outcome.status is not None else outcome.kind
                self.statuses[what] = self.statuses.get(what, 0) + 1
                if outcome.status in (401, 403):
                    self.refused += 1
                if self.first_error is None and outcome.detail:
                    self.first_error = outcome.detail
            if self.done < self.round_size:
                return None
            self.checked = True
            return self.verdict()

    def verdict(self) -> tuple[str, str] | None:
        counts = ", ".join(
            f"{n} x {what}" for what, n in sorted(self.statuses.items(), key=lambda x: -x[1])
        )
        if self.refused > AUTH_SHARE * self.done:
            fix = (
                "the key given with --api-key (or $OPENAI_API_KEY / $VRAMDOCTOR_API_KEY) is not "
                "accepted: pass the server's key with --api-key"
                if self.key_given
                else "the server wants an API key; pass it with --api-key (or $OPENAI_API_KEY)"
            )
            return STOPPED_AUTH, (
                f"stopped after round 1: {self.refused} of {self.done} requests "
                f"refused as unauthorized ({counts}); {fix}"
            )
        if self.ok == 0:
            first = f"; first error: {self.first_error[:120]}" if self.first_error else ""
            return STOPPED_FAILING, (
                f"stopped after round 1: none of its {self.done} requests "
                f"succeeded ({counts}{first}): the server is failing, so "
                "memory was never exercised"
            )
        return None


def run_soak(
    config: SoakConfig,
    *,
    hooks: Sequence[RoundHook] = (),
    notify: Notify | None = None,
    progress: Callable[[ProtocolState], None] | None = None,
    on_result: Callable[[PlannedRequest, Outcome], None] | None = None,
    on_sample: Callable[[str, Any], None] | None = None,
    argv: list[str] | None = None,
    before_run: Callable[[Protocol], Any] | None = None,
) -> SoakOutcome:
    """Run a soak and analyse it.

    Raises InputError / SourceUnavailable (one-line messages) before anything is recorded
    when the settings or the server cannot be used. `hooks` run at the end of each idle
    window; `notify` receives notes for the user; `progress`, `on_result` and `on_sample` feed
    a live view; `before_run(protocol)` may return a context manager entered around the
    protocol (the CLI's live display). KeyboardInterrupt during the measurement is caught:
    the outcome then has status "interrupted" and the analysis of what was measured. One
    before the run file exists raises `Interrupted` ("interrupted before measuring", exit
    130); one while the partial report is analysed raises `Interrupted` naming the kept file.
    """
    made: list[RunWriter] = []
    try:
        return _run_soak(
            config,
            hooks=hooks,
            notify=notify,
            progress=progress,
            on_result=on_result,
            on_sample=on_sample,
            argv=argv,
            before_run=before_run,
            made=made,
        )
    except KeyboardInterrupt:
        if not made:
            raise Interrupted(
                "interrupted before measuring: nothing was sent or recorded"
            ) from None
        writer = made[0]
        with contextlib.suppress(Exception):
            if not writer.closed:
                writer.close("interrupted", stopped_by="interrupt")
        raise Interrupted(
            f"interrupted; the run file is kept: {writer.path} (re-analyse: "
            f"vramdoctor report {writer.path})"
        ) from None


def _run_soak(
    config: SoakConfig,
    *,
    hooks: Sequence[RoundHook] = (),
    notify: Notify | None = None,
    progress: Callable[[ProtocolState], None] | None = None,
    on_result: Callable[[PlannedRequest, Outcome], None] | None = None,
    on_sample: Callable[[str, Any], None] | None = None,
    argv: list[str] | None = None,
    before_run: Callable[[Protocol], Any] | None = None,
    made: list[RunWriter],
) -> SoakOutcome:
    """`run_soak`'s body; `made` receives the run file's writer as soon as it exists."""
    cfg = config.validate()
    say: Notify = notify or (lambda _m: None)
    key = cfg.resolved_api_key
    register_secret(key)  # masked wherever it comes back (a model id, an error body)
    headers = {"Authorization": f"Bearer {key}"} if key else None
    images = prompt_images(cfg)
    run_path = cfg.out or default_run_path()
    if run_path.exists():
        raise InputError(f"run file {run_path} already exists; choose another --out")

    # --- what is the server (before sending anything) ---------------------------------------
    base = base_url(cfg.url)
    info = identify(base, headers, model=cfg.model)
    say(f"server: {info.describe()} at {redact_url(base)}")
    for note in info.notes:
        say(note)
    send_model = cfg.model or info.model or "default"
    plan = build_requests(
        cfg.requests,
        model=send_model,
        images=images,
        max_tokens=cfg.max_tokens,
        text_only=cfg.text_only,
        api=cfg.api,
        stream=cfg.stream,
        abort_fraction=cfg.abort_fraction,
    )

    # --- sources ----------------------------------------------------------------------------
    found = discover_server(base)
    watch = ServerWatch(base, found)
    roles_fn = _Roles(watch, found, cfg.pids)
    gpu_src, gpu_note = _gpu_source(cfg, found.remote)
    notes = [n for n in info.notes]
    if gpu_note:
        say(gpu_note)
        notes.append(gpu_note)
    if found.found:
        say("server processes: " + ", ".join(f"{p} ({n})" for p, n in sorted(found.tree.items())))
    elif found.reason:
        say(f"server processes not found: {found.reason}")
        notes.append(found.reason)
    sources: dict[str, Any] = {}
    if gpu_src is not None:
        sources["gpu"] = gpu_src
    if found.found or cfg.pids or (gpu_src is not None and not found.remote):
        # /proc/PID/maps of a large server has thousands of lines; arenas change slowly: every ~2 s.
        sources["host"] = HostSource(roles_fn, maps_every=max(1, round(2.0 / cfg.interval_s)))
    if not sources:
        raise SourceUnavailable(
            "nothing to measure: no GPU source and the server's processes are not on this host; "
            "pass --gpu-metrics http://HOST:9400/metrics (dcgm-exporter or nvitop-exporter)"
        )
    try:
        from vramdoctor.sources.server_metrics import ServerMetricsSource

        msrc = ServerMetricsSource(base, headers=headers, page_size_tokens=info.page_size_tokens)
        msrc.sample()
        sources["metrics"] = msrc
    except SourceUnavailable as exc:
        note = f"no server /metrics ({exc}): the KV-pool layer is not measured; memory only"
        say(note)
        notes.append(note)

    devices: list[dict[str, Any]] = []
    if gpu_src is not None and hasattr(gpu_src, "devices"):
        with contextlib.suppress(Exception):
            devices = gpu_src.devices()
    record_cfg = cfg.to_record()
    record_cfg.update(
        {
            "baseline_s": cfg.baseline,
            "idle_s": cfg.idle_s,
            "model": send_model,
            "images": [img.label for img in images],
            "sources": sorted(sources),
            "server": info.to_dict(),
            "server_pids": found.root_pids,
            "server_tree": {str(k): v for k, v in found.tree.items()},
            "notes": notes,
            "max_rounds": cfg.rounds_cap,
            # glibc's arena cap is 8 x cores unless MALLOC_ARENA_MAX says otherwise (the host
            # layer's bound on arena growth): this host's cores, the server's own setting.
            "cpu_count": os.cpu_count() if not found.remote else None,
            "server_malloc_arena_max": _malloc_arena_max(found.root_pids),
        }
    )
    # Imported before the run file exists: scipy takes a second to import, and a Ctrl-C in that
    # second must land inside the try below (partial report, run file closed), not before it.
    from vramdoctor.soak import analysis as _analysis  # noqa: F401

    header = make_header(
        "soak",
        argv=argv,
        target=base,
        gpus=devices,
        config=record_cfg,
        secrets=[key] if key else [],
    )
    # Ctrl-C and SIGTERM are held from the run file's creation until the measurement's `try`:
    # one that lands in the set-up is delivered there, so it too gives a partial report.
    hold = contextlib.ExitStack()
    hold.enter_context(interrupts_held())
    try:
        writer = RunWriter(run_path, header)
        made.append(writer)
        run_dir = run_path.parent

        ticks = [0]

        def extra() -> list[Any]:
            ticks[0] += 1
            if ticks[0] % 20 != 1:
                return []
            mono, wall = now()
            return [{"kind": "host_memory", "t": mono, "wall": wall, **host_memory()}]

        collector = Collector(writer, sources, interval=cfg.interval_s, extra=extra)
        collector.add_listener(roles_fn.on_sample)
        baseline_traffic = _BaselineTraffic()
        collector.add_listener(baseline_traffic.on_sample)
        if on_sample is not None:
            collector.add_listener(on_sample)
        client = LoadClient(base, key, timeout=cfg.timeout_s)
        proto_cfg = ProtocolConfig(
            rounds=cfg.rounds,
            concurrency=cfg.concurrency,
            idle_s=cfg.idle_s,
            baseline_s=cfg.baseline,
            max_requests=cfg.max_requests,
            duration_s=cfg.duration_s,
            max_rounds=cfg.rounds_cap if cfg.adapt else None,
            abort_fraction=cfg.abort_fraction,
        )
        production = [cfg.production_rate_rps]

        def more_rounds(_state: ProtocolState) -> list[tuple[str, str]]:
            run = writer.read_back()  # the file, plus memory when the disk filled
            return undecided_layers(analyse_run(run, production_rate_rps=production[0]))

        def on_idle_end(rnd: int) -> None:
            if rnd == 0:
                rate, data = baseline_traffic.rate()
                writer.write(Event(*now(), name="baseline_traffic", data=data))
                if production[0] is None and rate is not None:
                    production[0] = rate
                    say(
                        f"production rate from the server's own counters during the baseline: "
                        f"{rate * 3600:.0f} requests/hour"
                    )
            for hook in hooks:
                try:
                    hook(rnd, run_dir)
                except Exception as exc:  # a hook must not end the measurement
                    writer.write(
                        Event(
                            *now(),
                            name="source_error",
                            data={
                                "source": f"round-hook {getattr(hook, '__name__', type(hook).__name__)}",
                                "error": f"{type(exc).__name__}: {exc}"[:300],
                            },
                        )
                    )

        first_round = _FirstRoundCheck(
            min(len(plan), cfg.max_requests or len(plan)), key_given=key is not None
        )
        refused: list[str] = []

        def on_request(req: PlannedRequest, outcome: Outcome) -> None:
            if outcome.kind == "connection":
                for _name, data in watch.connection_failed():
                    protocol.server_died(str(data.get("reason")), pid=data.get("pid"))
            if protocol.state.round == 1 and outcome.kind != "connection":
                stop = first_round.add(outcome)
                if stop is not None and protocol.state.server_died is None:
                    protocol.state.stopped_by = stop[0]
                    refused.append(stop[1])
                    protocol.stop.set()  # no idle window, no more rounds: they would measure nothing
            if on_result is not None:
                on_result(req, outcome)

        protocol = Protocol(
            proto_cfg,
            client=client,
            plan=plan,
            writer=writer,
            on_result=on_request,
            progress=progress,
            more_rounds=more_rounds if cfg.adapt else None,
            on_idle_end=on_idle_end,
        )

        # A sampler that dies (COLLECTOR_FAILED) ends the traffic: the rest could not be measured.
        collector.on_failure = lambda _reason: protocol.stop.set()
        stop_watch = threading.Event()

        def watch_loop() -> None:
            while not stop_watch.wait(min(1.0, max(0.2, cfg.interval_s * 2))):
                try:
                    events = watch.check()
                except Exception:
                    continue
                for name, data in events:
                    if name == SERVER_DIED:
                        protocol.server_died(str(data.get("reason")), pid=data.get("pid"))
                    else:
                        writer.write(Event(*now(), name=name, data=dict(data)))

        watcher = threading.Thread(target=watch_loop, name="vramdoctor-server-watch", daemon=True)
    except BaseException:
        hold.close()
        raise
    status = "complete"
    try:
        hold.close()  # a Ctrl-C held during the set-up is raised here
        collector.tick()  # one sample before anything else: the first point of every series
        collector.start()
        watcher.start()
        ctx = before_run(protocol) if before_run is not None else None
        with ctx if ctx is not None else contextlib.nullcontext():
            protocol.run()
    except KeyboardInterrupt:
        status = "interrupted"
        say("interrupted: stopped sending; reporting on what was measured")
    finally:
        protocol.stop.set()
        stop_watch.set()
        collector.stop()
        with contextlib.suppress(Exception):
            collector.tick()
        with contextlib.suppress(Exception):  # a death seen only now (e.g. during the last idle)
            for name, data in watch.check():
                if name == SERVER_DIED:
                    protocol.server_died(str(data.get("reason")), pid=data.get("pid"))
        stopped = protocol.state.stopped_by
        if stopped and stopped != "interrupt":
            writer.write(Event(*now(), name="stopped", data={"by": stopped}))
        if collector.failed and status == "complete":
            status = "failed"  # exit code non-zero; the report says sampling stopped and why
        writer.close(
            status, stopped_by=stopped, **({"error": collector.failed} if collector.failed else {})
        )
        for src in sources.values():
            with contextlib.suppress(Exception):
                src.close()
    state = protocol.state
    if refused:
        say(refused[0])
    if state.server_died is not None:
        say(
            f"the server died ({state.server_died.get('reason')}) in round {state.round}: "
            "no request was sent after it; the rounds it cut short carry no verdict"
        )
    elif state.stopped_by == "max-rounds" and state.undecided:
        say(
            "still undecided after --max-rounds: "
            + "; ".join(f"{layer}: {why}" for layer, why in state.undecided)
        )
    run = writer.read_back()  # the file, plus what only memory holds if the disk filled
    analysis = analyse_run(run, production_rate_rps=production[0])
    return SoakOutcome(
        run_path=run_path,
        status=run.status if run.end else status,
        stopped_by=state.stopped_by,
        rounds=len(state.results),
        server=info,
        server_died=state.server_died,
        undecided=list(state.undecided),
        production_rate_rps=production[0],
        notes=notes,
        analysis=analysis,
    )
