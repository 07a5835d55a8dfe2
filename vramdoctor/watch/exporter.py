"""`watch`'s own /metrics: prometheus_client's registry with one custom collector.

The collector reads the latest `WatchResult` and the sampler's health at scrape time (no
metric objects to keep in step). Names follow Prometheus conventions: a `vramdoctor_`
prefix, base units in the name (`_bytes`, `_seconds`), `_total` for counters. Labels are
gpu, pid, process (the process *name* only), layer, pool, source, verdict: never a command
line, an environment variable, a URL or anything else that may hold a secret.

Memory is exported in bytes (MiB x 2**20); the KV layer in tokens.
"""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any, TypeGuard
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vramdoctor.errors import InputError
from vramdoctor.redact import escape_control, one_line
from vramdoctor.units import MIB
from vramdoctor.verdicts import VERDICTS
from vramdoctor.watch.result import WatchResult

__all__ = [
    "EXPORTED_METRICS",
    "ExporterServer",
    "SamplerHealth",
    "WatchCollector",
    "parse_listen",
    "serve",
]

_SERIES_LABELS = ["gpu", "gpu_instance", "pid", "process", "layer", "scope"]

EXPORTED_METRICS: dict[str, str] = {
    "vramdoctor_process_memory_bytes": "Memory a process holds, by layer (vram per GPU, rss, rss_anon, rss_file, rss_shmem), latest sample.",
    "vramdoctor_process_memory_floor_bytes": "Lowest level of the latest bucket (what the process keeps between requests).",
    "vramdoctor_process_memory_growth_bytes_per_hour": "Growth rate at comparable moments, at the request rate the server serves (or in time).",
    "vramdoctor_process_memory_growth_bytes_per_request": "Growth per served request at comparable moments (needs the server's request counter).",
    "vramdoctor_process_memory_time_to_oom_seconds": "Time until the layer's free memory is used up at the current growth (the leaking layer's series only).",
    "vramdoctor_process_memory_verdict": "1 for the series' current verdict (LEAK, CACHING, STABLE, INCONCLUSIVE), 0 for the others.",
    "vramdoctor_layer_verdict": "1 for the memory layer's current verdict (vram, kv, host: soak's judge), 0 for the others.",
    "vramdoctor_layer_growth_bytes_per_hour": "The leaking layer's growth per hour (KV: tokens per hour).",
    "vramdoctor_layer_time_to_oom_seconds": "Time until the leaking layer runs out (KV: the pool is full).",
    "vramdoctor_gpu_memory_used_bytes": "GPU memory used (device level; a MIG slice by gpu_instance).",
    "vramdoctor_gpu_memory_free_bytes": "GPU memory free (device level; a MIG slice by gpu_instance).",
    "vramdoctor_gpu_memory_total_bytes": "GPU memory total (device level; a MIG slice by gpu_instance).",
    "vramdoctor_kv_idle_used_tokens": "KV pool tokens the server holds at its last idle moment (0 on a healthy server).",
    "vramdoctor_kv_growth_tokens_per_request": "Growth of idle KV usage per served request.",
    "vramdoctor_kv_verdict": "1 for the KV pool's current verdict, 0 for the others.",
    "vramdoctor_stray_context_bytes": "A context-sized footprint of a process on a GPU that is not its main one.",
    "vramdoctor_server_requests_per_hour": "Requests the server served per hour over the window (from its request counter).",
    "vramdoctor_watch_idle_windows": "The server's idle windows in the rolling window (watch's rounds are the traffic between them).",
    "vramdoctor_verdict": "1 for the worst verdict over the server's layers, 0 for the others.",
    "vramdoctor_events_total": "Process life events seen (process_appeared, process_exited, server_replaced, ...).",
    "vramdoctor_sampler_up": "1 when the source's last sample succeeded.",
    "vramdoctor_sampler_samples_total": "Samples taken from the source.",
    "vramdoctor_sampler_errors_total": "Failed samples of the source.",
    "vramdoctor_sampler_last_success_timestamp_seconds": "Wall-clock time of the source's last good sample.",
    "vramdoctor_sampler_duration_seconds": "How long the source's last sample took.",
    "vramdoctor_watch_recording_up": "1 when the run file is being written, 0 while the disk refuses (--out only).",
    "vramdoctor_watch_records_dropped_total": "Records the disk refused (dropped, never kept in memory; --out only).",
    "vramdoctor_watch_series": "Series the rolling analysis holds (bounded).",
    "vramdoctor_watch_window_seconds": "Length of the rolling analysis window.",
}
"""Every metric family watch exports, with its help text (the README and the rules check use it)."""


@dataclass
class SamplerHealth:
    """Per-source counters the watcher keeps (thread-safe enough: ints and floats)."""

    samples: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    up: dict[str, bool] = field(default_factory=dict)
    last_success_wall: dict[str, float] = field(default_factory=dict)
    last_duration_s: dict[str, float] = field(default_factory=dict)
    last_error: dict[str, str] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)


def _lbl(value: Any) -> str:
    return "" if value is None else one_line(str(value))


