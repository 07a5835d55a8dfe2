"""The reference server as a real process, and real traffic for it (tests of the modes' truth).

`RefProc(mode, *args, env=...)` starts examples/reference_server/server.py on a free loopback
port in its own session (process group), reads the URL and pid from its first line, and
`stop()` ends the whole group (a restarted server's successor and helpers included), then
waits for the pids it knew. `Traffic(url)` sends soak-like rounds: `concurrency` client
threads with keep-alive sessions, chat requests with seeded noise PNGs (every fourth text
only), or any body you give. `info(url)` is GET /reference/info (the server's own truth).
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import requests
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "reference_server" / "server.py"
MIB = 1024 * 1024


def png_data_url(width: int, height: int, seed: int = 0) -> str:
    """A seeded noise PNG (PNG cannot compress noise: decoded size is what the server sees)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
        buf, format="PNG", compress_level=1
    )
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours is not alive
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as fh:
        if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class RefProc:
    """A reference server process (see the module doc). `lines` collects its stdout."""

    def __init__(
        self,
        mode: str,
        *extra: str,
        env: dict[str, str] | None = None,
        device: str = "cpu",
        expect_start: bool = True,
        timeout: float = 60.0,
    ) -> None:
        cmd = [sys.executable, str(SERVER), "--port", "0", "--mode", mode, "--device", device]
        self.proc = subprocess.Popen(
            [*cmd, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.pgid = self.proc.pid
        self.lines: list[str] = []
        self.stderr_lines: list[str] = []
        self.url = ""
        self.pid = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._ereader = threading.Thread(target=self._read_err, daemon=True)
        self._first = threading.Event()
        self._reader.start()
        self._ereader.start()
        if expect_start and (not self._first.wait(timeout) or not self.url):
            self.stop()
            raise AssertionError(
                f"reference server did not start: {self.lines[:3]} {self.stderr_lines[-5:]}"
            )

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            m = re.search(r"listening on (http://\S+) .* pid=(\d+)", line)
            if m and not self.url:
                self.url, self.pid = m.group(1), int(m.group(2))
                self._first.set()
        self._first.set()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    def info(self) -> dict[str, Any]:
        return requests.get(self.url + "/reference/info", timeout=30).json()

    def wait(self, timeout: float = 30.0) -> int:
        """The exit code, once the process ended and its output was read to the end (the
        readers are threads: a line written just before a crash may still be on its way)."""
        code = self.proc.wait(timeout)
        self._reader.join(5)
        self._ereader.join(5)
        return code

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after `timeout`; reaps the first pid."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)
            self.proc.wait(5)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                os.killpg(self.pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)

    def __enter__(self) -> RefProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Traffic:
    """Soak-like rounds against `url` (see the module doc)."""

    def __init__(
        self,
        url: str,
        *,
        sizes: tuple[tuple[int, int], ...] = ((448, 448), (896, 672)),
        concurrency: int = 4,
        seed: int = 0,
    ) -> None:
        self.url = url
        self.concurrency = concurrency
        self.images = [png_data_url(w, h, seed + k) for k, (w, h) in enumerate(sizes)]
        self._local = threading.local()

    def _session(self) -> requests.Session:
        s = getattr(self._local, "s", None)
        if s is None:
            s = self._local.s = requests.Session()
            # loopback: no proxy lookup, which iterates os.environ while pytest may change it in
            # another thread (KeyError 'PYTEST_CURRENT_TEST' seen in watch's parallel runs)
            s.trust_env = False
        return s

    def body(self, i: int, **extra: Any) -> dict[str, Any]:
        """Request i of a round: an image prompt, every fourth text only."""
        if self.images and i % 4 != 3:
            content: Any = [
                {"type": "image_url", "image_url": {"url": self.images[i % len(self.images)]}},
                {"type": "text", "text": "Describe this image."},
            ]
        else:
            content = "Write a haiku about idle GPUs."
        return {
            "model": "vramdoctor-reference",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 4,
            **extra,
        }

    def send(self, body: dict[str, Any], path: str = "/v1/chat/completions") -> int:
        r = self._session().post(self.url + path, json=body, timeout=120)
        return r.status_code

    def round(self, n: int = 30, **extra: Any) -> list[int]:
        """n requests, `concurrency` at a time; the HTTP statuses."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda i: self.send(self.body(i, **extra)), range(n)))
