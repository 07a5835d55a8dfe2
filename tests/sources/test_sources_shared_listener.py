"""Whose is a listening socket that several processes hold (real processes, real sockets).

A worker forked after bind() inherits the listening descriptor (gunicorn and uWSGI workers,
multiprocessing pools created after the server started, fork-based tokenizer helpers). Such a
worker is part of the server, not its replacement: the process that opened the socket stays
the port's owner while it lives and holds the socket, however often its workers are recycled.
A replacement is a new owner once every previous owner is gone (the reference server's
handover restart: the successor inherits the socket, the old pid exits).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from vramdoctor.samples import PROCESS_APPEARED, PROCESS_EXITED, SERVER_REPLACED
from vramdoctor.sources.discover import ServerWatch, discover_server, listening_pids

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")

# A front that binds, then forks a worker that inherits the socket; on each line "recycle" on
# stdin it kills the worker and forks a new one (gunicorn --max-requests style). Prints
# "PORT FRONT_PID WORKER_PID" after each change.
_FRONT = textwrap.dedent(
    """
    import os, signal, socket, sys, time
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
    port = s.getsockname()[1]
    def fork():
        pid = os.fork()
        if pid == 0:
            while True:
                time.sleep(1)
        return pid
    worker = fork()
    print(port, os.getpid(), worker, flush=True)
    for line in sys.stdin:
        if line.strip() == "recycle":
            os.kill(worker, signal.SIGKILL); os.waitpid(worker, 0)
            worker = fork()
            print(port, os.getpid(), worker, flush=True)
    os.kill(worker, signal.SIGKILL)
    """
)

# A process that hands its listening socket to a successor (inherited fd) and exits: a real
# restart on the same port (the reference server's handover). Prints "PORT PID", then the
# successor prints "SUCCESSOR PID" once it holds the socket.
_HANDOVER = textwrap.dedent(
    """
    import os, socket, subprocess, sys, time
    if len(sys.argv) > 1:
        s = socket.socket(fileno=int(sys.argv[1]))
        print("SUCCESSOR", os.getpid(), flush=True)
        time.sleep(30)
        sys.exit(0)
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
    print(s.getsockname()[1], os.getpid(), flush=True)
    sys.stdin.readline()
    subprocess.Popen([sys.executable, __file__, str(s.fileno())], pass_fds=(s.fileno(),))
    time.sleep(0.5)
    """
)


def _start(tmp: Path, name: str, code: str) -> subprocess.Popen[str]:
    path = tmp / name
    path.write_text(code)
    return subprocess.Popen(
        [sys.executable, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _ints(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the test process ended early"
    return [int(x) for x in line.split() if x.isdigit()]


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    proc.wait(5)


def test_every_process_that_holds_the_listening_socket_is_listed_and_the_opener_is_the_root(
    tmp_path: Path,
) -> None:
    """psutil's system-wide list names one holder of a shared socket (the last: the fork);
    soak must find the process that opened it, with the fork in its tree."""
    proc = _start(tmp_path, "front.py", _FRONT)
    try:
        port, front, worker = _ints(proc)
        pids, reason = listening_pids(port)
        assert set(pids) == {front, worker}, reason
        assert pids[0] == front  # oldest first
        found = discover_server(f"http://127.0.0.1:{port}")
        assert found.root_pids == [front]
        assert {front, worker} <= set(found.tree)
    finally:
        _kill_group(proc)


def _settle(watch: ServerWatch, seconds: float = 1.5) -> list[tuple[str, dict[str, object]]]:
    events: list[tuple[str, dict[str, object]]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        events += watch.check()
        time.sleep(0.1)
    return events


def test_a_recycled_worker_that_shares_the_socket_is_not_a_server_replacement(
    tmp_path: Path,
) -> None:
    """Workers recycled three times under a front that holds the socket throughout: no
    SERVER_REPLACED, the front stays the root and in the tree; each worker is a process of
    the server's tree that exits and appears."""
    proc = _start(tmp_path, "front.py", _FRONT)
    try:
        port, front, worker = _ints(proc)
        url = f"http://127.0.0.1:{port}"
        watch = ServerWatch(url, discover_server(url))
        events = _settle(watch, 0.5)
        workers = [worker]
        assert proc.stdin is not None
        for _ in range(3):
            proc.stdin.write("recycle\n")
            proc.stdin.flush()
            _port, _front, worker = _ints(proc)
            workers.append(worker)
            events += _settle(watch)
        names = [name for name, _ in events]
        assert SERVER_REPLACED not in names, events
        assert watch.roots == [front]
        assert front in watch.tree and workers[-1] in watch.tree
        assert not watch.dead
        exited = {d["pid"] for n, d in events if n == PROCESS_EXITED}
        appeared = {d["pid"] for n, d in events if n == PROCESS_APPEARED}
        assert front not in exited
        assert set(workers[:-1]) <= exited and set(workers[1:]) <= appeared
    finally:
        _kill_group(proc)


def test_a_new_owner_once_the_old_one_is_gone_is_a_replacement(tmp_path: Path) -> None:
    """The successor holds the socket (inherited) while the old owner still runs: part of
    the server; the old owner exits: SERVER_REPLACED old -> successor, and the successor's
    tree is followed."""
    proc = _start(tmp_path, "handover.py", _HANDOVER)
    successor = None
    try:
        port, old = _ints(proc)
        url = f"http://127.0.0.1:{port}"
        watch = ServerWatch(url, discover_server(url))
        assert watch.roots == [old]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        successor = _ints(proc)[0]
        events = _settle(watch, 0.2)  # both hold the socket now
        assert SERVER_REPLACED not in [n for n, _ in events]
        proc.wait(10)  # the old owner exits
        events += _settle(watch)
        replaced = [d for n, d in events if n == SERVER_REPLACED]
        assert replaced == [{"old_pid": old, "new_pid": successor}], events
        assert watch.roots == [successor] and successor in watch.tree
    finally:
        if successor is not None and psutil.pid_exists(successor):
            os.kill(successor, 9)
        _kill_group(proc)
