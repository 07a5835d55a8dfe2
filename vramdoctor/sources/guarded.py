"""HTTP sessions with a hard total deadline and no automatic redirects.

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

What the deadline covers, for every way a connection is made (direct, an HTTP(S) proxy, a
SOCKS proxy):

- **Name resolution.** `getaddrinfo` has no timeout of its own and no socket the timer could
  shut, so every name (the server's, an HTTP proxy's, a SOCKS proxy's, and the server's again
  for `socks5://` and `socks4://`, which resolve it here) is looked up on a daemon thread that
  the call waits for at most until the deadline (`Deadline.resolve`). A resolver that hangs
  costs the caller the deadline, never more: it gets `Deadline.unresolved` (the name) and
  `not_reached()` says so in one line. The lookup thread that is left waiting ends when the
  resolver gives up; a later call for the same name waits on that same lookup instead of
  starting another, and at most `MAX_LOOKUPS` lookups wait at once (more: that call is not
  resolved), so a hung name server never piles up threads.
- **SOCKS proxies** (`socks5://`, `socks5h://`, `socks4://`, `socks4a://` in `all_proxy` /
  `https_proxy` / `http_proxy`): the socket is handed to the deadline before the proxy's
  handshake starts, so a proxy that accepts and then trickles or says nothing is cut off with
  the rest of the call. SOCKS needs PySocks (`pip install 'vramdoctor[socks]'`): without it a
  SOCKS proxy is refused at once with one line that says so (`SocksUnavailable`).

Standard library plus requests/urllib3 2.x only (PySocks when a SOCKS proxy is used).
Thread-safe: each call's deadline is thread-local; the timer and the lookups are daemon
threads that never hold the process at exit.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import sys
import threading
import time
import warnings
from typing import Any
from urllib.parse import urljoin

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import allowed_gai_family

from vramdoctor.errors import SourceUnavailable
from vramdoctor.redact import one_line, redact_text, redact_url

__all__ = [
    "MAX_LOOKUPS",
    "Deadline",
    "SocksUnavailable",
    "guarded_session",
    "is_redirect",
    "not_reached",
    "redirect_error",
]

_local = threading.local()
# Name lookups that may wait at once (each on its own daemon thread; see the module docstring).
MAX_LOOKUPS = 16


class Deadline:
    """The total deadline of one HTTP call on this thread (see the module docstring).

    `seconds` > 0 from entry. `remaining()` is never below 0.001 s (a socket timeout of 0
    would mean non-blocking). Re-entrant use on one thread is not supported.
    """

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + max(0.0, seconds)
        self.fired = False
        self.connected = False
        # A name whose lookup had not finished when the deadline passed.
        self.unresolved: str | None = None
        # The SOCKS proxy (host:port) of the connection being made, while it is being made.
        self.socks_proxy: str | None = None
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._timer: threading.Timer | None = None

    def remaining(self) -> float:
        """Seconds left (at least 0.001)."""
        return max(0.001, self.at - time.monotonic())

    def expired(self) -> bool:
        """Whether the deadline has passed (or the timer already cut the call off)."""
        return self.fired or time.monotonic() >= self.at

    def watch(self, sock: Any, *, connected: bool = True) -> None:
        """Cut `sock` off when the deadline passes (at once if it already has). `connected`:
        whether the server has been reached (False for a SOCKS proxy's handshake)."""
        if sock is None:
            return
        with self._lock:
            if connected:
                self.connected = True
            if not self.fired:
                if sock not in self._socks:
                    self._socks.append(sock)
                return
        _shut(sock)

    def resolve(self, host: str, port: int, family: int = 0, kind: int = 0) -> list[Any]:
        """`socket.getaddrinfo(host, port, family, kind)`, waited for at most until the
        deadline. Raises `_Unresolved` when it has not finished by then (and sets
        `unresolved`), `socket.gaierror` when the name does not resolve."""
        if _numeric(host):  # an address: getaddrinfo does not ask a name server
            return socket.getaddrinfo(host, port, family, kind)
        key = (host, port, family, kind)
        with _lookups_lock:
            lookup = _lookups.get(key)
            if lookup is None and len(_lookups) < MAX_LOOKUPS:
                lookup = _lookups[key] = _Lookup(key)
        if lookup is None or not lookup.done.wait(max(0.0, self.at - time.monotonic())):
            self.unresolved = host
            raise _Unresolved(host)
        if lookup.error is not None:
            raise lookup.error
        return list(lookup.result or [])

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


class _Unresolved(Exception):
    """A name lookup that had not finished when the deadline passed."""

    def __init__(self, host: str) -> None:
        super().__init__(f"the name {host} was not resolved within the deadline")
        self.host = host


class _Lookup:
    """One `getaddrinfo` call on a daemon thread; calls for the same key wait on the same one."""

    def __init__(self, key: tuple[str, int, int, int]) -> None:
        self.key = key
        self.done = threading.Event()
        self.result: list[Any] | None = None
        self.error: Exception | None = None
        thread = threading.Thread(target=self._run, name="vramdoctor-resolve", daemon=True)
        thread.start()

    def _run(self) -> None:
        try:
            self.result = socket.getaddrinfo(*self.key)
        except Exception as exc:  # handed to every caller that waits on this lookup
            self.error = exc
        finally:
            with _lookups_lock:
                if _lookups.get(self.key) is self:
                    del _lookups[self.key]
            self.done.set()


_lookups: dict[tuple[str, int, int, int], _Lookup] = {}
_lookups_lock = threading.Lock()


def _numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _connect_timeout(timeout: Any, deadline: Deadline) -> float:
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return max(0.001, min(float(timeout), deadline.remaining()))
    return deadline.remaining()


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


class _Direct(_Watched):
    """A connection made by this process itself (directly, or to an HTTP proxy): the name is
    looked up under the deadline (`Deadline.resolve`), then each address is tried in turn as
    urllib3's `create_connection` does."""

    _dns_host: str
    host: str
    port: int
    source_address: Any
    socket_options: Any

    def _new_conn(self) -> socket.socket:
        deadline = _current()
        host = self._dns_host
        if host.startswith("["):
            host = host.strip("[]")
        try:
            host.encode("idna")
        except UnicodeError:
            deadline = None  # urllib3 says what is wrong with such a name
        if deadline is None:
            made: socket.socket = super()._new_conn()  # type: ignore[misc]
            return made
        conn: Any = self
        timeout = _connect_timeout(self.timeout, deadline)
        try:
            addresses = deadline.resolve(host, self.port, allowed_gai_family(), socket.SOCK_STREAM)
        except _Unresolved as exc:
            raise ConnectTimeoutError(conn, str(exc)) from None
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, conn, exc) from exc
        err: OSError | None = None
        for family, kind, proto, _, address in addresses:
            sock: socket.socket | None = None
            try:
                sock = socket.socket(family, kind, proto)
                for option in self.socket_options or ():
                    sock.setsockopt(*option)
                sock.settimeout(_connect_timeout(timeout, deadline))
                if self.source_address:
                    sock.bind(self.source_address)
                sock.connect(address)
            except OSError as exc:
                err = exc
                if sock is not None:
                    sock.close()
                continue
            sys.audit("http.client.connect", self, self.host, self.port)
            return sock
        if isinstance(err, TimeoutError) or deadline.expired():
            raise ConnectTimeoutError(
                conn, f"Connection to {self.host} timed out. (connect timeout={timeout:g})"
            )
        raise NewConnectionError(
            conn, f"Failed to establish a new connection: {err or 'no address for the name'}"
        )


