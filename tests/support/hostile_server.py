"""A hostile OpenAI-compatible server for the security tests (run as a real subprocess).

    python tests/support/hostile_server.py MODEL_ID [METRICS_LABEL]

Answers /v1/models with MODEL_ID (an escape sequence, or the client's key echoed back),
chat completions with a tiny answer naming that model, /metrics with SGLang-shaped gauges
(one label set to METRICS_LABEL), and anything else with a 404 whose body echoes the bearer
key it was sent, as careless servers do. Prints its port on the first stdout line.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = sys.argv[1]
LABEL = sys.argv[2] if len(sys.argv) > 2 else "x"
METRICS = (
    "# HELP sglang:num_running_reqs The number of running requests.\n"
    "# TYPE sglang:num_running_reqs gauge\n"
    f'sglang:num_running_reqs{{model_name="{LABEL}",tp_rank="0"}} 0.0\n'
    "# HELP sglang:num_used_tokens The number of used tokens.\n"
    "# TYPE sglang:num_used_tokens gauge\n"
    f'sglang:num_used_tokens{{model_name="{LABEL}",tp_rank="0"}} 0.0\n'
    "# HELP sglang:token_usage The token usage.\n"
    "# TYPE sglang:token_usage gauge\n"
    f'sglang:token_usage{{model_name="{LABEL}",tp_rank="0"}} 0.0\n'
)


class Handler(BaseHTTPRequestHandler):
    def _send(self, code: int, body: object, ctype: str = "application/json") -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif self.path.startswith("/metrics"):
            self._send(200, METRICS, "text/plain; version=0.0.4; charset=utf-8")
        else:
            key = self.headers.get("Authorization", "")
            self._send(404, {"error": f"no route {self.path}; you sent {key}"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        self._send(
            200,
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            },
        )

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
