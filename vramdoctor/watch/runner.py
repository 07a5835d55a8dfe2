"""The `watch` loop: sample the sources, record, fold into the rolling state, export. Sends no traffic.

Sources (the same ones soak uses, `vramdoctor.sources`): NVML here, or GPU exporters
(`--gpu-metrics`, dcgm-exporter / nvitop-exporter); host memory of the server's processes
(psutil, by kind where /proc tells); the server's /metrics. A source that cannot start is
said once and left out (NVML absent on a CPU host); a source that fails later is counted in
the sampler's health and retried next tick. Life cycle: `Watcher(options).open()` ->
`tick()`/`analyse()` (or `run(stop)`) -> `close()`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.record import make_header
from vramdoctor.samples import Event, GpuSample, now
from vramdoctor.watch.exporter import ExporterServer, SamplerHealth, WatchCollector, serve
from vramdoctor.watch.runfile import RotatingRunWriter
from vramdoctor.watch.state import WatchConfig, WatchResult, WatchState

__all__ = ["WatchOptions", "Watcher"]

_DISCOVER_EVERY_S = 30.0


@dataclass
class WatchOptions:
    """What to watch and how. Durations in seconds; `listen=None` serves no /metrics."""

    interval_s: float = 5.0
    analyse_every_s: float = 30.0
    server_url: str | None = None
    metrics_url: str | None = None
    pids: list[int] = field(default_factory=list)
    gpu_metrics: list[str] = field(default_factory=list)
    gpus: list[int] | None = None
    use_nvml: bool = True
    config: WatchConfig = field(default_factory=WatchConfig)
    out_dir: Path | None = None
    rotate_bytes: int = 64 * 1024 * 1024
    keep_files: int = 8
    listen: str | None = "127.0.0.1:9840"
    headers: dict[str, str] | None = None


class Watcher:
    """One host's passive watcher. Thread use: `run` in one thread; the exporter reads `result`."""

    def __init__(
        self, options: WatchOptions, *, on_event: Callable[[Event], None] | None = None
    ) -> None:
        if options.interval_s <= 0:
            raise InputError("--interval must be positive")
        self.options = options
        self.state = WatchState(options.config)
        self.health = SamplerHealth()
        self.notes: list[str] = []
        self.result: WatchResult | None = None
        self.exporter: ExporterServer | None = None
        self.writer: RotatingRunWriter | None = None
        self._on_event = on_event
        self._sources: dict[str, Any] = {}
        self._host: Any = None
        self._local_gpu = False
        self._server_pids: dict[int, str] = {}
        self._gpu_pids: dict[int, str] = {}
        self._discovered_at = -1e18
        self._starts_known: set[int] = set()
        self._lock = threading.Lock()
        self._last_analysis = -1e18

    # -- life cycle -------------------------------------------------------------------------
    def open(self) -> Watcher:
        o = self.options
        for pid in o.pids:
            if not psutil.pid_exists(pid):
                raise InputError(f"--pid {pid}: no such process on this host")
        if o.gpu_metrics:
            from vramdoctor.sources.exporter import ExporterSource

            self._sources["gpu"] = ExporterSource(o.gpu_metrics, headers=None)
        elif o.use_nvml:
            from vramdoctor.sources.nvml import NvmlSource

            try:
                self._sources["gpu"] = NvmlSource(o.gpus).open()
                self._local_gpu = True
            except SourceUnavailable as exc:
                self.notes.append(f"GPU memory is not watched: {exc}")
        metrics_url = o.metrics_url or (
            o.server_url.rstrip("/") + "/metrics" if o.server_url else None
        )
        if metrics_url:
            from vramdoctor.sources.server_metrics import ServerMetricsSource

            self._sources["server_metrics"] = ServerMetricsSource(metrics_url, headers=o.headers)
        if o.server_url:
            from vramdoctor.sources.discover import is_local

            if not is_local(o.server_url):
                self.notes.append(
                    "the server is on another host: its processes' host memory is not watched here"
                )
        from vramdoctor.sources.host import HostSource

        self._host = HostSource(self._host_pids)
        if not self._sources and not o.pids and not o.server_url:
            raise InputError(
                "nothing to watch: NVML is not available here and no --gpu-metrics, --server or --pid "
                "was given" + (f" ({self.notes[0]})" if self.notes else "")
            )
        if o.out_dir is not None:
            self.writer = RotatingRunWriter(
                o.out_dir, self._header, max_bytes=o.rotate_bytes, keep=o.keep_files
            )
        if o.listen:
            self.exporter = serve(
                WatchCollector(lambda: self.result, self.health, lambda: self.state.series_count),
                o.listen,
            )
        return self

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
                "quiet_quantile": c.quiet_quantile,
                "sources": [*sorted(self._sources), "host"],
                "notes": list(self.notes),
            },
        )

    def close(self, status: str = "complete") -> None:
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None
        for src in self._sources.values():
            closer = getattr(src, "close", None)
            if closer is not None:
                with contextlib.suppress(Exception):  # closing must not hide the real outcome
                    closer()
        if self.writer is not None:
            self.writer.close(status, verdict=self.result.verdict if self.result else None)
            self.writer = None

    def __enter__(self) -> Watcher:
        return self.open()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(
            "interrupted"
            if exc_type is KeyboardInterrupt
            else ("failed" if exc_type else "complete")
        )

    # -- sampling ---------------------------------------------------------------------------
    def _host_pids(self) -> dict[int, str]:
        o = self.options
        if o.server_url and time.monotonic() - self._discovered_at > _DISCOVER_EVERY_S:
            self._discovered_at = time.monotonic()
            from vramdoctor.sources.discover import discover_server

            try:
                found = discover_server(o.server_url)
                self._server_pids = {pid: "server" for pid in found.tree}
            except Exception as exc:  # discovery is best effort; say it once
                msg = f"server processes not found: {type(exc).__name__}"
                if msg not in self.notes:
                    self.notes.append(msg)
        pids = dict(self._gpu_pids)
        pids.update(self._server_pids)
        pids.update({p: "watched" for p in o.pids})
        return pids

    def _record(self, record: Any) -> None:
        if self.writer is not None:
            self.writer.write(record)
        for ev in self.state.ingest(record):
            self.health.events[ev.name] = self.health.events.get(ev.name, 0) + 1
            if self.writer is not None:
                self.writer.write(ev)
            if self._on_event is not None:
                self._on_event(ev)

    def _sample(self, name: str, source: Any) -> Any:
        t0 = time.perf_counter()
        try:
            record = source.sample()
        except Exception as exc:
            self.health.errors[name] = self.health.errors.get(name, 0) + 1
            self.health.up[name] = False
            msg = f"{type(exc).__name__}: {exc}"[:300]
            if self.health.last_error.get(name) != msg:
                self.health.last_error[name] = msg
                t, wall = now()
                if self.writer is not None:
                    self.writer.write(
                        Event(
                            t=t, wall=wall, name="source_error", data={"source": name, "error": msg}
                        )
                    )
            return None
        finally:
            self.health.last_duration_s[name] = time.perf_counter() - t0
        self.health.samples[name] = self.health.samples.get(name, 0) + 1
        self.health.up[name] = True
        self.health.last_success_wall[name] = time.time()
        self.health.last_error.pop(name, None)
        return record

    def _start_times(self, pids: list[int]) -> None:
        for pid in pids:
            if pid in self._starts_known:
                continue
            self._starts_known.add(pid)
            try:
                start = psutil.Process(pid).create_time()
            except (psutil.Error, OSError):
                continue
            self._record({"kind": "process_start", "pid": pid, "start_wall": start})
        if len(self._starts_known) > 65536:
            self._starts_known.clear()

    def tick(self) -> None:
        """Sample every source once and fold the samples in (no analysis)."""
        with self._lock:
            for name, source in self._sources.items():
                record = self._sample(name, source)
                if record is None:
                    continue
                if isinstance(record, GpuSample) and self._local_gpu:
                    self._gpu_pids = {p.pid: "gpu" for p in record.processes if p.visible}
                    self._start_times(sorted(self._gpu_pids))
                self._record(record)
            self._start_times(sorted(set(self._server_pids) | set(self.options.pids)))
            host = self._sample("host", self._host)
            if host is not None:
                self._record(host)
            from vramdoctor.sources.host import host_memory

            mono, wall = now()
            self._record({"kind": "host_memory", "t": mono, "wall": wall, **host_memory()})

    def analyse(self, wall: float | None = None) -> WatchResult:
        """Run the rolling analysis now; the exporter serves this result until the next one."""
        with self._lock:
            result = self.state.analyse(time.time() if wall is None else wall)
        result.notes = list(self.notes) + result.notes
        self.result = result
        self._last_analysis = time.monotonic()
        return result

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
            stop.wait(delay)
        return self.analyse()
