"""The mode interface: one class per `--mode`, one module per mode family.

A mode decides what happens to memory; everything else (HTTP, KV accounting, metrics, the
lifecycle endpoints) is shared. Hooks, in the order a server meets them:

- `add_arguments(parser)` (classmethod): the mode's own flags (every mode's flags are
  registered, argparse needs them before it knows the mode).
- `check(state)`: refuse to start (SystemExit with one line) when the mode cannot run here.
- `setup(state)`, `warm_up(state)`: once, before the port is bound / traffic is taken.
- `cpu_image(state, img, data, req)` / `gpu_image(...)`: each image of a request (PIL image,
  its encoded bytes, the `Request`).
- `after_request_locked(state, req)` (under `state.lock`), `after_request(state, req)`.
- `kv_tokens_kept(state, req)`: tokens of the finished request never returned to the pool.
- `request_end(state, req)`: after the answer was sent (or the client left: `req.aborted`).
- `info(state)`: extra fields of GET /reference/info; `truth(state)`: what a correct verdict is,
  per layer (see `truth_of`).

TRUTH: each mode's module docstring says what a correct verdict is and why; `truth()` gives the
same in GET /reference/info as {"summary": str, "layers": {layer: {"verdict": ..., "why": ...,
["bytes_per_request": float], ["bytes_per_hour": float], ["tokens_per_request": int],
["feature": str], ["operation": str], ["bytes_per_cycle": float]}}}; layers are "vram", "kv",
"host"; verdicts are LEAK, CACHING or STABLE (the words soak reports).
"""

from __future__ import annotations

import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from PIL import Image

    from refserver.request import Request
    from refserver.state import State


def layer(verdict: str, why: str, **extra: Any) -> dict[str, Any]:
    """One layer's truth: {"verdict", "why", **extra}."""
    return {"verdict": verdict, "why": why, **extra}


class Mode:
    """The default: preprocessing only, on the CPU, nothing cached or kept (STABLE)."""

    name: ClassVar[str] = ""
    # glibc tuning at start (fixed mmap threshold, 2 arenas): host RSS tracks live data. Modes
    # that are about glibc's own behaviour leave it at its defaults.
    tune_malloc: ClassVar[bool] = True

    # Answer every request with `Connection: close`: a thread per connection is then a thread
    # per request (servers without keep-alive).
    close_connections: ClassVar[bool] = False

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.exit_code = 0

    def prefork(self, args: argparse.Namespace) -> None:
        """In `main`, before torch is imported, the state built or any thread started: the
        one safe place to fork helper processes."""

    def make_server(
        self, state: State, handler: type[BaseHTTPRequestHandler]
    ) -> ThreadingHTTPServer:
        """The listening server (a thread per connection)."""
        server = ThreadingHTTPServer((self.args.host, self.args.port), handler)
        server.daemon_threads = True
        return server

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add this mode's own flags (none by default)."""

    def check(self, state: State) -> None:
        """Raise SystemExit("one line") when the mode cannot run on this machine."""

    def setup(self, state: State) -> None:
        """After the state exists, before the warm-up."""

    def warm_up(self, state: State) -> None:
        """After the shared warm-up request."""

    def cpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        state.cpu(img)

    def gpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        state.cpu(img)

    def after_request_locked(self, state: State, req: Request | None) -> None:
        """Under `state.lock`, right after `state.requests` was counted."""

    def after_request(self, state: State, req: Request | None) -> None:
        """Outside the lock, before the answer is sent."""

    def kv_tokens_kept(self, state: State, req: Request) -> int:
        """Tokens of this request never returned to the KV pool (0: all returned)."""
        return 0

    def stream_chunk(self, state: State, req: Request) -> None:
        """After each streamed chunk was written."""

    def request_end(self, state: State, req: Request) -> None:
        """After the answer was sent or the client went away (`req.aborted`)."""

    def leak_bytes_per_request(self, state: State) -> float | None:
        """Bytes this mode leaks per request where it is one number (None: no leak / varies)."""
        return None

    def kv_leak_tokens_per_request(self, state: State) -> int:
        return 0

    def stop(self, state: State) -> None:
        """The server is shutting down (stop threads and processes the mode started)."""

    def info(self, state: State) -> dict[str, Any]:
        """Extra GET /reference/info fields (the caller holds `state.lock`)."""
        return {}

    def truth(self, state: State) -> dict[str, Any]:
        """What a correct soak verdict is for this server, per layer (see the module doc)."""
        return {
            "summary": "preprocessing only, nothing cached or kept: stable on every layer",
            "layers": {
                "vram": layer("STABLE", "no GPU work is kept"),
                "kv": layer("STABLE", "every request's KV tokens return to the pool"),
                "host": layer("STABLE", "nothing outlives a request"),
            },
        }
