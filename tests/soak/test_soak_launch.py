"""`soak --launch CMD` / `soak -- CMD ARGS...`: vramdoctor starts the server, soaks it, stops it.

Every test launches a real process (the reference server, or a wrapper in tests/soak/targets/
that ends in it) through the real CLI, and checks by pid, from /proc, that nothing vramdoctor
started is left: after a normal end, a failed start, a crash, Ctrl-C in every phase, and
vramdoctor itself killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from support.procs import (
    ROOT,
    TARGETS,
    cli_env,
    descendants,
    free_port,
    kill_all,
    pid_alive,
    ref_cmd,
    wait_gone,
)

from vramdoctor.record import read_run
from vramdoctor.samples import Event
from vramdoctor.soak import SoakConfig, SoakHook, SoakSession

STARTUP_LOG = ROOT / "tests" / "fixtures" / "launch" / "vllm_16378_startup.log"
FAST = ["--rounds", "2", "--no-adapt", "--requests", "3", "--idle", "0.6", "--interval", "0.1"]
FAST += ["--text-only", "--stop-grace", "3", "--startup-timeout", "30"]


def _soak(tmp: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vramdoctor", "soak", "--out", str(tmp / "run.jsonl"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        cwd=tmp,
    )


def _events(path: Path, name: str) -> list[Event]:
    return [r for r in read_run(path).records if isinstance(r, Event) and r.name == name]


def _launch_record(path: Path) -> dict:
    (ev,) = _events(path, "server_launch")
    return dict(ev.data)


def test_launch_soaks_the_server_it_started_and_leaves_nothing(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, str(TARGETS / "with_startup_log.py"), str(STARTUP_LOG), "--"]
    cmd += ref_cmd("stable", port)[1:]
    r = _soak(tmp_path, *FAST, "--json", "--", *cmd)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "STABLE"
    run = tmp_path / "run.jsonl"
    launch = _launch_record(run)
    pid = launch["pid"]
    assert launch["stopped"]["how"] == "sigterm" and launch["stopped"]["leftovers"] == []
    assert not pid_alive(pid)
    log = tmp_path / "run.server.log"
    assert launch["log"] == str(log)
    text = log.read_text()
    assert (
        "Using a slow image processor" in text and f"listening on http://127.0.0.1:{port}" in text
    )
    # the agent ran inside the launched process: it made its folder in the run's agent dir
    assert (tmp_path / "run.agent" / "agents").is_dir()
    # the start-up facts, read from the server's own log, each with the line it rests on
    lines = text.splitlines()
    facts = doc["launch"]["startup"]["facts"]
    util = facts["gpu_memory_utilization"]
    assert util["value"] == 0.9 and "gpu_memory_utilization (0.90)" in lines[util["line"] - 1]
    fast = facts["fast_image_processor"]
    assert fast["value"] is False and "slow image processor" in lines[fast["line"] - 1]
    assert doc["launch"]["url"] == f"http://127.0.0.1:{port}"
    header = read_run(run).header["config"]["launch"]
    assert header["argv"][-6:] == ["--port", str(port), "--mode", "stable", "--device", "cpu"]
    # the same lines offline
    again = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(run)],
        capture_output=True,
        text=True,
        env=cli_env(COLUMNS="100"),
        timeout=60,
    )
    assert again.returncode == 0, again.stderr
    assert f"memory fraction (gpu_memory_utilization): 0.9 (line {util['line']})" in again.stdout
    assert f"fast image processor: off (CPU) (line {fast['line']})" in again.stdout
    assert "CUDA IPC transport: unknown (the log does not say)" in again.stdout


def test_launch_url_comes_from_the_command_and_the_option_form_works(tmp_path: Path) -> None:
    port = free_port()
    launch = " ".join(ref_cmd("stable", port))
    r = _soak(tmp_path, *FAST, "--launch", launch)
    assert r.returncode == 0, r.stderr
    assert f"http://127.0.0.1:{port}" in r.stderr
    assert "STABLE" in r.stdout
    assert not pid_alive(_launch_record(tmp_path / "run.jsonl")["pid"])


def test_a_leaking_server_launched_is_called_a_leak(tmp_path: Path) -> None:
    port = free_port()
    r = _soak(
        tmp_path,
        "--rounds", "5", "--no-adapt", "--requests", "12", "--idle", "1.5", "--interval", "0.1",
        "--text-only", "--stop-grace", "3", "--json",
        "--", *ref_cmd("leaking", port, "--leak-kib", "4096"),
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["layers"]["host"]["verdict"] == "LEAK", doc["headline"]
    assert not pid_alive(doc["launch"]["pid"])


def test_a_server_that_exits_at_start_is_one_line_with_its_last_log_lines(tmp_path: Path) -> None:
    code = "import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'); sys.exit(3)"
    r = _soak(tmp_path, *FAST, "--", sys.executable, "-c", code, "--port", str(free_port()))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "CUDA out of memory. Tried to allocate 2.00 GiB" in r.stderr  # the log's last lines
    last = r.stderr.strip().splitlines()[-1]
    assert "exited with exit code 3 before it answered" in last and "run.server.log" in last
    assert not (tmp_path / "run.jsonl").exists()  # nothing was measured


def test_a_server_that_never_answers_is_stopped_at_the_startup_timeout(tmp_path: Path) -> None:
    code = "import time; print('loading weights', flush=True); time.sleep(600)"
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramdoctor", "soak", "--out", str(tmp_path / "run.jsonl"),
         "--startup-timeout", "2", "--stop-grace", "2",
         "--", sys.executable, "-c", code, "--port", str(free_port())],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=tmp_path,
    )  # fmt: skip
    _wait_for(tmp_path / "run.server.log", "loading weights")
    below = descendants(proc.pid)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "did not answer at http://127.0.0.1:" in err and "within 2 s" in err
    assert "loading weights" in err
    assert time.monotonic() - start < 30
    assert below and wait_gone(below, 5) == []


def test_a_server_that_leaves_a_setsid_grandchild_behind_is_cleaned_up(tmp_path: Path) -> None:
    port = free_port()
    pidfile = tmp_path / "grandchild.pid"
    cmd = [sys.executable, str(TARGETS / "stubborn.py"), str(pidfile), "--"]
    r = _soak(tmp_path, *FAST, "--", *cmd, *ref_cmd("stable", port)[1:])
    grandchild = int(pidfile.read_text())
    try:
        assert r.returncode == 0, r.stderr
        assert wait_gone([grandchild], 5) == []  # SIGTERM ignored, out of the group: still killed
        stopped = _launch_record(tmp_path / "run.jsonl")["stopped"]
        beats = Path(str(pidfile) + ".beat").read_text().splitlines()
        assert not any(b.startswith("ended") for b in beats), beats[-3:]  # nothing else ended it
        assert stopped["how"] == "sigkill" and grandchild in stopped["signalled"], (
            json.dumps(stopped),
            beats[-2:],
            time.time(),
        )
    finally:
        kill_all([grandchild])


def test_a_server_that_crashes_mid_soak_is_a_death_with_its_exit_status(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, str(TARGETS / "crash_after.py"), "3", "--", *ref_cmd("stable", port)[1:]]
    r = _soak(
        tmp_path, "--rounds", "6", "--no-adapt", "--requests", "3", "--idle", "1", "--interval",
        "0.1", "--text-only", "--stop-grace", "2", "--json", "--", *cmd,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["server_died"] is True, doc["headline"]
    assert "the server died" in doc["headline"]
    launch = doc["launch"]
    assert launch["stopped"]["returncode"] == 139
    assert "Segmentation fault" in (tmp_path / "run.server.log").read_text()
    assert not pid_alive(launch["pid"])


def _wait_for(path: Path, marker: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and marker in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"{marker!r} never appeared in {path}")


@pytest.mark.parametrize(
    "phase, marker",
    [
        ("startup", None),
        ("baseline", '"baseline_start"'),
        ("round", '"round_start"'),
        ("idle", '"idle_start"'),
    ],
)
def test_ctrl_c_in_every_phase_leaves_no_process(
    tmp_path: Path, phase: str, marker: str | None
) -> None:
    port = free_port()
    run = tmp_path / "run.jsonl"
    cmd = [sys.executable, str(TARGETS / "slow_start.py"), "4" if phase == "startup" else "0", "--"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramdoctor", "soak", "--out", str(run), "--rounds", "3",
         "--no-adapt", "--requests", "20", "--concurrency", "1", "--idle", "3", "--baseline", "3",
         "--interval", "0.1", "--text-only", "--stop-grace", "3",
         "--", *cmd, *ref_cmd("stable", port)[1:]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=tmp_path,
    )  # fmt: skip
    below: list[int] = []
    try:
        if marker is None:
            _wait_for(tmp_path / "run.server.log", "loading weights")
        else:
            _wait_for(run, marker)
        below = descendants(proc.pid)
        assert below, "nothing was launched"
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
        assert "Traceback" not in err
        if phase == "startup":
            assert proc.returncode == 130 and "interrupted before measuring" in err
            assert not run.exists()
        else:
            assert proc.returncode == 130, err
            assert read_run(run).status == "interrupted"
            assert _launch_record(run)["stopped"]["leftovers"] == []
        assert wait_gone(below, 5) == [], [
            (p, Path(f"/proc/{p}/cmdline").read_bytes()) for p in below if pid_alive(p)
        ]
    finally:
        kill_all([proc.pid, *below])


def test_vramdoctor_killed_with_sigkill_takes_its_server_with_it(tmp_path: Path) -> None:
    """The keeper notices its lifeline close and stops the whole tree, grandchildren included."""
    port = free_port()
    run = tmp_path / "run.jsonl"
    pidfile = tmp_path / "grandchild.pid"
    cmd = [
        sys.executable,
        str(TARGETS / "stubborn.py"),
        str(pidfile),
        "--",
        *ref_cmd("stable", port)[1:],
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramdoctor", "soak", "--out", str(run), "--rounds", "3",
         "--no-adapt", "--requests", "20", "--concurrency", "1", "--idle", "5", "--interval",
         "0.1", "--text-only", "--stop-grace", "2", "--", *cmd],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=tmp_path,
    )  # fmt: skip
    below: list[int] = []
    try:
        _wait_for(run, '"round_start"')
        below = descendants(proc.pid)
        grandchild = int(pidfile.read_text())
        assert grandchild in below and len(below) >= 3  # keeper, server, grandchild
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert wait_gone([*below, grandchild], 10) == []
    finally:
        kill_all([proc.pid, *below])


def test_launch_refuses_a_url_on_another_host_and_a_command_without_port(tmp_path: Path) -> None:
    r = _soak(tmp_path, "--url", "http://10.255.255.1:8000", "--launch", "python -m x --port 1")
    assert r.returncode == 2 and "--launch starts the server on this host" in r.stderr
    r = _soak(tmp_path, "--launch", "python -m x")
    assert r.returncode == 2 and "names no --port; give --url" in r.stderr
    r = _soak(tmp_path, "--launch", "python 'unclosed")
    assert r.returncode == 2 and "--launch" in r.stderr and "Traceback" not in r.stderr
    r = _soak(tmp_path, "--launch", "a --port 1", "--", "b", "--port", "1")
    assert r.returncode == 2 and "give the server's command once" in r.stderr


def test_a_command_that_cannot_be_executed_is_one_line(tmp_path: Path) -> None:
    r = _soak(tmp_path, "--", str(tmp_path / "no-such-server"), "--port", str(free_port()))
    assert r.returncode == 2, r.stderr
    assert "cannot start" in r.stderr and "Traceback" not in r.stderr


class _Inside(SoakHook):
    """Reads the launched server's own environment and the agent's status file while it runs."""

    name = "inside-check"

    def __init__(self) -> None:
        self.seen: dict[str, object] = {}

    def on_start(self, session: SoakSession) -> None:
        launched = session.launched
        assert launched is not None
        raw = Path(f"/proc/{launched.pid}/environ").read_bytes().split(b"\0")
        env = dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)
        self.seen["env"] = env
        self.seen["agent_dir"] = launched.agent_dir
        self.seen["status"] = sorted((launched.agent_dir / "agents").glob(f"*-{launched.pid}.json"))
        self.seen["info"] = requests.get(session.base + "/reference/info", timeout=5).json()

    def before_round(self, session: SoakSession, round_index: int) -> None:
        self.seen.setdefault("rounds", []).append(round_index)  # type: ignore[union-attr]


def test_the_library_launch_puts_the_agent_in_the_servers_environment(tmp_path: Path) -> None:
    from vramdoctor.agent import agent_path

    port = free_port()
    hook = _Inside()
    cfg = SoakConfig(
        launch=tuple(ref_cmd("stable", port)),
        rounds=2,
        adapt=False,
        requests=3,
        idle_s=0.5,
        interval_s=0.1,
        text_only=True,
        stop_grace_s=3,
        out=tmp_path / "lib.jsonl",
    )
    outcome = SoakSession(cfg, hooks=[hook]).run()
    env = hook.seen["env"]
    assert isinstance(env, dict)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(agent_path())
    assert env["VRAMDOCTOR_AGENT_DIR"] == str(hook.seen["agent_dir"])
    assert hook.seen["status"], "the agent wrote no status file from inside the server"
    assert hook.seen["rounds"] == [1, 2]
    info = hook.seen["info"]
    assert (
        isinstance(info, dict)
        and info["mode"] == "stable"
        and info["pid"] == outcome.launched["pid"]
    )
    assert outcome.analysis.verdict == "STABLE"
    assert outcome.launched is not None and outcome.launched["stopped"]["how"] == "sigterm"
    assert not pid_alive(outcome.launched["pid"])


def test_a_launched_servers_setsid_helper_out_of_its_tree_is_sampled_and_its_leak_found(
    tmp_path: Path,
) -> None:
    """The server double-forks a helper daemon (setsid: its parent is no
    longer the server; the keeper, a child subreaper, still holds it) that keeps 256 KiB per
    request. Under --launch every process below the keeper is the server's: the helper's RSS
    is sampled as a server process and the agent's counters from inside it decide: LEAK in
    the helper's pid. The port owner itself (the reference server, stable) keeps nothing."""
    port = free_port()
    pidfile = tmp_path / "helper.pid"
    cmd = [
        sys.executable,
        str(TARGETS / "helper_daemon.py"),
        "256",
        str(pidfile),
        "--",
        *ref_cmd("stable", port)[1:],
    ]
    cfg = SoakConfig(
        launch=tuple(cmd),
        rounds=5,
        adapt=False,
        requests=12,
        idle_s=1.5,
        interval_s=0.1,
        text_only=True,
        stop_grace_s=5,
        startup_timeout_s=60,
        out=tmp_path / "run.jsonl",
    )
    outcome = SoakSession(cfg).run()
    helper = int(pidfile.read_text())
    try:
        assert outcome.launched is not None and helper in outcome.launched["stopped"]["signalled"]
        from vramdoctor.samples import HostSample

        records = read_run(tmp_path / "run.jsonl").records
        rows = [
            p for r in records if isinstance(r, HostSample) for p in r.processes if p.pid == helper
        ]
        assert rows, "the helper below the keeper was never sampled"
        assert {p.scope for p in rows} == {"server"}
        host = outcome.analysis.layers["host"]
        assert host.verdict == "LEAK", host
        assert host.culprit is not None and host.culprit.pid == helper
        assert host.rate_mib_per_request == pytest.approx(0.25, rel=0.15)
    finally:
        kill_all([helper])
        wait_gone([helper])


