"""Hostile HTTP servers on loopback for the clients' hostile-server tests (real sockets, raw bytes).

`RawServer(handler)` listens on 127.0.0.1 (or `host`) on a free port and runs `handler(conn,
request, server)` on a thread per connection; `request` is the raw request head (bytes up to
the blank line). `server.stopping` is set by `close()`, so endless senders end with the test.
`server.heads` keeps every request head seen (to check which headers reached a host).

The behaviours are functions named after what they do: `trickle_body`, `trickle_headers`,
`redirect(location, endless_body)`, `answer(status, body)`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

Handler = Callable[[socket.socket, bytes, "RawServer"], None]


class RawServer:
    def __init__(self, handler: Handler, host: str = "127.0.0.1") -> None:
        self.handler = handler
        self.stopping = threading.Event()
        self.heads: list[bytes] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.host = host
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            self.heads.append(head)
            self.handler(conn, head, self)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stopping.set()
        self._sock.close()
        self._thread.join(2)

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _drip(conn: socket.socket, server: RawServer, every_s: float) -> None:
    while not server.stopping.is_set():
        conn.sendall(b"a")
        time.sleep(every_s)


def trickle_body(every_s: float = 0.2) -> Handler:
    """Headers at once with Content-Length 100000, then one byte every `every_s`."""

    def handler(conn: socket.socket, head: bytes, server: RawServer) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        )
        _drip(conn, server, every_s)

    return handler


def trickle_headers(every_s: float = 0.3) -> Handler:
    """The status line, then one header's value one byte every `every_s`, never ending."""

    def handler(conn: socket.socket, head: bytes, server: RawServer) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-A: ")
        _drip(conn, server, every_s)

    return handler


def redirect(location: str, status: int = 302, endless_body: bool = False) -> Handler:
    """A redirect to `location`; with `endless_body`, a chunked body that never ends."""

    def handler(conn: socket.socket, head: bytes, server: RawServer) -> None:
        if not endless_body:
            conn.sendall(
                f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode()
            )
            return
        conn.sendall(
            f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        chunk = b"x" * 65536
        frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        while not server.stopping.is_set():
            conn.sendall(frame)

    return handler


def answer(status: int, body: bytes, ctype: str = "application/json") -> Handler:
    """One whole answer."""

    def handler(conn: socket.socket, head: bytes, server: RawServer) -> None:
        conn.sendall(
            f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )

    return handler
