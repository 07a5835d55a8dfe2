"""A misbehaving reverse proxy in front of a real Prometheus or VictoriaMetrics.

Real operators put Prometheus behind proxies (auth, tenancy, path prefixes); proxies and
overloaded servers trickle, truncate, inflate and reshape answers, and careless ones echo the
credentials they were sent. `Proxy(upstream)` forwards every request to the real engine and
then applies `mode` to the answer:

- "pass": unchanged; "trickle": the real answer, `trickle_bytes` every `trickle_s` seconds;
- "huge": a valid answer padded to `huge_mib` MiB (one extra series with that many points);
- "shape:<kind>": a wrong JSON shape (`data_list`, `result_obj`, `value_null`, `value_text`,
  `times_backwards`, `label_number`, `status_odd`, `html`, `values_null`);
- "echo": an error answer whose message repeats the Authorization header it was sent.

`require_auth=(user, password)` answers 401 without that Basic auth; `require_query=(name,
value)` answers 403 unless the query string carries it; `prefix` is a path the proxy serves
the API under (e.g. "/prom"). `seen` records each request's path and query string.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests


class Proxy:
    def __init__(self, upstream: str, *, prefix: str = "") -> None:
        self.upstream = upstream.rstrip("/")
        self.prefix = prefix.rstrip("/")
        self.mode = "pass"
        self.trickle_bytes = 64
        self.trickle_s = 0.3
        self.huge_mib = 50.0
        self.require_auth: tuple[str, str] | None = None
        self.require_query: tuple[str, str] | None = None
        self.seen: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}{self.prefix}"

    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(handler.path)
        self.seen.append(handler.path)
        if self.require_auth is not None:
            want = "Basic " + base64.b64encode(":".join(self.require_auth).encode()).decode()
            if handler.headers.get("Authorization") != want:
                return self._send(handler, 401, b'{"status":"error","error":"unauthorized"}')
        query = parse_qsl(parts.query, keep_blank_values=True)
        if self.require_query is not None and self.require_query not in query:
            return self._send(handler, 403, b'{"status":"error","error":"no token"}')
        path = parts.path
        if self.prefix:
            if not path.startswith(self.prefix + "/"):
                return self._send(handler, 404, b"404 page not found", "text/plain")
            path = path[len(self.prefix) :]
        upstream_query = [
            (k, v) for k, v in query if not (self.require_query and k == self.require_query[0])
        ]
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        if self.mode == "echo":
            said = handler.headers.get("Authorization", "")
            msg = {
                "status": "error",
                "errorType": "bad_data",
                "error": f"denied for {said} on {handler.path}",
            }
            return self._send(handler, 400, json.dumps(msg).encode())
        resp = requests.request(
            method,
            self.upstream + path,
            params=upstream_query,
            data=body,
            headers={
                "Content-Type": handler.headers.get(
                    "Content-Type", "application/x-www-form-urlencoded"
                )
            },
            timeout=120,
        )
        data = resp.content
        if self.mode.startswith("shape:"):
            data = _reshape(self.mode.split(":", 1)[1], data)
        elif self.mode == "huge":
            data = _inflate(data, self.huge_mib)
        if self.mode == "trickle":
            return self._trickle(handler, resp.status_code, data)
        ctype = "text/html" if self.mode == "shape:html" else "application/json"
        self._send(handler, resp.status_code, data, ctype)

    def _send(
        self,
        handler: BaseHTTPRequestHandler,
        code: int,
        data: bytes,
        ctype: str = "application/json",
    ) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        with contextlib.suppress(OSError):
            handler.wfile.write(data)

    def _trickle(self, handler: BaseHTTPRequestHandler, code: int, data: bytes) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        try:
            for i in range(0, len(data), self.trickle_bytes):
                handler.wfile.write(data[i : i + self.trickle_bytes])
                handler.wfile.flush()
                time.sleep(self.trickle_s)
        except OSError:
            pass  # the client gave up: what a deadline is for

    @contextlib.contextmanager
    def running(self) -> Iterator[Proxy]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy._answer(self, "GET")

            def do_POST(self) -> None:
                proxy._answer(self, "POST")

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()


def _reshape(kind: str, data: bytes) -> bytes:
    doc: Any = json.loads(data)
    if kind == "html":
        return b"<html><body>Welcome to nginx!</body></html>"
    if kind == "status_odd":
        doc["status"] = "maybe"
        return json.dumps(doc).encode()
    if not isinstance(doc.get("data"), dict) or not isinstance(doc["data"].get("result"), list):
        return data  # label lists etc.: passed through
    result = doc["data"]["result"]
    if kind == "data_list":
        doc["data"] = [doc["data"]]
    elif kind == "result_obj":
        doc["data"]["result"] = {"series": result}
    elif kind in ("value_null", "value_text", "values_null"):
        for item in result:
            if "value" in item:
                item["value"][1] = None if kind != "value_text" else "lots"
            for pair in item.get("values", []):
                pair[1] = None if kind != "value_text" else "lots"
    elif kind == "times_backwards":
        for item in result:
            if len(item.get("values", [])) > 1:
                item["values"].reverse()
    elif kind == "label_number":
        for item in result:
            item["metric"]["gpu"] = 0
    return json.dumps(doc).encode()


def _inflate(data: bytes, mib: float) -> bytes:
    doc: Any = json.loads(data)
    if not isinstance(doc.get("data"), dict) or not isinstance(doc["data"].get("result"), list):
        return data
    point = [1.7e9, "12345.678"]
    n = int(mib * 1024 * 1024 / 24)
    kind = doc["data"].get("resultType")
    if kind == "matrix":
        doc["data"]["result"].append({"metric": {"pad": "x"}, "values": [point] * n})
    else:
        doc["data"]["result"].extend(
            {"metric": {"pad": str(i)}, "value": point} for i in range(n // 3)
        )
    return json.dumps(doc).encode()
