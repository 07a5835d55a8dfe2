"""The keeper: the one process between vramdoctor and a server it launched (`--launch`).

Run by path (`python .../keeper.py --log FILE --grace S -- CMD ARGS...`), standard library
only, so it starts in milliseconds and never imports vramdoctor. It

- makes itself a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): every process the server
  starts and orphans (a double fork, a `setsid` daemon) is re-parented to the keeper, not to
  init, so the keeper always finds the whole tree;
- starts the server in a new session and process group, its stdout and stderr appended to
  `--log`, with `PR_SET_PDEATHSIG` = SIGKILL set in the child: should the keeper itself be
  killed, the server's main process dies with it;
- holds its stdin as the lifeline from vramdoctor: a line "stop" or end of file (vramdoctor
  exited, crashed or was killed with SIGKILL: the kernel closes the pipe) starts the stop;
- remembers every process it sees below itself (scanned once a second: pid and start time), so
  one that slipped out of the tree is still stopped (a pid later given to another process is
  never signalled: the start time must match);
- stops by SIGTERM to the server's process group and to every other descendant, waits up to
  `--grace` seconds, then SIGKILLs whatever is left, reaps it and exits (the tree is read
  twice empty before it is called empty: /proc is read one process at a time).

It speaks one JSON object per line on stdout: {"event": "started", "pid", "pgid"} once the
server runs, {"event": "exited", "returncode"} when the server's main process ends by itself,
{"event": "stopped", "how", "returncode", "killed", "seconds"} at the end ("how": "sigterm"
when SIGTERM sufficed, "sigkill" when the grace ran out, "exited" when the server had already
ended; "killed": the pids signalled). SIGTERM or SIGHUP sent to the keeper start the same stop;
SIGINT is ignored: a Ctrl-C is vramdoctor's to handle (it stops sending first, then asks).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _say(**data: object) -> None:
    try:
        sys.stdout.write(json.dumps(data) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):  # vramdoctor is gone: nobody reads; the stop goes on
        pass


def _descendants(root: int) -> list[int]:
    """Every live process below `root` (by parent pid, read from /proc).

    The walk goes THROUGH zombies (only the result leaves them out): /proc is read one process
    at a time, so a child read before its parent died still names that parent, which is a
    zombie by the time it is read; skipping the zombie would hide the child."""
    children: dict[int, list[int]] = {}
    zombies: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) < 2:
            continue
        if rest[0] in ("Z", "X"):
            zombies.add(int(name))
        children.setdefault(int(rest[1]), []).append(int(name))
    out: list[int] = []
    todo = [root]
    seen = {root}
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            if child in seen:
                continue
            seen.add(child)
            if child not in zombies:
                out.append(child)
            todo.append(child)
    return out


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot; /proc/PID/stat field 22), None when
    it is gone or a zombie: with the pid, what tells it from a later process given that pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2 :].split()
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    return rest[19]


def _remember(seen: dict[int, str], pids: list[int]) -> None:
    for pid in pids:
        if pid not in seen:
            started = _start_time(pid)
            if started is not None:
                seen[pid] = started


def _still_ours(seen: dict[int, str]) -> set[int]:
    """The pids seen below the keeper that still run as the same process (never a pid reused)."""
    return {pid for pid, started in seen.items() if _start_time(pid) == started}


def _signal_all(pgid: int, sig: int, seen: dict[int, str]) -> list[int]:
    """`sig` to the server's process group, every descendant of the keeper, and every process
    seen below it before that still runs (one that slipped out of the tree is still ours)."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, sig)
    hit = []
    for pid in sorted(set(_descendants(os.getpid())) | _still_ours(seen)):
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except OSError:
            pass
    return hit


def _reap() -> dict[int, int]:
    """Reap every exited child (the server and re-parented orphans): pid -> wait status."""
    done: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = status


