"""The `watch` loop: sample the sources, record, fold into the rolling state, export. Sends no traffic.

Sources (the same ones soak uses, `vramdoctor.sources`): NVML here, or GPU exporters
(`--gpu-metrics`); host memory of the server's processes (`HostSource`, RSS by kind, glibc
arenas); the server's /metrics (`ServerMetricsSource`: request counter, running/queued, KV
pools, names from `vramdoctor.servers`); the agent's inside evidence where the server has the
agent (`attribution.hooks.inside_hook`: at most once per idle window, never during traffic).

Whose memory (soak's scope rules): with `--server` on this host, the server is the port
owner's process tree (`sources.discover`, followed by `ServerWatch`: a replaced port owner is
a new life, a server that died and comes back is found again) plus `--pid`; every other
process on its GPUs is another tenant (NVML rows by `server_pids`, exporter rows of a local
exporter by pid). Without `--server` nothing is known of scope (None: read as the server's).

A source that cannot start is said once and left out (NVML absent on a CPU host); a source
that fails later is said once per kind of failure (and again when it answers after failing),
recorded as a `source_error` event, counted in the exporter's sampler health and retried
next tick. Life cycle: `Watcher(options).open()` -> `tick()`/`analyse()` (or `run(stop)`) ->
`close()`; with `options.launch` the server is started in `open()` and stopped in `close()`.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.record import make_header
from vramdoctor.samples import (
    LAUNCHED_HANDOVER,
    SERVER_DIED,
    SERVER_REPLACED,
    SOURCE_ERROR,
    Event,
    GpuSample,
    InsideSample,
    now,
)
from vramdoctor.watch.config import WatchConfig, WatchOptions, check_pids
from vramdoctor.watch.exporter import ExporterServer, SamplerHealth, WatchCollector, serve
from vramdoctor.watch.result import WatchResult
from vramdoctor.watch.runfile import RotatingRunWriter
from vramdoctor.watch.state import WatchState

__all__ = ["WatchConfig", "WatchOptions", "Watcher"]

_DISCOVER_EVERY_S = 30.0
_SERVER_CHECK_EVERY_S = 1.0


def _kind(source: str, message: str) -> str:
    """A failure's kind: its source and its words, numbers left out (a byte count or a
    time differs from scrape to scrape; the kind does not)."""
    return source + ":" + re.sub(r"\d+(\.\d+)?", "N", message)


class _Server:
    """The server's processes on this host: found, followed (ServerWatch), found again."""

    def __init__(self, url: str, extra_pids: list[int]) -> None:
        from vramdoctor.sources.discover import ServerWatch, discover_server

        self.url = url
        self.extra = list(extra_pids)
        self.found = discover_server(url)
        self.watch: Any = ServerWatch(url, self.found) if self.found.found else None
        self.roots: list[int] = list(self.found.root_pids)
        self.tree: dict[int, str] = dict(self.found.tree)
        self.peers: dict[int, str] = {}
        self._found_at = time.monotonic()
        self._checked_at = -1e18
        self._lock = threading.Lock()

    @property
    def local(self) -> bool:
        return bool(self.found.found or self.watch is not None)

    def pids(self) -> set[int]:
        with self._lock:
            return set(self.tree) | set(self.roots) | set(self.extra)

    def check(self) -> list[tuple[str, dict[str, object]]]:
        """The server's life events since the last check (at most once a second)."""
        from vramdoctor.sources.discover import ServerWatch, discover_server

        mono = time.monotonic()
        if mono - self._checked_at < _SERVER_CHECK_EVERY_S:
            return []
        self._checked_at = mono
        if self.watch is not None and not self.watch.dead:
            events: list[tuple[str, dict[str, object]]] = self.watch.check()
            with self._lock:
                self.roots, self.tree = list(self.watch.roots), dict(self.watch.tree)
            return events
        if mono - self._found_at < _DISCOVER_EVERY_S and self.watch is not None:
            return []
        self._found_at = mono
        found = discover_server(self.url)
        if not found.found:
            return []
        old = self.roots[0] if self.roots else None
        self.found, self.watch = found, ServerWatch(self.url, found)
        with self._lock:
            self.roots, self.tree = list(found.root_pids), dict(found.tree)
        if old is None or old in found.root_pids:
            return []
        return [
            (SERVER_REPLACED, {"old_pid": old, "new_pid": found.root_pids[0], "found_again": True})
        ]

    def roles(self) -> dict[int, str]:
        from vramdoctor.sources.discover import roles

        with self._lock:
            self.found.root_pids, self.found.tree = list(self.roots), dict(self.tree)
            out = roles(self.found, self.peers)
        for pid in self.extra:
            out.setdefault(pid, "watched")
        return out


