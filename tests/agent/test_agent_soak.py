"""`vramdoctor soak` collects the agent's inside evidence by itself whenever the agent is in the
server: no option needed, the directory found in the server processes' own
environment; `--trace-python` adds tracemalloc's lines; `--attribute DIR` snapshots as well.
Real servers (tests/fixtures/attribute/agent_server.py), the real CLI, real run files.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import requests
from support.agent import agent_server
from support.procs import run_cli

from vramdoctor.record import read_run
from vramdoctor.samples import InsideSample

KIB = 1024


def post(port: int, n: int = 1) -> None:
    for _ in range(n):
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={}, timeout=10)
        assert r.status_code == 200


def soak(url: str, out: Path, *extra: str) -> tuple[int, str, str]:
    r = run_cli(
        "soak",
        "--url",
        url,
        "--rounds",
        "3",
        "--no-adapt",
        "--requests",
        "4",
        "--idle",
        "0.5",
        "--text-only",
        "--out",
        str(out),
        "--json",
        *extra,
        timeout=240,
    )
    return r.returncode, r.stdout, r.stderr


def test_soak_records_inside_evidence_whenever_the_agent_is_in_the_server(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--no-torch", "--malloc-leak-kib", "128")
    try:
        post(srv.port)
        out = tmp_path / "runs" / "run.jsonl"
        code, stdout, stderr = soak(srv.url(), out)
        assert code in (0, 1), stderr
        assert "agent (in the server's environment): inside evidence from pid" in stderr
        run = read_run(out)
        records = run.of(InsideSample)
        assert [(r.round, r.pid) for r in records] == [(n, srv.proc.pid) for n in range(4)]
        in_use = [r.glibc["in_use_bytes"] for r in records]  # type: ignore[index]
        # 4 requests a round keep 128 KiB each from malloc
        assert all(b - a >= 4 * 128 * KIB for a, b in itertools.pairwise(in_use[1:]))
        agent = run.header["config"]["agent"]
        assert agent == {
            "dir": str(agent_dir),
            "found_in": "the server's environment",
            "snapshots": False,
            "trace_python": False,
        }
        assert "trace_python" not in run.header["config"]  # off: not recorded
        # soak cleaned up after itself: no trigger, no session, no answers
        assert sorted(p.name for p in agent_dir.iterdir()) == ["agents", "replies"]
        assert list((agent_dir / "replies").iterdir()) == []
        assert json.loads(stdout)["attribution"] is None  # no snapshots, no traced lines
    finally:
        srv.stop()


def test_soak_trace_python_names_the_growing_line(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--no-torch", "--py-leak-objects", "2000")
    try:
        post(srv.port)
        out = tmp_path / "runs" / "run.jsonl"
        code, stdout, stderr = soak(srv.url(), out, "--trace-python")
        assert code in (0, 1), stderr
        run = read_run(out)
        assert run.header["config"]["trace_python"] is True
        assert all((r.python or {}).get("tracing") for r in run.of(InsideSample))
        (proc,) = json.loads(stdout)["attribution"]["python"]
        (line,) = proc["growing"]
        assert line["file"].endswith("agent_server.py") and line["bytes_per_request"] > 0
    finally:
        srv.stop()


def test_soak_without_an_agent_says_trace_python_has_nothing_to_trace(tmp_path: Path) -> None:

    from support.agent import FIXTURES, Proc, agent_env

    env = agent_env(tmp_path / "unused")
    env.pop("VRAMDOCTOR_AGENT_DIR")
    srv = Proc(
        [sys.executable, str(FIXTURES / "agent_server.py"), "--no-torch"], env, tmp_path / "s.log"
    )
    srv.wait_port()
    try:
        out = tmp_path / "runs" / "run.jsonl"
        code, _stdout, stderr = soak(srv.url(), out, "--trace-python")
        assert code in (0, 1), stderr
        assert "--trace-python: no server process has the agent" in stderr
        assert read_run(out).of(InsideSample) == []
    finally:
        srv.stop()


def test_vramdoctor_itself_never_answers_as_a_server(tmp_path: Path) -> None:
    """A shell that exports the agent (PYTHONPATH, VRAMDOCTOR_AGENT_DIR) for the server also
    gives them to `vramdoctor soak`: soak's own process must not register as one of the server's."""
    from support.agent import agent_env

    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--no-torch")
    try:
        post(srv.port)
        env = agent_env(agent_dir, fake_torch=False)
        r = run_cli(
            "soak", "--url", srv.url(), "--rounds", "1", "--no-adapt", "--requests", "2",
            "--idle", "1", "--text-only", "--out", str(tmp_path / "run.jsonl"), "--json",
            env=env, timeout=240,
        )  # fmt: skip
        assert r.returncode in (0, 1), r.stderr
        pids = {rec.pid for rec in read_run(tmp_path / "run.jsonl").of(InsideSample)}
        assert pids == {srv.proc.pid}
    finally:
        srv.stop()
