"""A real restart (a new pid on the same port) and the faults the variant matrix
needs (a start-up failure, a crash after N requests, an env knob that fixes the leak, a flag
that makes it worse), on real processes; and every mode the split kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests
from support.refserver import MIB, SERVER, RefProc, Traffic, alive

OLD_MODES = ["plain", "leaking", "fixed", "stable", "kv-leaking", "arena", "worker-churn"]
NEW_MODES = [
    "retention",
    "host-leak",
    "converging",
    "background",
    "vram-leaking",
    "tenant",
    "restart",
    "leak-on-every",
    "leak-on-images",
    "leak-on-large-images",
    "leak-on-multi-image",
    "leak-on-stream",
    "leak-on-abort",
    "leak-on-max-tokens-1",
    "leak-on-prefix",
    "leak-on-structured",
    "leak-on-n",
]
# modes that need the server's own switch to start
SWITCHED = {
    "sleep-leak": ("--enable-sleep-mode",),
    "release-leak": ("--enable-memory-saver",),
    "lora-leak": ("--enable-lora",),
    "leak-on-lora": ("--enable-lora",),
}


def _pgroup_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def test_help_lists_every_mode_and_the_old_flags() -> None:
    out = subprocess.run(
        [sys.executable, str(SERVER), "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for mode in [*OLD_MODES, "pinned", *NEW_MODES, *SWITCHED]:
        assert mode in out
    for flag in (
        "--leak-kib",
        "--leak-kind",
        "--kv-leak-on",
        "--kv-leak-tokens",
        "--arena-threads",
        "--churn-after",
        "--churn-lifetime",
        "--kv-pool-tokens",
        "--metrics-flavour",
        "--models-status",
        "--api-key",
    ):
        assert flag in out


@pytest.mark.parametrize("mode", [*OLD_MODES, *NEW_MODES, *SWITCHED])
def test_every_mode_serves_and_states_its_truth(mode: str) -> None:
    with RefProc(mode, *SWITCHED.get(mode, ())) as srv:
        assert set(Traffic(srv.url).round(4)) == {200}
        info = srv.info()
    assert info["mode"] == mode and info["pid"] == srv.pid
    truth = info["truth"]
    assert truth["summary"]
    assert set(truth["layers"]) == {"vram", "kv", "host"}
    assert all(v["verdict"] in ("LEAK", "CACHING", "STABLE") for v in truth["layers"].values())


def test_pinned_refuses_without_cuda_in_one_line() -> None:
    r = subprocess.run(
        [sys.executable, str(SERVER), "--port", "0", "--mode", "pinned", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert r.returncode != 0
    assert "--mode pinned needs" in (r.stderr + r.stdout)
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("style", ["handover", "supervisor"])
def test_restart_replaces_the_serving_pid_and_the_port_keeps_answering(style: str) -> None:
    srv = RefProc("restart", "--restart-after", "6", "--restart-style", style, "--restarts", "1")
    try:
        traffic = Traffic(srv.url, sizes=())
        first = srv.info()
        assert first["generation"] == 0
        assert set(traffic.round(8)) == {200}
        deadline = time.monotonic() + 15
        info = first
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                info = srv.info()
            except requests.ConnectionError:
                continue
            if info["generation"] == 1:
                break
        assert info["generation"] == 1, info
        assert info["pid"] != first["pid"]
        assert set(traffic.round(8)) == {200}  # the port answers; the new life serves
        assert srv.info()["pid"] == info["pid"]  # and it stays (one restart asked)
        gone = time.monotonic() + 10
        while alive(first["pid"]) and time.monotonic() < gone:
            time.sleep(0.1)
        if style == "handover":
            assert info["restarted_from"] == first["pid"]
            assert not alive(first["pid"])  # the old pid exited
            assert srv.wait(1) == 0
        else:
            assert alive(srv.pid) and srv.pid not in (first["pid"], info["pid"])  # supervisor
            assert not alive(first["pid"])
        new_pid = info["pid"]
    finally:
        srv.stop()
    assert not alive(new_pid) and not _pgroup_alive(srv.pgid)


def test_a_handed_over_server_ends_when_its_launcher_is_gone(tmp_path) -> None:
    """The successor watches the first life's parent: it never outlives its launcher."""
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, {str(SERVER)!r}, '--port', '0', '--mode', "
            "'restart', '--device', 'cpu', '--restart-after', '2'], stdout=subprocess.PIPE, text=True)\n"
            "print(p.stdout.readline(), flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout is not None
        line = launcher.stdout.readline()
        url = line.split("listening on ")[1].split()[0]
        s = requests.Session()
        for _ in range(3):
            s.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10)
        deadline = time.monotonic() + 15
        successor = None
        while time.monotonic() < deadline and successor is None:
            time.sleep(0.2)
            try:
                d = requests.get(url + "/reference/info", timeout=5).json()
            except requests.ConnectionError:
                continue
            if d["generation"] == 1:
                successor = d["pid"]
        assert successor is not None
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 5
    while alive(successor) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(successor)


def test_fail_start_exits_1_with_the_error_line_before_binding() -> None:
    srv = RefProc("plain", "--fail-start", expect_start=False)
    code = srv.wait(60)
    srv.stop()
    assert code == 1
    err = "\n".join(srv.stderr_lines)
    assert "torch.OutOfMemoryError: CUDA out of memory" in err
    assert not any("listening on" in line for line in srv.lines)


def test_fail_start_from_the_environment() -> None:
    srv = RefProc(
        "plain", env={"REFERENCE_FAIL_START": "ValueError: bad config"}, expect_start=False
    )
    assert srv.wait(60) == 1
    srv.stop()
    assert "ValueError: bad config" in "\n".join(srv.stderr_lines)


@pytest.mark.parametrize(
    ("how", "code"),
    [("exit", 1), ("kill", -signal.SIGKILL), ("segv", -signal.SIGSEGV), ("abort", -signal.SIGABRT)],
)
def test_crash_after_n_requests(how: str, code: int) -> None:
    srv = RefProc("leaking", "--crash-after", "3", "--crash-how", how)
    try:
        traffic = Traffic(srv.url, sizes=(), concurrency=1)
        statuses = []
        for i in range(5):
            try:
                statuses.append(traffic.send(traffic.body(i)))
            except requests.ConnectionError:
                statuses.append(None)
        assert statuses[:2] == [200, 200] and statuses[2:] == [None, None, None]
        assert srv.wait(10) == code
        assert any("crashes after request 3" in line for line in srv.stderr_lines)
    finally:
        srv.stop()


def test_leak_scale_makes_the_leak_worse_and_the_env_knob_fixes_it() -> None:
    per = {}
    for name, extra, env in (
        ("base", (), {}),
        ("worse", ("--leak-scale", "4"), {}),
        ("fixed", (), {"REFERENCE_FREE_REQUEST_BUFFERS": "1"}),
    ):
        with RefProc("leaking", "--leak-kib", "512", *extra, env=env) as srv:
            Traffic(srv.url, sizes=()).round(10)
            info = srv.info()
        per[name] = (info["kept_bytes"], info["leak_bytes_per_request"], info["proc"])
    assert per["base"][0] == 10 * 512 * 1024
    assert per["worse"][0] == 4 * per["base"][0] and per["worse"][1] == 4 * 512 * 1024
    assert per["fixed"][0] == 0 and per["fixed"][1] == 0
    assert per["worse"][2]["rss_anon_bytes"] - per["base"][2]["rss_anon_bytes"] > 10 * MIB
