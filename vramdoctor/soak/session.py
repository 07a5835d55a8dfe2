"""A soak as named steps: launch, identify, open sources, start, measure, stop, analyse.

    from vramdoctor.soak import SoakConfig, SoakSession
    session = SoakSession(SoakConfig(url="http://127.0.0.1:30000"), hooks=[MyHook()])
    outcome = session.run()          # every step below, in order; the server stopped if launched

`run()` is `launch()` (only with `SoakConfig.launch`: start the server under the keeper and
wait until it answers) -> `identify()` (what the server is, the request plan) ->
`open_sources()` (GPU by NVML or an exporter, host memory of the server's processes, the
server's /metrics) -> `start()` (the run file, the sampler, the protocol, the server watch) ->
`measure()` (baseline, rounds with idle windows, adaptive rounds; a Ctrl-C ends it with a
partial run) -> `stop()` (samplers and watch stopped, the launched server stopped and its log
diagnosed, the run file closed) -> `analyse()` (the `SoakOutcome`). Library code: nothing is
printed; what a user should know goes through `notify`.

**Hooks are the extension point** (`SoakHook`; every method optional, each called on the
step's thread with the session): inside evidence and attribution (`on_idle_end`), varied
traffic and lifecycle cycles (`before_round` may set `session.plan`; `on_idle_start`),
leftovers after the run (`on_stop`), extra header fields (`header`). A hook that raises after
the run file exists is recorded as a `source_error` event and the soak goes on; one that raises
in `header` stops the soak before anything is sent (InputError: exit 2). The old round hooks,
callables `hook(round_index, run_dir)`, are still accepted and run at each idle window's end.
"""

from __future__ import annotations

import contextlib
import os
import secrets as _secrets
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from typing import Protocol as TypingProtocol

from vramdoctor.errors import ExitCode, InputError, Interrupted, SourceUnavailable
from vramdoctor.record import RunWriter, interrupts_held, make_header
from vramdoctor.redact import redact_url, register_secret
from vramdoctor.samples import (
    LAUNCHED_HANDOVER,
    SERVER_DIED,
    Event,
    GpuSample,
    MetricsSample,
    now,
)
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
from vramdoctor.sources.discover import (
    ServerProcesses,
    ServerWatch,
    discover_server,
    gpu_peers,
    roles,
)
from vramdoctor.sources.host import HostSource, host_memory
from vramdoctor.sources.server_info import ServerInfo, base_url, identify

if TYPE_CHECKING:
    from vramdoctor.soak.launch import LaunchedServer

__all__ = [
    "LAUNCH_EVENT",
    "SERVER_LOG_EVENT",
    "RoundHook",
    "SoakHook",
    "SoakOutcome",
    "SoakSession",
    "default_run_path",
    "run_soak",
]

Notify = Callable[[str], None]

# Run-file events of a launched server (docs/soak.md, "--launch"): how it was started and how
# it stopped, and what its own log says (vramdoctor.diagnose's start-up facts and findings).
LAUNCH_EVENT = "server_launch"
SERVER_LOG_EVENT = "server_log"


class RoundHook(TypingProtocol):
    """The old extension point, still accepted: called at the END of each idle window (round
    0 = the baseline) with the round index and the run directory (the run file's folder), on
    the protocol's thread. New code subclasses `SoakHook`."""

    def __call__(self, round_index: int, run_dir: Path) -> None: ...


