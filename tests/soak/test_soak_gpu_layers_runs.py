"""Per-layer soak runs recorded on an H200 (scripts/gpu_soak_layers.sh), re-analysed offline.

Truth of each run: `transformers serve` with a tiny random Qwen2-VL built from a config (no
/metrics, /v1/models answering 500: caching, no leak); the reference server on CUDA keeping one
64-token KV page per request in a 1,000,000-token pool (SGLang metric names); the same server
caching pinned host memory; and a helper process that appears and exits in round 1. The numbers
are in docs/soak.md ("GPU results per layer").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramdoctor.cli import main

RUNS = Path(__file__).parents[1] / "fixtures" / "soak"


def report_json(name: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["report", str(RUNS / f"h200-{name}.jsonl"), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_transformers_serve_is_caching_and_says_kv_is_not_measured(capsys) -> None:
    code, d = report_json("transformers-serve", capsys)
    assert (code, d["verdict"]) == (0, "CACHING")
    assert d["layers"]["vram"]["verdict"] == "CACHING"
    assert d["layers"]["kv"]["verdict"] == "NOT_MEASURED"
    assert d["layers"]["host"]["verdict"] != "LEAK"


def test_kv_page_leak_in_a_million_token_pool_is_one_page_per_request(capsys) -> None:
    code, d = report_json("kv-page-leak", capsys)
    assert (code, d["verdict"]) == (1, "LEAK")
    kv = d["layers"]["kv"]
    assert kv["verdict"] == "LEAK" and kv["unit"] == "tokens"
    assert kv["rate_per_request"] == pytest.approx(64, rel=0.10)
    assert d["layers"]["vram"]["verdict"] != "LEAK"  # a preallocated pool never moves NVML


def test_pinned_host_memory_is_named_caching(capsys) -> None:
    code, d = report_json("pinned", capsys)
    assert code == 0 and d["layers"]["host"]["verdict"] == "CACHING"
    assert "pinned" in json.dumps(d["layers"]["host"]).lower()


def test_a_helper_that_exits_in_round_one_decides_nothing(capsys) -> None:
    code, d = report_json("worker-churn", capsys)
    assert code == 0 and d["verdict"] in ("CACHING", "STABLE")
    assert d["process_changes"]  # reported
