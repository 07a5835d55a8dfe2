"""The in-process agent in real server processes (tests/fixtures/attribute/agent_server.py).

Where real torch is absent (CI), a minimal `torch` (tests/fixtures/attribute/fake_torch) stands in
at the agent's boundary: is_initialized, _record_memory_history, _snapshot in PyTorch's format,
and the faults (half-imported, a snapshot that raises, no history API) by environment variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from support.agent import FIXTURES, agent_env, agent_server

from vramdoctor.agent import Controller, agent_path, list_agents, pth_line
from vramdoctor.attribution import load_snapshot, summarise


def post(port: int, n: int = 1) -> None:
    for _ in range(n):
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={}, timeout=10)
        assert r.status_code == 200


def wait_for(cond, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def armed(agent_dir: Path) -> list:
    return [a for a in list_agents(agent_dir) if a.state == "armed"]


def agent_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("vramdoctor-agent[")]


def test_arms_after_the_process_initialised_cuda_and_snapshots_on_trigger(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--keep-kib", "64")
    try:
        post(srv.port, 3)  # the first request initialises "CUDA" (the loader thread)
        assert wait_for(lambda: armed(agent_dir))
        (info,) = armed(agent_dir)
        assert info.pid == srv.proc.pid and info.program == "agent_server.py" and info.local
        status = json.loads(next((agent_dir / "agents").glob("*.json")).read_text())
        assert status["history"] == {"enabled": "state", "context": "state", "stacks": "python"}
        post(srv.port, 2)
        files, missing = Controller(agent_dir).snapshot(1, timeout_s=10)
        assert missing == [] and [f.pid for f in files] == [srv.proc.pid]
        live = summarise(load_snapshot(files[0].pickle_path)).live_by_stack
        kept = {st.frames[0].function: n for st, n in live.items() if st.frames}
        assert "keep_for_request" in kept
    finally:
        srv.stop()


def test_stale_and_repeated_triggers_do_nothing(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--keep-kib", "64")
    try:
        post(srv.port)
        assert wait_for(lambda: armed(agent_dir))
        stale = Controller(agent_dir, token="earlierrun", clock=lambda: time.time() - 3600)
        stale.trigger(5)  # an earlier run's trigger, long expired
        time.sleep(0.6)
        assert not (agent_dir / "replies").exists()
        ctl = Controller(agent_dir, token="thisrun")
        files, _ = ctl.snapshot(1, timeout_s=10)
        (meta,) = [f.pickle_path.with_suffix(".json") for f in files]
        first = json.loads(meta.read_text())["wall"]
        ctl.trigger(1)  # the same token and seq again: already handled
        time.sleep(0.6)
        assert json.loads(meta.read_text())["wall"] == first
        assert sorted(p.name for p in (agent_dir / "replies").iterdir()) == ["thisrun"]
    finally:
        srv.stop()


def test_a_process_that_never_initialises_cuda_is_left_alone(tmp_path: Path) -> None:
    """Ready for host evidence, never armed, no snapshot, no CUDA call: the fake torch kills the
    process (exit 98) on any call that would create a context in real PyTorch."""
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--no-cuda")
    try:
        post(srv.port, 3)
        assert wait_for(lambda: list_agents(agent_dir))
        (info,) = list_agents(agent_dir)
        assert info.state == "ready" and not info.cuda and info.pid == srv.proc.pid
        ctl = Controller(agent_dir)
        files, missing = ctl.snapshot(0, timeout_s=1)
        assert files == [] and missing == []  # nobody armed: nobody is asked for a snapshot
        replies, missing = ctl.collect(1, want=["inside"], timeout_s=10, min_agents=1)
        assert missing == [] and [r.pid for r in replies] == [srv.proc.pid]
        assert replies[0].inside is not None and replies[0].inside["cuda"] is None
        assert "no CUDA in this process" in (replies[0].inside["error"] or "")
        assert not list((agent_dir / "replies").rglob("*.pickle"))
        post(srv.port)
        assert srv.proc.poll() is None, srv.text()
        assert agent_lines(srv.text()) == []
    finally:
        srv.stop()


def _unwritable(tmp_path: Path) -> Path:
    if (
        os.geteuid() == 0
    ):  # root writes through permissions: a path under a regular file cannot be made
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        return blocker / "agent"
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    return ro / "agent"


def test_unwritable_directory_one_line_and_the_server_keeps_serving(tmp_path: Path) -> None:
    srv = agent_server(tmp_path, _unwritable(tmp_path), "--keep-kib", "64")
    try:
        post(srv.port)
        assert wait_for(lambda: agent_lines(srv.text()))
        post(srv.port, 5)
        lines = agent_lines(srv.text())
        assert len(lines) == 1 and "standing down" in lines[0] and "cannot create" in lines[0]
        assert srv.proc.poll() is None
    finally:
        srv.stop()


def test_a_snapshot_that_raises_one_line_and_the_server_keeps_serving(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--keep-kib", "64", FAKE_TORCH_SNAPSHOT_RAISES="1")
    try:
        post(srv.port)
        assert wait_for(lambda: armed(agent_dir))
        files, _missing = Controller(agent_dir).snapshot(1, timeout_s=2)
        assert files == []
        assert wait_for(lambda: any("standing down" in ln for ln in agent_lines(srv.text())))
        post(srv.port, 5)
        (info,) = list_agents(agent_dir)
        assert info.state == "stood-down" and "snapshot raised RuntimeError" in (info.reason or "")
        assert srv.proc.poll() is None
    finally:
        srv.stop()


def test_half_imported_torch_is_never_touched(tmp_path: Path) -> None:
    """The fake torch marks CUDA initialised in the middle of its import and kills the process
    (exit 99) if history is touched before the import ends: an agent that does not wait for
    the import to finish takes the server down here."""
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--keep-kib", "64", FAKE_TORCH_IMPORT_DELAY_S="1.5")
    try:
        post(srv.port, 2)  # waits for the import to finish
        assert wait_for(lambda: armed(agent_dir))
        post(srv.port, 2)
        assert srv.proc.poll() is None, srv.text()
        assert "half-imported" not in srv.text()
    finally:
        srv.stop()


def test_torch_without_the_history_api_stands_down(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--keep-kib", "64", FAKE_TORCH_NO_HISTORY="1")
    try:
        post(srv.port)
        assert wait_for(lambda: agent_lines(srv.text()))
        post(srv.port, 3)
        (line,) = agent_lines(srv.text())
        assert "has no allocator history" in line
        assert srv.proc.poll() is None
    finally:
        srv.stop()


# Each process waits until its own agent registered, says so, and exits (a normal exit removes
# the status file again: the directory keeps only live processes).
REGISTERED = r"""
def registered():
    import os, time, vramdoctor_agent as a
    path = os.path.join(os.environ["VRAMDOCTOR_AGENT_DIR"], "agents", f"{a.safe_host()}-{os.getpid()}.json")
    deadline = time.monotonic() + 20
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    print("registered", os.getpid(), os.path.exists(path), flush=True)
"""

CHILDREN = (
    REGISTERED
    + r"""
