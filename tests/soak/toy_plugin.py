"""A plugin made outside vramdoctor: a server kind, a memory layer and its report block.

`register()` adds, through the three public registries only (no edit of vramdoctor):
- the server kind "toyvlm" (`vramdoctor.servers.register`): identified by GET /toyvlm/about,
  its /metrics prefix `toyvlm_`, a KV pool in its own names;
- the memory layer "adapters" (`vramdoctor.judge.layers.register`): the MiB the server's
  adapter cache holds, its gauge `toyvlm_adapter_cache_mib` (the kind's stable name
  `adapter_cache_mib`, so every /metrics sample keeps it),
  judged like every other series (settled level per idle window, the growth model);
- its report block (`vramdoctor.soak.report.layers.register`): the layer's name and its own
  LEAK sentence.

`ToyServer(leak_mib)` is a real loopback HTTP server of that kind whose adapter cache keeps
`leak_mib` MiB per finished request (never released: a leak in the toy layer), while its KV
pool returns to 0 at idle.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vramdoctor import servers
from vramdoctor.judge import layers
from vramdoctor.judge.layers import LayerContext, worst_layer
from vramdoctor.judge.results import LayerResult, SoakAnalysis
from vramdoctor.judge.series import Series
from vramdoctor.samples import MetricsSample
from vramdoctor.servers.base import (
    Identity,
    KvPoolMetrics,
    Metrics,
    MetricSeries,
    Probe,
    ProbeAnswer,
    ServerKind,
)
from vramdoctor.soak.report import layers as blocks
from vramdoctor.soak.report.layers import LayerBlock, who
from vramdoctor.soak.report.text import rate

GAUGE = "toyvlm_adapter_cache_mib"
STABLE_NAME = "adapter_cache_mib"  # the kind's stable name: kept in every /metrics sample


def _read(data: object) -> ProbeAnswer | None:
    if isinstance(data, dict) and data.get("engine") == "toyvlm":
        return ProbeAnswer(version=str(data.get("version")), model="toyvlm-2b")
    return None


KIND = ServerKind(
    name="toyvlm",
    display_name="ToyVLM",
    identity=Identity(probes=(Probe("/toyvlm/about", _read),), metric_prefixes=("toyvlm_",)),
    metrics=Metrics(
        series=(MetricSeries(STABLE_NAME, (GAUGE,), "sum", "MiB", "adapter weights cached"),),
        kv_pools=(KvPoolMetrics("kv", used=("toyvlm_kv_used_tokens",), capacity="toyvlm_kv_total", primary=True),),
        running_requests=("toyvlm_running",),
        queued_requests=("toyvlm_waiting",),
    ),
)  # fmt: skip


class AdapterLayer:
    """The adapter cache, in MiB, from the server's own gauge."""

    name = "adapters"
    unit = "MiB"

    def extract(self, records: Sequence[Any]) -> dict[str, Series]:
        s = Series("adapters/cache", self.name, "adapter_cache", self.unit)
        s.points = [
            (r.t, r.values[STABLE_NAME])
            for r in records
            if isinstance(r, MetricsSample) and STABLE_NAME in r.values
        ]
        return {s.key: s} if s.points else {}  # fmt: skip

    def judge(self, ctx: LayerContext) -> LayerResult:
        mine = [s for s in ctx.series if s.layer == self.name]
        return worst_layer(self.name, self.unit, mine, ctx.life)


class AdapterBlock(LayerBlock):
    layer = "adapters"
    display = "adapter cache"
    not_measured = "the server exports no toyvlm_adapter_cache_mib gauge"

    def leak(self, lay: LayerResult, a: SoakAnalysis, *, ci: str, proj: str) -> str:
        return (
            f"{self.display}: LEAK: {who(lay)} keeps {rate(lay.rate_per_request, 'MiB')} of "
            f"adapter weights per request{ci} and never evicts them{proj}."
        )


def register() -> None:
    if KIND.name not in {k.name for k in servers.kinds()}:
        servers.register(KIND)
    if AdapterLayer.name not in layers.names():
        layers.register(AdapterLayer())
    blocks.register(AdapterBlock())


class ToyServer:
    def __init__(self, leak_mib: float = 0.5) -> None:
        self.leak_mib = leak_mib
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
                if path == "/toyvlm/about":
                    self._send(
                        200, "application/json", json.dumps({"engine": "toyvlm", "version": "0.9"})
                    )
                elif path == "/v1/models":
                    self._send(200, "application/json", json.dumps({"data": [{"id": "toyvlm-2b"}]}))
                elif path == "/metrics":
                    with owner.lock:
                        cache = 64.0 + owner.done * owner.leak_mib
                    page = (
                        "# TYPE toyvlm_running gauge\ntoyvlm_running 0\n"
                        "# TYPE toyvlm_waiting gauge\ntoyvlm_waiting 0\n"
                        "# TYPE toyvlm_kv_used_tokens gauge\ntoyvlm_kv_used_tokens 0\n"
                        "# TYPE toyvlm_kv_total gauge\ntoyvlm_kv_total 65536\n"
                        f"# TYPE {GAUGE} gauge\n{GAUGE} {cache}\n"
                    )
                    self._send(200, "text/plain; version=0.0.4", page)
                else:
                    self._send(404, "text/plain", "no")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with owner.lock:
                    owner.done += 1
                answer = {"id": "x", "object": "chat.completion", "model": "toyvlm-2b",
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                       "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}  # fmt: skip
                self._send(200, "application/json", json.dumps(answer))

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)  # fmt: skip

    def __enter__(self) -> ToyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
