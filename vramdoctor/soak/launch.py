"""`--launch`: vramdoctor starts the server itself, watches it answer, and stops it after.

    from vramdoctor.soak.launch import LaunchSpec, launch
    spec = LaunchSpec.from_command("python -m sglang.launch_server --model-path M --port 30000")
    with launch(spec, run_dir=Path("runs"), stem="soak-1") as server:
        server.wait_ready(spec.url() or "http://127.0.0.1:30000")
        ...                                   # soak it
    server.stopped                            # StopResult: how it stopped, its exit code

Used by soak (`--launch CMD`, `-- CMD ARGS...`), by `ab-test --server` (one launch per
variant) and by watch. What it guarantees:

- **Its own process group, under a keeper.** The server runs under `keeper.py` (standard
  library only), a child subreaper that holds a pipe from vramdoctor as its lifeline: when
  vramdoctor exits in any way (Ctrl-C, a crash, SIGKILL), the pipe closes and the keeper stops
  the server's whole tree (SIGTERM to its process group and every descendant, SIGKILL after
  `stop_grace_s`). The server's main process also has PR_SET_PDEATHSIG = SIGKILL, should the
  keeper itself be killed. Nothing it starts outlives vramdoctor.
- **The agent in its environment** (`agent=True`): `PYTHONPATH` starts with
  `vramdoctor.agent.agent_path()` and `VRAMDOCTOR_AGENT_DIR` names a folder beside the run
  file, so inside evidence and attribution are on without a separate step.
- **Its output kept**: stdout and stderr, interleaved, in `<run dir>/<stem>.server.log`.
- **Waiting until it answers** (`wait_ready`): GET /v1/models (then /health) until an HTTP
  answer below 500 (401/403 count: the server is up and wants a key) within
  `startup_timeout_s`; `LaunchFailed` (exit 2) with the last log lines when it exits first or
  never answers.

Secrets: the command line is recorded through `vramdoctor.redact.redact_argv`; log lines shown
in errors are redacted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from vramdoctor.errors import InputError, SourceUnavailable

__all__ = [
    "KEEPER",
    "LaunchFailed",
    "LaunchSpec",
    "LaunchedServer",
    "StopResult",
    "launch",
    "url_from_argv",
]

KEEPER = Path(__file__).with_name("keeper.py")
TAIL_LINES = 20  # log lines an error shows
MAX_STARTUP_S = 24 * 3600.0


class LaunchFailed(SourceUnavailable):
    """The launched server exited before it answered, or never answered in time. The message
    is one line; `log_tail` holds the server's last log lines (redacted), `log_path` its log,
    `returncode` its exit status when it exited (negative: killed by that signal)."""

    def __init__(
        self,
        message: str,
        *,
        log_path: Path | None = None,
        log_tail: Sequence[str] = (),
        returncode: int | None = None,
    ) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = list(log_tail)
        self.returncode = returncode


def url_from_argv(argv: Sequence[str]) -> str | None:
    """The base URL a server command line listens on, from its `--port N` / `--port=N` and
    `--host H` (default 127.0.0.1; 0.0.0.0 and :: become 127.0.0.1); None without a port."""
    port = host = None
    for i, a in enumerate(argv):
        for name in ("--port", "--host"):
            value = None
            if a == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(name + "="):
                value = a.split("=", 1)[1]
            if value is not None:
                if name == "--port":
                    port = value
                else:
                    host = value
    if port is None or not port.isdigit():
        return None
    if host in (None, "", "0.0.0.0", "::", "[::]", "localhost"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one server. `argv` the command; `env` variables set on top of ours;
    `unset_env` variables removed; `startup_timeout_s` seconds to wait for an answer;
    `stop_grace_s` seconds between SIGTERM and SIGKILL; `agent` puts the agent in its env."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    unset_env: tuple[str, ...] = ()
    cwd: Path | None = None
    startup_timeout_s: float = 600.0
    stop_grace_s: float = 15.0
    agent: bool = True

    @classmethod
    def from_command(cls, command: str | Sequence[str], **kwargs: Any) -> LaunchSpec:
        """From a shell-quoted string ("python -m x --port 1") or an argv list."""
        if isinstance(command, str):
            try:
                argv = tuple(shlex.split(command))
            except ValueError as exc:
                raise InputError(f"--launch {command!r}: {exc}") from None
        else:
            argv = tuple(command)
        return cls(argv=argv, **kwargs).validate()

    def validate(self) -> LaunchSpec:
        """Raise InputError (one line) for a command that cannot be started."""
        if not self.argv or not self.argv[0].strip():
            raise InputError("--launch: give the server's command (e.g. --launch 'vllm serve M')")
        for option, v in (
            ("--startup-timeout", self.startup_timeout_s),
            ("--stop-grace", self.stop_grace_s),
        ):
            if not isinstance(v, (int, float)) or v != v or not 0 < v <= MAX_STARTUP_S:
                raise InputError(f"{option} {v}: give seconds, more than 0")
        for k in [*self.env, *self.unset_env]:
            if not k or "=" in k or "\0" in k:
                raise InputError(f"--launch: {k!r} is not an environment variable name")
        return self

    def url(self) -> str | None:
        """The base URL the command says it listens on (`url_from_argv`)."""
        return url_from_argv(self.argv)

    def shown(self) -> list[str]:
        """The command line as recorded and shown: secrets masked."""
        from vramdoctor.redact import redact_argv

        return list(redact_argv(list(self.argv)))

    def to_record(self) -> dict[str, Any]:
        """The spec for a run file's header: the redacted command, the env names changed (the
        values of variables that look secret are masked), timeouts."""
        from vramdoctor.redact import redact_text, secret_name

        return {
            "argv": self.shown(),
            "env": {
                k: "***" if secret_name(k) else redact_text(v) for k, v in sorted(self.env.items())
            },
            "unset_env": list(self.unset_env),
            "startup_timeout_s": self.startup_timeout_s,
            "stop_grace_s": self.stop_grace_s,
            "agent": self.agent,
        }


@dataclass(frozen=True)
class StopResult:
    """How the server ended. `how`: "sigterm" (stopped within the grace), "sigkill" (the grace
    ran out), "exited" (it had ended by itself), "keeper-lost" (the keeper did not answer; the
    group was killed from here). `returncode`: the main process's exit status (negative: the
    signal), None when unknown; `seconds` the stop took; `signalled` the pids signalled;
    `leftovers` pids of its tree still alive afterwards (must be empty)."""

    how: str
    returncode: int | None
    seconds: float
    signalled: tuple[int, ...] = ()
    leftovers: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "returncode": self.returncode,
            "seconds": self.seconds,
            "signalled": list(self.signalled),
            "leftovers": list(self.leftovers),
        }


def agent_env(agent_dir: Path) -> dict[str, str]:
    """The environment that puts vramdoctor's agent in a Python server: PYTHONPATH first
    (keeping the one given) and VRAMDOCTOR_AGENT_DIR."""
    from vramdoctor.agent import agent_path

    path = str(agent_path())
    old = os.environ.get("PYTHONPATH", "")
    return {
        "PYTHONPATH": path + (os.pathsep + old if old else ""),
        "VRAMDOCTOR_AGENT_DIR": str(agent_dir),
    }


class LaunchedServer:
    """A server started by `launch`. `pid` is the server's main process (its process group
    id too), `log_path` its output, `agent_dir` the agent folder (None without the agent).
    `stop()` is idempotent; leaving the `with` block stops it."""

    def __init__(
        self,
        spec: LaunchSpec,
        *,
        keeper: subprocess.Popen[bytes],
        pid: int,
        log_path: Path,
        agent_dir: Path | None,
        env_changes: Mapping[str, str | None],
    ) -> None:
        self.spec = spec
        self.keeper = keeper
        self.pid = pid
        self.pgid = pid
        self.log_path = log_path
        self.agent_dir = agent_dir
        self.env_changes = dict(env_changes)
        self.started_t = time.monotonic()
        self.ready_s: float | None = None
        self.returncode: int | None = None  # set when the server ended by itself
        self.stopped: StopResult | None = None
        self._events: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._stop_event: dict[str, Any] | None = None
        self._keeper_done = threading.Event()
        self._reader = threading.Thread(
            target=self._read_keeper, name="vramdoctor-keeper", daemon=True
        )
        self._reader.start()

    # --- the keeper's reports ---------------------------------------------------------------

    def _read_keeper(self) -> None:
        assert self.keeper.stdout is not None
        for raw in self.keeper.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            with self._lock:
                self._events.append(event)
                if event.get("event") == "exited" and self.returncode is None:
                    rc = event.get("returncode")
                    self.returncode = int(rc) if isinstance(rc, int) else -1
                elif event.get("event") == "stopped":
                    self._stop_event = event
        self._keeper_done.set()

    def exited(self) -> int | None:
        """The server's exit status when its main process has ended by itself, else None."""
        with self._lock:
            return self.returncode

    def successor(self, port: int) -> int | None:
        """After the main process ended by itself: a pid other than it that listens on the
        server's `port` now and still runs -- the server handed its socket on (a handover
        restart) and has not died. None while the main process runs, or when no other process
        holds the port (read from /proc: `sources.discover.listening_pids`)."""
        if self.exited() is None:
            return None
        from vramdoctor.sources.discover import listening_pids, topmost

        owners, _ = listening_pids(port)
        return next((p for p in topmost(owners) if p != self.pid and _pid_alive(p)), None)

    def alive(self) -> bool:
        """Whether the server's main process still runs."""
        return self.exited() is None and self.stopped is None and _pid_alive(self.pid)

    def tree(self) -> list[int]:
        """The pids of the server's process tree now (its main process and descendants)."""
        import psutil

        try:
            root = psutil.Process(self.pid)
            return [root.pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.Error:
            return []

    def tail(self, n: int = TAIL_LINES) -> list[str]:
        """The last `n` lines of the server's log, redacted (secrets masked)."""
        return log_tail(self.log_path, n)

    # --- waiting ----------------------------------------------------------------------------

    def wait_ready(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        poll_s: float = 0.5,
    ) -> float:
        """Block until the server answers HTTP at `base_url` (an answer below 500 from
        /v1/models or /health); the seconds it took. Raises LaunchFailed with its last log
        lines when it exits first or does not answer within `timeout_s` (default: the spec's)."""
        import requests

        from vramdoctor.redact import redact_url

        limit = self.spec.startup_timeout_s if timeout_s is None else timeout_s
        deadline = self.started_t + limit
        base = base_url.rstrip("/")
        with requests.Session() as s:
            if headers:
                s.headers.update(headers)
            while True:
                rc = self.exited()
                if rc is not None:
                    raise LaunchFailed(
                        f"the launched server exited with {_status_text(rc)} before it answered "
                        f"at {redact_url(base)} (log: {self.log_path})",
                        log_path=self.log_path,
                        log_tail=self.tail(),
                        returncode=rc,
                    )
                for path in ("/v1/models", "/health"):
                    try:
                        r = s.get(base + path, timeout=min(5.0, max(0.5, poll_s * 4)))
                    except requests.RequestException:
                        break  # not listening yet: no use asking the second path
                    if r.status_code < 500:
                        self.ready_s = time.monotonic() - self.started_t
                        return self.ready_s
                if time.monotonic() >= deadline:
                    raise LaunchFailed(
                        f"the launched server did not answer at {redact_url(base)} within "
                        f"{limit:g} s (--startup-timeout; log: {self.log_path})",
                        log_path=self.log_path,
                        log_tail=self.tail(),
                    )
                time.sleep(poll_s)

    # --- stopping ---------------------------------------------------------------------------

    def stop(self) -> StopResult:
        """Stop the server's whole tree: SIGTERM, SIGKILL after the grace; idempotent. Safe
        against a Ctrl-C in the middle: the group is killed from here before it propagates."""
        if self.stopped is not None:
            return self.stopped
        start = time.monotonic()
        before = set(self.tree())
        finished = False
        try:
            with contextlib.suppress(OSError, ValueError):
                assert self.keeper.stdin is not None
                self.keeper.stdin.write(b"stop\n")
                self.keeper.stdin.flush()
                self.keeper.stdin.close()
            wait = self.spec.stop_grace_s + 10.0
            try:
                self.keeper.wait(wait)
            except subprocess.TimeoutExpired:
                self.keeper.kill()
                self.keeper.wait(5)
            self._keeper_done.wait(2.0)
            finished = True
        finally:
            if not finished:  # interrupted while waiting: no grace left, kill it all now
                _kill_group(self.pgid, before)
                with contextlib.suppress(OSError):
                    self.keeper.kill()
        event = self._stop_event
        if event is None:
            _kill_group(self.pgid, before)
            how, rc, signalled = "keeper-lost", self.exited(), tuple(sorted(before))
        else:
            how = str(event.get("how", "sigterm"))
            rc_raw = event.get("returncode")
            rc = int(rc_raw) if isinstance(rc_raw, int) else self.exited()
            signalled = tuple(int(p) for p in event.get("killed", []) if isinstance(p, int))
        leftovers = tuple(sorted(p for p in before if _pid_alive(p)))
        if leftovers:
            _kill_group(self.pgid, set(leftovers))
            leftovers = tuple(p for p in leftovers if _pid_alive(p))
        self.stopped = StopResult(
            how=how,
            returncode=rc,
            seconds=round(time.monotonic() - start, 3),
            signalled=signalled,
            leftovers=leftovers,
        )
        return self.stopped

    def __enter__(self) -> LaunchedServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def to_record(self) -> dict[str, Any]:
        """What the run file keeps about the launch: the spec (redacted), pid, log, agent dir,
        seconds to the first answer, and how it stopped (once stopped)."""
        return {
            **self.spec.to_record(),
            "pid": self.pid,
            "log": str(self.log_path),
            "agent_dir": str(self.agent_dir) if self.agent_dir else None,
            "ready_s": round(self.ready_s, 3) if self.ready_s is not None else None,
            "stopped": self.stopped.to_dict() if self.stopped else None,
        }


def launch(
    spec: LaunchSpec,
    *,
    run_dir: Path,
    stem: str,
    extra_env: Mapping[str, str] | None = None,
) -> LaunchedServer:
    """Start `spec` under the keeper: output in `run_dir/<stem>.server.log`, the agent folder
    `run_dir/<stem>.agent/` when `spec.agent`. Returns once the server process exists (not
    once it answers: `wait_ready`). Raises LaunchFailed when the command cannot be started
    (not found, not executable) and InputError when the run folder cannot be written."""
    spec.validate()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create {run_dir}: {exc.strerror}") from None
    log_path = run_dir / f"{stem}.server.log"
    agent_dir = _agent_dir(spec, run_dir, stem)
    changes = _env_changes(spec, agent_dir, extra_env)
    env = _server_env(changes)
    try:
        log_path.touch()
    except OSError as exc:
        raise InputError(f"cannot write the server's log {log_path}: {exc.strerror}") from None
    keeper = subprocess.Popen(
        _keeper_command(spec, log_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=str(spec.cwd) if spec.cwd else None,
        start_new_session=True,  # a Ctrl-C at the terminal is ours to handle, not the keeper's
        close_fds=True,
    )
    event = _keeper_started(keeper, log_path)
    return LaunchedServer(
        spec,
        keeper=keeper,
        pid=int(event["pid"]),
        log_path=log_path,
        agent_dir=agent_dir,
        env_changes=changes,
    )


def _agent_dir(spec: LaunchSpec, run_dir: Path, stem: str) -> Path | None:
    """The agent folder `run_dir/<stem>.agent/`, created private (None without the agent).
    Raises InputError when it cannot be created."""
    agent_dir: Path | None = None
    if spec.agent:
        agent_dir = (run_dir / f"{stem}.agent").resolve()
        try:
            agent_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # the agent refuses others
        except OSError as exc:
            raise InputError(f"cannot create {agent_dir}: {exc.strerror}") from None
    return agent_dir


def _env_changes(
    spec: LaunchSpec, agent_dir: Path | None, extra_env: Mapping[str, str] | None
) -> dict[str, str | None]:
    """What the server's environment changes from ours: name -> value (None: unset); the
    agent's variables, then `extra_env`, then the spec's own, then the spec's unsets."""
    changes: dict[str, str | None] = {}
    if agent_dir is not None:
        changes.update(agent_env(agent_dir))
    changes.update(extra_env or {})
    changes.update(spec.env)
    for k in spec.unset_env:
        changes[k] = None
    return changes


def _server_env(changes: Mapping[str, str | None]) -> dict[str, str]:
    """Our environment with `changes` applied: the server's environment."""
    env = dict(os.environ)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _keeper_command(spec: LaunchSpec, log_path: Path) -> list[str]:
    """The keeper's command line that runs `spec.argv` with its output in `log_path`."""
    return [
        sys.executable,
        "-I",  # the keeper never imports from the server's PYTHONPATH or cwd
        str(KEEPER),
        "--log",
        str(log_path),
        "--grace",
        str(spec.stop_grace_s),
        "--",
        *spec.argv,
    ]


def _keeper_started(keeper: subprocess.Popen[bytes], log_path: Path) -> dict[str, Any]:
    """The keeper's "started" event (the server's pid in it). When the keeper's first line is
    anything else, kills and waits for the keeper, then raises LaunchFailed."""
    assert keeper.stdout is not None
    first = keeper.stdout.readline()
    try:
        event = json.loads(first) if first else {}
    except ValueError:
        event = {}
    if not isinstance(event, dict) or event.get("event") != "started":
        with contextlib.suppress(OSError):
            keeper.kill()
        keeper.wait(5)
        why = event.get("error") if isinstance(event, dict) else None
        raise LaunchFailed(
            f"cannot launch the server: {why or 'its keeper did not start'}",
            log_path=log_path,
            log_tail=log_tail(log_path, TAIL_LINES),
            returncode=keeper.returncode,
        )
    return event


def log_tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    """The last `n` lines of a log file (its last 64 KiB read), redacted; [] if unreadable."""
    from vramdoctor.redact import redact_text

    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > 65536 and lines:
        lines = lines[1:]  # the first one was cut by the seek
    return [str(redact_text(line))[:400] for line in lines[-n:]]


def _status_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return False
    rest = stat[stat.rfind(")") + 2 :].split()
    return bool(rest) and rest[0] not in ("Z", "X")


def _kill_group(pgid: int, pids: set[int]) -> None:
    """SIGKILL the process group and the given pids (the keeper is gone or was interrupted)."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