class _Socks(_Watched):
    """A connection through a SOCKS proxy (urllib3's `SOCKSConnection`, PySocks), made under
    the deadline: the proxy's name and (`socks5://`, `socks4://`) the server's are looked up
    under it, and the socket is handed to it before the proxy's handshake starts."""

    _dns_host: str
    _socks_options: dict[str, Any]
    host: str
    port: int
    source_address: Any
    socket_options: Any

    def _new_conn(self) -> Any:
        deadline = _current()
        if deadline is None:
            return super()._new_conn()  # type: ignore[misc]
        pysocks: Any = _contrib_socks().socks
        conn: Any = self
        opts = self._socks_options
        version, rdns = opts["socks_version"], bool(opts["rdns"])
        proxy_host = str(opts["proxy_host"] or "").strip("[]")
        proxy_port = int(opts["proxy_port"] or 1080)
        deadline.socks_proxy = f"{proxy_host}:{proxy_port}"
        dest = self._dns_host.strip("[]")
        timeout = _connect_timeout(self.timeout, deadline)
        try:
            proxies = deadline.resolve(proxy_host, proxy_port, 0, socket.SOCK_STREAM)
            if not rdns:  # socks5:// and socks4:// resolve the server's name here
                family = socket.AF_INET if version == pysocks.PROXY_TYPE_SOCKS4 else 0
                found = deadline.resolve(dest, self.port, family, socket.SOCK_STREAM)
                dest = found[0][4][0] if found else dest
        except _Unresolved as exc:
            raise ConnectTimeoutError(conn, str(exc)) from None
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, conn, exc) from exc
        except UnicodeError:  # a name IDNA cannot encode (urllib3 checks only direct ones)
            raise NewConnectionError(
                conn, "Failed to establish a new connection: a name IDNA cannot encode"
            ) from None
        err: Exception | None = None
        for family, kind, proto, _, address in proxies:
            sock = None
            try:
                sock = pysocks.socksocket(family, kind, proto)
                for option in self.socket_options or ():
                    sock.setsockopt(*option)
                sock.settimeout(_connect_timeout(timeout, deadline))
                sock.set_proxy(
                    version, address[0], address[1], rdns, opts["username"], opts["password"]
                )
                if self.source_address:
                    sock.bind(self.source_address)
                deadline.watch(sock, connected=False)  # the handshake is under the deadline
                sock.connect((dest, self.port))
            except (OSError, pysocks.ProxyError) as exc:
                err = exc
                if sock is not None:
                    sock.close()
                continue
            deadline.socks_proxy = None
            return sock
        if deadline.expired() or isinstance(getattr(err, "socket_err", err), TimeoutError):
            raise ConnectTimeoutError(
                conn,
                f"the SOCKS proxy {proxy_host}:{proxy_port} did not connect {self.host} "
                f"in time (connect timeout={timeout:g})",
            )
        deadline.socks_proxy = None  # it answered: what it said is the connection's error
        raise NewConnectionError(conn, f"Failed to establish a new connection: {err}")


