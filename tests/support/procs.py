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
