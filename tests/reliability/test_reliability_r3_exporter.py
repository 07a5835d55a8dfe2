"""watch's exporter never serves raw ESC/BEL from a watched process's name.

A real server process sets its name (comm, `prctl(PR_SET_NAME)`) to `ESC[2J ESC]0;x BEL \\n
LEAK`, which any local user can do for their own process; watch watches it with `--listen`,
and the exporter page, read over HTTP as `curl` would, must hold no control byte at all: the
name is shown as `\\x1b[2J\\x1b]0;x\\x07\\nLEAK`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from support.cli import cli_env
from support.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "support" / "hostile_server.py"
NAME = b"\x1b[2J\x1b]0;x\x07\nLEAK"  # 15 bytes: comm holds at most 15

SERVER = f"""
import ctypes, runpy, sys
ctypes.CDLL(None).prctl(15, ctypes.c_char_p({NAME!r}), 0, 0, 0)
sys.argv = [{str(HOSTILE)!r}, "m"]
runpy.run_path({str(HOSTILE)!r}, run_name="__main__")
"""


def test_exported_label_values_carry_no_control_bytes(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    watch = None
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        assert Path(f"/proc/{server.pid}/comm").read_bytes().rstrip(b"\n") == NAME[:15]
        listen = free_port()
        watch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vramdoctor",
                "watch",
                "--server",
                f"http://127.0.0.1:{port}",
                "--interval",
                "0.5s",
                "--duration",
                "60s",
                "--listen",
                f"127.0.0.1:{listen}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=cli_env(),
            cwd=tmp_path,
            start_new_session=True,
        )
        page = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and b"process=" not in page:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{listen}/metrics", timeout=2) as r:
                    page = r.read()
            except OSError:
                continue
        assert b"process=" in page, "the exporter never showed the server's process"
        line = next(x for x in page.splitlines() if b"process=" in x and b"[2J" in x)
        bad = sorted({c for c in page if (c < 0x20 and c not in (0x0A, 0x09)) or c == 0x7F})
        assert not bad, f"control bytes {bad} in the exporter page: {line!r}"
        assert b"\\\\x1b[2J\\\\x1b]0;x\\\\x07\\\\nLEAK" in line, line
    finally:
        for p in (watch, server):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
