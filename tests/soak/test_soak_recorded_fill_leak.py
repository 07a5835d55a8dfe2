"""Real CPU runs: a malloc leak of 256 KiB per request under a cache that fills in round 1.

Recorded on 2026-12-02 by `python benchmarks/soak_sensitivity.py --layer host-modes --rounds N
--leak-runs 3` (N = 5: `cpu-host-leak-under-fill-agent.jsonl`; N = 6: `...-6r.jsonl`): the
reference server's `host-leak` mode (the retention server, a 40-entry feature cache still
filling in round 1, and 256 KiB per request through libc malloc, 30 requests a round), with
vramdoctor's agent in the server. glibc's bytes in use read +24.5, then +7.5 MiB a round: the
fill, then the leak alone (30 x 256 KiB = 7.5 MiB).

Live bytes need four steady increments after the fill (a second cache filling at a fixed rate
reads the same for fewer): five rounds give three, so the run is undecided with one more round
to go; six rounds decide a LEAK at the leak's own rate, with an interval the fill's increment
does not widen (it once did, to -83 to 583 KiB/request, and the layer said noisy).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramdoctor.cli import main

RUNS = Path(__file__).parents[1] / "fixtures" / "soak"


def _report(name: str, capsys) -> tuple[int, dict]:
    code = main(["report", str(RUNS / name), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_five_rounds_of_a_leak_under_a_fill_are_undecided_with_one_round_to_go(capsys) -> None:
    code, result = _report("cpu-host-leak-under-fill-agent.jsonl", capsys)
    host = result["layers"]["host"]
    assert result["verdict"] == "INCONCLUSIVE" and host["verdict"] == "INCONCLUSIVE"
    assert host["reason"] == "steady_or_converging" and host["decided_by"] == "inside_glibc"
    rss = next(s for s in result["series"] if s["kind"] == "rss" and s["decides"])
    assert rss["steps_to_decide"] == 1
    assert code == result["exit_code"]


def test_six_rounds_find_the_leak_under_the_fill_at_its_own_rate(capsys) -> None:
    code, result = _report("cpu-host-leak-under-fill-agent-6r.jsonl", capsys)
    host = result["layers"]["host"]
    assert code == 1 and result["verdict"] == "LEAK" and host["verdict"] == "LEAK"
    assert host["decided_by"] == "inside_glibc"
    in_use = next(s for s in result["series"] if s["kind"] == "glibc_in_use")
    assert in_use["slope_per_request"] * 1024 == pytest.approx(256.0, rel=0.01)
    lo, hi = in_use["slope_ci"]
    assert 0 < lo * 1024 <= 256.0 <= hi * 1024 and (hi - lo) * 1024 < 26.0
