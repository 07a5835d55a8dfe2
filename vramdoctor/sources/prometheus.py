"""A Prometheus-compatible query API (Prometheus, VictoriaMetrics, Thanos, Mimir), defensively.

`fleet` reads history that the operator's time-series database already stores; it never
trusts what comes back. API (prometheus.io/docs/prometheus/latest/querying/api/), the same on
VictoriaMetrics, Thanos Querier and Mimir (which serves it under `/prometheus`):

- `POST /api/v1/query` (`query`, `time`) -> `{"status": "success", "data": {"resultType":
  "vector", "result": [{"metric": {...}, "value": [unix_s, "1.5"]}]}}`;
- `POST /api/v1/query_range` (`query`, `start`, `end`, `step`) -> `resultType` "matrix",
  `"values": [[unix_s, "1.5"], ...]`; values are strings and may be "NaN", "+Inf"; Prometheus
  refuses more than 11,000 points per series (HTTP 400), VictoriaMetrics more than
  `-search.maxPointsPerTimeseries` (30,000 by default);
- `GET /api/v1/label/<name>/values` (`start`, `end`, `match[]`) -> `"data": ["a", "b"]`;
- an error is `{"status": "error", "errorType": "bad_data", "error": "..."}`; `"warnings"`
  (Prometheus, Thanos partial responses) and VictoriaMetrics' `"isPartial": true` are notes.

What this client guarantees (each one against a fault a real proxy or database can show):

- **A total deadline per call** (`deadline_s`, name resolution + connect (a SOCKS proxy's
  handshake included) + wait + status line + headers + every byte of the answer;
  `vramdoctor.sources.guarded.Deadline` shuts the socket down when it
  passes, and the body is read with `read1`, so nothing waits for a full chunk): a server or
  proxy that trickles its answer or its headers is cut off at the deadline, not at each read.
- **No redirect followed**: a 3xx answer is one line naming its (redacted) target; its body is
  never read and the headers and credentials are never sent to another host.
- **A size cap per answer** (`max_answer_bytes`, counted after decompression, refused at once
  when `Content-Length` says so): a range query over the cap is split in time (at most
  `MAX_SPLITS` halvings), then refused with a note that names `--match` and `--step`.
- **Bounded chunking**: a range has at most `max_steps` steps per series (`InputError` before
  any query), cut into chunks of at most `max_points` steps by integer arithmetic, so no step
  or end can make the loop stall.
- **One clear line for every malformed answer** (`MalformedAnswer`, exit 2): wrong JSON
  shapes, null or non-numeric values, timestamps out of order, label values that are not
  strings. Nothing malformed becomes an empty, healthy-looking result.
- **Credentials never shown**: the user and password of `http://user:pw@host` are sent as Basic
  auth and registered with `vramdoctor.redact` (the password, `user:pw` and its base64 form,
  which is what a proxy echoes), as are secret-named query parameters (`?access_token=T`) and
  secret-named headers; the URL shown (`shown_url`) has none of them.
- **API paths joined to the URL's path** (`http://host/prometheus/?org=1` ->
  `http://host/prometheus/api/v1/query?org=1`): a path prefix is kept and the query string
  stays last.
- **Every call recorded** (`calls`: `Call` with kind, query, times, status, bytes, series,
  points, seconds), for `--json` and the benchmarks.

Errors: `SourceUnavailable` (cannot connect, deadline, refused query, answer over the cap) and
its subclasses `MalformedAnswer` and `AnswerTooLarge`; `InputError` for a bad URL or range.
Messages are one line, with credentials masked.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

import requests
import urllib3

from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.redact import one_line, redact_text, redact_url, register_secret, secret_name
from vramdoctor.sources.guarded import (
    Deadline,
    SocksUnavailable,
    guarded_session,
    is_redirect,
    not_reached,
    redirect_error,
)

if TYPE_CHECKING:  # numpy is imported where range answers are parsed (fleet loads it on a thread)
    import numpy as np

__all__ = [
    "MAX_POINTS_PER_SERIES",
    "MAX_SPLITS",
    "AnswerTooLarge",
    "Call",
    "InstantSample",
    "MalformedAnswer",
    "PrometheusClient",
    "RangeSeries",
    "chunk_bounds",
]

MAX_POINTS_PER_SERIES = 11_000
"""Prometheus refuses a range query that would return more points than this per series."""

MAX_SPLITS = 4
"""How many times a range query over the size cap is halved in time before it is refused."""

_READ_CHUNK = 16 * 1024  # bytes per read: also bounds what one gzip chunk can inflate to at once
_CONNECT_S = 10.0


class MalformedAnswer(SourceUnavailable):
    """The server answered, but not in the shape of the Prometheus API (exit 2)."""


class AnswerTooLarge(SourceUnavailable):
    """An answer over the size cap (`PrometheusClient.max_answer_bytes`)."""


@dataclass(frozen=True)
class InstantSample:
    """One series of an instant query: its labels and its value (float; NaN kept)."""

    labels: dict[str, str]
    value: float


@dataclass
class RangeSeries:
    """One series of a range query: labels, timestamps (unix s, increasing) and values."""

    labels: dict[str, str]
    t: np.ndarray
    v: np.ndarray


CallKind = Literal["labels", "instant", "range"]


@dataclass
class Call:
    """One request made (a range query's chunks are one call). Times are unix seconds."""

    kind: CallKind
    query: str
    time: float | None = None
    start: float | None = None
    end: float | None = None
    step_s: float | None = None
    status: str = "ok"  # ok | refused | too_large | timeout | malformed | unreachable
    chunks: int = 0
    series: int = 0
    points: int = 0
    bytes: int = 0
    seconds: float = 0.0
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`--json` "queries"): every field, times rounded to ms."""
        return {
            "kind": self.kind,
            "query": self.query,
            "time": self.time,
            "start": self.start,
            "end": self.end,
            "step_s": self.step_s,
            "status": self.status,
            "chunks": self.chunks,
            "series": self.series,
            "points": self.points,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "note": self.note,
        }


@dataclass
class _Endpoint:
    """The parsed base URL: where API paths go, and what it carries that must stay secret."""

    scheme: str
    netloc: str  # host[:port], no userinfo
    path: str  # the prefix API paths are joined to, no trailing slash
    query: list[tuple[str, str]]  # the URL's own parameters, sent last on every call
    auth: tuple[str, str] | None
    shown: str

    def url(self, api_path: str) -> str:
        query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in self.query)
        return urlunsplit((self.scheme, self.netloc, self.path + api_path, query, ""))


def _endpoint(url: str) -> _Endpoint:
    text = url.strip()
    if not text:
        raise InputError("--prometheus wants a URL like http://prometheus:9090")
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise InputError(f"--prometheus: not a URL ({redact_url(one_line(url))}: {exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(
            f"--prometheus wants an http:// or https:// URL with a host, not {redact_url(one_line(url))}"
        )
    auth = None
    if parts.username is not None or parts.password is not None:
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        auth = (user, password)
        for secret in (password, f"{user}:{password}"):
            register_secret(secret)
        register_secret(base64.b64encode(f"{user}:{password}".encode()).decode())
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host + (f":{port}" if port is not None else "")
    path = parts.path.rstrip("/")
    for suffix in ("/graph", "/api/v1/query_range", "/api/v1/query", "/api/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)].rstrip("/")
            break
    query = parse_qsl(parts.query, keep_blank_values=True)
    for name, value in query:
        if secret_name(name, url_param=True):
            register_secret(value)
    shown = redact_url(urlunsplit((parts.scheme, netloc, path or "", parts.query, "")))
    return _Endpoint(parts.scheme, netloc, path, query, auth, shown)


def chunk_bounds(
    start: float, end: float, step_s: float, max_points: int, *, max_steps: int = 1_000_000
) -> list[tuple[float, float]]:
    """The [start, end] pieces a range query asks for: each at most `max_points` steps, every
    step of the range exactly once, computed by index (no float accumulation, so the loop
    always ends). InputError for a range over `max_steps` steps, a step that is not a positive
    finite number, or end < start."""
    for value in (start, end, step_s):
        if not math.isfinite(value):
            raise InputError("a range query needs finite times and step")
    if step_s <= 0 or end < start:
        raise InputError("a range query needs step > 0 and end >= start")
    if max_points < 2:
        raise InputError("max_points must be at least 2")
    steps = math.floor((end - start) / step_s + 1e-9) + 1
    if steps > max_steps:
        raise InputError(
            f"the range is {steps:,} steps of {step_s:g} s per series (at most {max_steps:,}): "
            "coarsen --step or shorten --since"
        )
    out = []
    for first in range(0, steps, max_points):
        last = min(first + max_points, steps) - 1
        out.append((start + first * step_s, start + last * step_s))
    return out


def _ts(value: float) -> str:
    if not math.isfinite(value):
        raise InputError("timestamps must be finite")
    return f"{value:.3f}"


def _socket(resp: requests.Response) -> Any:
    """The socket under a streamed response (urllib3 1.x and 2.x), or None."""
    raw = resp.raw
    conn = getattr(raw, "connection", None) or getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is None:
        fp = getattr(raw, "_fp", None)
        sock = getattr(getattr(getattr(fp, "fp", None), "raw", None), "_sock", None)
    return sock


class PrometheusClient:
    """A Prometheus-compatible query API at `url` (its base: http://host:9090, or a path prefix
    such as http://mimir/prometheus). Thread-safe; use as a context manager or call `close`.

    `deadline_s`: total time for one call, connect to last byte (a range query's chunks each
    get their own). `max_answer_bytes`: the largest answer read (decoded bytes). `max_points`:
    steps per chunk of a range query (<= 11,000). `max_steps`: steps per series of one range
    query in all. `parallel`: chunks and `many()` jobs asked at once. `headers`: sent on every
    call (secret-named ones are masked in every output).
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        deadline_s: float = 60.0,
        max_answer_bytes: int = 64 * 1024 * 1024,
        max_points: int = 10_000,
        max_steps: int = 1_000_000,
        parallel: int = 3,
    ) -> None:
        if not (math.isfinite(deadline_s) and 0 < deadline_s <= 86_400):
            raise InputError("the query deadline must be between 0 and 86400 seconds")
        if not 1024 <= max_answer_bytes <= 1 << 40:
            raise InputError("the answer size cap must be between 1 KiB and 1 TiB")
        if not 2 <= max_points <= MAX_POINTS_PER_SERIES:
            raise InputError(f"max_points must be 2..{MAX_POINTS_PER_SERIES}")
        self._endpoint = _endpoint(url)
        self.shown_url = self._endpoint.shown
        self.deadline_s = float(deadline_s)
        self.max_answer_bytes = int(max_answer_bytes)
        self.max_points = int(max_points)
        self.max_steps = int(max_steps)
        self.parallel = max(1, int(parallel))
        self.headers = dict(headers or {})
        for name, value in self.headers.items():
            if secret_name(name) or name.lower() in ("authorization", "proxy-authorization"):
                register_secret(value)
                if " " in value.strip():  # "Bearer T", "Basic B64": the credential itself too
                    register_secret(value.strip().split(None, 1)[1])
        self.calls: list[Call] = []
        self.notes: list[str] = []
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        self._closed = False

    # -- plumbing --------------------------------------------------------------------------
    @property
    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = guarded_session()
            session.headers.update(self.headers)
            if self._endpoint.auth is not None:
                session.auth = self._endpoint.auth
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def close(self) -> None:
        """Close every connection (also aborts calls in flight on other threads)."""
        with self._lock:
            self._closed = True
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def _note(self, text: str) -> None:
        text = one_line(redact_text(text))
        with self._lock:
            if text not in self.notes:
                self.notes.append(text)

    def _what(self) -> str:
        return f"Prometheus at {self.shown_url}"

    def _exchange(
        self, method: str, api_path: str, params: Sequence[tuple[str, str]], call: Call
    ) -> Any:
        """One HTTP call under the deadline and size cap; returns the parsed JSON `data`.

        The deadline is total (`guarded.Deadline`: connect, status line, headers and body; the
        socket is shut down when it passes); a redirect is refused, never followed."""
        with Deadline(self.deadline_s) as deadline:
            status, body = self._call(method, api_path, params, call, deadline)
        return self._data(status, body, api_path, call)

    def _slow(
        self, call: Call, got: int | None = None, *, deadline: Deadline | None = None
    ) -> SourceUnavailable:
        call.status = "timeout"
        early = (
            not_reached(
                deadline, "Prometheus", self.shown_url, self.deadline_s, " (--query-timeout)"
            )
            if deadline is not None
            else None
        )
        if early is not None:
            return early
        if got is None:
            return SourceUnavailable(
                f"{self._what()} did not answer within the {self.deadline_s:g} s deadline "
                "(--query-timeout)"
            )
        return SourceUnavailable(
            f"{self._what()} did not finish its answer within the {self.deadline_s:g} s "
            f"deadline ({got:,} bytes read; --query-timeout)"
        )

    def _call(
        self,
        method: str,
        api_path: str,
        params: Sequence[tuple[str, str]],
        call: Call,
        deadline: Deadline,
    ) -> tuple[int, bytes]:
        url = self._endpoint.url(api_path)
        kwargs: dict[str, Any] = {"stream": True, "allow_redirects": False}
        if method == "GET":
            kwargs["params"] = list(params)
        else:
            kwargs["data"] = list(params)
        kwargs["timeout"] = (min(_CONNECT_S, deadline.remaining()), deadline.remaining())
        t0 = time.perf_counter()
        try:
            resp = self._session.request(method, url, **kwargs)
        except requests.exceptions.Timeout:
            raise self._slow(call, deadline=deadline) from None
        except requests.exceptions.ConnectionError as exc:
            if deadline.expired():
                raise self._slow(call, deadline=deadline) from None
            call.status = "unreachable"
            if deadline.connected:
                raise SourceUnavailable(
                    f"{self._what()} connected but closed the connection before its answer "
                    f"({type(exc).__name__})"
                ) from None
            raise SourceUnavailable(
                f"cannot connect to {self._what()}: is it running, and is the port right?"
            ) from None
        except SocksUnavailable as exc:
            call.status = "unreachable"
            raise SourceUnavailable(f"{self._what()} was not reached: {exc}") from None
        except requests.exceptions.RequestException as exc:
            call.status = "unreachable"
            raise SourceUnavailable(f"{self._what()} failed: {type(exc).__name__}") from None
        try:
            if is_redirect(resp):
                call.status = "refused"
                raise redirect_error(resp, "Prometheus", self.shown_url)
            body = self._read(resp, deadline, call)
        finally:
            resp.close()
            call.seconds += time.perf_counter() - t0
        return resp.status_code, body

    def _read(self, resp: requests.Response, deadline: Deadline, call: Call) -> bytes:
        """The body, in `read1` pieces (whatever one recv brought, never a wait for a full
        chunk), the total deadline checked between pieces, the size cap after decoding."""
        cap = self.max_answer_bytes
        length = resp.headers.get("Content-Length", "")
        if (
            length.isdigit()
            and int(length) > cap
            and resp.headers.get("Content-Encoding")
            in (
                None,
                "identity",
            )
        ):
            call.status = "too_large"
            raise AnswerTooLarge(self._too_large(int(length)))
        sock = _socket(resp)
        raw = resp.raw
        buf = bytearray()
        try:
            while True:
                if deadline.expired():
                    raise self._slow(call, len(buf))
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.settimeout(deadline.remaining())
                chunk = raw.read1(_READ_CHUNK, decode_content=True)
                if not chunk:
                    if deadline.fired:  # the deadline's timer shut the socket: not the end
                        raise self._slow(call, len(buf))
                    break
                buf += chunk
                if len(buf) > cap:
                    call.status = "too_large"
                    raise AnswerTooLarge(self._too_large(len(buf), at_least=True))
        except (urllib3.exceptions.HTTPError, requests.exceptions.RequestException, OSError) as exc:
            if deadline.expired() or "timed out" in str(exc):
                raise self._slow(call, len(buf)) from None
            call.status = "unreachable"
            raise SourceUnavailable(
                f"{self._what()} broke off its answer after {len(buf):,} bytes ({type(exc).__name__})"
            ) from None
        call.bytes += len(buf)
        return bytes(buf)

    def _too_large(self, size: int, *, at_least: bool = False) -> str:
        more = "over " if at_least else ""
        return (
            f"{self._what()} sent an answer of {more}{size / 2**20:,.1f} MiB, over the "
            f"{self.max_answer_bytes / 2**20:,.0f} MiB cap (--max-answer-mib): narrow --match "
            "or coarsen --step"
        )

    def _data(self, status: int, raw: bytes, api_path: str, call: Call) -> Any:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: [[[[... deep
            body = None
        if not isinstance(body, dict):
            call.status = "malformed"
            if status == 404:
                raise SourceUnavailable(
                    f"{self.shown_url} has no Prometheus API ({api_path} answered 404): is it the "
                    "Prometheus base URL?"
                )
            if status in (401, 403):
                raise SourceUnavailable(
                    f"{self._what()} refused the credentials (HTTP {status}): check the URL's "
                    "user and password, VRAMDOCTOR_PROMETHEUS_TOKEN or --header"
                )
            raise MalformedAnswer(
                f"{self.shown_url} did not answer as a Prometheus server ({api_path} answered "
                f"HTTP {status}, not Prometheus JSON): is it the base URL of Prometheus?"
            )
        if body.get("status") != "success":
            call.status = "refused"
            kind = body.get("errorType")
            kind = kind if isinstance(kind, str) else f"HTTP {status}"
            error = body.get("error")
            text = (
                one_line(redact_text(str(error)))[:300] if error is not None else "no reason given"
            )
            if body.get("status") != "error":
                call.status = "malformed"
                raise MalformedAnswer(
                    f"{self._what()} answered {api_path} with status "
                    f"{one_line(str(body.get('status')))[:40]!r}, not success or error"
                )
            raise SourceUnavailable(
                f"{self._what()} refused the query ({one_line(kind)[:40]}): {text}"
            )
        for key in ("warnings", "infos"):
            extra = body.get(key)
            if isinstance(extra, list):
                for w in extra[:5]:
                    self._note(f"{self.shown_url} warned: {str(w)[:200]}")
        if body.get("isPartial") is True:
            self._note(
                f"{self.shown_url} said its answer is partial (a storage node did not answer): "
                "some series may be missing"
            )
        if "data" not in body:
            call.status = "malformed"
            raise MalformedAnswer(f"{self._what()} answered {api_path} without data")
        return body["data"]

    def _malformed(self, call: Call, what: str) -> MalformedAnswer:
        call.status = "malformed"
        return MalformedAnswer(f"{self._what()} sent a malformed answer: {what}")

    # -- the API -----------------------------------------------------------------------------
    def label_values(
        self,
        label: str,
        start: float | None = None,
        end: float | None = None,
        match: Sequence[str] = (),
    ) -> list[str]:
        """Values of `label` among the series stored between start and end (where the server
        supports the range), optionally only those matching the `match` selectors."""
        params: list[tuple[str, str]] = []
        if start is not None:
            params.append(("start", _ts(start)))
        if end is not None:
            params.append(("end", _ts(end)))
        params += [("match[]", m) for m in match]
        call = Call("labels", f"label/{label}/values", start=start, end=end)
        try:
            data = self._exchange(
                "GET", f"/api/v1/label/{quote(label, safe='')}/values", params, call
            )
            if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
                raise self._malformed(call, f"the {label} values are not a list of strings")
            call.series = len(data)
            return list(data)
        finally:
            self._record(call)

    def metric_names(self, start: float | None = None, end: float | None = None) -> set[str]:
        """Names of the metrics stored between start and end."""
        return set(self.label_values("__name__", start, end))

    def instant(self, query: str, at: float) -> list[InstantSample]:
        """An instant query at `at` (unix s): one value per series. A scalar answer is one
        sample with no labels."""
        call = Call("instant", query, time=at)
        try:
            data = self._exchange(
                "POST", "/api/v1/query", [("query", query), ("time", _ts(at))], call
            )
            out = self._vector(data, call)
            call.series = call.points = len(out)
            call.chunks = 1
            return out
        finally:
            self._record(call)

    def _vector(self, data: Any, call: Call) -> list[InstantSample]:
        if not isinstance(data, dict):
            raise self._malformed(call, "data is not an object")
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar":
            value = self._point(result, call)
            return [InstantSample({}, value[1])]
        if kind != "vector" or not isinstance(result, list):
            raise self._malformed(
                call, f"an instant query answered {one_line(str(kind))[:20]!r}, not a vector"
            )
        out = []
        for item in result:
            if not isinstance(item, dict):
                raise self._malformed(call, "a result item is not an object")
            labels = self._labels(item.get("metric"), call)
            if "value" not in item:
                if "histogram" in item:
                    continue  # native histograms carry no gauge value: not a memory series
                raise self._malformed(call, "a vector item has no value")
            out.append(InstantSample(labels, self._point(item["value"], call)[1]))
        return out

    def _labels(self, metric: Any, call: Call) -> dict[str, str]:
        if not isinstance(metric, dict):
            raise self._malformed(call, "a series has no label object")
        for k, v in metric.items():
            if not isinstance(v, str):
                raise self._malformed(call, f"label {one_line(str(k))[:40]!r} is not a string")
        return dict(metric)

    def _point(self, pair: Any, call: Call) -> tuple[float, float]:
        if not isinstance(pair, list) or len(pair) != 2:
            raise self._malformed(call, "a sample is not a [time, value] pair")
        t, v = pair
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise self._malformed(call, "a sample's time is not a finite number")
        return float(t), self._value(v, call)

    def _value(self, v: Any, call: Call) -> float:
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                raise self._malformed(
                    call, f"a value is not a number: {one_line(v)[:30]!r}"
                ) from None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        raise self._malformed(
            call, f"a value is {'null' if v is None else type(v).__name__}, not a number"
        )

    def _matrix(self, data: Any, call: Call) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
        import numpy as np

        if not isinstance(data, dict):
            raise self._malformed(call, "data is not an object")
        kind, result = data.get("resultType"), data.get("result")
        if kind != "matrix" or not isinstance(result, list):
            raise self._malformed(
                call, f"a range query answered {one_line(str(kind))[:20]!r}, not a matrix"
            )
        out = []
        for item in result:
            if not isinstance(item, dict):
                raise self._malformed(call, "a result item is not an object")
            labels = self._labels(item.get("metric"), call)
            values = item.get("values")
            if values is None and "histograms" in item:
                continue
            if not isinstance(values, list):
                raise self._malformed(call, "a series has no list of values")
            if not values:
                continue
            try:
                ts, vs = zip(*values, strict=True)
            except (TypeError, ValueError):
                raise self._malformed(call, "a sample is not a [time, value] pair") from None
            if len(ts) != len(values):
                raise self._malformed(call, "a sample is not a [time, value] pair")
            if not all(isinstance(x, str) for x in vs):
                for x in vs:  # names the first bad one
                    self._value(x, call)
            if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in ts):
                raise self._malformed(call, "a sample's time is not a number")
            t = np.array(ts, dtype=float)
            try:
                v = np.array(vs, dtype=float)
            except ValueError:
                for x in vs:
                    self._value(x, call)
                raise self._malformed(call, "a value is not a number") from None
            if not np.isfinite(t).all():
                raise self._malformed(call, "a sample's time is not finite")
            if len(t) > 1 and not (np.diff(t) > 0).all():
                raise self._malformed(call, "a series' times are not in increasing order")
            out.append((labels, t, v))
        return out

    def range(self, query: str, start: float, end: float, step_s: float) -> list[RangeSeries]:
        """A range query over [start, end] every `step_s` seconds, chunked under the points
        limit and the size cap (an answer over the cap is asked again in halves, at most
        `MAX_SPLITS` times). Series are joined across chunks by their label set, in time
        order; NaN values are kept (callers decide)."""
        import numpy as np

        call = Call("range", query, start=start, end=end, step_s=step_s)
        try:
            bounds = chunk_bounds(start, end, step_s, self.max_points, max_steps=self.max_steps)
            pieces = self._map(lambda b: self._range_piece(query, b, step_s, call, 0), bounds)
            parts: dict[
                tuple[tuple[str, str], ...],
                tuple[dict[str, str], list[np.ndarray], list[np.ndarray]],
            ] = {}
            for got in pieces:  # in time order
                for labels, t, v in got:
                    entry = parts.setdefault(tuple(sorted(labels.items())), (labels, [], []))
                    entry[1].append(t)
                    entry[2].append(v)
                    call.points += len(t)
            out = []
            for labels, ts, vs in parts.values():
                t, v = (ts[0], vs[0]) if len(ts) == 1 else (np.concatenate(ts), np.concatenate(vs))
                if len(t) > 1 and not (np.diff(t) > 0).all():  # chunks overlapped: keep the first
                    keep = np.r_[True, np.diff(t) > 0]
                    t, v = t[keep], v[keep]
                out.append(RangeSeries(labels, t, v))
            call.series = len(out)
            return out
        finally:
            self._record(call)

    def _range_piece(
        self, query: str, bound: tuple[float, float], step_s: float, call: Call, depth: int
    ) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
        params = [
            ("query", query),
            ("start", _ts(bound[0])),
            ("end", _ts(bound[1])),
            ("step", _ts(step_s)),
        ]
        try:
            data = self._exchange("POST", "/api/v1/query_range", params, call)
        except AnswerTooLarge:
            steps = round((bound[1] - bound[0]) / step_s) + 1
            if depth >= MAX_SPLITS or steps < 2:
                raise
            call.status = "ok"
            call.note = "answers over the size cap were asked again in halves"
            mid = bound[0] + (steps // 2) * step_s
            first = self._range_piece(query, (bound[0], mid - step_s), step_s, call, depth + 1)
            second = self._range_piece(query, (mid, bound[1]), step_s, call, depth + 1)
            return first + second
        with self._lock:
            call.chunks += 1
        return self._matrix(data, call)

    def _map(
        self, fn: Callable[[Any], Any], items: Sequence[Any], *, at_once: int | None = None
    ) -> list[Any]:
        """fn over items, `parallel` at once, results in order; the first error is raised.

        The workers are daemon threads: on an error or Ctrl-C the caller goes on at once, and
        a call still in flight (it ends by its deadline) never holds the process at exit.
        """
        width = max(1, at_once if at_once is not None else self.parallel)
        if len(items) <= 1 or width == 1:
            return [fn(x) for x in items]
        results: list[Any] = [None] * len(items)
        errors: list[BaseException] = []
        order = iter(range(len(items)))
        lock = threading.Lock()
        done = threading.Event()
        left = [len(items)]

        def worker() -> None:
            while True:
                with lock:
                    i = None if errors else next(order, None)
                if i is None:
                    return
                try:
                    results[i] = fn(items[i])
                except BaseException as exc:  # handed to the caller
                    with lock:
                        errors.append(exc)
                    done.set()
                    return
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

        for _ in range(min(width, len(items))):
            threading.Thread(target=worker, name="vramdoctor-prometheus", daemon=True).start()
        done.wait()
        if errors:
            raise errors[0]
        return results

    def many(self, jobs: Sequence[Callable[[], Any]], *, at_once: int | None = None) -> list[Any]:
        """Run independent calls (closures over `instant`/`range`), `parallel` at once (or
        `at_once`), results in order; the first error is raised."""
        return self._map(lambda job: job(), jobs, at_once=at_once)
