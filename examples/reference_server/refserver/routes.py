"""The HTTP routes, one handler thread per connection (`ThreadingHTTPServer`).

GET: /metrics (Prometheus), /health, /get_server_info and /server_info (sglang flavour, as
SGLang's), /reference/info (the truth), /v1/models (the model and its loaded LoRA adapters, as
vLLM lists them), and the lifecycle routes of `refserver.lifecycle`. POST: /v1/chat/completions,
/v1/completions (streamed as server-sent events when asked; a client that closes the stream
early is noticed), and the lifecycle routes (sleep/wake, release/resume, LoRA load/unload).
"""

from __future__ import annotations

import json
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from refserver.request import Request
from refserver.state import MODEL_ID, State

COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")


def answer_text(req: Request) -> str:
    """The generated text: `max_tokens` words (a JSON object when the output is constrained)."""
    if req.structured is not None:
        return json.dumps({"answer": " ".join(["ok"] * max(1, req.max_tokens // 4))})
    return " ".join(["ok"] * req.max_tokens)


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, payload: Any, ctype: str = "application/json") -> None:
            if isinstance(payload, bytes):
                body = payload
            elif isinstance(payload, str):
                body = payload.encode()
            else:
                body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if state.mode.close_connections:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _authorised(self) -> bool:
            key = state.args.api_key
            if not key:
                return True
            if self.headers.get("Authorization", "") == f"Bearer {key}":
                return True
            self._send(401, {"error": {"message": "invalid api key", "type": "auth"}})
            return False

        def _lifecycle(
            self, method: str, path: str, query: dict[str, list[str]], raw: bytes
        ) -> bool:
            answer = state.lifecycle.route(method, path, query, raw)
            if answer is None:
                return False
            if not self._authorised():
                return True
            code, payload = answer
            self._send(
                code, payload, "application/json" if not isinstance(payload, str) else "text/plain"
            )
            return True

        def do_GET(self) -> None:
            path, _, qs = self.path.partition("?")
            if path == "/metrics":
                self._send(200, generate_latest(state.registry), CONTENT_TYPE_LATEST)
            elif path == "/health":
                self._send(200, {"status": "ok"})
            elif (
                path in ("/get_server_info", "/server_info")
                and state.args.metrics_flavour == "sglang"
            ):
                # As SGLang's: the version and the server args soak reads (page_size).
                self._send(
                    200,
                    {
                        "version": "reference",
                        "page_size": state.args.kv_page_size,
                        "max_total_num_tokens": state.kv_capacity,
                        "served_model_name": MODEL_ID,
                        **state.lifecycle.server_args(),
                    },
                )
            elif path == "/version" and state.args.metrics_flavour == "vllm":
                self._send(200, {"version": "reference"})  # as vLLM's GET /version
            elif path == "/reference/info":
                self._send(200, state.info())
            elif path == "/v1/models" and state.args.models_status != 200:
                # As `transformers serve` on a host without a Hugging Face cache directory.
                self._send(state.args.models_status, {"error": {"message": "no model list here"}})
            elif path == "/v1/models":
                if self._authorised():
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [
                                {
                                    "id": MODEL_ID,
                                    "object": "model",
                                    "owned_by": "vramdoctor-reference",
                                },
                                *state.lifecycle.model_cards(),
                            ],
                        },
                    )
            elif self._lifecycle("GET", path, parse_qs(qs), b""):
                return
            else:
                self._send(404, {"error": {"message": f"no route {path}"}})

        def do_POST(self) -> None:
            path, _, qs = self.path.partition("?")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if path not in COMPLETION_PATHS:
                if not self._lifecycle("POST", path, parse_qs(qs), raw):
                    self._send(404, {"error": {"message": f"no route {path}"}})
                return
            if not self._authorised():
                return
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("not an object")
                req = Request.parse(path, body, state.lifecycle.adapter_names())
            except (json.JSONDecodeError, ValueError, TypeError):
                self._send(400, {"error": {"message": "body is not a JSON request object"}})
                return
            refusal = state.lifecycle.refuse_request(req)
            if refusal is not None:
                self._send(*refusal)
                return
            tokens = state.args.kv_tokens_per_request + 256 * len(req.images)
            state.running_delta(+1, tokens)
            try:
                self._serve(req, tokens)
            finally:
                state.mode.request_end(state, req)

        def _serve(self, req: Request, tokens: int) -> None:
            path = req.path
            try:
                for data in req.images:
                    state.handle_image(data, req)
                state.after_request(req)
                if req.stream:
                    req.aborted = not self._stream(req)
                    return
            except Exception as exc:  # a bad image must not kill the server
                self._send(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
                return
            finally:
                # A mode may keep some of the request's KV pages (kv-leaking: every request, or
                # only when the client went away mid-stream).
                kept = state.mode.kv_tokens_kept(state, req)
                state.running_delta(-1, -(tokens - kept))
                if req.aborted:
                    with state.lock:
                        state.aborted += 1
            n = req.max_tokens
            text = answer_text(req)
            usage = {
                "prompt_tokens": 8,
                "completion_tokens": n * req.n,
                "total_tokens": 8 + n * req.n,
            }
            created = int(time.time())
            choices: list[dict[str, Any]] = []
            for i in range(req.n):
                if path == "/v1/chat/completions":
                    choices.append(
                        {
                            "index": i,
                            "finish_reason": "length",
                            "message": {"role": "assistant", "content": text},
                        }
                    )
                else:
                    choices.append({"index": i, "finish_reason": "length", "text": text})
            obj = "chat.completion" if path == "/v1/chat/completions" else "text_completion"
            self._send(
                200,
                {
                    "id": f"ref-{created}",
                    "object": obj,
                    "created": created,
                    "model": MODEL_ID,
                    "choices": choices,
                    "usage": usage,
                },
            )

        def _client_gone(self) -> bool:
            try:
                return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                return False
            except OSError:
                return True

        def _stream(self, req: Request) -> bool:
            """Server-sent events, one token a chunk per choice; False when the client went away."""
            path = req.path
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            created = int(time.time())
            try:
                for _ in range(req.max_tokens):
                    for i in range(req.n):
                        if path == "/v1/chat/completions":
                            choice: dict[str, Any] = {
                                "index": i,
                                "delta": {"content": "ok "},
                                "finish_reason": None,
                            }
                            obj = "chat.completion.chunk"
                        else:
                            choice = {"index": i, "text": "ok ", "finish_reason": None}
                            obj = "text_completion"
                        chunk = {
                            "id": f"ref-{created}",
                            "object": obj,
                            "created": created,
                            "model": MODEL_ID,
                            "choices": [choice],
                        }
                        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                        self.wfile.flush()
                        state.mode.stream_chunk(state, req)
                    time.sleep(state.args.stream_token_s)
                    if self._client_gone():
                        return False
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except OSError:  # broken pipe, connection reset: the client went away
                return False
            return True

    return Handler
