"""Subprocess helpers shared by the tests: the reference server, and Python without torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "reference_server" / "server.py"

# Prepend to a `python -c` program to make torch unimportable, whether or not it is installed.
NO_TORCH = (
    "import sys, importlib.abc\n"
    "class _NoTorch(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'torch':\n"
    "            raise ImportError('No module named torch (blocked by the test)')\n"
    "sys.meta_path.insert(0, _NoTorch())\n"
)


class RefServer:
    """examples/reference_server as a real subprocess on a free loopback port (CPU mode)."""

    def __init__(self, mode: str, *extra: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--port", "0", "--mode", mode, "--device", "cpu", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://\S+) .* pid=(\d+)", line)
        if not m:
            self.proc.kill()
            raise AssertionError(f"reference server did not start: {line!r}")
        self.url = m.group(1)
        self.pid = int(m.group(2))

    def info(self) -> dict:
        return requests.get(self.url + "/reference/info", timeout=5).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for running vramdoctor in a test: no API keys, no colour, CI set."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "VRAMDOCTOR_API_KEY")}
    env.update(NO_COLOR="1", CI="1", **extra)
    return env


def run_soak(
    url: str,
    tmp: Path,
    *args: str,
    env: dict[str, str] | None = None,
    name: str = "run.jsonl",
    out: bool = True,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """`vramdoctor soak --url URL [--out TMP/NAME] ARGS...` as a real subprocess in `tmp`."""
    cmd = [sys.executable, "-m", "vramdoctor", "soak", "--url", url, *args]
    if out:
        cmd += ["--out", str(tmp / name)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env or cli_env(), cwd=tmp
    )


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m vramdoctor ARGS` as a user runs it, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "vramdoctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


# --- processes a test started through vramdoctor: found by pid, checked gone -----------------

TARGETS = ROOT / "tests" / "soak" / "targets"


def ref_cmd(mode: str, port: int, *extra: str) -> list[str]:
    """The reference server's command line (CPU) on `port`, as `--launch` or a variant gets it."""
    return [
        sys.executable,
        str(SERVER),
        "--port",
        str(port),
        "--mode",
        mode,
        "--device",
        "cpu",
        *extra,
    ]


def free_port() -> int:
    """A TCP port nobody listens on now (loopback)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return False
    rest = stat[stat.rfind(")") + 2 :].split()
    return bool(rest) and rest[0] not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` now, by parent pid (read from /proc)."""
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
        if len(rest) > 1 and rest[0] != "Z":
            children.setdefault(int(rest[1]), []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    """Wait until none of `pids` runs; the ones still alive after `timeout` seconds."""
    import time

    end = time.monotonic() + timeout
    while True:
        left = [p for p in pids if pid_alive(p)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


def kill_all(pids: list[int]) -> None:
    """SIGKILL what a failed test left (so one failure does not leak into the next test)."""
    import contextlib
    import signal

    for p in pids:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
