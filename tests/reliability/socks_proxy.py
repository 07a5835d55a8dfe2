"""A real SOCKS5 proxy on loopback for the deadline tests (raw sockets, RFC 1928, no auth).

`SocksProxy(mode)` listens on 127.0.0.1 on a free port, one thread per connection:

- "relay": a working proxy. It connects where CONNECT asks (an address, or a name it resolves
  itself, as `socks5h://` wants) and relays both ways. Loopback only: any other address is
  refused with reply 0x02 (not allowed), so no test traffic leaves the machine.
- "silent": reads the client's greeting and never answers.
- "trickle": answers the greeting and the CONNECT one byte every `every_s`, then sends an HTTP
  status line and one header's value a byte at a time, never ending.
- "headers": answers the handshake at once, then trickles the HTTP headers as above.

`asked` keeps each CONNECT's (address type, host, port): 1 IPv4, 3 a name, 4 IPv6.
`connections` counts the connections accepted. `close()` (or the with block) ends every
connection.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
import time
from typing import Any

_REPLY_OK = b"\x05\x00\x00\x01" + bytes(4) + b"\x00\x00"
_REPLY_NOT_ALLOWED = b"\x05\x02\x00\x01" + bytes(4) + b"\x00\x00"


class SocksProxy:
    def __init__(self, mode: str, every_s: float = 0.2) -> None:
        assert mode in ("relay", "silent", "trickle", "headers"), mode
        self.mode = mode
        self.every_s = every_s
        self.stopping = threading.Event()
        self.asked: list[tuple[int, str, int]] = []
        self.connections = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self, scheme: str = "socks5h") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            greeting = _exactly(conn, 2)
            _exactly(conn, greeting[1])
            if self.mode == "silent":
                self.stopping.wait(30)
                return
            self._send(conn, b"\x05\x00")
            _ver, _cmd, _rsv, atyp = _exactly(conn, 4)
            if atyp == 1:
                host = socket.inet_ntoa(_exactly(conn, 4))
            elif atyp == 4:
                host = socket.inet_ntop(socket.AF_INET6, _exactly(conn, 16))
            else:
                host = _exactly(conn, _exactly(conn, 1)[0]).decode("idna")
            (port,) = struct.unpack(">H", _exactly(conn, 2))
            self.asked.append((atyp, host, port))
            if self.mode == "relay":
                self._relay(conn, host, port)
                return
            self._send(conn, _REPLY_OK)
            self._send(conn, b"HTTP/1.1 200 OK\r\nX-A: ")
            while not self.stopping.is_set():
                conn.sendall(b"a")
                time.sleep(self.every_s)
        except OSError:
            pass
        finally:
            conn.close()

    def _send(self, conn: socket.socket, data: bytes) -> None:
        if self.mode != "trickle":
            conn.sendall(data)
            return
        for byte in data:
            if self.stopping.is_set():
                return
            conn.sendall(bytes([byte]))
            time.sleep(self.every_s)

    def _relay(self, conn: socket.socket, host: str, port: int) -> None:
        address = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0][4]
        if not ipaddress.ip_address(address[0]).is_loopback:
            conn.sendall(_REPLY_NOT_ALLOWED)
            return
        upstream = socket.create_connection(address[:2], timeout=5)
        conn.sendall(_REPLY_OK)
        back = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
        back.start()
        _pipe(conn, upstream)
        back.join(5)
        upstream.close()

    def close(self) -> None:
        self.stopping.set()
        self._sock.close()
        self._thread.join(2)

    def __enter__(self) -> SocksProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the client closed")
        data += chunk
    return data


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
