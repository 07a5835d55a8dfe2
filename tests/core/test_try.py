"""`vramdoctor try`: the newcomer's first minute works, as a new user runs it (real processes).

watch against the reference server (real traffic, real host-memory leak of 1 MiB per request)
must end LEAK at that rate, its caching twin must not; fleet against a real Prometheus with
generated history must find the leaks the history holds. Nothing the trial starts may outlive
it (every process it started is looked for by pid afterwards).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.procs import cli_env, run_cli

from vramdoctor.trial import TrialUnavailable, source_file


def _children_named(pattern: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if pattern in cmd:
            out.append(p)
    return out


def _server_pids(log_dir: Path) -> set[int]:
    """The pids the trial's server printed in its log (the reference server names its pid)."""
    text = "".join(p.read_text() for p in log_dir.glob("*.server.log"))
    return {int(m) for m in re.findall(r"pid=(\d+)", text)}


def test_try_watch_finds_the_reference_servers_leak_at_its_rate(tmp_path: Path) -> None:
    # the trial's own duration (45 s): 20 s is enough on an idle machine, not on a loaded one
    r = run_cli("try", "watch", "--dir", str(tmp_path), env=cli_env(), timeout=240)
    assert r.returncode == 1, (r.stdout, r.stderr)
    # the sentence may wrap at spaces (pytest exports COLUMNS=80): read it up to the table's title
    first = " ".join(r.stdout.split("\nwatch: ", 1)[0].split())
    assert first.startswith("LEAK in rss"), r.stdout
    per_request = float(re.search(r"\(\+([\d.]+) MiB per served request\)", first).group(1))
    assert 0.8 <= per_request <= 1.25, first  # the server keeps 1 MiB per request
    assert "vramdoctor watch --server http://127.0.0.1:" in r.stderr  # the command to copy
    pids = _server_pids(tmp_path)
    assert pids, "the server's log names no pid"
    time.sleep(0.5)
    assert not [p for p in pids if psutil.pid_exists(p)], "the trial's server outlived it"


def test_try_watch_healthy_twin_is_not_a_leak(tmp_path: Path) -> None:
    r = run_cli(
        "try",
        "watch",
        "--healthy",
        "--duration",
        "20",
        "--dir",
        str(tmp_path),
        env=cli_env(),
        timeout=180,
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "LEAK" not in r.stdout.split("\nwatch: ", 1)[0], r.stdout  # the sentence, wrapped or not


def test_ctrl_c_in_try_watch_stops_the_server_and_says_one_line(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramdoctor", "try", "watch", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _server_pids(tmp_path):
        time.sleep(0.2)
    time.sleep(4)  # watch is running now
    pids = _server_pids(tmp_path)
    assert pids
    import os

    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at a terminal reaches the whole group
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err, err
    time.sleep(0.5)
    assert not [p for p in pids if psutil.pid_exists(p)], "the trial's server outlived it"


@pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="needs prometheus and promtool (apt-get install prometheus; CI installs them)",
)
def test_try_fleet_finds_the_leaks_the_history_holds(tmp_path: Path) -> None:
    r = run_cli("try", "fleet", "--dir", str(tmp_path), "--json", env=cli_env(), timeout=300)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "vramdoctor fleet --prometheus http://127.0.0.1:" in r.stderr
    assert "gpu-a/device/gpu=0: leaks 40 MiB per hour" in r.stderr  # what the history holds
    assert "LEAK" in r.stdout and "gpu-c" in r.stdout, r.stdout
    assert not _children_named(f"--storage.tsdb.path={tmp_path / 'data'}"), "Prometheus outlived it"


def test_outside_a_source_tree_the_trial_says_how_to_get_one() -> None:
    with pytest.raises(TrialUnavailable, match=r"git clone .* vramdoctor try watch"):
        source_file("examples/no-such-server.py")


def test_try_something_else_is_one_usage_line() -> None:
    r = run_cli("try", "soak", env=cli_env())
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "vramdoctor: error: try 'soak': give watch or fleet (vramdoctor try watch)"
    ]
