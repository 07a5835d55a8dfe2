"""`--attribute sglang`: SGLang's own /start_profile + /stop_profile against a loopback server
that follows SGLang's source (tests/fixtures/attribute/fake_sglang.py) and dumps real pickles."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import requests
from support.agent import FIXTURES, Proc
from support.procs import run_cli

from vramdoctor.attribution.hooks import (
    SGLANG_NOT_COVERED,
    SglangHook,
    build_hook,
    parse_attribute_option,
)
from vramdoctor.attribution.snapshots import attribute_run
from vramdoctor.errors import InputError, SourceUnavailable


@pytest.fixture
def sglang(tmp_path: Path):
    p = Proc(
        [
            sys.executable,
            str(FIXTURES / "fake_sglang.py"),
            "--fixtures",
            str(FIXTURES / "gpu"),
            "--series",
            "leak",
            "--series",
            "caching",
        ],
        env={"PATH": "/usr/bin:/bin"},
        log=tmp_path / "sglang.log",
    )
    p.wait_port()
    yield p
    p.stop()


def calls(p: Proc) -> dict:
    return requests.get(p.url() + "/fake/calls", timeout=5).json()


def test_rounds_collect_one_pickle_per_scheduler_and_always_stop(
    sglang: Proc, tmp_path: Path
) -> None:
    dest = tmp_path / "run.attribution"
    dest.mkdir()
    hook = SglangHook(sglang.url(), dest)
    for rnd in range(4):  # baseline end arms; each later idle end stops (dump) and re-arms
        hook(rnd, tmp_path)
    assert calls(sglang)["in_progress"]
    hook.close()
    c = calls(sglang)
    assert not c["in_progress"], "close() must stop the profile an idle server would never stop"
    starts = [x for x in c["calls"] if x["path"] == "/start_profile"]
    assert starts and all(
        x["body"]["activities"] == ["MEM"] and "num_steps" not in x["body"] for x in starts
    )
    assert sorted(p.name for p in dest.glob("*.pickle")) == [
        f"{r:04d}-sglang-TP{k}.pickle" for r in (1, 2, 3) for k in (0, 1)
    ]
    cov = json.loads((dest / "collection.json").read_text())
    assert cov["covered"] == ["SGLang scheduler TP 0", "SGLang scheduler TP 1"]
    assert cov["not_covered"] == [SGLANG_NOT_COVERED] and "tokenizer" in SGLANG_NOT_COVERED
    report = attribute_run([], dest)
    assert report is not None
    verdicts = {p.label: p.verdict for p in report.processes}
    assert verdicts == {
        "SGLang scheduler TP 0": "growing-stack",
        "SGLang scheduler TP 1": "no-growing-stack",
    }
    assert "keep_per_request" in report.processes[0].growing[0].stack.describe()
    # the dump of close() belongs to no round: not collected, and removed
    assert not list((dest / "sglang-output").glob("*.pickle"))


def test_a_profile_already_running_is_a_clear_error(sglang: Proc, tmp_path: Path) -> None:
    requests.post(sglang.url() + "/start_profile", json={"activities": ["CPU"]}, timeout=5)
    hook = SglangHook(sglang.url(), tmp_path)
    with pytest.raises(SourceUnavailable, match="already in progress"):
        hook(0, tmp_path)
    requests.post(sglang.url() + "/stop_profile", timeout=5)


def test_option_parsing() -> None:
    assert parse_attribute_option("sglang") == ("sglang", None)
    kind, d = parse_attribute_option("sglang:/shared/x")
    assert kind == "sglang" and d == Path("/shared/x")
    assert parse_attribute_option("/tmp/agent")[0] == "agent"
    with pytest.raises(InputError):
        parse_attribute_option("sglang:")
    with pytest.raises(InputError, match="another host"):
        build_hook("sglang", url="http://h:1", run_path=Path("/tmp/r.jsonl"), remote=True)


def test_soak_attribute_sglang_end_to_end(sglang: Proc, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "s.jsonl"
    r = run_cli(
        "soak",
        "--url",
        sglang.url(),
        "--rounds",
        "3",
        "--no-adapt",
        "--requests",
        "3",
        "--idle",
        "0.5",
        "--text-only",
        "--attribute",
        "sglang",
        "--out",
        str(out),
        "--json",
        timeout=180,
    )
    assert r.returncode in (0, 1), r.stderr
    d = json.loads(r.stdout)
    att = d["attribution"]
    assert att["source"] == "sglang"
    assert att["not_covered"] == [SGLANG_NOT_COVERED]
    tp0 = next(p for p in att["processes"] if p["label"] == "SGLang scheduler TP 0")
    assert tp0["verdict"] == "growing-stack"
    assert not calls(sglang)["in_progress"]
    # offline: `vramdoctor report` re-runs the diff from the run directory
    rep = run_cli("report", str(out))
    assert "SGLang scheduler TP 0: memory held by a stack that grows every round" in rep.stdout


def test_an_sglang_without_the_mem_activity_is_given_up_after_one_round(tmp_path: Path) -> None:
    p = Proc(
        [
            sys.executable,
            str(FIXTURES / "fake_sglang.py"),
            "--fixtures",
            str(FIXTURES / "gpu"),
            "--series",
            "leak",
            "--no-mem",
        ],
        env={"PATH": "/usr/bin:/bin"},
        log=tmp_path / "old.log",
    )
    p.wait_port()
    try:
        hook = SglangHook(p.url(), tmp_path / "dest", file_wait_s=1.0)
        (tmp_path / "dest").mkdir()
        t0 = time.monotonic()
        for rnd in range(4):
            hook(rnd, tmp_path)
        hook.close()
        assert time.monotonic() - t0 < 10  # one wait, not one per round
        assert not calls(p)["in_progress"]
        cov = json.loads((tmp_path / "dest" / "collection.json").read_text())
        assert cov["covered"] == [] and "gave up" in cov["notes"][0]
        assert len([c for c in calls(p)["calls"] if c["path"] == "/stop_profile"]) == 1
    finally:
        p.stop()