import os, subprocess, sys, time
import torch
torch.cuda.init()
pid = os.fork()
if pid == 0:
    keep = torch.empty(1 << 20, device="cuda")
    registered()
    os._exit(0)
spawned = "import torch; torch.cuda.init()\n" + sys.argv[1] + "\nregistered()"
subprocess.run([sys.executable, "-c", spawned])
registered()
os.waitpid(pid, 0)
"""
)


def _registered(stdout: str) -> dict[int, bool]:
    return {
        int(line.split()[1]): line.split()[2] == "True"
        for line in stdout.splitlines()
        if line.startswith("registered ")
    }


def test_forked_and_spawned_children_arm_too(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    out = subprocess.run(
        [sys.executable, "-c", CHILDREN, REGISTERED],
        env=agent_env(agent_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    seen = _registered(out.stdout)
    # the parent, the forked child, the spawned child: three processes, each registered
    assert len(seen) == 3 and all(seen.values()), (out.stdout, out.stderr)
    # normal exits removed their status files; the forked child's os._exit left its own
    assert len(list_agents(agent_dir)) <= 1


def test_sitecustomize_chains_to_the_one_it_shadows(tmp_path: Path) -> None:
    other = tmp_path / "site"
    other.mkdir()
    marker = tmp_path / "marker"
    (other / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = agent_env(tmp_path / "agent", fake_torch=False)
    env["PYTHONPATH"] = f"{agent_path()}{os.pathsep}{other}"
    out = subprocess.run(
        [sys.executable, "-c", "import sys; print('vramdoctor_agent' in sys.modules)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout.strip() == "True", out.stderr
    assert marker.read_text() == "ran"


def test_pth_alternative_boots_only_with_the_directory_set(tmp_path: Path) -> None:
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    (site_dir / "vramdoctor-agent.pth").write_text(pth_line())
    code = (
        "import site, sys, threading; site.addsitedir(sys.argv[1]); time = __import__('time'); "
        "time.sleep(0.2); print('vramdoctor_agent' in sys.modules, "
        "any(t.name == 'vramdoctor-agent' for t in threading.enumerate()))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMDOCTOR_AGENT")}
    off = subprocess.run(
        [sys.executable, "-c", code, str(site_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert off.stdout.split() == ["True", "False"], off.stderr
    on = subprocess.run(
        [sys.executable, "-c", code, str(site_dir)],
        env={**env, "VRAMDOCTOR_AGENT_DIR": str(tmp_path / "a")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert on.stdout.split() == ["True", "True"], on.stderr


def test_test_only_leak_hook_lands_in_the_named_function(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    srv = agent_server(
        tmp_path, agent_dir, "--keep-kib", "0", VRAMDOCTOR_AGENT_TEST_LEAK="__main__:transient:64"
    )
    try:
        post(srv.port)
        assert wait_for(lambda: "TEST-ONLY leak" in srv.text())
        post(srv.port, 3)
        files, _ = Controller(agent_dir).snapshot(1, timeout_s=10)
        live = summarise(load_snapshot(files[0].pickle_path)).live_by_stack
        where = {st.frames[0].function for st in live if st.frames}
        # 3.12+: allocated from a sys.monitoring callback inside `transient`; before: a wrapper,
        # so the stack shows its caller
        assert where == ({"transient"} if sys.version_info >= (3, 12) else {"do_POST"})
    finally:
        srv.stop()


@pytest.mark.parametrize(("keep_kib", "growing"), [("512", True), ("0", False)])
def test_soak_attribute_dir_end_to_end(tmp_path: Path, keep_kib: str, growing: bool) -> None:
    from support.procs import run_cli

    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--keep-kib", keep_kib)
    try:
        post(srv.port)
        assert wait_for(lambda: armed(agent_dir))
        out = tmp_path / "runs" / "run.jsonl"
        r = run_cli(
            "soak",
            "--url",
            srv.url(),
            "--rounds",
            "3",
            "--no-adapt",
            "--requests",
            "4",
            "--idle",
            "0.5",
            "--text-only",
            "--attribute",
            str(agent_dir),
            "--out",
            str(out),
            "--json",
            timeout=180,
        )
        assert r.returncode in (0, 1), r.stderr
        att = json.loads(r.stdout)["attribution"]
        (proc,) = att["processes"]
        assert proc["pid"] == srv.proc.pid and proc["snapshots"] == 4
        assert proc["requests_per_interval"] == [4, 4, 4]
        if growing:
            assert proc["verdict"] == "growing-stack"
            (g,) = proc["growing"]
            assert g["stack"]["frames"][0]["function"] == "keep_for_request"
        else:
            assert proc["verdict"] == "no-growing-stack" and proc["growing"] == []
        assert not (agent_dir / "trigger.json").exists()  # soak removes its trigger at the end
        assert (
            sorted(p.suffix for p in (out.parent / "run.attribution").iterdir()).count(".pickle")
            == 4
        )
    finally:
        srv.stop()


def test_agent_path_holds_the_loader() -> None:
    assert (agent_path() / "sitecustomize.py").is_file()
    assert (agent_path() / "vramdoctor_agent.py").is_file()
    assert FIXTURES.is_dir()


def test_a_relative_directory_is_the_same_for_children_that_change_directory(
    tmp_path: Path,
) -> None:
    code = (
        REGISTERED
        + "import os, subprocess, sys, torch; torch.cuda.init(); os.chdir('/')\n"
        + "child = 'import torch; torch.cuda.init()\\n' + sys.argv[1] + '\\nregistered()'\n"
        + "subprocess.run([sys.executable, '-c', child])\n"
        + "registered()\n"
    )
    env = agent_env(Path("agent"))
    out = subprocess.run(
        [sys.executable, "-c", code, REGISTERED],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    seen = _registered(out.stdout)
    assert len(seen) == 2 and all(seen.values()), (out.stdout, out.stderr)
    assert (tmp_path / "agent" / "agents").is_dir()
    assert not Path("/agent").exists()
