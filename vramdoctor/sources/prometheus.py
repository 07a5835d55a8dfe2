"""Prometheus's HTTP API: range queries chunked under the points limit, as numpy arrays.

`fleet` reads history that Prometheus already stores (dcgm-exporter, nvitop-exporter,
nvidia_gpu_exporter, the servers' own metrics, watch's exporter) instead of keeping its own.
API (prometheus.io/docs/prometheus/latest/querying/api/): `POST /api/v1/query_range` with
`query`, `start`, `end`, `step` answers `{"status": "success", "data": {"resultType":
"matrix", "result": [{"metric": {...}, "values": [[unix_s, "value"], ...]}]}}`; values are
strings and may be "NaN"/"+Inf". A query over more than 11,000 points per series is refused
with HTTP 400, so a long range is split into consecutive chunks of at most `max_points`
steps and the pieces are joined per series. Errors are one line with the URL's credentials
removed (`SourceUnavailable`, `InputError`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import requests

from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.redact import redact_url
from vramdoctor.sources.http import metrics_url

__all__ = ["MAX_POINTS_PER_SERIES", "PrometheusClient", "QueryStats", "RangeSeries", "chunk_bounds"]

MAX_POINTS_PER_SERIES = 11_000
"""Prometheus refuses a range query that would return more points than this per series."""


@dataclass
class RangeSeries:
    """One series of a range query: its labels, timestamps (unix s) and float values."""

    labels: dict[str, str]
    t: np.ndarray
    v: np.ndarray


@dataclass
class QueryStats:
    """What a client asked, for the report and the benchmarks."""

    query: str
    chunks: int = 0
    series: int = 0
    points: int = 0
    seconds: float = 0.0


@dataclass
class PrometheusClient:
    """A Prometheus server's query API. `url` is its base (http://host:9090)."""

    url: str
    timeout_s: float = 60.0
    headers: dict[str, str] | None = None
    max_points: int = 10_000
    parallel: int = 3  # chunks asked at once
    stats: list[QueryStats] = field(default_factory=list)

    def __post_init__(self) -> None:
        base = metrics_url(self.url, default_path="/")
        self.base = base.rstrip("/")
        for suffix in ("/graph", "/api/v1"):
            if self.base.endswith(suffix):
                self.base = self.base[: -len(suffix)]
        self.shown_url = redact_url(self.base)
        if not 2 <= self.max_points <= MAX_POINTS_PER_SERIES:
            raise InputError(f"max_points must be 2..{MAX_POINTS_PER_SERIES}")
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    @property
    def _session(self) -> requests.Session:
        """One kept-alive session per thread (chunks are fetched in parallel)."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            if self.headers:
                session.headers.update(self.headers)
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def close(self) -> None:
        with self._lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP -------------------------------------------------------------------------------
    def _post(self, path: str, data: dict[str, str]) -> Any:
        url = self.base + path
        try:
            resp = self._session.post(url, data=data, timeout=self.timeout_s)
        except requests.exceptions.Timeout:
            raise SourceUnavailable(
                f"Prometheus at {self.shown_url} did not answer within {self.timeout_s:g} s"
            ) from None
        except requests.exceptions.ConnectionError:
            raise SourceUnavailable(
                f"cannot connect to Prometheus at {self.shown_url}: is it running, and is the port right?"
            ) from None
        except requests.exceptions.RequestException as exc:
            raise SourceUnavailable(
                f"Prometheus at {self.shown_url} failed: {type(exc).__name__}"
            ) from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            if resp.status_code == 404:
                raise SourceUnavailable(
                    f"{self.shown_url} has no Prometheus API ({path} answered 404): is it the Prometheus base URL?"
                )
            raise SourceUnavailable(
                f"{self.shown_url}{path} answered HTTP {resp.status_code}, not Prometheus JSON"
            )
        if body.get("status") != "success":
            kind = body.get("errorType", f"HTTP {resp.status_code}")
            raise SourceUnavailable(
                f"Prometheus at {self.shown_url} refused the query ({kind}): {str(body.get('error'))[:300]}"
            )
        return body.get("data")

    def metric_names(self, start: float | None = None, end: float | None = None) -> set[str]:
        """Names of the metrics stored (between start and end, where the server supports it)."""
        data: dict[str, str] = {}
        if start is not None:
            data["start"] = _ts(start)
        if end is not None:
            data["end"] = _ts(end)
        url = self.base + "/api/v1/label/__name__/values"
        try:
            resp = self._session.get(url, params=data, timeout=self.timeout_s)
        except requests.exceptions.RequestException:
            raise SourceUnavailable(
                f"cannot connect to Prometheus at {self.shown_url}: is it running, and is the port right?"
            ) from None
        try:
            body = resp.json()
        except ValueError:  # requests' JSONDecodeError is a ValueError
            raise SourceUnavailable(
                f"{self.shown_url} did not answer as a Prometheus server (no JSON from /api/v1/label/__name__/values)"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise SourceUnavailable(
                f"Prometheus at {self.shown_url} could not list its metric names"
            )
        return {str(n) for n in body.get("data") or []}

    def query(self, query: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query: [(labels, value)] of a vector result."""
        data = {"query": query}
        if at is not None:
            data["time"] = _ts(at)
        result = self._post("/api/v1/query", data)
        out: list[tuple[dict[str, str], float]] = []
        if result and result.get("resultType") == "vector":
            for item in result.get("result") or []:
                out.append((dict(item.get("metric") or {}), float(item["value"][1])))
        return out

    def query_range(self, query: str, start: float, end: float, step_s: float) -> list[RangeSeries]:
        """A range query over [start, end] every `step_s` seconds, chunked under the points limit.

        Series are joined across chunks by their full label set, in time order. NaN values
        are kept (callers drop them).
        """
        if step_s <= 0 or end < start:
            raise InputError("a range query needs step > 0 and end >= start")
        stats = QueryStats(query=query)
        t0 = time.perf_counter()
        bounds = chunk_bounds(start, end, step_s, self.max_points)

        def fetch(
            bound: tuple[float, float],
        ) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
            result = self._post(
                "/api/v1/query_range",
                {
                    "query": query,
                    "start": _ts(bound[0]),
                    "end": _ts(bound[1]),
                    "step": _ts(step_s),
                },
            )
            if not result or result.get("resultType") != "matrix":
                raise SourceUnavailable(
                    f"Prometheus at {self.shown_url} answered a range query without a matrix"
                )
            got = []
            for item in result.get("result") or []:
                values = item.get("values") or []
                if values:
                    t = np.fromiter((p[0] for p in values), dtype=float, count=len(values))
                    v = np.array(
                        [p[1] for p in values], dtype=float
                    )  # "NaN", "+Inf" parse as floats
                    got.append((dict(item.get("metric") or {}), t, v))
            return got

        # Chunks in parallel: Prometheus evaluates the next while this process parses the last.
        if len(bounds) == 1:
            pieces = [fetch(bounds[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(self.parallel, len(bounds))) as pool:
                pieces = list(pool.map(fetch, bounds))
        parts: dict[
            tuple[tuple[str, str], ...], tuple[dict[str, str], list[np.ndarray], list[np.ndarray]]
        ] = {}
        for got in pieces:  # in time order
            stats.chunks += 1
            for labels, t, v in got:
                entry = parts.setdefault(tuple(sorted(labels.items())), (labels, [], []))
                entry[1].append(t)
                entry[2].append(v)
                stats.points += len(t)
        out = [
            RangeSeries(labels, np.concatenate(ts), np.concatenate(vs))
            for labels, ts, vs in parts.values()
        ]
        stats.series = len(out)
        stats.seconds = time.perf_counter() - t0
        self.stats.append(stats)
        return out


def _ts(value: float) -> str:
    if not math.isfinite(value):
        raise InputError("timestamps must be finite")
    return f"{value:.3f}"


def chunk_bounds(
    start: float, end: float, step_s: float, max_points: int
) -> Sequence[tuple[float, float]]:
    """The [start, end] pieces `query_range` asks for (each at most `max_points` steps)."""
    out = []
    span = step_s * (max_points - 1)
    s = start
    while s <= end:
        e = min(end, s + span)
        out.append((s, e))
        s = e + step_s
    return out
