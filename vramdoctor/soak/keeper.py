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
- stops by SIGTERM to the server's process group and to every other descendant, waits up to
  `--grace` seconds, then SIGKILLs whatever is left, reaps it and exits.

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
    """Every live process below `root` (by parent pid, read from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) < 2 or rest[0] == "Z":
            continue
        children.setdefault(int(rest[1]), []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def _signal_all(pgid: int, sig: int) -> list[int]:
    """`sig` to the server's process group and to every descendant of the keeper."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, sig)
    hit = []
    for pid in _descendants(os.getpid()):
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


def main(argv: list[str]) -> int:
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

    def in_child() -> None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    try:
        out = open(log, "ab", buffering=0)  # noqa: SIM115 - the server writes to it until it ends
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=in_child,  # only prctl and signal dispositions: safe without threads
            close_fds=True,
        )
    except OSError as exc:
        _say(event="error", error=f"cannot start {cmd[0]}: {exc.strerror or exc}")
        return 127
    out.close()
    pgid = proc.pid  # start_new_session: the server leads its own session and group
    _say(event="started", pid=proc.pid, pgid=pgid, subreaper=subreaper)
    returncode: int | None = None
    lifeline = sys.stdin.fileno()
    while not stop_asked[0]:
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
    start = time.monotonic()
    how = "exited" if returncode is not None else "sigterm"
    killed = _signal_all(pgid, signal.SIGTERM)
    deadline = start + max(0.0, grace)
    while True:
        for pid, status in _reap().items():
            if pid == proc.pid and returncode is None:
                returncode = _returncode(status)
        left = _descendants(os.getpid())
        if not left:
            break
        if time.monotonic() >= deadline:
            if how == "sigterm":
                how = "sigkill"
            killed += _signal_all(pgid, signal.SIGKILL)
            time.sleep(0.05)
            for pid, status in _reap().items():
                if pid == proc.pid and returncode is None:
                    returncode = _returncode(status)
            if not _descendants(os.getpid()):
                break
            deadline = time.monotonic() + 0.2  # SIGKILL again until nothing is left
        time.sleep(0.05)
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