class Watcher:
    """One host's passive watcher. Thread use: `run` in one thread; the exporter reads `result`.

    `on_event(ev)` gets the server's life events and the process events watch derives;
    `on_note(line)` every line watch has to say once (a source that fails, a full disk).
    """

    def __init__(
        self,
        options: WatchOptions,
        *,
        on_event: Callable[[Event], None] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.options = options.check()
        self.state = WatchState(options.config)
        self.health = SamplerHealth()
        self.notes: list[str] = []
        self.result: WatchResult | None = None
        self.exporter: ExporterServer | None = None
        self.writer: RotatingRunWriter | None = None
        self.launched: Any = None
        self.server: _Server | None = None
        self._on_event = on_event
        self._on_note = on_note
        self._sources: dict[str, Any] = {}
        self._host: Any = None
        self._local_gpu = False
        self._gpu_pids: dict[int, str] = {}
        self._starts_known: set[int] = set()
        self._lock = threading.Lock()
        self._last_analysis = -1e18
        self._said: set[str] = set()
        self._failing: dict[str, str] = {}
        self._metrics_url: str | None = None
        self._inside: Any = None
        self._inside_q: queue.Queue[InsideSample] = queue.Queue(maxsize=256)
        self._inside_thread: threading.Thread | None = None
        self._inside_seq = 0
        self._inside_at = -1e18
        self._launch_dir: tempfile.TemporaryDirectory[str] | None = None
        self._facts: dict[str, Any] = {}
        self._gpu_note: str | None = None

    # -- saying things once ---------------------------------------------------------------
    def say(self, message: str, *, kind: str | None = None, keep: bool = True) -> None:
        """Say `message` once (per `kind`, default the message): a note on stderr and, with
        `keep`, in the result's notes."""
        key = kind or message
        if key in self._said:
            return
        self._said.add(key)
        if keep:
            self.notes.append(message)
        if self._on_note is not None:
            self._on_note(message)

    # -- life cycle -------------------------------------------------------------------------
    def open(self) -> Watcher:
        """Launch (with `launch`), find the server, open every source, the run files and the
        exporter. InputError / SourceUnavailable (LaunchFailed) when nothing can be watched."""
        o = self.options
        from vramdoctor.sources.http import metrics_url

        for url in (o.server_url, *o.gpu_metrics):  # a URL that cannot be right: one line, first
            if url:
                metrics_url(url)
        check_pids(o.pids)
        if o.listen:
            from vramdoctor.watch.exporter import parse_listen

            parse_listen(o.listen)  # refuse a bad address before starting anything
        if o.launch:
            self._launch()
        if o.server_url:
            self._find_server(o.server_url)
        self._open_gpu()
        self._open_metrics()
        from vramdoctor.sources.host import HostSource

        self._host = HostSource(self._host_roles, maps_every=max(1, round(10.0 / o.interval_s)))
        if not self._sources and not o.pids and not (self.server and self.server.local):
            raise InputError(
                "nothing to watch: no --gpu-metrics, --server or --pid was given"
                + (f", and {self._gpu_note}" if self._gpu_note else "")
            )
        if self._gpu_note:
            self.say(self._gpu_note)
        self._facts = self._run_facts()
        self.state.header["config"].update(self._facts)
        self._open_inside()
        if o.out_dir is not None:
            self.writer = RotatingRunWriter(
                o.out_dir,
                self._header,
                max_bytes=o.rotate_bytes,
                keep=o.keep_files,
                on_problem=lambda m: self.say(f"run files: {m}", kind="runfile:" + m[:40]),
            )
            if self.launched is not None:
                self.writer.write(Event(*now(), name="launched", data=self.launched.to_record()))
        if o.listen:
            self.exporter = serve(
                WatchCollector(
                    lambda: self.result,
                    self.health,
                    lambda: self.state.series_count,
                    recording=self._recording,
                ),
                o.listen,
            )
        return self

    def _launch(self) -> None:
        from vramdoctor.soak.launch import LaunchSpec, launch

        o = self.options
        assert o.launch is not None
        spec = LaunchSpec(
            argv=tuple(o.launch),
            startup_timeout_s=o.startup_timeout_s,
            stop_grace_s=o.stop_grace_s,
            agent=o.agent,
        )
        url = o.server_url or spec.url()
        if url is None:
            raise InputError("--launch: the command names no --port; give --server URL")
        if o.out_dir is not None:
            run_dir = Path(o.out_dir)
        else:
            self._launch_dir = tempfile.TemporaryDirectory(prefix="vramdoctor-watch-")
            run_dir = Path(self._launch_dir.name)
        stem = "watch-" + time.strftime("%Y%m%d-%H%M%S")
        self.launched = launch(spec, run_dir=run_dir, stem=stem)
        try:
            self.launched.wait_ready(url, headers=o.headers)
        except BaseException:
            self.launched.stop()
            raise
        o.server_url = url
        self.say(
            f"launched the server (pid {self.launched.pid}); its log: {self.launched.log_path}"
        )

    def _find_server(self, url: str) -> None:
        from vramdoctor.sources.discover import is_local

        if not is_local(url):
            self.say(
                "the server is on another host: its processes' host memory is not watched here"
            )
            return
        self.server = _Server(url, self.options.pids)
        if self.server.found.found:
            tree = ", ".join(f"{p} ({n})" for p, n in sorted(self.server.tree.items()))
            self.say(f"server processes: {tree}")
        elif self.server.found.reason:
            self.say(f"server processes not found: {self.server.found.reason}")
        for pid in self.server.roots:
            self._start_times([pid], server=True)

    def _open_gpu(self) -> None:
        o = self.options
        if o.gpu_metrics:
            from vramdoctor.sources.exporter import ExporterSource

            self._sources["gpu"] = ExporterSource(o.gpu_metrics, headers=None)
            return
        if not o.use_nvml:
            return
        from vramdoctor.sources.nvml import NvmlSource

        server = self.server
        pids = server.pids if server is not None and server.local else None
        try:
            self._sources["gpu"] = NvmlSource(o.gpus, server_pids=pids).open()
            self._local_gpu = True
        except SourceUnavailable as exc:
            self._gpu_note = f"GPU memory is not watched: {exc}"

    def _open_metrics(self) -> None:
        o = self.options
        url = o.metrics_url or (o.server_url.rstrip("/") + "/metrics" if o.server_url else None)
        if not url:
            return
        from vramdoctor.sources.server_metrics import ServerMetricsSource

        self._sources["server_metrics"] = ServerMetricsSource(url, headers=o.headers)
        self._metrics_url = self._sources["server_metrics"].shown_url

    def _open_inside(self) -> None:
        o = self.options
        if not o.inside or self.server is None or not self.server.local:
            return
        from vramdoctor.attribution.hooks import inside_hook

        pids = {p: "server" for p in self.server.pids()}
        hook = inside_hook(
            pids, trace_python=o.trace_python, write=self._inside_put, notify=self.say
        )
        if hook is not None:
            self._inside = hook
            self.say(hook.start_note())

    def _run_facts(self) -> dict[str, Any]:
        """What soak's judge reads beyond the samples: this host's cores and the server's
        MALLOC_ARENA_MAX (glibc's arena bound), recorded in every part's header."""
        facts: dict[str, Any] = {}
        server = self.server
        if server is not None and server.local:
            facts["cpu_count"] = os.cpu_count()
            for pid in server.roots:
                with contextlib.suppress(psutil.Error, OSError):
                    value = psutil.Process(pid).environ().get("MALLOC_ARENA_MAX", "")
                    if value.strip().isdigit():
                        facts["server_malloc_arena_max"] = int(value.strip())
                        break
        return facts

    def _header(self) -> dict[str, Any]:
        o = self.options
        c = o.config
        return make_header(
            "watch",
            target=o.metrics_url or o.server_url,
            config={
                "interval_s": o.interval_s,
                "bucket_s": c.bucket_s,
                "max_buckets": c.max_buckets,
                "warmup_s": c.warmup_s,
                "min_idle_s": c.min_idle_s,
                "settle_s": c.settle_s,
                "max_rounds": c.max_rounds,
                "quiet_quantile": c.quiet_quantile,
                "sources": [*sorted(self._sources), "host"],
                "server_pids": sorted(self.server.roots) if self.server else [],
                "notes": list(self.notes),
                **self._facts,
                **({"launch": self.launched.to_record()} if self.launched is not None else {}),
            },
        )

    def _recording(self) -> tuple[bool | None, int]:
        w = self.writer
        if w is None:
            return None, 0
        return w.path is not None, w.dropped

    def close(self, status: str = "complete") -> None:
        """Stop the exporter, the agent's session, the launched server; close the run file."""
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None
        if self._inside_thread is not None:
            self._inside_thread.join(15)
        if self._inside is not None:
            with contextlib.suppress(Exception):
                self._inside.close()
            self._inside = None
        for src in self._sources.values():
            closer = getattr(src, "close", None)
            if closer is not None:
                with contextlib.suppress(Exception):  # closing must not hide the real outcome
                    closer()
        if self.launched is not None:
            stopped = self.launched.stop()
            if self.writer is not None:
                self.writer.write(Event(*now(), name="launch_stopped", data=stopped.to_dict()))
        if self.writer is not None:
            self.writer.close(status, verdict=self.result.verdict if self.result else None)
            self.writer = None
        if self._launch_dir is not None:
            with contextlib.suppress(OSError):
                self._launch_dir.cleanup()
            self._launch_dir = None

    def __enter__(self) -> Watcher:
        return self.open()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(
            "interrupted"
            if exc_type is KeyboardInterrupt
            else ("failed" if exc_type else "complete")
        )

    # -- sampling ---------------------------------------------------------------------------
    def _host_roles(self) -> dict[int, str]:
        server = self.server
        if server is not None and server.local:
            return server.roles()
        pids = {p: "gpu-process" for p in self._gpu_pids}
        pids.update({p: "watched" for p in self.options.pids})
        return pids

    def _record(self, record: Any) -> None:
        if self.writer is not None:
            self.writer.write(record)
        for ev in self.state.ingest(record):
            self._event(ev, write=True)

    def _event(self, ev: Event, *, write: bool) -> None:
        self.health.events[ev.name] = self.health.events.get(ev.name, 0) + 1
        if write and self.writer is not None:
            self.writer.write(ev)
        if self._on_event is not None:
            self._on_event(ev)

    def _failed(self, name: str, message: str) -> None:
        """A source failed: counted; said and recorded once per kind of failure."""
        self.health.errors[name] = self.health.errors.get(name, 0) + 1
        self.health.up[name] = False
        self.health.last_error[name] = message
        self._failing[name] = message
        kind = _kind(name, message)
        if kind in self._said:
            return
        self.say(f"{name}: {message} (retried every sample; said once)", kind=kind, keep=False)
        if self.writer is not None:
            self.writer.write(
                Event(*now(), name=SOURCE_ERROR, data={"source": name, "error": message})
            )

    def _sample(self, name: str, source: Any) -> Any:
        t0 = time.perf_counter()
        try:
            record = source.sample()
        except (SourceUnavailable, InputError) as exc:
            self._failed(name, str(exc)[:300])
            return None
        except Exception as exc:  # a source must never end a watch of weeks
            self._failed(name, f"{type(exc).__name__}: {exc}"[:300])
            return None
        finally:
            self.health.last_duration_s[name] = time.perf_counter() - t0
        h = self.health
        h.samples[name] = h.samples.get(name, 0) + 1
        h.up[name] = True
        h.last_success_wall[name] = time.time()
        h.last_error.pop(name, None)
        if name in self._failing:
            errors = h.errors.get(name, 0)
            self.say(
                f"{name}: answers again after {errors} failed samples",
                kind=f"recovered:{name}:{errors // 1000}",
                keep=False,
            )
            del self._failing[name]
        return record

    def _start_times(self, pids: list[int], *, server: bool = False) -> None:
        for pid in pids:
            if pid in self._starts_known and not server:
                continue
            self._starts_known.add(pid)
            try:
                start = psutil.Process(pid).create_time()
            except (psutil.Error, OSError):
                continue
            self._record(
                {"kind": "process_start", "pid": pid, "start_wall": start, "server": server}
            )
        if len(self._starts_known) > 65536:
            self._starts_known.clear()

    def _stamp_scope(self, sample: GpuSample) -> None:
        """Exporter rows of a local exporter: whose process each is, by pid (NVML's rows are
        stamped by NvmlSource itself)."""
        server = self.server
        if server is None or not server.local or self._local_gpu:
            return
        from vramdoctor.sources.discover import is_local

        if not all(is_local(u) for u in self.options.gpu_metrics):
            return
        mine = server.pids()
        for p in sample.processes:
            if p.scope is None and p.visible:
                p.scope = "server" if p.pid in mine else "tenant"

    def _server_events(self) -> None:
        server = self.server
        if server is None:
            return
        for name, data in server.check():
            mono, wall = now()
            ev = Event(t=mono, wall=wall, name=name, data=dict(data))
            self._record(ev)
            self._event(ev, write=False)
            if name == SERVER_REPLACED and data.get("new_pid") is not None:
                self._start_times([int(str(data["new_pid"]))], server=True)
        if self.launched is not None:
            rc = self.launched.exited()
            said = {"launched-handover", "launched-exit"} & self._said
            if rc is None or said:
                return
            from vramdoctor.sources.discover import url_port

            mono, wall = now()
            successor = self.launched.successor(url_port(server.url))
            if successor is not None:  # it handed its port to a successor: not a death
                self.say(
                    f"the launched server (pid {self.launched.pid}) exited ({rc}) after pid "
                    f"{successor} took over its port: watching the successor",
                    kind="launched-handover",
                )
                data = {"pid": self.launched.pid, "status": rc, "successor": successor}
                self._record(Event(t=mono, wall=wall, name=LAUNCHED_HANDOVER, data=data))
                return
            self.say(
                f"the launched server exited ({rc}); its log: {self.launched.log_path}",
                kind="launched-exit",
            )
            ev = Event(t=mono, wall=wall, name=SERVER_DIED, data={"reason": f"exited {rc}"})
            self._record(ev)

    def tick(self) -> None:
        """Sample every source once and fold the samples in (no analysis)."""
        with self._lock:
            self._server_events()
            for name, source in self._sources.items():
                record = self._sample(name, source)
                if record is None:
                    continue
                if isinstance(record, GpuSample):
                    self._stamp_scope(record)
                    if self._local_gpu or not (self.server and self.server.local):
                        self._gpu_pids = {p.pid: "gpu" for p in record.processes if p.visible}
                    if self.server is not None:
                        from vramdoctor.sources.discover import gpu_peers

                        self.server.peers = gpu_peers(record, self.server.pids())
                    self._start_times(sorted(self._gpu_pids))
                self._record(record)
            host = self._sample("host", self._host)
            if host is not None:
                self._record(host)
            from vramdoctor.sources.host import host_memory

            mono, wall = now()
            self._record({"kind": "host_memory", "t": mono, "wall": wall, **host_memory()})
            self._drain_inside()
            self._maybe_inside()

    # -- inside evidence (the agent) ---------------------------------------------------------
    def _inside_put(self, record: Any) -> None:
        if isinstance(record, InsideSample):
            with contextlib.suppress(queue.Full):
                self._inside_q.put_nowait(record)
        elif isinstance(record, Event) and self.writer is not None:
            self.writer.write(record)

    def _drain_inside(self) -> None:
        while True:
            try:
                rec = self._inside_q.get_nowait()
            except queue.Empty:
                return
            self._record(rec)

    def _maybe_inside(self) -> None:
        """Ask the agent for its counters once per idle stretch, as soon as it settled (so
        that the reply, measured up to a poll later, still falls inside it: a record measured
        after traffic resumed is left out), at most every `inside_every_s`, in a thread of
        its own."""
        hook = self._inside
        if hook is None or (self._inside_thread is not None and self._inside_thread.is_alive()):
            return
        w = self.state.rounds.settled()
        if w is None or w.inside_asked:
            return
        if time.monotonic() - self._inside_at < self.options.config.inside_every_s:
            return
        w.inside_asked = True
        self._inside_at = time.monotonic()
        self._inside_seq += 1
        if self.server is not None:
            hook.server_pids = {p: "server" for p in self.server.pids()}
        self._inside_thread = threading.Thread(
            target=hook, args=(self._inside_seq,), name="vramdoctor-inside", daemon=True
        )
        self._inside_thread.start()

    # -- analysis -----------------------------------------------------------------------------
    def analyse(self, wall: float | None = None) -> WatchResult:
        """Run the rolling analysis now; the exporter serves this result until the next one."""
        with self._lock:
            self._drain_inside()
            result = self.state.analyse(time.time() if wall is None else wall)
        result.notes = self._source_notes() + list(self.notes) + result.notes
        result.sources = self._source_table()
        self.result = result
        self._last_analysis = time.monotonic()
        return result

    def _source_notes(self) -> list[str]:
        """A source that never answered, or fails now: said in the result too."""
        out = []
        for name, message in sorted(self._failing.items()):
            ok = self.health.samples.get(name, 0)
            what = "never answered" if ok == 0 else "fails now"
            out.append(
                f"{name} {what} ({self.health.errors.get(name, 0)} failed samples): {message}"
            )
        return out

    @property
    def failing(self) -> dict[str, str]:
        """source -> its last error, for the sources failing now."""
        return dict(self._failing)

    def watched_anything(self) -> bool:
        """False when no source ever answered and no server process was seen: nothing of
        the server was watched (a wrong URL, a server that never came up)."""
        return (
            any(self.health.samples.get(n, 0) for n in self._sources)
            or bool(self.server is not None and self.server.local)
            or bool(self.options.pids)
        )

    def _source_table(self) -> dict[str, dict[str, Any]]:
        h = self.health
        return {
            name: {
                "up": bool(h.up.get(name)),
                "samples": h.samples.get(name, 0),
                "errors": h.errors.get(name, 0),
                "last_error": h.last_error.get(name),
            }
            for name in sorted(set(h.samples) | set(h.errors))
        }

    def run(
        self,
        stop: threading.Event,
        duration_s: float | None = None,
        on_result: Callable[[WatchResult], None] | None = None,
    ) -> WatchResult:
        """Tick every `interval_s` and analyse every `analyse_every_s` until `stop` or `duration_s`."""
        o = self.options
        started = time.monotonic()
        next_at = started
        while not stop.is_set():
            self.tick()
            if time.monotonic() - self._last_analysis >= o.analyse_every_s:
                res = self.analyse()
                if on_result is not None:
                    on_result(res)
            if duration_s is not None and time.monotonic() - started >= duration_s:
                break
            next_at += o.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                delay = 0.0
            if duration_s is not None:
                delay = min(delay, max(0.0, started + duration_s - time.monotonic()))
            stop.wait(delay)
        return self.analyse()
