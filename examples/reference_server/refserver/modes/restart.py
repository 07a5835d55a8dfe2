"""restart: the server's process is replaced by a new pid (a real restart), as plain otherwise.

After at least `--restart-after` requests, at the first idle moment (no request in flight for
0.3 s), the serving process is replaced, `--restarts` times in all:
- `--restart-style handover` (default): the process starts its successor (a new pid) on the
  same listening socket (inherited fd), waits until it serves, stops accepting, closes its idle
  keep-alive connections and exits 0. The successor's parent becomes pid 1 (or the subreaper).
- `--restart-style supervisor`: a supervisor process (the pid printed first, holding the
  listening socket, as gunicorn's master does) runs the server as a worker child; a worker that
  reached its requests exits 0 and the supervisor starts a new worker (a new pid) on the same
  socket. SIGTERM to the supervisor stops the worker too.
Each life starts fresh: plain's bounded cache fills on its first requests, then stays.

TRUTH: each life is CACHING (a rise, then flat) or STABLE; never a LEAK; the replacement is
reported as a new life (GET /reference/info `generation`, `restarted_from`). The old pid is
gone, the port keeps answering.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from refserver.modes.plain import PlainMode

if TYPE_CHECKING:
    from refserver.state import State

SERVER_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "server.py")
_INTERNAL = (
    "--inherit-fd",
    "--ready-fd",
    "--restart-generation",
    "--restarted-from",
    "--port",
    "--restarts",
    "--anchor-pid",
)


def _argv_without_internal(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _INTERNAL:
            skip = True
            continue
        if any(a.startswith(k + "=") for k in _INTERNAL):
            continue
        out.append(a)
    return out


class RestartMode(PlainMode):
    name = "restart"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--restart-after",
            type=int,
            default=30,
            help="restart: requests a life serves before it is replaced (at the next idle moment)",
        )
        parser.add_argument(
            "--restart-style",
            choices=["handover", "supervisor"],
            default="handover",
            help="restart: a successor on the same socket, or a supervisor's new worker",
        )
        parser.add_argument("--restarts", type=int, default=1, help="restart: replacements in all")
        parser.add_argument("--inherit-fd", type=int, default=None, help=argparse.SUPPRESS)
        parser.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
        parser.add_argument("--restart-generation", type=int, default=0, help=argparse.SUPPRESS)
        parser.add_argument("--restarted-from", type=int, default=None, help=argparse.SUPPRESS)
        parser.add_argument("--anchor-pid", type=int, default=None, help=argparse.SUPPRESS)

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.server: ThreadingHTTPServer | None = None
        self.connections: set[socket.socket] = set()
        self.replaced = False
        self._stop = threading.Event()

    # --- supervisor style: the first process supervises, workers serve ------------------------
    def prefork(self, args: argparse.Namespace) -> None:
        if args.restart_style == "supervisor" and args.inherit_fd is None:
            sys.exit(self._supervise(args))

    def _supervise(self, args: argparse.Namespace) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
        sock.listen(128)
        host, port = sock.getsockname()[:2]
        print(
            f"reference server listening on http://{host}:{port} mode=restart device={args.device} "
            f"processor=supervisor pid={os.getpid()}",
            flush=True,
        )
        worker: list[subprocess.Popen[bytes] | None] = [None]
        stopping = [False]

        def on_term(*_: Any) -> None:
            stopping[0] = True
            proc = worker[0]
            if proc is not None and proc.poll() is None:
                proc.terminate()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        base = _argv_without_internal(sys.argv[1:])
        generation = 0
        code = 0
        while not stopping[0]:
            left = max(0, args.restarts - generation)
            cmd = [
                sys.executable,
                SERVER_PY,
                *base,
                "--port",
                str(port),
                "--inherit-fd",
                str(sock.fileno()),
                "--restart-generation",
                str(generation),
                "--restarts",
                str(left),
            ]
            proc = subprocess.Popen(cmd, pass_fds=(sock.fileno(),))
            worker[0] = proc
            while True:
                try:
                    code = proc.wait()
                    break
                except InterruptedError:
                    continue
            if stopping[0] or code != 0 or left == 0:
                break
            generation += 1
        sock.close()
        return code if not stopping[0] else 0

    # --- serving ---------------------------------------------------------------------------
    def make_server(
        self, state: State, handler: type[BaseHTTPRequestHandler]
    ) -> ThreadingHTTPServer:
        mode = self

        class Tracked(handler):  # type: ignore[misc, valid-type]
            def setup(self) -> None:
                super().setup()
                mode.connections.add(self.connection)

            def finish(self) -> None:
                mode.connections.discard(self.connection)
                super().finish()

        if self.args.inherit_fd is None:
            server = ThreadingHTTPServer((self.args.host, self.args.port), Tracked)
        else:
            server = ThreadingHTTPServer(
                (self.args.host, self.args.port), Tracked, bind_and_activate=False
            )
            server.socket.close()
            server.socket = socket.socket(fileno=self.args.inherit_fd)
            server.server_address = server.socket.getsockname()
            host, port = server.server_address[:2]
            server.server_name = socket.getfqdn(host)
            server.server_port = port
        server.daemon_threads = True
        self.server = server
        return server

    def warm_up(self, state: State) -> None:
        if self.args.ready_fd is not None:  # tell the predecessor we are about to serve
            with contextlib.suppress(OSError):
                os.write(self.args.ready_fd, b"ok")
                os.close(self.args.ready_fd)
        if self.args.restarts > 0:
            threading.Thread(target=self._watch, args=(state,), daemon=True).start()
        if self.args.anchor_pid is not None:
            threading.Thread(target=self._anchored, daemon=True).start()

    def _anchored(self) -> None:
        """A successor ends when whoever started the first life (the anchor) is gone: a
        replaced server never outlives its launcher (a test, vramdoctor --launch)."""
        from refserver.modes.tenant import _alive

        while not self._stop.wait(0.5):
            if not _alive(int(self.args.anchor_pid)):
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def _watch(self, state: State) -> None:
        quiet_since: float | None = None
        while not self._stop.wait(0.05):
            with state.lock:
                due = state.requests >= self.args.restart_after and state.running == 0
            if not due:
                quiet_since = None
                continue
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= 0.3:
                self._replace(state)
                return

    def _replace(self, state: State) -> None:
        assert self.server is not None
        self.replaced = True
        if self.args.restart_style == "handover":
            read, write = os.pipe()
            fd = self.server.socket.fileno()
            cmd = [
                sys.executable,
                SERVER_PY,
                *_argv_without_internal(sys.argv[1:]),
                "--port",
                str(self.server.server_address[1]),
                "--inherit-fd",
                str(fd),
                "--ready-fd",
                str(write),
                "--restart-generation",
                str(self.args.restart_generation + 1),
                "--restarted-from",
                str(os.getpid()),
                "--restarts",
                str(self.args.restarts - 1),
                "--anchor-pid",
                str(self.args.anchor_pid if self.args.anchor_pid is not None else os.getppid()),
            ]
            subprocess.Popen(cmd, pass_fds=(fd, write))
            os.close(write)
            with contextlib.suppress(OSError):
                os.read(read, 2)  # the successor is ready (or gone: EOF)
            os.close(read)
        # Stop accepting; close the idle keep-alive connections so this process can end.
        threading.Thread(target=self.server.shutdown, daemon=True).start()
        for conn in list(self.connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def stop(self, state: State) -> None:
        self._stop.set()

    def info(self, state: State) -> dict[str, Any]:
        return {
            "generation": self.args.restart_generation,
            "restarted_from": self.args.restarted_from,
            "restart_style": self.args.restart_style,
            "restarts_left": self.args.restarts,
        }

    def truth(self, state: State) -> dict[str, Any]:
        out = super().truth(state)
        out["summary"] = (
            f"plain caching; the serving process is replaced after {self.args.restart_after} "
            f"requests ({self.args.restart_style}): each life rises once then stays flat"
        )
        out["lives"] = "each replacement starts a new life judged on its own"
        return out


MODES = [RestartMode]
