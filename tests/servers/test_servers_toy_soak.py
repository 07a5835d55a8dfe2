"""A server kind added from outside runs through soak and report: one module, no other edit.

A process registers `toy_kind.KIND` (tests/servers/toy_kind.py, as a plugin would) and runs
`vramdoctor soak` against a real loopback server of that kind whose KV pool keeps 16 tokens per
request: the soak must identify it by the kind's own probe, read its KV pool through the
kind's own metric names, and find the leak (exit 1). The recorded run then reports the same in
a process where the toy kind was never registered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.cli import cli_env, vd

HERE = Path(__file__).resolve().parent


def test_a_registered_kind_is_soaked_and_reported(tmp_path: Path) -> None:
    run = tmp_path / "toy.jsonl"
    script = textwrap.dedent(
        f"""
        import sys
        import toy_kind
        toy_kind.register()
        from vramdoctor.cli import main
        with toy_kind.ToyServer(leak_tokens=16) as srv:
            code = main(["soak", "--url", srv.url, "--rounds", "4", "--requests", "10",
                         "--idle", "1", "--no-adapt", "--text-only", "--out", {str(run)!r},
                         "--json"])
        sys.exit(code)
        """
    )
    env = cli_env(PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]))
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 1, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    kv = doc["layers"]["kv"]
    assert kv["verdict"] == "LEAK" and kv["unit"] == "tokens"
    assert abs(kv["rate_per_request"] - 16.0) < 0.5
    header = json.loads(run.read_text().splitlines()[0])
    assert "toy" in json.dumps(header)  # the run says which kind it identified
    again = vd("report", str(run), "--json")  # no toy kind in this process
    assert again.returncode == 1, again.stderr
    assert json.loads(again.stdout)["layers"]["kv"]["verdict"] == "LEAK"