class _HTTPConnection(_Direct, HTTPConnection):
    pass


class _HTTPSConnection(_Direct, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class SocksUnavailable(requests.exceptions.InvalidSchema):
    """A SOCKS proxy is set and PySocks, which SOCKS needs, is not installed."""


_socks_pools: dict[str, Any] | None = None


def _contrib_socks() -> Any:
    """urllib3's SOCKS support (`urllib3.contrib.socks`), or None without PySocks."""
    try:
        with warnings.catch_warnings():  # urllib3 warns before it raises ImportError
            warnings.simplefilter("ignore")
            from urllib3.contrib import socks as contrib
    except ImportError:
        return None
    return contrib


def _socks_pool_classes() -> dict[str, Any] | None:
    """Pools of watched SOCKS connections (None without PySocks), made once."""
    global _socks_pools
    if _socks_pools is None:
        contrib = _contrib_socks()
        if contrib is None:
            return None

        class _SocksHTTPConnection(_Socks, contrib.SOCKSConnection):  # type: ignore[misc,name-defined]
            pass

        class _SocksHTTPSConnection(_Socks, contrib.SOCKSHTTPSConnection):  # type: ignore[misc,name-defined]
            pass

        class _SocksHTTPPool(contrib.SOCKSHTTPConnectionPool):  # type: ignore[misc,name-defined]
            ConnectionCls = _SocksHTTPConnection

        class _SocksHTTPSPool(contrib.SOCKSHTTPSConnectionPool):  # type: ignore[misc,name-defined]
            ConnectionCls = _SocksHTTPSConnection

        _socks_pools = {"http": _SocksHTTPPool, "https": _SocksHTTPSPool}
    return dict(_socks_pools)


class _Adapter(HTTPAdapter):
    """An adapter whose pools (direct, through an HTTP proxy, through a SOCKS proxy) use the
    watched connections."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        if not proxy.lower().startswith("socks"):
            manager = super().proxy_manager_for(proxy, **kwargs)
            manager.pool_classes_by_scheme = dict(_POOLS)
            return manager
        pools = _socks_pool_classes()
        if pools is None:
            raise SocksUnavailable(
                f"the proxy {redact_url(one_line(proxy))} is a SOCKS proxy, and SOCKS needs "
                "PySocks, which is not installed: pip install 'vramdoctor[socks]'"
            )
        manager = super().proxy_manager_for(proxy, **kwargs)
        manager.pool_classes_by_scheme = pools
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


def not_reached(
    deadline: Deadline, what: str, shown_url: str, seconds: float, hint: str = ""
) -> SourceUnavailable | None:
    """When the deadline passed before the server was reached because a name was not resolved
    or a SOCKS proxy did not connect, one line that says which; None otherwise (then the
    server itself was slow). `hint` ends the line (" (--query-timeout)")."""
    if deadline.unresolved is not None:
        name = redact_text(one_line(deadline.unresolved))[:200]
        return SourceUnavailable(
            f"{what} at {shown_url} was not reached: the name {name} was not resolved within "
            f"{seconds:g} s (the name server did not answer){hint}"
        )
    if deadline.socks_proxy is not None and not deadline.connected:
        proxy = redact_text(one_line(deadline.socks_proxy))[:200]
        return SourceUnavailable(
            f"{what} at {shown_url} was not reached: the SOCKS proxy {proxy} did not connect "
            f"it within {seconds:g} s{hint}"
        )
    return None


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