def _clean_label(value: str) -> str:
    return escape_control(one_line(value))


def _ok(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


class WatchCollector(Collector):
    """A custom collector over `result()` (the latest WatchResult) and `health` (SamplerHealth);
    `recording()` gives (run file being written or None without --out, records dropped)."""

    def __init__(
        self,
        result: Callable[[], WatchResult | None],
        health: SamplerHealth,
        series_count: Callable[[], int] | None = None,
        *,
        recording: Callable[[], tuple[bool | None, int]] | None = None,
    ) -> None:
        self._result = result
        self._health = health
        self._series_count = series_count
        self._recording = recording

    def _g(self, name: str, labels: list[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, EXPORTED_METRICS[name], labels=labels)

    def collect(self) -> Iterator[Metric]:
        """Every family, each label value cleaned (the one choke point):
        a line break shown as `\\n`, other control characters (ESC, BEL, C1, bidi
        overrides) as `\\x1b`..., so a process name cannot drive the terminal of whoever
        curls this page."""
        for metric in self._collect():
            metric.samples = [
                s._replace(labels={k: _clean_label(v) for k, v in s.labels.items()})
                if any(_clean_label(v) != v for v in s.labels.values())
                else s
                for s in metric.samples
            ]
            yield metric

    def _collect(self) -> Iterator[Metric]:
        yield from self._health_metrics()
        res = self._result()
        if res is None:
            return
        yield from self._series(res)
        yield from self._layers(res)
        yield from self._devices(res)
        rph = self._g("vramdoctor_server_requests_per_hour", [])
        if _ok(res.requests_per_hour):
            rph.add_metric([], res.requests_per_hour)
        idle = self._g("vramdoctor_watch_idle_windows", [])
        idle.add_metric([], float(res.idle_windows))
        overall = self._g("vramdoctor_verdict", ["verdict"])
        for v in VERDICTS:
            overall.add_metric([v], 1.0 if res.verdict == v else 0.0)
        window = self._g("vramdoctor_watch_window_seconds", [])
        window.add_metric([], res.window_s)
        yield from (rph, idle, overall, window)

    def _series(self, res: WatchResult) -> Iterator[Metric]:
        level = self._g("vramdoctor_process_memory_bytes", _SERIES_LABELS)
        floor = self._g("vramdoctor_process_memory_floor_bytes", _SERIES_LABELS)
        per_h = self._g("vramdoctor_process_memory_growth_bytes_per_hour", _SERIES_LABELS)
        per_r = self._g("vramdoctor_process_memory_growth_bytes_per_request", _SERIES_LABELS)
        oom = self._g("vramdoctor_process_memory_time_to_oom_seconds", _SERIES_LABELS)
        verdict = self._g("vramdoctor_process_memory_verdict", [*_SERIES_LABELS, "verdict"])
        kv_idle = self._g("vramdoctor_kv_idle_used_tokens", ["pool"])
        kv_per_r = self._g("vramdoctor_kv_growth_tokens_per_request", ["pool"])
        kv_verdict = self._g("vramdoctor_kv_verdict", ["pool", "verdict"])
        for s in res.series:
            if s.layer == "kv":
                pool = _lbl(s.pool)
                if _ok(s.growth_per_request):
                    kv_per_r.add_metric([pool], s.growth_per_request)
                for v in VERDICTS:
                    kv_verdict.add_metric([pool, v], 1.0 if s.verdict == v else 0.0)
                continue
            if not s.alive or s.layer == "device":
                continue  # an exited process's series stays in the JSON, not in /metrics
            labels = [
                _lbl(s.gpu),
                _lbl(s.gpu_instance),
                _lbl(s.pid),
                _lbl(s.process),
                s.layer,
                _lbl(s.scope),
            ]
            if _ok(s.level):
                level.add_metric(labels, s.level * MIB)
            if _ok(s.floor_level):
                floor.add_metric(labels, s.floor_level * MIB)
            if _ok(s.growth_per_hour):
                per_h.add_metric(labels, s.growth_per_hour * MIB)
            if _ok(s.growth_per_request):
                per_r.add_metric(labels, s.growth_per_request * MIB)
            if _ok(s.hours_to_oom):
                oom.add_metric(labels, s.hours_to_oom * 3600.0)
            for v in VERDICTS:
                verdict.add_metric([*labels, v], 1.0 if s.verdict == v else 0.0)
        for pool, used in res.kv_idle_used_tokens.items():
            kv_idle.add_metric([_lbl(pool)], used)
        yield from (level, floor, per_h, per_r, oom, verdict, kv_idle, kv_per_r, kv_verdict)

    def _layers(self, res: WatchResult) -> Iterator[Metric]:
        verdict = self._g("vramdoctor_layer_verdict", ["layer", "verdict"])
        per_h = self._g("vramdoctor_layer_growth_bytes_per_hour", ["layer"])
        oom = self._g("vramdoctor_layer_time_to_oom_seconds", ["layer"])
        for name, lay in res.layers.items():
            for v in VERDICTS:
                verdict.add_metric([name, v], 1.0 if lay.verdict == v else 0.0)
            if lay.verdict == "LEAK" and _ok(lay.rate_per_hour):
                per_h.add_metric([name], lay.rate_per_hour * (MIB if lay.unit == "MiB" else 1.0))
            if lay.verdict == "LEAK" and _ok(lay.hours_to_oom):
                oom.add_metric([name], lay.hours_to_oom * 3600.0)
        yield from (verdict, per_h, oom)

    def _devices(self, res: WatchResult) -> Iterator[Metric]:
        labels = ["gpu", "gpu_instance", "gpu_name"]
        used_g = self._g("vramdoctor_gpu_memory_used_bytes", labels)
        free = self._g("vramdoctor_gpu_memory_free_bytes", labels)
        total = self._g("vramdoctor_gpu_memory_total_bytes", labels)
        for g in res.gpus:
            lab = [_lbl(g.get("index")), _lbl(g.get("gpu_instance")), _lbl(g.get("name"))]
            for fam, key in ((used_g, "used_mib"), (free, "free_mib"), (total, "total_mib")):
                value = g.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    fam.add_metric(lab, float(value) * MIB)
        yield from (used_g, free, total)
        stray = self._g("vramdoctor_stray_context_bytes", ["gpu", "pid", "process", "flag"])
        for f in res.strays:
            if f.get("mib") is not None:
                stray.add_metric(
                    [
                        _lbl(f.get("gpu")),
                        _lbl(f.get("pid")),
                        _lbl(f.get("process")),
                        _lbl(f.get("code")),
                    ],
                    float(f["mib"]) * MIB,
                )
        yield stray

    def _health_metrics(self) -> Iterator[Metric]:
        h = self._health
        up = self._g("vramdoctor_sampler_up", ["source"])
        samples = CounterMetricFamily(
            "vramdoctor_sampler_samples",
            EXPORTED_METRICS["vramdoctor_sampler_samples_total"],
            labels=["source"],
        )
        errors = CounterMetricFamily(
            "vramdoctor_sampler_errors",
            EXPORTED_METRICS["vramdoctor_sampler_errors_total"],
            labels=["source"],
        )
        last = self._g("vramdoctor_sampler_last_success_timestamp_seconds", ["source"])
        dur = self._g("vramdoctor_sampler_duration_seconds", ["source"])
        for src in sorted(set(h.samples) | set(h.errors) | set(h.up)):
            up.add_metric([src], 1.0 if h.up.get(src) else 0.0)
            samples.add_metric([src], float(h.samples.get(src, 0)))
            errors.add_metric([src], float(h.errors.get(src, 0)))
            if src in h.last_success_wall:
                last.add_metric([src], h.last_success_wall[src])
            if src in h.last_duration_s:
                dur.add_metric([src], h.last_duration_s[src])
        events = CounterMetricFamily(
            "vramdoctor_events", EXPORTED_METRICS["vramdoctor_events_total"], labels=["event"]
        )
        for name, count in sorted(h.events.items()):
            events.add_metric([name], float(count))
        yield from (up, samples, errors, last, dur, events)
        if self._recording is not None:
            writing, dropped = self._recording()
            if writing is not None:
                rec = self._g("vramdoctor_watch_recording_up", [])
                rec.add_metric([], 1.0 if writing else 0.0)
                lost = CounterMetricFamily(
                    "vramdoctor_watch_records_dropped",
                    EXPORTED_METRICS["vramdoctor_watch_records_dropped_total"],
                )
                lost.add_metric([], float(dropped))
                yield from (rec, lost)
        if self._series_count is not None:
            n = self._g("vramdoctor_watch_series", [])
            n.add_metric([], float(self._series_count()))
            yield n


def parse_listen(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port); '[::1]:PORT' for IPv6. Port 0 picks a free port."""
    value = text.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise InputError(f"--listen wants HOST:PORT (e.g. 127.0.0.1:9840), not {text!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise InputError(f"--listen: {port_text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise InputError(f"--listen: port {port} is out of range")
    return host, port


@dataclass
class ExporterServer:
    """The running /metrics server: its URL and how to stop it."""

    url: str
    _server: Any
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve(collector: Collector, listen: str = "127.0.0.1:9840") -> ExporterServer:
    """Serve `collector` on its own registry at http://HOST:PORT/metrics (a daemon thread).

    prometheus-client's WSGI app (exposition, content negotiation, gzip) on the standard
    library's threading WSGI server: the same on every prometheus-client release pyproject allows.
    """
    host, port = parse_listen(listen)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server_class = _Server6 if ":" in host else _Server
    try:
        server = make_server(
            host, port, make_wsgi_app(registry), server_class, handler_class=_QuietHandler
        )
    except (OSError, socket.gaierror) as exc:
        raise InputError(
            f"--listen {listen}: cannot serve there ({getattr(exc, 'strerror', None) or exc})"
        ) from None
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.2},
        name="vramdoctor-exporter",
        daemon=True,
    )
    thread.start()
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    return ExporterServer(url=f"http://{shown}:{bound}/metrics", _server=server, _thread=thread)
