"""Real soak runs recorded on an H200 (docs/soak.md), re-analysed offline as users would.

The run files come from scripts/gpu_soak.sh: the reference server running a real transformers
fast image processor on CUDA in plain (caching), leaking (a tensor escaping a request-scoped
MemPool) and fixed (vramdoctor.fixes) modes, sampled by NVML per process. The analysis must
keep telling them apart; the leak rate is checked against the server's own count of kept bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramdoctor.cli import main

RUNS = Path(__file__).parent / "fixtures" / "soak"
MIB = 1024 * 1024


def report_json(name: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["report", str(RUNS / f"h200-{name}.jsonl"), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("name", "verdict", "exit_code"),
    [("plain", "CACHING", 0), ("leaking", "LEAK", 1), ("fixed", "STABLE", 0)],
)
def test_recorded_gpu_run_keeps_its_verdict(name: str, verdict: str, exit_code: int, capsys) -> None:
    code, result = report_json(name, capsys)
    assert result["schema"] == "vramdoctor.soak/1"
    assert result["verdict"] == verdict
    assert code == exit_code


def test_recorded_gpu_leak_rate_and_culprit_match_the_truth(capsys) -> None:
    truth = json.loads((RUNS / "h200-leaking.truth.json").read_text())
    _, result = report_json("leaking", capsys)
    true_rate = truth["leak_bytes_per_request"] / MIB
    assert result["leak_mib_per_request"] == pytest.approx(true_rate, rel=0.25)
    culprit = result["culprit"]
    assert culprit["pid"] == truth["pid"]
    assert culprit["gpu"] == 0
    assert culprit["layer"] == "allocator"
    assert result["hours_to_oom"] is not None and result["hours_to_oom"] > 0


def test_recorded_gpu_caching_run_settles_above_the_context(capsys) -> None:
    _, result = report_json("plain", capsys)
    levels = [r["settled_mib"] for r in result["rounds"]]
    process_series = [k for k in levels[0] if k.startswith("gpu0/pid")]
    assert process_series, levels[0]
    values = [round(level[process_series[0]]) for level in levels]
    assert values[0] > 612  # the cache grew above the bare CUDA context in round 1 ...
    assert len(set(values)) == 1  # ... and then stayed flat
