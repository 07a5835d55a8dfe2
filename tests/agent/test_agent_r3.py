"""The agent's status files and directory: stale status files, and links above the directory.

Stale status files: processes that die without a normal exit (`os._exit`, SIGKILL, a crash)
left their status file behind for good, and soak's reader looked only at the first 10,000 names
in sorted order, so enough stale files hid a live agent. Now the agent removes, at start, the status files
of its own host and PID namespace whose process is gone (only files of its own shape, uid and
namespace; never a link, never another namespace's), and the reader looks at live processes'
files first.

Links above the directory: a link another user planted above the agent directory (in a shared
`/tmp/x`) made a root server create directories and files where that user chose. Now the agent refuses a path
with a link of another user on the way, or an ancestor writable by others without the sticky
bit; a private directory in sticky `/tmp` (the docs' example) still works.
Real server processes (tests/fixtures/attribute/agent_server.py), real files and links.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.agent import agent_env, agent_server

from vramdoctor.agent import control, list_agents
from vramdoctor.agent.pythonpath import vramdoctor_agent as runtime


def wait_for(cond, timeout_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def agent_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("vramdoctor-agent[")]


def crashed_workers(agent_dir: Path, n: int) -> list[int]:
    """n processes with the agent, at once, that register and then end with os._exit (no
    atexit): each leaves its status file behind, as a SIGKILLed or crashed worker does (they
    run together, so none starts after another died). Returns their pids."""
    code = "import os, time; time.sleep(1.5); os._exit(0)"
    env = agent_env(agent_dir, fake_torch=False)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(n)]
    for p in procs:
        assert p.wait(60) == 0
    return [p.pid for p in procs]


def test_status_files_of_processes_that_died_are_removed_and_nothing_else(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    dead = crashed_workers(agent_dir, 3)
    agents = agent_dir / "agents"
    host = runtime.safe_host()
    for pid in dead:
        assert (agents / f"{host}-{pid}.json").exists(), "the crashed worker left no file"
    # what must stay: a live process's, another PID namespace's, one from before pid_ns was
    # written, a damaged one, a link of the status shape
    me = {
        "pid": os.getpid(),
        "host": host,
        "start_ticks": runtime.start_ticks(),
        "pid_ns": runtime.pid_namespace(),
        "state": "ready",
    }
    gone = dead[0]
    keep = {
        f"{host}-{os.getpid()}.json": me,
        f"{host}-{gone + 100000}.json": {**me, "pid": gone + 100000, "pid_ns": "pid:[1]"},
        f"{host}-{gone + 200000}.json": {
            k: v for k, v in {**me, "pid": gone + 200000}.items() if k != "pid_ns"
        },
    }
    for name, body in keep.items():
        (agents / name).write_text(json.dumps(body))
    (agents / f"{host}-{gone + 300000}.json").write_text("{not json")
    target = tmp_path / "precious.json"
    target.write_text(json.dumps({**me, "pid": gone + 400000, "start_ticks": 1}))
    (agents / f"{host}-{gone + 400000}.json").symlink_to(target)

    srv = agent_server(tmp_path, agent_dir, "--no-torch")
    try:
        mine = agents / f"{host}-{srv.proc.pid}.json"
        assert wait_for(mine.exists)
        assert wait_for(lambda: not any((agents / f"{host}-{p}.json").exists() for p in dead))
        for name in [*keep, f"{host}-{gone + 300000}.json", f"{host}-{gone + 400000}.json"]:
            assert os.path.lexists(agents / name), f"{name} was removed"
        assert target.exists() and (agents / f"{host}-{gone + 400000}.json").is_symlink()
        assert srv.proc.poll() is None and not agent_lines(srv.text())
    finally:
        srv.stop()


def test_a_live_agent_is_seen_past_thousands_of_stale_files(tmp_path: Path) -> None:
    """Old code: `sorted(names)[:10_000]` read only the stale files that sort first."""
    agent_dir = tmp_path / "agent"
    agents = agent_dir / "agents"
    agents.mkdir(parents=True, mode=0o700)
    agent_dir.chmod(0o700)
    host = runtime.safe_host()
    # files from before pid_ns was written (never pruned by the agent), of processes that
    # cannot exist (pids over any pid_max), whose names sort before almost any live pid's
    stale = json.dumps(
        {"pid": 1, "host": host, "start_ticks": 1, "state": "ready", "updated_wall": 0.0}
    )
    for i in range(getattr(control, "MAX_STATUS_FILES", 10_000) + 50):
        (agents / f"{host}-1{i:09d}.json").write_text(stale)
    srv = agent_server(tmp_path, agent_dir, "--no-torch")
    try:
        assert wait_for((agents / f"{host}-{srv.proc.pid}.json").exists)
        found = [a for a in list_agents(agent_dir) if a.pid == srv.proc.pid]
        assert found and found[0].alive() is True, "the live agent was hidden by stale files"
    finally:
        srv.stop()


# --- what lies above the directory -----------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link needs root")
def test_a_link_another_user_planted_above_the_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = shared / "vd"
    link.symlink_to(target)
    os.lchown(link, 65534, 65534)  # planted by nobody
    srv = agent_server(tmp_path, link / "agent", "--no-torch")
    try:
        assert wait_for(lambda: agent_lines(srv.text()))
        (line,) = agent_lines(srv.text())
        assert "standing down" in line and "is a link that belongs to uid 65534" in line, line
        assert list(target.iterdir()) == [], "the agent created something through the link"
        assert srv.proc.poll() is None
    finally:
        srv.stop()


def test_an_ancestor_others_can_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    srv = agent_server(tmp_path, open_dir / "agent", "--no-torch")
    try:
        assert wait_for(lambda: agent_lines(srv.text()))
        (line,) = agent_lines(srv.text())
        assert "writable by group or others without the sticky bit (mode 777)" in line, line
        assert list(open_dir.iterdir()) == []
        assert srv.proc.poll() is None
    finally:
        srv.stop()


def test_a_private_directory_in_a_sticky_shared_one_still_works(tmp_path: Path) -> None:
    """The docs' example, `/tmp/vd-agent`: in sticky, world-writable /tmp, created by the
    server's user (0700): accepted, and so is a link of one's own above it."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (tmp_path / "mine").symlink_to(sticky)  # this uid's link: accepted
    agent_dir = tmp_path / "mine" / "vd-agent"
    srv = agent_server(tmp_path, agent_dir, "--no-torch")
    try:
        status = sticky / "vd-agent" / "agents" / f"{runtime.safe_host()}-{srv.proc.pid}.json"
        assert wait_for(status.exists), srv.text()
        assert not agent_lines(srv.text())
    finally:
        srv.stop()
