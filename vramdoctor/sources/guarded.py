"""HTTP sessions with a hard total deadline and no automatic redirects (review R3 findings 1-3, 5).

`requests` bounds each socket read, not an answer: a server that sends its status line and
headers one byte a second holds `requests.get(timeout=5)` for as long as it likes, and it
follows redirects itself, reading each redirect's body in full (an endless one fills memory)
and sending the session's headers to whatever host the `Location` names. Every vramdoctor
client that reads an outside HTTP answer (server `/metrics`, GPU exporters, a Prometheus API)
goes through this module instead:

- `guarded_session()`: a `requests.Session` whose connections report their socket to the
  deadline of the call in flight on their thread.
- `Deadline(seconds)`: a context manager around one call (request, headers and body). When its
  time is up, a timer shuts the call's socket down (`shutdown(SHUT_RDWR)`), which ends any
  blocked read at once: connect, status line, headers and body together get `seconds` in all.
  After a read ends, `Deadline.fired` says whether it ended because the deadline passed (a
  body cut short by the timer must never be taken as a whole answer). `Deadline.connected`
  says whether a connection was made (so "cannot connect" is never said of a server that
  connected and then stalled).
- `redirect_error(resp, what, shown_url)`: a 3xx answer as one `SourceUnavailable` line that
  names the (redacted) target. The session never follows one (`allow_redirects` is forced
  off), so a redirect's body is never read and no header or
  credential is sent to another host.

Standard library plus requests/urllib3 2.x only. Thread-safe: each call's deadline is
thread-local; the timer is a daemon thread that never holds the process at exit.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any
from urllib.parse import urljoin

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from vramdoctor.errors import SourceUnavailable
from vramdoctor.redact import one_line, redact_text

__all__ = ["Deadline", "guarded_session", "is_redirect", "redirect_error"]

_local = threading.local()


class Deadline:
    """The total deadline of one HTTP call on this thread (see the module docstring).

    `seconds` > 0 from entry. `remaining()` is never below 0.001 s (a socket timeout of 0
    would mean non-blocking). Re-entrant use on one thread is not supported.
    """

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + max(0.0, seconds)
        self.fired = False
        self.connected = False
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._timer: threading.Timer | None = None

    def remaining(self) -> float:
        """Seconds left (at least 0.001)."""
        return max(0.001, self.at - time.monotonic())

    def expired(self) -> bool:
        """Whether the deadline has passed (or the timer already cut the call off)."""
        return self.fired or time.monotonic() >= self.at

    def watch(self, sock: Any) -> None:
        """Cut `sock` off when the deadline passes (at once if it already has)."""
        if sock is None:
            return
        with self._lock:
            self.connected = True
            if not self.fired:
                if sock not in self._socks:
                    self._socks.append(sock)
                return
        _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            socks, self._socks = self._socks, []
        for sock in socks:
            _shut(sock)

    def __enter__(self) -> Deadline:
        self._timer = threading.Timer(max(0.0, self.at - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.name = "vramdoctor-deadline"
        self._timer.start()
        _local.deadline = self
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if getattr(_local, "deadline", None) is self:
            _local.deadline = None
        with self._lock:
            self._socks.clear()


def _shut(sock: Any) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sock.shutdown(socket.SHUT_RDWR)


def _current() -> Deadline | None:
    deadline: Deadline | None = getattr(_local, "deadline", None)
    return deadline


class _Watched:
    """Mixin for urllib3 connections: hand the socket to the thread's Deadline, and connect
    within what is left of it."""

    sock: Any
    timeout: Any

    def connect(self) -> None:
        deadline = _current()
        if deadline is not None and isinstance(self.timeout, (int, float)):
            self.timeout = min(float(self.timeout), deadline.remaining())
        super().connect()  # type: ignore[misc]
        if deadline is not None:
            deadline.watch(self.sock)

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        deadline = _current()
        if deadline is not None:
            deadline.watch(self.sock)  # a kept-alive connection is not connected again
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]


class _HTTPConnection(_Watched, HTTPConnection):
    pass


class _HTTPSConnection(_Watched, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _Adapter(HTTPAdapter):
    """An adapter whose pools (direct and through an HTTP proxy) use the watched connections."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools keep their own classes
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager


class _Session(requests.Session):
    """A Session that never follows a redirect, nor reads one's body.

    `allow_redirects=False` alone is not enough: requests (2.32+) still starts its redirect
    generator to set `Response.next`, and that reads the redirect's body in full
    (`resp.content`) before it looks at `max_redirects`. With no redirect target, it reads
    nothing."""

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs["allow_redirects"] = False
        return super().request(*args, **kwargs)

    def get_redirect_target(self, resp: requests.Response) -> None:
        return None


def guarded_session() -> requests.Session:
    """A Session for outside answers: watched connections, redirects never followed."""
    session = _Session()
    session.max_redirects = 0
    adapter = _Adapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def is_redirect(resp: requests.Response) -> bool:
    """Whether `resp` is a redirect (3xx other than 304)."""
    return 300 <= resp.status_code < 400 and resp.status_code != 304


def redirect_error(resp: requests.Response, what: str, shown_url: str) -> SourceUnavailable:
    """A redirect answer as one line naming its target (credentials masked), never followed."""
    location = resp.headers.get("location", "")
    if location:
        target = redact_text(one_line(urljoin(resp.url or "", location)))
        if len(target) > 200:
            target = target[:200] + "..."
        where = f"a redirect to {target}"
    else:
        where = "a redirect with no Location"
    return SourceUnavailable(
        f"{what} at {shown_url} answered HTTP {resp.status_code}, {where}: not followed "
        "(vramdoctor never follows redirects, so no header or credential goes to another "
        "host); give the final URL directly if you trust it"
    )