def _returncode(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else status


def _parse_args(argv: list[str]) -> tuple[str | None, float, list[str]]:
    """The command line's log path (None when missing), grace seconds and server command."""
    log, grace, cmd = None, 10.0, []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--log":
            log = args.pop(0)
        elif a == "--grace":
            grace = float(args.pop(0))
        elif a == "--":
            cmd = args
            break
    return log, grace, cmd


def _in_child() -> None:
    """In the server's process before it runs: dies with the keeper, default signal
    dispositions; returns nothing."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _start_server(cmd: list[str], log: str) -> subprocess.Popen[bytes] | None:
    """The server's process, started in its own session with its output appended to `log`;
    None (the error said) when it cannot be started."""
    try:
        out = open(log, "ab", buffering=0)  # noqa: SIM115 - the server writes to it until it ends
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_in_child,  # only prctl and signal dispositions: safe without threads
            close_fds=True,
        )
    except OSError as exc:
        _say(event="error", error=f"cannot start {cmd[0]}: {exc.strerror or exc}")
        return None
    out.close()
    return proc


def _watch(
    proc: subprocess.Popen[bytes], seen: dict[int, str], stop_asked: list[bool]
) -> int | None:
    """Watches the server until a stop is asked (a signal, "stop" or end of file on the
    lifeline), remembering the tree once a second; returns the server's return code when its
    main process ended by itself meanwhile, else None."""
    returncode: int | None = None
    lifeline = sys.stdin.fileno()
    scanned = 0.0
    while not stop_asked[0]:
        if time.monotonic() - scanned >= 1.0:  # the tree, once a second
            _remember(seen, _descendants(os.getpid()))
            scanned = time.monotonic()
        for pid, status in _reap().items():
            if pid == proc.pid and returncode is None:
                returncode = _returncode(status)
                _say(event="exited", returncode=returncode)
        try:
            ready, _, _ = select.select([lifeline], [], [], 0.2)
        except InterruptedError:
            continue
        if ready:
            try:
                line = os.read(lifeline, 4096)
            except OSError:
                line = b""
            if not line or b"stop" in line:
                break
    return returncode


def _stop(
    proc: subprocess.Popen[bytes],
    pgid: int,
    grace: float,
    seen: dict[int, str],
    returncode: int | None,
) -> None:
    """Stops the whole tree (SIGTERM, then SIGKILL once the grace ran out), reaps it and says
    "stopped"; returns nothing."""
    start = time.monotonic()
    how = "exited" if returncode is not None else "sigterm"
    _remember(seen, _descendants(os.getpid()))
    killed = _signal_all(pgid, signal.SIGTERM, seen)
    deadline = start + max(0.0, grace)

    def remaining() -> list[int]:
        for pid, status in _reap().items():
            if pid == proc.pid and returncode_box[0] is None:
                returncode_box[0] = _returncode(status)
        found = _descendants(os.getpid())
        _remember(seen, found)
        return sorted(set(found) | _still_ours(seen))

    returncode_box = [returncode]
    while True:
        if not remaining():
            time.sleep(0.05)
            if not remaining():  # twice: a process between two reads of /proc is not missed
                break
        if time.monotonic() >= deadline:
            if how == "sigterm":
                how = "sigkill"
            killed += _signal_all(pgid, signal.SIGKILL, seen)
            deadline = time.monotonic() + 0.2  # SIGKILL again until nothing is left
        time.sleep(0.05)
    returncode = returncode_box[0]
    if returncode is None:  # ended between the last reap and the scan: a zombie now
        try:
            _pid, status = os.waitpid(proc.pid, 0)
            returncode = _returncode(status)
        except ChildProcessError:
            pass
    _reap()
    _say(
        event="stopped",
        how=how,
        returncode=returncode,
        killed=sorted(set(killed)),
        seconds=round(time.monotonic() - start, 3),
    )


def main(argv: list[str]) -> int:
    log, grace, cmd = _parse_args(argv)
    if not cmd or log is None:
        _say(event="error", error="usage: keeper.py --log FILE [--grace S] -- CMD ARGS...")
        return 2
    stop_asked = [False]

    def on_signal(_signum: int, _frame: object) -> None:
        stop_asked[0] = True

    # Ctrl-C is vramdoctor's to handle (it stops its traffic first, then asks us): ignored here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    proc = _start_server(cmd, log)
    if proc is None:
        return 127
    pgid = proc.pid  # start_new_session: the server leads its own session and group
    _say(event="started", pid=proc.pid, pgid=pgid, subreaper=subreaper)
    seen: dict[int, str] = {}  # every process ever seen below the keeper: pid -> start time
    _remember(seen, [proc.pid])
    returncode = _watch(proc, seen, stop_asked)
    _stop(proc, pgid, grace, seen, returncode)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
