"""Real subprocesses for the attribution tests: servers that print "listening PORT"."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from vramdoctor.agent import agent_path

FIXTURES = Path(__file__).parents[1] / "fixtures" / "attribute"
FAKE_TORCH = FIXTURES / "fake_torch"


class Proc:
    """A child process with its output in a file; `port` once it printed "listening PORT".

    limit_as_mib: the child's address-space limit (RLIMIT_AS), so a runaway allocation in it
    ends in MemoryError there instead of exhausting the test machine."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log: Path,
        cwd: Path | None = None,
        limit_as_mib: int | None = None,
    ) -> None:
        self.log = log
        self.fh = open(log, "w")  # noqa: SIM115

        def limit() -> None:
            if limit_as_mib is not None:
                n = limit_as_mib * 1024 * 1024
                resource.setrlimit(resource.RLIMIT_AS, (n, n))

        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdout=self.fh,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            preexec_fn=limit if limit_as_mib is not None else None,
        )
        self.port = 0

    def wait_port(self, timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # Another writer (the agent's one-line messages on stderr) may land between the
            # server's "listening PORT" and its newline, so read the number, not the line.
            found = re.search(r"^listening (\d+)", self.text(), re.MULTILINE)
            if found:
                self.port = int(found.group(1))
                return self.port
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}: {self.text()}")
            time.sleep(0.05)
        raise AssertionError(f"no port: {self.text()}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.fh.close()


def agent_env(agent_dir: Path, *, fake_torch: bool = True, **extra: str) -> dict[str, str]:
    """The environment of a server started with the agent (and the fake torch when asked)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("VRAMDOCTOR_AGENT", "FAKE_TORCH"))
    }
    parts = [str(agent_path())] + ([str(FAKE_TORCH)] if fake_torch else [])
    env["PYTHONPATH"] = os.pathsep.join(
        [*parts, env["PYTHONPATH"]] if env.get("PYTHONPATH") else parts
    )
    env["VRAMDOCTOR_AGENT_DIR"] = str(agent_dir)
    env["VRAMDOCTOR_AGENT_POLL_S"] = "0.05"
    env.update(extra)
    return env


def agent_server(
    tmp: Path, agent_dir: Path, *args: str, limit_as_mib: int | None = None, **env: str
) -> Proc:
    """tests/fixtures/attribute/agent_server.py with the agent (and the fake torch), started and
    listening; `args` go to the server, `env` into its environment."""
    p = Proc(
        [sys.executable, str(FIXTURES / "agent_server.py"), *args],
        agent_env(agent_dir, **env),
        tmp / f"server-{len(list(tmp.glob('server-*.log')))}.log",
        limit_as_mib=limit_as_mib,
    )
    p.wait_port()
    return p