class SoakHook:
    """A soak's extension point: override the steps you need; each gets the `SoakSession`.

    Order of the calls: `header` (before the run file exists: extra header fields) ->
    `on_start` (run file open, sampling on, before the baseline) -> for each round:
    `before_round(n)` (before its requests; may set `session.plan`), `on_idle_start(n)`
    (its idle window has begun), `on_idle_end(n)` (the window ended; n = 0 is the baseline,
    which has no `before_round`) -> `on_stop` (traffic and sampling stopped, the run file still
    open for records) -> `close` (always, last; also after a failure). `name` names the hook in
    `source_error` events.
    """

    name: str = ""

    def header(self, session: SoakSession) -> Mapping[str, Any]:
        """Extra fields for the run header's config (JSON-able); {} by default."""
        return {}

    def on_start(self, session: SoakSession) -> None:
        """The run file exists and sampling runs; the baseline has not begun."""

    def before_round(self, session: SoakSession, round_index: int) -> None:
        """Before round `round_index` (1..) sends anything; `session.plan` may be replaced."""

    def on_idle_start(self, session: SoakSession, round_index: int) -> None:
        """Round `round_index`'s idle window has begun (its time runs while the hook runs)."""

    def on_idle_end(self, session: SoakSession, round_index: int) -> None:
        """An idle window ended (0 = the baseline): e.g. inside evidence, snapshots."""

    def on_stop(self, session: SoakSession) -> None:
        """Traffic, sampling and the server watch stopped; the run file is still open."""

    def close(self, session: SoakSession) -> None:
        """Always called once at the end (release what the hook holds)."""

    def more_rounds(
        self, session: SoakSession, undecided: list[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """After an idle window from the planned last round on: the (layer, reason) pairs that
        still need a round, given what the hooks before said (`undecided`); unchanged by
        default. soak --vary / --cycle answer for their own designs."""
        return undecided


class _CallableHook(SoakHook):
    """An old-style round hook `hook(round_index, run_dir)`."""

    def __init__(self, fn: RoundHook) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def on_idle_end(self, session: SoakSession, round_index: int) -> None:
        self.fn(round_index, session.run_dir)


def _as_hook(h: SoakHook | RoundHook) -> SoakHook:
    return h if isinstance(h, SoakHook) else _CallableHook(h)


def _hook_name(h: SoakHook) -> str:
    return h.name or type(h).__name__


@dataclass
class SoakOutcome:
    """What a soak run gave: where its data is, how it ended, and the analysis.

    `status`: complete, interrupted or failed (the run file's end mark). `stopped_by`: why the
    protocol stopped early (interrupt, duration, max-requests, max-rounds, server-died) or None.
    `server_died`: the SERVER_DIED data (reason, pid, round) when the server died. `analysis`:
    the soak analysis of the run file (`vramdoctor.judge`). `launched`: the launched server's
    record (`LaunchedServer.to_record()`: command, pid, log, how it stopped) or None.
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
    launched: dict[str, Any] | None = None

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
    """The images every round sends (none for text-only or the completions API)."""
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

    def __init__(
        self,
        watch: ServerWatch,
        found: ServerProcesses,
        extra_pids: Iterable[int],
        launched: Callable[[], dict[int, str]] | None = None,
    ) -> None:
        self.watch = watch
        self.found = found
        self.extra = list(extra_pids)
        self.launched = launched
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
        if self.launched is not None:
            # --launch: every process seen below the keeper is the server's (a double-forked or
            # setsid helper is re-parented to the keeper, a child subreaper, not to the tree).
            for pid in self.launched():
                if out.get(pid) in (None, "gpu-peer", "gpu-process"):
                    out[pid] = "child"
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
        data: dict[str, Any] = {
            "samples": len(self.points),
            "requests": n1 - n0,
            "seconds": t1 - t0,
        }
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


class SoakSession:
    """One soak, step by step (see the module docstring). Attributes hooks may read, once their
    step has run: `config` (validated), `base` (the base URL), `headers` (the Authorization
    header, or None), `info` (`ServerInfo`), `found` and `watch` (the server's processes),
    `sources` (name -> source), `writer` (the run file), `run_path`, `run_dir`, `protocol`,
    `plan` (the requests of a round; settable), `launched` (`LaunchedServer` or None),
    `notes` (what the user was told)."""

    def __init__(
        self,
        config: SoakConfig,
        *,
        hooks: Sequence[SoakHook | RoundHook] = (),
        notify: Notify | None = None,
        progress: Callable[[ProtocolState], None] | None = None,
        on_result: Callable[[PlannedRequest, Outcome], None] | None = None,
        on_sample: Callable[[str, Any], None] | None = None,
        argv: list[str] | None = None,
        before_run: Callable[[Protocol], Any] | None = None,
    ) -> None:
        self.config = config.validate()
        self.hooks = [_as_hook(h) for h in hooks]
        self.say: Notify = notify or (lambda _m: None)
        self.progress = progress
        self.on_result = on_result
        self.on_sample = on_sample
        self.argv = argv
        self.before_run = before_run
        self.key = self.config.resolved_api_key
        register_secret(self.key)  # masked wherever it comes back (a model id, an error body)
        self.headers: dict[str, str] | None = (
            {"Authorization": f"Bearer {self.key}"} if self.key else None
        )
        self.run_path: Path = self.config.out or default_run_path()
        self.run_dir: Path = self.run_path.parent
        self.notes: list[str] = []
        self.launched: LaunchedServer | None = None
        self.base = ""
        self.info: ServerInfo | None = None
        self.found: ServerProcesses | None = None
        self.watch: ServerWatch | None = None
        self.sources: dict[str, Any] = {}
        self.writer: RunWriter | None = None
        self.protocol: Protocol | None = None
        self.collector: Collector | None = None
        self.status = "complete"
        self.production_rate_rps = self.config.production_rate_rps
        self._plan: Sequence[PlannedRequest] = ()
        self._refused: list[str] = []
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None
        self._phase_seen: set[tuple[str, int]] = set()
        self._stopped = False
        self._handed_over = False  # the launched process exited after a successor took its port
        self._closed_hooks = False
        self._owned: list[Any] = []  # hooks the session made (attribution): it closes them
        self.send_model = ""
        self.images: list[PromptImage] = []
        self.devices: list[dict[str, Any]] = []
        self.roles: _Roles | None = None
        self._hold = contextlib.ExitStack()
        self._baseline_traffic = _BaselineTraffic()
        self._first_round = _FirstRoundCheck(1, key_given=False)
        self._below_keeper: dict[int, tuple[float, str]] = {}  # pid -> (start time, name)
        self._keeper_lock = threading.Lock()

    # --- what hooks use ------------------------------------------------------------------------

    @property
    def plan(self) -> Sequence[PlannedRequest]:
        """The requests each round sends (in order). A hook's `before_round` may set it: the
        round about to start and the later ones send the new plan."""
        return self._plan

    @plan.setter
    def plan(self, requests: Sequence[PlannedRequest]) -> None:
        self._plan = requests  # a lazy plan stays lazy (a round may hold 10^9 requests)
        if self.protocol is not None:
            self.protocol.plan = self._plan

    def event(self, name: str, data: Mapping[str, Any] | None = None) -> None:
        """Write one `Event` to the run file now (a hook's own marks)."""
        if self.writer is None:
            raise RuntimeError("the run file does not exist yet (before start())")
        self.writer.write(Event(*now(), name=name, data=dict(data or {})))

    def server_pids(self) -> dict[int, str]:
        """The server's processes now: pid -> name (the port owner's tree, as watched; with
        --launch also every process seen below the keeper that still runs)."""
        if self.watch is not None:
            out = dict(self.watch.tree)
        else:
            out = dict(self.found.tree) if self.found is not None else {}
        for pid, name in self.launched_processes().items():
            out.setdefault(pid, name)
        return out

    def launched_processes(self) -> dict[int, str]:
        """With --launch: every process ever seen below the keeper that still runs as the same
        process (pid and start time), pid -> name; {} without --launch. The keeper is a child
        subreaper, so a helper that double-forks or calls setsid stays below it: it is the
        server's, though the port owner's tree no longer holds it."""
        launched = self.launched
        keeper = getattr(launched, "keeper", None)
        if launched is None or keeper is None:
            return {}
        import psutil

        with self._keeper_lock:
            try:
                kept_by = psutil.Process(keeper.pid)
                uid = kept_by.uids().real
                below = kept_by.children(recursive=True)
            except psutil.Error:
                uid, below = None, []
            for proc in below:
                if proc.pid in self._below_keeper:
                    continue
                try:
                    if uid is not None and proc.uids().real != uid:
                        continue  # it made itself another user: another owner's process
                    self._below_keeper[proc.pid] = (proc.create_time(), proc.name())
                except psutil.Error:
                    continue
            out: dict[int, str] = {}
            for pid, (started, name) in list(self._below_keeper.items()):
                try:
                    same = psutil.Process(pid).create_time() == started
                except psutil.Error:
                    same = False
                if same:
                    out[pid] = name
                else:
                    del self._below_keeper[pid]
            return out

    # --- the whole run ---------------------------------------------------------------------------

    def run(self) -> SoakOutcome:
        """Every step in order; the outcome with its analysis.

        Raises InputError / SourceUnavailable (one-line messages; `LaunchFailed` with the
        server's last log lines) before anything is recorded when the settings or the server
        cannot be used. A KeyboardInterrupt during the measurement gives status
        "interrupted" and the analysis of what was measured; one before the run file exists
        raises `Interrupted` ("interrupted before measuring", exit 130); one later (while
        stopping or analysing) raises `Interrupted` naming the kept run file. A launched
        server is stopped on every path."""
        try:
            try:
                self.launch()
                self.identify()
                self.open_sources()
                self.start()
                self.measure()
                self.stop()
                return self.analyse()
            finally:
                self._stop_launched()
                self._close_hooks()
        except KeyboardInterrupt:
            writer = self.writer
            if writer is None:
                raise Interrupted(
                    "interrupted before measuring: nothing was sent or recorded"
                ) from None
            with contextlib.suppress(Exception):
                if not writer.closed:
                    writer.close("interrupted", stopped_by="interrupt")
            raise Interrupted(
                f"interrupted; the run file is kept: {writer.path} (re-analyse: "
                f"vramdoctor report {writer.path})"
            ) from None

    # --- the steps --------------------------------------------------------------------------------

    def launch(self) -> None:
        """With `config.launch`: start the server (its own process group, under the keeper,
        the agent in its environment, output in the run folder) and wait until it answers.
        Raises LaunchFailed (its last log lines attached) when it exits or never answers."""
        spec = self.config.launch_spec()
        if spec is None:
            return
        from vramdoctor.soak.launch import LaunchFailed, launch

        if self.run_path.exists():
            raise InputError(f"run file {self.run_path} already exists; choose another --out")
        self.launched = launch(spec, run_dir=self.run_dir, stem=self.run_path.stem)
        self.say(
            f"launched: pid {self.launched.pid}, output in {self.launched.log_path}; waiting "
            f"up to {spec.startup_timeout_s:g} s for {redact_url(self.config.url)} to answer"
        )
        try:
            took = self.launched.wait_ready(self.config.url, headers=self.headers)
        except LaunchFailed as exc:
            if exc.log_tail:
                self.say(f"the server's last log lines ({exc.log_path}):")
                for line in exc.log_tail:
                    self.say("  " + line)
            raise
        self.say(f"the launched server answers after {took:.1f} s")

    def identify(self) -> None:
        """What the server is (SGLang, vLLM, any OpenAI-compatible), the model to send and the
        request plan. Raises SourceUnavailable when nothing OpenAI-like answers."""
        cfg = self.config
        images = prompt_images(cfg)
        if self.run_path.exists() and self.launched is None:
            raise InputError(f"run file {self.run_path} already exists; choose another --out")
        self.base = base_url(cfg.url)
        self.info = identify(self.base, self.headers, model=cfg.model)
        self.say(f"server: {self.info.describe()} at {redact_url(self.base)}")
        for note in self.info.notes:
            self.say(note)
        self.send_model = cfg.model or self.info.model or "default"
        self.images = images
        self._plan = build_requests(
            cfg.requests,
            model=self.send_model,
            images=images,
            max_tokens=cfg.max_tokens,
            text_only=cfg.text_only,
            api=cfg.api,
            stream=cfg.stream,
            abort_fraction=cfg.abort_fraction,
        )

    def open_sources(self) -> None:
        """The server's processes and every memory source that reaches them. Raises
        SourceUnavailable when nothing can be measured."""
        cfg = self.config
        assert self.info is not None
        self.found = found = discover_server(self.base)
        self.watch = ServerWatch(self.base, found)
        self.roles = _Roles(
            self.watch,
            found,
            cfg.pids,
            launched=self.launched_processes if self.launched is not None else None,
        )
        gpu_src, gpu_note = _gpu_source(cfg, found.remote)
        if gpu_src is not None and hasattr(gpu_src, "server_pids") and found.found:
            # Whose process each NVML row is: the server's tree as watched now (and
            # --pid); every other process on its GPUs is another tenant, never deciding.
            extra = {int(p) for p in cfg.pids or ()}
            gpu_src.server_pids = lambda: {*self.server_pids(), *extra}
        self.notes = list(self.info.notes)
        if gpu_note:
            self.say(gpu_note)
            self.notes.append(gpu_note)
        if found.found:
            self.say(
                "server processes: "
                + ", ".join(f"{p} ({n})" for p, n in sorted(found.tree.items()))
            )
        elif found.reason:
            self.say(f"server processes not found: {found.reason}")
            self.notes.append(found.reason)
        sources: dict[str, Any] = {}
        if gpu_src is not None:
            sources["gpu"] = gpu_src
        if found.found or cfg.pids or (gpu_src is not None and not found.remote):
            # /proc/PID/maps of a large server has thousands of lines; arenas change slowly: every ~2 s.
            sources["host"] = HostSource(self.roles, maps_every=max(1, round(2.0 / cfg.interval_s)))
        if not sources:
            raise SourceUnavailable(
                "nothing to measure: no GPU source and the server's processes are not on this host; "
                "pass --gpu-metrics http://HOST:9400/metrics (dcgm-exporter or nvitop-exporter)"
            )
        try:
            from vramdoctor.sources.server_metrics import ServerMetricsSource

            msrc = ServerMetricsSource(
                self.base, headers=self.headers, page_size_tokens=self.info.page_size_tokens
            )
            msrc.sample()
            sources["metrics"] = msrc
        except SourceUnavailable as exc:
            note = f"no server /metrics ({exc}): the KV-pool layer is not measured; memory only"
            self.say(note)
            self.notes.append(note)
        self.sources = sources
        self._attribution_hook()
        from vramdoctor.soak.variations import variation_hooks  # --vary / --cycle

        self.hooks.extend(variation_hooks(self))

    def _attribution_hook(self) -> None:
        """The agent's hooks (`vramdoctor.attribution.soak_hook.soak_hooks`): inside evidence
        whenever the agent is in the server (found in the server processes' environment, or
        `--attribute DIR`), snapshots with `--attribute`; InputError for an unusable value."""
        from vramdoctor.attribution.soak_hook import soak_hooks

        for hook in soak_hooks(self):
            self.hooks.append(hook)

    def _header_config(self) -> dict[str, Any]:
        cfg = self.config
        assert self.info is not None and self.found is not None
        found = self.found
        gpu_src = self.sources.get("gpu")
        self.devices = []
        if gpu_src is not None and hasattr(gpu_src, "devices"):
            with contextlib.suppress(Exception):
                self.devices = gpu_src.devices()
        record_cfg = cfg.to_record()
        record_cfg.update(
            {
                "baseline_s": cfg.baseline,
                "idle_s": cfg.idle_s,
                "model": self.send_model,
                "images": [img.label for img in self.images],
                "sources": sorted(self.sources),
                "server": self.info.to_dict(),
                "server_pids": found.root_pids,
                "server_tree": {str(k): v for k, v in found.tree.items()},
                "notes": self.notes,
                "max_rounds": cfg.rounds_cap,
                # glibc's arena cap is 8 x cores unless MALLOC_ARENA_MAX says otherwise (the host
                # layer's bound on arena growth): this host's cores, the server's own setting.
                "cpu_count": os.cpu_count() if not found.remote else None,
                "server_malloc_arena_max": _malloc_arena_max(found.root_pids),
            }
        )
        if self.launched is not None:
            record_cfg["launch"] = self.launched.to_record()
        for hook in self.hooks:
            extra = hook.header(self)
            if extra:
                record_cfg.update(dict(extra))
        return record_cfg

    def start(self) -> None:
        """The run file (its header: settings, server, sources, hooks' fields), the sampler,
        the protocol and the server watch; nothing runs yet. Ctrl-C and SIGTERM are held from
        the run file's creation until `measure()`, so one landing here gives a partial report."""
        cfg = self.config
        record_cfg = self._header_config()
        # Imported before the run file exists: scipy takes a second to import, and a Ctrl-C in that
        # second must land inside the measurement's try (partial report, run file closed), not here.
        from vramdoctor.soak import analysis as _analysis  # noqa: F401

        header = make_header(
            "soak",
            argv=self.argv,
            target=self.base,
            gpus=self.devices,
            config=record_cfg,
            secrets=[self.key] if self.key else [],
        )
        self._hold = contextlib.ExitStack()
        self._hold.enter_context(interrupts_held())
        try:
            self._build(cfg, header)
        except BaseException:
            self._hold.close()
            raise

    def _build(self, cfg: SoakConfig, header: dict[str, Any]) -> None:
        writer = self.writer = RunWriter(self.run_path, header)
        ticks = [0]

        def extra() -> list[Any]:
            ticks[0] += 1
            if ticks[0] % 20 != 1:
                return []
            mono, wall = now()
            return [{"kind": "host_memory", "t": mono, "wall": wall, **host_memory()}]

        collector = self.collector = Collector(
            writer, self.sources, interval=cfg.interval_s, extra=extra
        )
        assert self.roles is not None
        collector.add_listener(self.roles.on_sample)
        self._baseline_traffic = _BaselineTraffic()
        collector.add_listener(self._baseline_traffic.on_sample)
        if self.on_sample is not None:
            collector.add_listener(self.on_sample)
        client = LoadClient(self.base, self.key, timeout=cfg.timeout_s)
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
        self._first_round = _FirstRoundCheck(
            min(len(self._plan), cfg.max_requests or len(self._plan)),
            key_given=self.key is not None,
        )
        self.protocol = Protocol(
            proto_cfg,
            client=client,
            plan=self._plan,
            writer=writer,
            on_result=self._on_request,
            progress=self._on_progress,
            more_rounds=self._more_rounds if cfg.adapt else None,
            on_idle_end=self._on_idle_end,
        )
        protocol = self.protocol
        # A sampler that dies (COLLECTOR_FAILED) ends the traffic: the rest could not be measured.
        collector.on_failure = lambda _reason: protocol.stop.set()
        self._watcher = threading.Thread(
            target=self._watch_loop, name="vramdoctor-server-watch", daemon=True
        )

    def measure(self) -> None:
        """Baseline, rounds and idle windows (more rounds while a layer is undecided). A Ctrl-C
        (or SIGTERM, as the CLI maps it) stops sending: status "interrupted", nothing lost."""
        assert self.protocol is not None and self.collector is not None
        assert self._watcher is not None
        try:
            self._hold.close()  # a Ctrl-C held during the set-up is raised here
            self.collector.tick()  # one sample before anything else: the first point of every series
            self.collector.start()
            self._watcher.start()
            self._call("on_start")
            ctx = self.before_run(self.protocol) if self.before_run is not None else None
            with ctx if ctx is not None else contextlib.nullcontext():
                self.protocol.run()
        except KeyboardInterrupt:
            self.status = "interrupted"
            self.say("interrupted: stopped sending; reporting on what was measured")

    def stop(self) -> None:
        """Stop sending, sampling and watching; hooks' `on_stop`; the launched server stopped
        and its own log diagnosed (both recorded as events); the run file closed. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        protocol, collector, writer = self.protocol, self.collector, self.writer
        assert protocol is not None and collector is not None and writer is not None
        protocol.stop.set()
        self._stop_watch.set()
        collector.stop()
        with contextlib.suppress(Exception):
            collector.tick()
        with contextlib.suppress(Exception):  # a death seen only now (e.g. during the last idle)
            assert self.watch is not None
            for name, data in self.watch.check():
                if name == SERVER_DIED:
                    protocol.server_died(str(data.get("reason")), pid=data.get("pid"))
        stopped = protocol.state.stopped_by
        if stopped and stopped != "interrupt":
            writer.write(Event(*now(), name="stopped", data={"by": stopped}))
        self._call("on_stop")
        self._stop_launched()
        if collector.failed and self.status == "complete":
            self.status = "failed"  # exit code non-zero; the report says sampling stopped and why
        writer.close(
            self.status,
            stopped_by=stopped,
            **({"error": collector.failed} if collector.failed else {}),
        )
        for src in self.sources.values():
            with contextlib.suppress(Exception):
                src.close()

    def analyse(self) -> SoakOutcome:
        """The run file read back and analysed: the `SoakOutcome`."""
        protocol, writer = self.protocol, self.writer
        assert protocol is not None and writer is not None and self.info is not None
        state = protocol.state
        if self._refused:
            self.say(self._refused[0])
        if state.server_died is not None:
            self.say(
                f"the server died ({state.server_died.get('reason')}) in round {state.round}: "
                "no request was sent after it; the rounds it cut short carry no verdict"
            )
        elif state.stopped_by == "max-rounds" and state.undecided:
            self.say(
                "still undecided after --max-rounds: "
                + "; ".join(f"{layer}: {why}" for layer, why in state.undecided)
            )
        run = writer.read_back()  # the file, plus what only memory holds if the disk filled
        analysis = analyse_run(run, production_rate_rps=self.production_rate_rps)
        return SoakOutcome(
            run_path=self.run_path,
            status=run.status if run.end else self.status,
            stopped_by=state.stopped_by,
            rounds=len(state.results),
            server=self.info,
            server_died=state.server_died,
            undecided=list(state.undecided),
            production_rate_rps=self.production_rate_rps,
            notes=self.notes,
            analysis=analysis,
            launched=self.launched.to_record() if self.launched is not None else None,
        )

    # --- inside the steps ----------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> None:
        """Each hook's `method`; one that raises is a `source_error` event, never the end."""
        for hook in self.hooks:
            try:
                getattr(hook, method)(self, *args)
            except Exception as exc:  # a hook must not end the measurement
                if self.writer is None or self.writer.closed:
                    continue
                self.writer.write(
                    Event(
                        *now(),
                        name="source_error",
                        data={
                            "source": f"round-hook {_hook_name(hook)}",
                            "error": f"{type(exc).__name__}: {exc}"[:300],
                        },
                    )
                )

    def _close_hooks(self) -> None:
        if self._closed_hooks:
            return
        self._closed_hooks = True
        for hook in self.hooks:
            with contextlib.suppress(Exception):
                hook.close(self)
        for owned in self._owned:
            with contextlib.suppress(Exception):
                owned.close()

    def _more_rounds(self, _state: ProtocolState) -> list[tuple[str, str]]:
        assert self.writer is not None
        run = self.writer.read_back()  # the file, plus memory when the disk filled
        undecided = undecided_layers(analyse_run(run, production_rate_rps=self.production_rate_rps))
        for hook in self.hooks:  # soak --vary / --cycle decide their own extra rounds
            undecided = list(hook.more_rounds(self, undecided))
        return undecided

    def _on_idle_end(self, rnd: int) -> None:
        assert self.writer is not None
        if rnd == 0:
            rate, data = self._baseline_traffic.rate()
            self.writer.write(Event(*now(), name="baseline_traffic", data=data))
            if self.production_rate_rps is None and rate is not None:
                self.production_rate_rps = rate
                self.say(
                    f"production rate from the server's own counters during the baseline: "
                    f"{rate * 3600:.0f} requests/hour"
                )
        self._call("on_idle_end", rnd)

    def _on_progress(self, state: ProtocolState) -> None:
        """The protocol's notifications: phase changes call the hooks (on the protocol's
        thread, before a round's round_start mark, after an idle window's idle_start mark)."""
        key = (state.phase, state.round)
        if key not in self._phase_seen:
            self._phase_seen.add(key)
            if state.phase == "load":
                self._call("before_round", state.round)
            elif state.phase == "idle":
                self._call("on_idle_start", state.round)
        if self.progress is not None:
            self.progress(state)

    def _on_request(self, req: PlannedRequest, outcome: Outcome) -> None:
        protocol, watch = self.protocol, self.watch
        assert protocol is not None and watch is not None
        if outcome.kind == "connection":
            for _name, data in watch.connection_failed():
                protocol.server_died(str(data.get("reason")), pid=data.get("pid"))
        if protocol.state.round == 1 and outcome.kind != "connection":
            stop = self._first_round.add(outcome)
            if stop is not None and protocol.state.server_died is None:
                protocol.state.stopped_by = stop[0]
                self._refused.append(stop[1])
                protocol.stop.set()  # no idle window, no more rounds: they would measure nothing
        if self.on_result is not None:
            self.on_result(req, outcome)

    def _watch_loop(self) -> None:
        protocol, watch, writer = self.protocol, self.watch, self.writer
        assert protocol is not None and watch is not None and writer is not None
        launched = self.launched
        while not self._stop_watch.wait(min(1.0, max(0.2, self.config.interval_s * 2))):
            try:
                events = watch.check()
            except Exception:
                continue
            rc = launched.exited() if launched is not None else None
            if launched is not None and rc is not None and not self._handed_over:
                # The keeper saw the main process end. A server that handed its socket to a
                # successor (a new pid owns the port, still serving) has not died: the soak
                # goes on with the successor, and stopping the launch's group still ends it.
                successor = launched.successor(watch.port) if watch.local else None
                if successor is not None and not watch.dead:
                    self._handed_over = True
                    self.say(
                        f"the launched server (pid {launched.pid}) exited with "
                        f"{_status_text(rc)} after pid {successor} took over its port: "
                        "the soak goes on with the successor"
                    )
                    writer.write(
                        Event(
                            *now(),
                            name=LAUNCHED_HANDOVER,
                            data={"pid": launched.pid, "status": rc, "successor": successor},
                        )
                    )
                else:
                    protocol.server_died(
                        f"the launched server exited with {_status_text(rc)}", pid=launched.pid
                    )
            for name, data in events:
                if name == SERVER_DIED:
                    protocol.server_died(str(data.get("reason")), pid=data.get("pid"))
                else:
                    writer.write(Event(*now(), name=name, data=dict(data)))

    def _stop_launched(self) -> None:
        """Stop the launched server (if any, once), record how, and diagnose its log."""
        launched = self.launched
        if launched is None or launched.stopped is not None:
            return
        result = launched.stop()
        self.say(
            f"stopped the launched server ({result.how}, {result.seconds:.1f} s)"
            + (f"; still alive: {list(result.leftovers)}" if result.leftovers else "")
        )
        writer = self.writer
        if writer is None or writer.closed:
            return
        writer.write(Event(*now(), name=LAUNCH_EVENT, data=launched.to_record()))
        from vramdoctor.soak.startup import server_log_facts

        writer.write(Event(*now(), name=SERVER_LOG_EVENT, data=server_log_facts(launched.log_path)))


def _status_text(rc: int) -> str:
    """An exit status in words: "exit code 3", "signal SIGSEGV"."""
    import signal

    if rc >= 0:
        return f"exit code {rc}"
    try:
        return f"signal {signal.Signals(-rc).name}"
    except ValueError:
        return f"signal {-rc}"


def run_soak(
    config: SoakConfig,
    *,
    hooks: Sequence[SoakHook | RoundHook] = (),
    notify: Notify | None = None,
    progress: Callable[[ProtocolState], None] | None = None,
    on_result: Callable[[PlannedRequest, Outcome], None] | None = None,
    on_sample: Callable[[str, Any], None] | None = None,
    argv: list[str] | None = None,
    before_run: Callable[[Protocol], Any] | None = None,
) -> SoakOutcome:
    """Run a soak and analyse it: `SoakSession(config, ...).run()` (its docstring has the
    errors). `hooks` are `SoakHook`s or old round hooks `hook(round_index, run_dir)`;
    `notify` receives notes for the user; `progress`, `on_result` and `on_sample` feed a live
    view; `before_run(protocol)` may return a context manager entered around the protocol
    (the CLI's live display)."""
    return SoakSession(
        config,
        hooks=hooks,
        notify=notify,
        progress=progress,
        on_result=on_result,
        on_sample=on_sample,
        argv=argv,
        before_run=before_run,
    ).run()
