"""`soak --fail-on-inconclusive`: a CI gate never passes an undecided run.

INCONCLUSIVE exits 0 by the documented rule (README "Exit codes"): an undecided layer is not a
problem found. From outside a threaded server, host growth that allocator retention or a leak
could explain stays INCONCLUSIVE `retention_or_leak`; a gate that must not pass it asks for exit
1. Real reference server, real soak: one round settles nothing that could be called stable.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.procs import RefServer, run_soak

ONE_ROUND = ["--rounds", "1", "--no-adapt", "--requests", "4", "--idle", "1", "--interval", "0.2"]
ONE_ROUND += ["--text-only", "--json"]


def test_an_undecided_run_exits_0_unless_the_gate_asks_for_1(tmp_path: Path) -> None:
    srv = RefServer("stable")
    try:
        plain = run_soak(srv.url, tmp_path, *ONE_ROUND, name="plain.jsonl")
        gated = run_soak(srv.url, tmp_path, *ONE_ROUND, "--fail-on-inconclusive", name="gate.jsonl")
    finally:
        srv.stop()
    assert json.loads(plain.stdout)["verdict"] == "INCONCLUSIVE", plain.stderr
    assert plain.returncode == 0
    assert json.loads(gated.stdout)["verdict"] == "INCONCLUSIVE", gated.stderr
    assert gated.returncode == 1
    assert "--fail-on-inconclusive" in gated.stderr and "Traceback" not in gated.stderr


def test_the_gate_leaves_a_decided_run_alone(tmp_path: Path) -> None:
    srv = RefServer("stable")
    try:
        r = run_soak(
            srv.url,
            tmp_path,
            "--rounds",
            "3",
            "--no-adapt",
            "--requests",
            "4",
            "--idle",
            "1",
            "--interval",
            "0.2",
            "--text-only",
            "--json",
            "--fail-on-inconclusive",
        )
    finally:
        srv.stop()
    verdict = json.loads(r.stdout)["verdict"]
    assert verdict in ("STABLE", "CACHING"), (verdict, r.stderr)
    assert r.returncode == 0
