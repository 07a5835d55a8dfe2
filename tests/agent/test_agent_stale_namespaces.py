"""Stale status files of another PID namespace (a container's agent writing into a directory
the host shares): they are ranked after live agents by soak's reader, and removed by an agent
once they are certainly stale (docs/threat-model.md, "Stale status files").

Before, the agent removed only files of its own host and PID namespace, and the reader ranked
only this host's running pids first: everything else, a live container agent included, was
sorted by name, and 10,000 stale files of dead containers that sort before it hid it.

Real processes and real files: a live agent in a real PID + UTS namespace (`unshare`, root
only: the container), thousands of planted status files of a fake other namespace whose mtime
and recorded heartbeat are days old, a live agent on the host side that tidies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.agent import FIXTURES, Proc, agent_env, agent_server

from vramdoctor.agent import control, list_agents
from vramdoctor.agent.pythonpath import vramdoctor_agent as runtime

OTHER_NS = "pid:[4026500001]"  # a PID namespace no process here has
DAYS_AGO = time.time() - 3 * 86400
UNSHARE = ["unshare", "--pid", "--fork", "--uts", "--mount-proc", "--kill-child"]


def wait_for(cond, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def agent_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("vramdoctor-agent[")]


def agents_dir(tmp_path: Path) -> tuple[Path, Path]:
    agent_dir = tmp_path / "agent"
    agents = agent_dir / "agents"
    agents.mkdir(parents=True, mode=0o700)
    agent_dir.chmod(0o700)
    return agent_dir, agents


def plant(path: Path, body: dict[str, object], mtime: float, uid: int | None = None) -> None:
    path.write_text(json.dumps(body))
    os.utime(path, (mtime, mtime))
    if uid is not None:
        os.chown(path, uid, uid)


def dead_container_file(host: str, pid: int) -> dict[str, object]:
    return {
        "protocol": 2,
        "pid": pid,
        "host": host,
        "start_ticks": 12345,
        "pid_ns": OTHER_NS,
        "state": "ready",
        "updated_wall": DAYS_AGO,
    }


def _unshare_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    r = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30, check=False)
    return r.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="a real PID namespace needs root and unshare")
def test_a_live_container_agent_is_seen_past_thousands_of_stale_files_of_other_namespaces(
    tmp_path: Path,
) -> None:
    agent_dir, agents = agents_dir(tmp_path)
    cap = getattr(control, "MAX_STATUS_FILES", 10_000)
    # dead containers' files, of another uid (so no agent here may remove them: this is the
    # reader's ranking alone), whose names sort before the live container's
    for pid in range(1, cap + 300):
        plant(agents / f"old-ctr-{pid}.json", dead_container_file("old-ctr", pid), DAYS_AGO, 65534)
    server = [sys.executable, str(FIXTURES / "agent_server.py"), "--no-torch"]
    container = Proc(
        [*UNSHARE, "sh", "-c", 'hostname vd-ctr && exec "$@"', "sh", *server],
        agent_env(agent_dir),
        tmp_path / "container.log",
    )
    try:
        container.wait_port()
        status = agents / "vd-ctr-1.json"  # pid 1 inside its namespace
        assert wait_for(status.exists), container.text()
        seen = json.loads(status.read_text())
        assert seen["pid_ns"] != runtime.pid_namespace(), "the agent did not run in a namespace"
        found = [a for a in list_agents(agent_dir) if a.host == "vd-ctr"]
        assert found, "the live container agent was hidden by stale files of other namespaces"
        assert found[0].alive() is True and found[0].local_pid is not None, found[0]
        assert found[0].local_pid != 1
        assert not agent_lines(container.text()), container.text()
    finally:
        container.proc.kill()  # unshare ignores SIGTERM; --kill-child takes the namespace with it
        container.stop()
    assert len(list(agents.glob("old-ctr-*.json"))) == cap + 299, "another uid's file was removed"


def test_stale_status_files_of_other_namespaces_are_removed_and_recent_ones_kept(
    tmp_path: Path,
) -> None:
    agent_dir, agents = agents_dir(tmp_path)
    host = runtime.safe_host()
    stale = [agents / f"old-ctr-{pid}.json" for pid in range(1, 1501)]
    for path in stale:
        pid = int(path.stem.rsplit("-", 1)[1])
        plant(path, dead_container_file("old-ctr", pid), DAYS_AGO)
    # one of this host from before pid_ns was written, days old, whose process is gone
    gone = {"pid": 4_000_000_001, "host": host, "start_ticks": 1, "updated_wall": DAYS_AGO}
    plant(agents / f"{host}-4000000001.json", gone, DAYS_AGO)
    stale.append(agents / f"{host}-4000000001.json")

    now = time.time()
    keep: list[Path] = []

    def kept(name: str, body: dict[str, object], mtime: float, uid: int | None = None) -> None:
        plant(agents / name, body, mtime, uid)
        keep.append(agents / name)

    # a container agent heard from just now: its process cannot be seen from here
    kept("new-ctr-7.json", {**dead_container_file("new-ctr", 7), "updated_wall": now}, now)
    # written days ago by mtime, but its recorded heartbeat is recent (a copy that kept times)
    kept("beat-ctr-8.json", {**dead_container_file("beat-ctr", 8), "updated_wall": now}, DAYS_AGO)
    # days old by both, but of this host and a process that runs (this one), no pid_ns
    me = {"pid": os.getpid(), "host": host, "start_ticks": runtime.start_ticks()}
    kept(f"{host}-{os.getpid()}.json", {**me, "updated_wall": DAYS_AGO}, DAYS_AGO)
    # days old, but not an agent's file: a name or content of another shape
    kept("old-ctr-9009.txt", dead_container_file("old-ctr", 9009), DAYS_AGO)
    kept("notes.json", {"note": "not an agent's"}, DAYS_AGO)
    kept("old-ctr-9010.json", dead_container_file("other-host", 9010), DAYS_AGO)
    kept("old-ctr-9011.json", {**dead_container_file("old-ctr", 9011), "pid": 9012}, DAYS_AGO)
    (agents / "old-ctr-9012.json").write_text("{not json")
    os.utime(agents / "old-ctr-9012.json", (DAYS_AGO, DAYS_AGO))
    keep.append(agents / "old-ctr-9012.json")
    if os.geteuid() == 0:  # another user's: never removed, however old
        kept("old-ctr-9013.json", dead_container_file("old-ctr", 9013), DAYS_AGO, 65534)
    # a link of the status shape to an old status file elsewhere: neither is removed
    target = tmp_path / "precious.json"
    plant(target, dead_container_file("old-ctr", 9014), DAYS_AGO)
    (agents / "old-ctr-9014.json").symlink_to(target)
    keep.append(agents / "old-ctr-9014.json")

    srv = agent_server(tmp_path, agent_dir, "--no-torch")
    try:
        assert wait_for((agents / f"{host}-{srv.proc.pid}.json").exists)
        assert wait_for(lambda: not any(p.exists() for p in stale)), (
            f"{sum(p.exists() for p in stale)} of {len(stale)} stale files are still there"
        )
        for path in keep:
            assert os.path.lexists(path), f"{path.name} was removed"
        assert (agents / "old-ctr-9014.json").is_symlink() and target.exists()
        assert srv.proc.poll() is None and not agent_lines(srv.text()), srv.text()
    finally:
        srv.stop()


@pytest.mark.skipif(not _unshare_works(), reason="a real PID namespace needs root and unshare")
def test_a_day_old_file_of_a_container_process_that_runs_is_kept(tmp_path: Path) -> None:
    """A stood-down agent stops its heartbeat, its process goes on: a container's, seen from
    the host through /proc's NSpid and the start time, is never taken for a dead one."""
    agent_dir, agents = agents_dir(tmp_path)
    container = subprocess.Popen([*UNSHARE, "sleep", "120"])
    try:
        assert wait_for(lambda: bool(psutil.Process(container.pid).children()))
        (inside,) = psutil.Process(container.pid).children()
        status = Path(f"/proc/{inside.pid}/status").read_text()
        nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()
        assert nspid[-1] == "1" and len(nspid) == 3, nspid  # pid 1 of its own namespace
        ticks = runtime.start_ticks(inside.pid)
        assert ticks is not None and ticks != runtime.start_ticks(1)
        alive = {**dead_container_file("vd-ctr", 1), "start_ticks": ticks, "state": "stood-down"}
        plant(agents / "vd-ctr-1.json", alive, DAYS_AGO)
        plant(agents / "old-ctr-5.json", dead_container_file("old-ctr", 5), DAYS_AGO)
        srv = agent_server(tmp_path, agent_dir, "--no-torch")
        try:
            host = runtime.safe_host()
            assert wait_for((agents / f"{host}-{srv.proc.pid}.json").exists)
            assert wait_for(lambda: not (agents / "old-ctr-5.json").exists()), "nothing removed"
            assert (agents / "vd-ctr-1.json").exists(), "a running container's file was removed"
            assert srv.proc.poll() is None and not agent_lines(srv.text()), srv.text()
        finally:
            srv.stop()
    finally:
        container.kill()  # unshare ignores SIGTERM; --kill-child takes the namespace with it
        container.wait(10)
