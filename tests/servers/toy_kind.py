"""A server kind defined outside vramdoctor (as a plugin would), and a toy server of that kind.

`KIND` is registered by `register()`; `ToyServer` serves the kind's identification probe,
/v1/models, /v1/chat/completions and a /metrics page in the kind's own names, whose KV pool
keeps `leak_tokens` tokens per finished request (used tokens at idle never return to 0: a KV
leak a correct soak must find through the toy's names alone).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vramdoctor import servers
from vramdoctor.servers.base import (
    Identity,
    KvPoolMetrics,
    Metrics,
    MetricSeries,
    Probe,
    ProbeAnswer,
    ProcessTitle,
    ServerKind,
)


def _read(data: object) -> ProbeAnswer | None:
    if isinstance(data, dict) and data.get("server") == "toyserve":
        return ProbeAnswer(version=str(data.get("release")), model="toy-1b")
    return None


KIND = ServerKind(
    name="toy",
    display_name="ToyServe",
    identity=Identity(
        probes=(Probe("/toy/about", _read),),
        metric_prefixes=("toy_",),
        titles=(ProcessTitle(re.compile(r"toyserve::engine"), "toy engine", "engine", "model"),),
    ),
    metrics=Metrics(
        series=(
            MetricSeries("running_requests", ("toy_running",), "sum", "requests", "running"),
            MetricSeries("queued_requests", ("toy_waiting",), "sum", "requests", "waiting"),
        ),
        kv_pools=(
            KvPoolMetrics(
                "kv",
                used=("toy_kv_used_tokens",),
                capacity="toy_kv_capacity_tokens",
                primary=True,
            ),
        ),
        running_requests=("toy_running",),
        queued_requests=("toy_waiting",),
        request_counters=("toy_requests_total",),
    ),
)


def register() -> None:
    if KIND.name not in {k.name for k in servers.kinds()}:
        servers.register(KIND)


class ToyServer:
    def __init__(self, leak_tokens: int = 16) -> None:
        self.leak_tokens = leak_tokens
        self.done = 0
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, ctype: str, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/toy/about":
                    self._send(
                        200,
                        "application/json",
                        json.dumps({"server": "toyserve", "release": "3.1"}),
                    )
                elif path == "/v1/models":
                    self._send(200, "application/json", json.dumps({"data": [{"id": "toy-1b"}]}))
                elif path == "/metrics":
                    with owner.lock:
                        used = owner.done * owner.leak_tokens
                        done = owner.done
                    page = (
                        "# TYPE toy_running gauge\ntoy_running 0\n"
                        "# TYPE toy_waiting gauge\ntoy_waiting 0\n"
                        f"# TYPE toy_kv_used_tokens gauge\ntoy_kv_used_tokens {used}\n"
                        "# TYPE toy_kv_capacity_tokens gauge\ntoy_kv_capacity_tokens 1000000\n"
                        f"# TYPE toy_requests counter\ntoy_requests_total {done}\n"
                    )
                    self._send(200, "text/plain; version=0.0.4", page)
                else:
                    self._send(404, "text/plain", "no")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if self.path.split("?", 1)[0] != "/v1/chat/completions":
                    self._send(404, "text/plain", "no")
                    return
                with owner.lock:
                    owner.done += 1
                answer = {
                    "id": "x",
                    "object": "chat.completion",
                    "model": "toy-1b",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }
                self._send(200, "application/json", json.dumps(answer))

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> ToyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
