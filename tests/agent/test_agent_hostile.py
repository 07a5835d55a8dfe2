"""The agent inside a production server, attacked through its directory.

Whoever can write the agent directory could, before, make the server read /dev/zero until it ran
out of memory, create files in any directory, write as many snapshots as it liked, or silence
the agent for good with one malformed trigger; a 0.4 MB pickle cost minutes of CPU in
`attribute`. docs/threat-model.md ("The agent") says who can do what; each test here shows one
promise with a real server process, real files and links.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from support.agent import agent_server

from vramdoctor.agent import Controller, list_agents
from vramdoctor.agent.pythonpath import vramdoctor_agent as runtime
from vramdoctor.errors import InputError
from vramdoctor.record import RunWriter, make_header

ROOT = Path(__file__).resolve().parents[2]


def post(port: int, n: int = 1) -> None:
    for _ in range(n):
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={}, timeout=10)
        assert r.status_code == 200


def wait_for(cond, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def agent_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("vramdoctor-agent[")]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        line = next(x for x in fh if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def ready_server(tmp_path: Path, *args: str, **kw):  # type: ignore[no-untyped-def]
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, *args, **kw)
    post(srv.port)
    assert wait_for(lambda: any(a.state in ("ready", "armed") for a in list_agents(agent_dir)))
    return agent_dir, srv


def answers(agent_dir: Path, seq: int = 50, timeout_s: float = 10) -> int:
    """How many agents answer a valid trigger of a fresh soak session now."""
    ctl = Controller(agent_dir)
    replies, _missing = ctl.collect(seq, want=["inside"], timeout_s=timeout_s)
    ctl.close()
    return len(replies)


# --- no size cap, links followed ----------------------------------------------------------------
def test_a_trigger_linked_to_dev_zero_is_never_read(tmp_path: Path) -> None:
    """Old code: json.load on /dev/zero read until MemoryError (here capped by RLIMIT_AS) and the
    agent stood down. Now: refused without reading, the agent answers the next real trigger."""
    agent_dir, srv = ready_server(tmp_path, "--keep-kib", "64", limit_as_mib=3072)
    try:
        before = rss_mib(srv.proc.pid)
        ctl = Controller(agent_dir)
        ctl.open_session()  # the planted link names no token anyway; the session is the soak's
        os.symlink("/dev/zero", agent_dir / "trigger.json")
        time.sleep(1.5)
        assert rss_mib(srv.proc.pid) - before < 50
        assert srv.proc.poll() is None
        (agent_dir / "trigger.json").unlink()
        replies, missing = ctl.collect(1, want=["inside"], timeout_s=10, min_agents=1)
        assert missing == [] and len(replies) == 1
        assert "trigger.json is a symbolic link" in srv.text()
    finally:
        srv.stop()


def test_a_huge_trigger_file_and_a_fifo_are_refused(tmp_path: Path) -> None:
    agent_dir, srv = ready_server(tmp_path, "--no-torch")
    try:
        big = agent_dir / ".big"
        body = json.dumps({"token": "x", "seq": 1, "expires_wall": time.time() + 60})
        big.write_text(body + " " * (8 * 1024 * 1024))
        os.replace(big, agent_dir / "trigger.json")
        time.sleep(0.5)
        (agent_dir / "trigger.json").unlink()
        os.mkfifo(agent_dir / "trigger.json")  # opened without O_NONBLOCK, this blocks forever
        time.sleep(0.5)
        (agent_dir / "trigger.json").unlink()
        assert answers(agent_dir) == 1
        lines = agent_lines(srv.text())
        assert len(lines) == 1 and "ignored a trigger" in lines[0] and "bytes" in lines[0]
    finally:
        srv.stop()


# --- the directory itself ------------------------------------------------------------------------
def test_a_directory_others_can_write_is_refused_and_left_untouched(tmp_path: Path) -> None:
    agent_dir = tmp_path / "shared"
    agent_dir.mkdir()
    agent_dir.chmod(0o777)
    srv = agent_server(tmp_path, agent_dir, "--keep-kib", "64")
    try:
        post(srv.port, 2)
        assert wait_for(lambda: agent_lines(srv.text()))
        (line,) = agent_lines(srv.text())
        assert "standing down" in line and "writable by group or others (mode 777)" in line
        assert list(agent_dir.iterdir()) == []  # nothing written into it
        post(srv.port, 2)
        assert srv.proc.poll() is None
        with pytest.raises(InputError, match="writable by group or others"):
            Controller(agent_dir).check()  # soak refuses it too, with the chmod to fix it
    finally:
        srv.stop()


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        agent_dir = tmp_path / "theirs"
        agent_dir.mkdir(mode=0o755)
        os.chown(agent_dir, 65534, 65534)
        owner = "uid 65534"
    else:  # not root: a directory owned by root that this user cannot have created
        agent_dir = Path("/")
        owner = "uid 0"
    srv = agent_server(tmp_path, agent_dir, "--no-torch")
    try:
        post(srv.port)
        assert wait_for(lambda: agent_lines(srv.text()))
        (line,) = agent_lines(srv.text())
        assert f"belongs to {owner}, not to this process's uid" in line
        assert not (agent_dir / "agents").exists()
    finally:
        srv.stop()


def test_a_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    srv = agent_server(tmp_path, link, "--no-torch")
    try:
        post(srv.port)
        assert wait_for(lambda: agent_lines(srv.text()))
        assert "is a link or not a directory" in agent_lines(srv.text())[0]
        assert list(real.iterdir()) == []
    finally:
        srv.stop()


# --- planted directory links, any token, unbounded files -----------------------------------------
@pytest.mark.parametrize("planted", ["agents", "replies"])
def test_planted_directory_links_never_get_files_written_through(
    tmp_path: Path, planted: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir(mode=0o700)
    (agent_dir / planted).symlink_to(elsewhere)
    srv = agent_server(tmp_path, agent_dir, "--keep-kib", "64")
    try:
        post(srv.port, 2)
        if planted == "replies":
            assert wait_for(lambda: (agent_dir / "agents").is_dir() and list_agents(agent_dir))
            Controller(agent_dir).collect(1, want=["inside", "snapshot"], timeout_s=2)
        assert wait_for(lambda: any("standing down" in x for x in agent_lines(srv.text())))
        assert "is a link or not a directory: refusing to write through it" in srv.text()
        assert list(elsewhere.iterdir()) == []
        post(srv.port)
        assert srv.proc.poll() is None
    finally:
        srv.stop()


def _trigger(agent_dir: Path, **fields: object) -> None:
    data = {
        "token": "intruder",
        "seq": 1,
        "expires_wall": time.time() + 60,
        "want": ["inside", "snapshot"],
        **fields,
    }
    tmp = agent_dir / ".t"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, agent_dir / "trigger.json")


def test_only_the_running_soaks_token_is_answered(tmp_path: Path) -> None:
    agent_dir, srv = ready_server(tmp_path, "--keep-kib", "64")
    try:
        _trigger(agent_dir, token="intruder", seq=1)  # no session at all
        time.sleep(0.4)
        ctl = Controller(agent_dir, token="therealsoak")
        ctl.open_session()
        for seq in range(2, 6):  # a session exists, but not with this token
            _trigger(agent_dir, token="intruder", seq=seq)
            time.sleep(0.15)
        assert not (agent_dir / "replies" / "intruder").exists()
        replies, missing = ctl.collect(1, want=["inside"], timeout_s=10, min_agents=1)
        assert missing == [] and len(replies) == 1
    finally:
        srv.stop()


def test_a_session_of_a_soak_that_ended_is_not_answered(tmp_path: Path) -> None:
    agent_dir, srv = ready_server(tmp_path, "--no-torch")
    try:
        gone = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        )
        dead_pid = int(gone.stdout)
        session = {
            "token": "oldsoak",
            "pid": dead_pid,
            "start_ticks": 1,
            "host": runtime.safe_host(),
            "pid_ns": runtime.pid_namespace(),
        }
        (agent_dir / "session.json").write_text(json.dumps(session))
        _trigger(agent_dir, token="oldsoak", seq=3, want=["inside"])
        time.sleep(0.6)
        assert not (agent_dir / "replies" / "oldsoak").exists()
        assert agent_lines(srv.text()) == []  # an ordinary case: nothing said
    finally:
        srv.stop()


def test_answers_nobody_collects_are_bounded(tmp_path: Path) -> None:
    """Triggers that are valid (the session's token, new seqs) but never collected: the agent
    stops at MAX_PENDING answers instead of filling the disk."""
    agent_dir, srv = ready_server(tmp_path, "--keep-kib", "64")
    try:
        ctl = Controller(agent_dir, token="flood")
        for seq in range(runtime.MAX_PENDING + 10):
            ctl.trigger(seq, want=["inside", "snapshot"])
            time.sleep(0.12)
        time.sleep(0.5)
        answered = list((agent_dir / "replies" / "flood").glob("*.json"))
        assert len(answered) == runtime.MAX_PENDING
        assert len(list((agent_dir / "replies" / "flood").glob("*.pickle"))) == runtime.MAX_PENDING
        assert "answers nobody collected are waiting" in srv.text()
    finally:
        srv.stop()


# --- one malformed trigger silenced the agent for good ------------------------------------------
MALFORMED = [
    b'{"token": "t", "seq": 1e300, "expires_wall": 1e300}',
    b'{"token": "t", "seq": 99999999999999999999999, "expires_wall": 1e300}',
    b'{"token": "t", "seq": -1, "expires_wall": 1e300}',
    b'{"token": "t", "seq": true, "expires_wall": 1e300}',
    b'{"token": "../../etc", "seq": 1, "expires_wall": 1e300}',
    b'{"token": "t", "seq": 1, "expires_wall": NaN}',
    b'{"token": "t", "seq": 1, "expires_wall": "tomorrow"}',
    b'{"token": "t", "seq": 1, "expires_wall": 1e300, "want": ["rm -rf"]}',
    b'{"token": "t", "seq": 1, "expires_wall": 1e300, "trace_python": "yes"}',
    b"[" * 3000 + b"]" * 3000,
    b"\xff\xfe not utf-8",
    b"[1, 2, 3]",
    b"",
]


def test_malformed_triggers_are_ignored_and_the_agent_stays_armed(tmp_path: Path) -> None:
    agent_dir, srv = ready_server(tmp_path, "--keep-kib", "64")
    try:
        ctl = Controller(agent_dir, token="t")
        ctl.open_session()
        for i, raw in enumerate(MALFORMED):
            tmp = agent_dir / f".m{i}"
            tmp.write_bytes(raw)
            os.replace(tmp, agent_dir / "trigger.json")
            time.sleep(0.12)
        replies, missing = ctl.collect(2, want=["inside", "snapshot"], timeout_s=10, min_agents=1)
        assert missing == [] and len(replies) == 1 and replies[0].snapshot is not None
        (info,) = list_agents(agent_dir)
        assert info.state == "armed"
        lines = agent_lines(srv.text())
        assert sum("ignored a trigger" in x for x in lines) == 1  # said once, not per file
        assert not any("standing down" in x for x in lines)
    finally:
        srv.stop()


# --- the soak side reads a directory the server's user controls ---------------------------------
def test_the_soak_side_never_follows_planted_answers(tmp_path: Path) -> None:
    agent_dir, srv = ready_server(tmp_path, "--keep-kib", "64")
    try:
        ctl = Controller(agent_dir, token="mine")
        ctl.open_session()
        folder = agent_dir / "replies" / "mine"
        folder.mkdir(parents=True)
        secret = tmp_path / "secret.txt"
        secret.write_text("not for the run folder")
        os.symlink(secret, folder / "0000003-evilhost-1.json")
        os.mkfifo(folder / "0000003-evilhost-2.json")
        (folder / "0000003-evilhost-3.json").write_text("{" * 2_000_000)
        dest = tmp_path / "run.attribution"
        replies, _ = ctl.collect(3, want=["inside", "snapshot"], timeout_s=3)
        assert [r.pid for r in replies] == [srv.proc.pid]
        moved = ctl.move([r.snapshot for r in replies if r.snapshot], dest)
        assert len(moved) == 1 and all(not p.is_symlink() for p in dest.iterdir())
        assert secret.read_text() == "not for the run folder"
    finally:
        srv.stop()


# --- a small hostile snapshot cost minutes -------------------------------------------------------
def hostile_snapshot(blocks: int = 40_000, frames: int = 40_000) -> bytes:
    """~0.4 MB: `blocks` live blocks sharing ONE `frames`-deep stack through the pickle memo."""
    frame = {"filename": "/srv/app/handler.py", "line": 7, "name": "handle"}
    stack = [frame] * frames
    block = {"size": 512, "state": "active_allocated", "frames": stack}
    seg = {
        "device": 0,
        "total_size": 512 * blocks,
        "segment_pool_id": (0, 0),
        "blocks": [block] * blocks,
    }
    return pickle.dumps({"segments": [seg], "device_traces": []}, protocol=4)


def test_a_hostile_snapshot_costs_seconds_not_minutes(tmp_path: Path) -> None:
    data = hostile_snapshot()
    assert len(data) < 600_000
    a, b = tmp_path / "a.pickle", tmp_path / "b.pickle"
    a.write_bytes(data)
    b.write_bytes(data)
    # old code: ~1.6e9 frame reads per snapshot (minutes); the subprocess limit is the test
    out = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "attribute", str(a), str(b), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    proc = json.loads(out.stdout)["processes"][0]
    assert proc["live_bytes"] == [512 * 40_000] * 2 and proc["verdict"] == "no-growing-stack"


def test_soak_s_diff_of_hostile_snapshots_and_planted_files_ends(tmp_path: Path) -> None:
    """`vramdoctor report` of a run whose attribution folder holds hostile snapshots, a FIFO and
    a link where pickles belong: it ends, and says what it refused."""
    run = tmp_path / "run.jsonl"
    with RunWriter(run, make_header("soak")):
        pass
    folder = tmp_path / "run.attribution"
    folder.mkdir()
    for seq in range(3):
        name = f"{seq:07d}-h-100"
        (folder / f"{name}.pickle").write_bytes(hostile_snapshot())
        (folder / f"{name}.json").write_text(
            json.dumps({"seq": seq, "pid": 100, "host": "h", "wall": seq})
        )
    os.mkfifo(folder / "0000000-h-200.pickle")
    (folder / "0000000-h-200.json").write_text(
        json.dumps({"seq": 0, "pid": 200, "host": "h", "wall": 0})
    )
    (folder / "0000000-h-300.pickle").symlink_to("/etc/hostname")
    (folder / "0000000-h-300.json").write_text(
        json.dumps({"seq": 0, "pid": 300, "host": "h", "wall": 0})
    )
    out = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(run), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode in (0, 1), out.stderr
    att = json.loads(out.stdout)["attribution"]
    assert [p["pid"] for p in att["processes"]] == [100]
    notes = " ".join(att["notes"])
    assert "is not a regular file" in notes and "symbolic link" in notes


# --- soak as root, pointed at a directory by a server process -----------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a server process of another user")
def test_a_server_cannot_point_a_root_soak_at_a_directory_it_does_not_own(tmp_path: Path) -> None:
    """A server process (uid 65534) names root's directory in its VRAMDOCTOR_AGENT_DIR: soak,
    running as root, finds it there and refuses it, writing nothing into it; a missing one is
    never created."""
    from vramdoctor.attribution.hooks import inside_hook

    roots = tmp_path / "roots"
    roots.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    said: list[str] = []
    for target in (roots, tmp_path / "missing" / "dir"):
        proc = subprocess.Popen(
            ["sleep", "30"],  # any process: what matters is its environment and its user
            env={"VRAMDOCTOR_AGENT_DIR": str(target), "PATH": "/usr/bin:/bin"},
            user=65534,
            group=65534,
        )
        try:
            assert wait_for(lambda p=proc: os.path.exists(f"/proc/{p.pid}/environ"))
            time.sleep(0.2)
            assert inside_hook({proc.pid: "server"}, notify=said.append) is None
        finally:
            proc.kill()
            proc.wait()
    assert "belongs to uid 0, not to the server process's uid 65534" in said[0]
    assert "does not exist" in said[1]
    assert list(roots.iterdir()) == [] and not (tmp_path / "missing").exists()
