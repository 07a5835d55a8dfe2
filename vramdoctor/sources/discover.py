"""Which processes are the server: the owner of the listening port and its process tree,
plus any other process on the same GPUs (SGLang's tokenizer process running the fast image
processor on GPU 0 is the one that matters most).

Works only when the server runs on this host and in our PID namespace; otherwise it says why
and soak goes on with device-level memory.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

import psutil

from vramdoctor.samples import GpuSample


@dataclass
class ServerProcesses:
    """The server's processes as found on this host; `reason` says why none were found."""

    root_pids: list[int] = field(default_factory=list)
    tree: dict[int, str] = field(default_factory=dict)  # pid -> name
    reason: str | None = None
    # The URL's host is not this machine: nothing here can be found, now or later.
    remote: bool = False

    @property
    def found(self) -> bool:
        return bool(self.root_pids)


def _split(url: str) -> SplitResult:
    """urlsplit with the port checked; InputError (one line) for a URL that cannot be right
    (`http://[::1`, port 99999) instead of ValueError."""
    try:
        parts = urlsplit(url if "://" in url else "http://" + url)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        from vramdoctor.errors import InputError
        from vramdoctor.redact import one_line, redact_url

        raise InputError(f"not a valid URL: {redact_url(one_line(url))} ({exc})") from None
    return parts


def is_local(url: str) -> bool:
    """Whether URL's host is this machine (loopback, or one of this host's addresses)."""
    host = _split(url).hostname or ""
    if host in ("localhost", "0.0.0.0", "::", socket.gethostname()):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        try:
            addr = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return False
    if addr.is_loopback or addr.is_unspecified:
        return True
    mine = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return str(addr) in mine


