"""Terminal escape injection: text from servers, exporters, logs and run
files is shown, never executed, on the terminal; JSON keeps it exact.

Real subprocesses against a real hostile loopback server whose model id is
`m\\x1b[2J\\x1b[32mSTABLE` (clear the screen, print a forged green STABLE).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import vd as _vd
from support.sources import metrics_only, nvitop_text, serve

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "support" / "hostile_server.py"
FORGED = "m\x1b[2J\x1b[32mSTABLE"
SHOWN = "m\\x1b[2J\\x1b[32mSTABLE"


def vd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return _vd(*args, cwd=cwd, env={"COLUMNS": "200"}, timeout=180)


@pytest.fixture
def hostile() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(HOSTILE), FORGED, "lbl\x1b]0;pwned\x07"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def no_live_escape(*texts: str) -> None:
    for text in texts:
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, repr(text[:400])


def test_a_model_id_with_escape_codes_is_shown_not_executed(hostile: str, tmp_path: Path) -> None:
    page = nvitop_text(
        "gpu-host",
        [
            {
                "index": 0,
                "name": "H100\x1b[2J",
                "uuid": "GPU-1",
                "total": 81559.0,
                "used": 20000.0,
                "free": 61559.0,
            }
        ],
        [{"index": 0, "pid": 4242, "mib": 19000.0, "command": "python\x1b[31m -m evil"}],
    )
    with serve(metrics_only(page)) as exporter:
        args = [
            "--url",
            hostile,
            "--gpu-metrics",
            exporter,
            "--rounds",
            "2",
            "--no-adapt",
            "--requests",
            "2",
            "--concurrency",
            "1",
            "--idle",
            "0.3",
            "--baseline",
            "0.3",
            "--interval",
            "0.1",
            "--text-only",
            "--max-tokens",
            "1",
            "--timeout",
            "5",
        ]
        text = vd("soak", *args, "--out", str(tmp_path / "a.jsonl"), cwd=tmp_path)
        assert text.returncode in (0, 1), text.stderr
        no_live_escape(text.stdout, text.stderr)
        assert SHOWN in text.stderr  # shown, so the operator sees something odd is there
        js = vd("soak", *args, "--out", str(tmp_path / "b.jsonl"), "--json", cwd=tmp_path)
        assert js.returncode in (0, 1), js.stderr
        no_live_escape(js.stderr)
        census = vd("census", "--gpu-metrics", exporter, cwd=tmp_path)
        assert census.returncode in (0, 1), census.stderr
        no_live_escape(census.stdout, census.stderr)
        assert "4242" in census.stdout
    # JSON stays exact: the model id as the server sent it, escaped the JSON way.
    json.loads(js.stdout)
    no_live_escape(js.stdout)
    first = (tmp_path / "b.jsonl").read_text().splitlines()[0]
    assert json.dumps(FORGED) in first  # "m\u001b[2J\u001b[32mSTABLE": exact, JSON-escaped
    assert "\x1b" not in first
    # A run file carrying escapes, shown again by `report`: still escaped.
    again = vd("report", str(tmp_path / "a.jsonl"), cwd=tmp_path)
    assert again.returncode in (0, 1), again.stderr
    no_live_escape(again.stdout, again.stderr)


def test_escapes_in_a_log_are_shown_not_executed(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-11-30 10:00:05 TP0] Load weight end. type=Qwen2VL\x1b[2J\x1b[32mOK, avail mem=60.10 GB, "
        "mem usage=4.42 GB.\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.10 GiB of which 1.10 GiB is free.\x1b]0;pwned\x07 Of the allocated memory 70.00 GiB is "
        "allocated by PyTorch, and 5.00 GiB is reserved by PyTorch but unallocated.\n"
    )
    r = vd("diagnose", str(log), cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    no_live_escape(r.stdout, r.stderr)
    j = vd("diagnose", str(log), "--json", cwd=tmp_path)
    json.loads(j.stdout)  # valid JSON; control characters escaped the JSON way
    no_live_escape(j.stdout)


def test_error_messages_with_escapes_are_escaped(tmp_path: Path) -> None:
    name = tmp_path / "run\x1b[2Jfile.jsonl"
    r = vd("report", str(name), cwd=tmp_path)
    assert r.returncode == 2
    no_live_escape(r.stderr)
    assert "\\x1b[2J" in r.stderr