def test_a_launched_server_that_hands_its_socket_to_a_successor_has_not_died(
    tmp_path: Path,
) -> None:
    """The reference server's handover restart: the launched process starts its successor on
    the socket it holds and exits with status 0. The port still answers, so the soak goes
    on with the successor: a new life, no death, every round judged, and the successor (out of
    the launched process's tree once its parent is gone) stopped with the launch's group."""
    port = free_port()
    cmd = [*ref_cmd("restart", port), "--restart-after", "6"]
    r = _soak(
        tmp_path, "--rounds", "5", "--no-adapt", "--requests", "3", "--idle", "1", "--interval",
        "0.1", "--text-only", "--stop-grace", "3", "--json", "--", *cmd, timeout=180,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr[-2000:]
    doc = json.loads(r.stdout)
    run = tmp_path / "run.jsonl"
    (handover,) = _events(run, "launched_handover")
    (replaced,) = _events(run, "server_replaced")
    assert handover.data["pid"] == doc["launch"]["pid"] == replaced.data["old_pid"]
    assert handover.data["successor"] == replaced.data["new_pid"]
    assert handover.data["status"] == 0
    assert doc["server_died"] is False, doc["headline"]
    assert doc["server_replaced"] is True
    assert "died" not in doc["headline"]
    assert "took over its port" in r.stderr
    for layer in ("vram", "host"):
        assert doc["layers"][layer]["verdict"] != "LEAK", doc["layers"][layer]
    assert not pid_alive(handover.data["successor"])
    assert not pid_alive(handover.data["pid"])