def url_port(url: str) -> int:
    parts = _split(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def _listen_inodes(port: int) -> set[int] | None:
    """Inodes of the TCP sockets listening on `port` in this network namespace
    (/proc/net/tcp and tcp6: state 0A is LISTEN); None where /proc/net cannot be read."""
    inodes: set[int] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != "0A":
                continue
            try:
                if int(f[1].rsplit(":", 1)[1], 16) == port and int(f[9]) > 0:
                    inodes.add(int(f[9]))
            except (IndexError, ValueError):
                continue
    return inodes if readable else None


def _socket_holders(inodes: set[int]) -> set[int]:
    """Every process with a file descriptor on one of these socket inodes (/proc/PID/fd).

    One listening socket can be held by many processes: a worker forked after bind() inherits
    the descriptor (gunicorn, uWSGI, multiprocessing pools, SO_REUSEPORT aside). psutil's
    system-wide connection list names only one of them (the last process that holds the
    inode), so a fork that shares the socket would hide the process that opened it."""
    links = {f"socket:[{i}]" for i in inodes}
    out: set[int] = set()
    for pid in psutil.pids():
        try:
            with os.scandir(f"/proc/{pid}/fd") as fds:
                for fd in fds:
                    try:
                        if os.readlink(fd.path) in links:
                            out.add(pid)
                            break
                    except OSError:
                        continue
        except OSError:
            continue
    return out


def _by_age(pids: Iterable[int]) -> list[int]:
    """The pids oldest first (the process that opened a shared socket before its forks)."""

    def key(pid: int) -> tuple[float, int]:
        try:
            return psutil.Process(pid).create_time(), pid
        except (psutil.Error, OSError):
            return float("inf"), pid

    return sorted(set(pids), key=key)


def holds_listener(pid: int, port: int) -> bool:
    """Whether process `pid` (alive) holds a TCP socket listening on `port`; True when its
    sockets cannot be read (another user): a live process is not taken for gone."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except (psutil.AccessDenied, OSError):
        return _alive(pid)
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def topmost(pids: Iterable[int]) -> list[int]:
    """The pids that descend from none of the others, oldest first: of the processes that share
    one listening socket, the ones the others were forked from (a gunicorn master, not its
    workers; an HTTP front, not the helpers it forks after bind())."""
    group = set(pids)
    out: list[int] = []
    for pid in group:
        try:
            ancestors = {p.pid for p in psutil.Process(pid).parents()}
        except (psutil.Error, OSError):
            ancestors = set()
        if not ancestors & group:
            out.append(pid)
    return _by_age(out)


def listening_pids(port: int) -> tuple[list[int], str | None]:
    """PIDs with a TCP socket listening on `port` (any address), oldest first: every process
    that holds the socket (forks that inherited it included); (pids, reason if none)."""
    inodes = _listen_inodes(port)
    if inodes:
        holders = _socket_holders(inodes)
        if holders:
            return _by_age(holders), None
    pids: set[int] = set()
    denied = False
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        conns = []
        denied = True
        for proc in psutil.process_iter():
            try:
                for c in proc.net_connections(kind="tcp"):
                    if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
                        pids.add(proc.pid)
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            if c.pid is None:
                denied = True
            else:
                pids.add(c.pid)
    if pids:
        return _by_age(pids), None
    if denied:
        return (
            [],
            f"port {port} is served by a process we may not inspect (another user or container)",
        )
    return [], f"no process on this host listens on port {port} (server in a container or remote?)"


def process_tree(pids: Iterable[int]) -> dict[int, str]:
    """The given PIDs and all their descendants, pid -> name."""
    out: dict[int, str] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for p in family:
            try:
                out[p.pid] = p.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                out[p.pid] = "?"
    return out


# Processes that only forward a published container port: the server is inside a container.
PORT_FORWARDERS = frozenset(
    {
        "docker-proxy",
        "rootlesskit",
        "rootlessport",
        "slirp4netns",
        "pasta",
        "pasta.avx2",
        "conmon",
        "gvproxy",
        "kubectl",
    }
)


def discover_server(url: str) -> ServerProcesses:
    """The listening port's owner and its process tree, when the server is on this host."""
    if not is_local(url):
        return ServerProcesses(
            reason="server is on another host: no per-process memory here "
            "(use --gpu-metrics for its GPUs)",
            remote=True,
        )
    port = url_port(url)
    roots, reason = listening_pids(port)
    if not roots:
        return ServerProcesses(reason=reason)
    roots = topmost(roots) or roots  # forks that share the socket are in the roots' tree
    names = process_tree(roots)
    if all(names.get(pid, "?") in PORT_FORWARDERS for pid in roots):
        forwarder = names.get(roots[0], "?")
        return ServerProcesses(
            reason=f"port {port} is forwarded by {forwarder}: the server runs in "
            "a container; its GPU processes are watched instead"
        )
    return ServerProcesses(root_pids=roots, tree=names)


def gpu_peers(sample: GpuSample, server_pids: Iterable[int]) -> dict[int, str]:
    """Other processes on the GPUs the server uses (pid -> name; '?' when unreadable)."""
    server = set(server_pids)
    gpus = {p.gpu for p in sample.processes if p.pid in server}
    if not gpus:  # server processes not visible to NVML (containers): every GPU is a candidate
        gpus = {g.index for g in sample.gpus}
    # Rows NVML reports with a PID outside our namespace (visible=False) are not ours to read:
    # the same number here may be an unrelated process.
    return {
        p.pid: p.name or "?"
        for p in sample.processes
        if p.gpu in gpus and p.pid not in server and p.visible
    }


def roles(found: ServerProcesses, peers: dict[int, str] | None = None) -> dict[int, str]:
    """pid -> role for the host sampler: server (listener), child (its tree), gpu-peer (another
    process on the server's GPUs: a tenant), or gpu-process (a process on the GPUs while the
    server's own processes were not found, e.g. behind a container's port forwarder: whose it
    is is not known)."""
    out = {pid: "child" for pid in found.tree}
    for pid in found.root_pids:
        out[pid] = "server"
    other = "gpu-peer" if found.found else "gpu-process"
    for pid in peers or {}:
        out.setdefault(pid, other)
    return out


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return bool(psutil.pid_exists(pid))


def port_refuses(url: str, timeout: float = 1.0) -> bool:
    """True when a TCP connect to the URL's port is refused (nobody listens there any more);
    False when it connects or the answer is anything else (a timeout proves nothing)."""
    parts = _split(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", url_port(url)), timeout=timeout
        ):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


class ServerWatch:
    """The server's life during a soak: which pid owns the port, which processes its tree holds.

    `check()` (about once a second) returns the events to record, as (name, data) pairs with
    the names of `vramdoctor.samples`: PROCESS_APPEARED / PROCESS_EXITED for the tree (workers,
    compile helpers, a second server that fails to bind), SERVER_REPLACED when a new pid owns
    the port, SERVER_DIED when the port owner is gone and nothing has listened for `grace_s`
    (a restart that comes back within it is a replacement), or a remote port refuses
    connections twice in a row. `connection_failed()` is called when a request could not
    connect: a refused port then means death at once (the traffic itself proves it). `tree`
    is the current pid -> name. Thread-safe.
    """

    def __init__(self, url: str, found: ServerProcesses, grace_s: float = 3.0) -> None:
        self.url = url
        self.port = url_port(url)
        self.local = found.found
        self.remote = found.remote
        self.roots: list[int] = list(found.root_pids)
        self.tree: dict[int, str] = dict(found.tree)
        self.grace_s = grace_s
        self.dead = False
        self._refused = 0
        self._gone_at: float | None = None
        self._probed_at = -1e9
        self._lock = threading.Lock()

    def _died(self, reason: str) -> list[tuple[str, dict[str, object]]]:
        from vramdoctor.samples import SERVER_DIED

        self.dead = True
        return [(SERVER_DIED, {"reason": reason, "pid": self.roots[0] if self.roots else None})]

    def connection_failed(self) -> list[tuple[str, dict[str, object]]]:
        """A request could not connect: probe the port (at most twice a second)."""
        with self._lock:
            if self.dead or time.monotonic() - self._probed_at < 0.5:
                return []
            self._probed_at = time.monotonic()
            return self._died("connection refused") if port_refuses(self.url) else []

    def check(self) -> list[tuple[str, dict[str, object]]]:
        with self._lock:
            return [] if self.dead else self._check()

    def _check(self) -> list[tuple[str, dict[str, object]]]:
        from vramdoctor.samples import PROCESS_APPEARED, PROCESS_EXITED, SERVER_REPLACED

        events: list[tuple[str, dict[str, object]]] = []
        if not self.local:
            self._refused = self._refused + 1 if port_refuses(self.url) else 0
            return self._died("connection refused") if self._refused >= 2 else events
        owners, _ = listening_pids(self.port)
        top = topmost(owners) if owners else []
        if top and set(top) != set(self.roots):
            # A replacement is a new owner of the port once every previous owner is GONE (exited,
            # or no longer holding the listening socket). A process that shares the socket while
            # an owner still holds it (a worker forked after bind(), recycled gunicorn-style; a
            # helper the socket was handed to) is part of the server, never a replacement.
            kept = [p for p in self.roots if p in owners or holds_listener(p, self.port)]
            if kept:
                self.roots = kept + [p for p in top if p not in kept]
            else:
                events.append(
                    (
                        SERVER_REPLACED,
                        {"old_pid": self.roots[0] if self.roots else None, "new_pid": top[0]},
                    )
                )
                self.roots = top
        if owners:
            self._gone_at = None
        tree = process_tree(self.roots) if owners else {}
        for pid, name in sorted(tree.items()):
            if pid not in self.tree:
                events.append((PROCESS_APPEARED, {"pid": pid, "name": name, "role": "child"}))
        for pid, name in sorted(self.tree.items()):
            if pid not in tree:
                events.append((PROCESS_EXITED, {"pid": pid, "name": name}))
        self.tree = tree
        if not owners:
            now_s = time.monotonic()
            self._gone_at = self._gone_at if self._gone_at is not None else now_s
            if now_s - self._gone_at >= self.grace_s:
                alive = any(_alive(p) for p in self.roots)
                events += self._died("connection refused" if alive else "process gone")
        return events
