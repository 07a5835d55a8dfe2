"""One HTTP client per worker thread; every outcome is classified, nothing raises.

A soak must survive the server it is measuring: errors, timeouts and a server that goes away
are counted as outcomes (`ok`, `http_error`, `timeout`, `connection`, `other`), never raised.
Streamed requests read the server-sent events to `data: [DONE]`; a request planned to abort
closes the connection after its first chunks (`aborted`: the server got it and must release
what it holds for it, the case real disconnect leaks need).
The API key is sent in the Authorization header only and appears in no outcome or message.
Redirects are not followed (a 3xx is an `http_error` naming where it pointed: the key would go
with a followed request to wherever the server sent it), and an answer is read up to
`ANSWER_MAX_BYTES` (a bigger one is an `http_error`, never held whole in memory).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import requests

from vramdoctor.redact import redact_text
from vramdoctor.soak.traffic.workload import PlannedRequest

OUTCOMES = ("ok", "aborted", "http_error", "timeout", "connection", "other")

# A completion's answer is kilobytes; one this large is not one (a proxy streaming a file).
ANSWER_MAX_BYTES = 16 * 1024 * 1024


@dataclass
class Outcome:
    kind: str  # one of OUTCOMES
    status: int | None
    latency_s: float
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


class LoadClient:
    """Sends planned requests to base_url; a requests.Session per thread (keep-alive)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._api_key = api_key
        self._local = threading.local()

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self._api_key:
            h["Authorization"] = f"Bearer {self._api_key}"
        return h

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            s.headers.update(self.headers())
            self._local.session = s
        return s

    def _clean(self, text: str) -> str:
        return redact_text(text, [self._api_key] if self._api_key else [])[:200]

    def _read_stream(
        self, req: PlannedRequest, resp: requests.Response, start: float, limit: float
    ) -> Outcome:
        """Read SSE chunks until [DONE], the planned abort, or the deadline (raises what
        requests raises; `send` classifies it)."""
        chunks = 0
        try:
            for line in resp.iter_lines():
                if time.monotonic() - start > limit:
                    raise requests.Timeout()
                if not line.startswith(b"data:"):
                    continue
                if line[5:].strip() == b"[DONE]":
                    return Outcome("ok", resp.status_code, time.monotonic() - start)
                chunks += 1
                if req.abort_after_chunks is not None and chunks >= req.abort_after_chunks:
                    # Close the socket itself: the server sees the client go away mid-stream.
                    self._local.session = None
                    return Outcome("aborted", resp.status_code, time.monotonic() - start)
        finally:
            resp.close()
        if chunks and req.abort_after_chunks is None:
            return Outcome("ok", resp.status_code, time.monotonic() - start)  # no [DONE] sent
        return Outcome(
            "http_error",
            resp.status_code,
            time.monotonic() - start,
            "stream ended before any chunk"
            if not chunks
            else "stream ended before the planned abort",
        )

    def send(self, req: PlannedRequest, timeout: float | None = None) -> Outcome:
        """Send one request; `timeout` can only shorten the client's own (a --duration deadline)."""
        limit = self.timeout if timeout is None else min(self.timeout, timeout)
        start = time.monotonic()
        try:
            resp = self._session().post(
                self.base_url + req.path,
                json=req.body,
                timeout=limit,
                stream=True,
                allow_redirects=False,
            )
            if (
                req.stream
                and 200 <= resp.status_code < 300
                and "event-stream" in resp.headers.get("content-type", "")
            ):
                return self._read_stream(req, resp, start, limit)
            try:
                body = resp.raw.read(ANSWER_MAX_BYTES + 1, decode_content=True)
            finally:
                resp.close()
        except requests.Timeout:
            return Outcome("timeout", None, time.monotonic() - start, f"no answer in {limit:g} s")
        except requests.ConnectionError as exc:
            self._local.session = None  # the server may come back: reconnect next time
            return Outcome(
                "connection",
                None,
                time.monotonic() - start,
                self._clean(type(exc).__name__ + ": server not reachable"),
            )
        except Exception as exc:  # never let one request end the soak
            return Outcome(
                "other", None, time.monotonic() - start, self._clean(f"{type(exc).__name__}: {exc}")
            )
        latency = time.monotonic() - start
        if 300 <= resp.status_code < 400:
            where = self._clean(resp.headers.get("location") or "nowhere said")
            return Outcome(
                "http_error",
                resp.status_code,
                latency,
                f"HTTP {resp.status_code}: a redirect to {where}, not followed (give the "
                "server's own URL)",
            )
        if len(body) > ANSWER_MAX_BYTES:
            return Outcome(
                "http_error",
                resp.status_code,
                latency,
                f"HTTP {resp.status_code}: an answer over {ANSWER_MAX_BYTES // 2**20} MiB, not "
                "read (not a completion)",
            )
        text = body.decode("utf-8", "replace")
        if 200 <= resp.status_code < 300:
            try:
                answer = json.loads(text)
            except ValueError:
                answer = None
            if isinstance(answer, dict) and "choices" in answer:
                return Outcome("ok", resp.status_code, latency)
            # A proxy's HTML page or some other service: the model did no work, so it is no
            # evidence about memory (counting it as ok made a soak of a wrong URL look STABLE).
            return Outcome(
                "http_error",
                resp.status_code,
                latency,
                self._clean(
                    f"HTTP {resp.status_code} but not a completion (no 'choices'): {text[:80]!r}"
                ),
            )
        detail = None
        try:
            detail = self._clean(str(json.loads(text).get("error", {}).get("message") or text))
        except Exception:
            detail = self._clean(text)
        return Outcome("http_error", resp.status_code, latency, detail)
