"""Variant orchestration: one fresh process per variant, its own environment, failures kept
apart, records streamed in order. The worker here is a real separate program speaking the
worker's line protocol (the GPU worker itself is exercised in test_abtest_gpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support.procs import NO_TORCH

from vramdoctor.abtest.runner import run_one, run_variants, variant_env
from vramdoctor.abtest.variants import BY_NAME, VARIANTS, select
from vramdoctor.errors import InputError

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    cfg = json.loads(sys.argv[1])
    v = cfg["variant"]["name"]
    def emit(kind, **d):
        print("@@VD " + json.dumps({"kind": kind, **d}), flush=True)
    print("some free text a library printed", flush=True)
    behaviour = cfg.get("behaviour", {}).get(v, "ok")
    if behaviour == "usage":
        emit("error", message="vramdoctor ab-test needs a CUDA GPU: torch sees none")
        sys.exit(2)
    emit("context", pid=os.getpid(), context_mib=500.0,
         alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    for r in range(cfg["workload"]["rounds"]):
        emit("request", round=r, i=0, latency_ms=1.0, nvml_mib=510.0, torch_reserved_mib=10.0)
        emit("round", round=r, nvml_mib=510.0, torch_reserved_mib=10.0)
    if behaviour == "crash":
        print("Traceback: boom", flush=True)
        os._exit(3)
    if behaviour == "hang":
        time.sleep(60)
    emit("idle", nvml_mib=510.0, torch_reserved_mib=10.0)
    emit("done")
    """
)


@pytest.fixture()
def worker(tmp_path):
    path = tmp_path / "fake_worker.py"
    path.write_text(WORKER)
    return [sys.executable, str(path)]


def _config(rounds: int = 2, **behaviour: str) -> dict:
    return {"workload": {"rounds": rounds}, "behaviour": behaviour}


def test_each_variant_runs_in_its_own_process_with_its_own_env(worker, monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    records: list[dict] = []
    started: list[str] = []
    outcomes = run_variants(
        VARIANTS,
        _config(),
        records.append,
        command=worker,
        on_start=lambda v: started.append(v.name),
    )
    assert [o.status for o in outcomes] == ["ok"] * len(VARIANTS)
    assert started == [v.name for v in VARIANTS]
    contexts = {r["variant"]: r for r in records if r["kind"] == "abtest.context"}
    assert len({c["pid"] for c in contexts.values()}) == len(VARIANTS)
    assert contexts["expandable_segments"]["alloc_conf"] == "expandable_segments:True"
    # the user's own allocator setting must not leak into any variant
    assert all(c["alloc_conf"] is None for n, c in contexts.items() if n != "expandable_segments")
    kinds = [r["kind"] for r in records if r["variant"] == "baseline"]
    assert kinds == [
        "abtest.variant",
        "abtest.context",
        "abtest.request",
        "abtest.round",
        "abtest.request",
        "abtest.round",
        "abtest.idle",
        "abtest.done",
        "abtest.variant",
    ]


def test_a_crash_is_kept_apart_and_the_rest_still_run(worker) -> None:
    records: list[dict] = []
    outcomes = run_variants(
        select(["scoped_pool", "cpu"]), _config(scoped_pool="crash"), records.append, command=worker
    )
    by = {o.variant: o for o in outcomes}
    assert by["scoped_pool"].status == "failed" and by["scoped_pool"].returncode == 3
    assert "boom" in (by["scoped_pool"].message or "")
    assert by["cpu"].status == "ok" and by["baseline"].status == "ok"
    # what the crashed variant measured before dying is kept
    assert (
        sum(1 for r in records if r["variant"] == "scoped_pool" and r["kind"] == "abtest.round")
        == 2
    )


def test_a_usage_error_stops_the_run(worker) -> None:
    records: list[dict] = []
    outcomes = run_variants(VARIANTS, _config(baseline="usage"), records.append, command=worker)
    assert len(outcomes) == 1
    assert outcomes[0].status == "error" and outcomes[0].returncode == 2
    assert "CUDA GPU" in (outcomes[0].message or "")


def test_a_hung_worker_is_killed_at_the_timeout(worker) -> None:
    records: list[dict] = []
    outcome = run_one(
        BY_NAME["cpu"], _config(rounds=1, cpu="hang"), records.append, command=worker, timeout_s=2
    )
    assert outcome.status == "timeout"
    assert records[-1]["status"] == "timeout"


def test_variant_env_sets_offline_and_drops_alloc_conf() -> None:
    env = variant_env(BY_NAME["baseline"], {"PYTORCH_CUDA_ALLOC_CONF": "x", "PATH": "/bin"})
    assert (
        "PYTORCH_CUDA_ALLOC_CONF" not in env
        and env["HF_HUB_OFFLINE"] == "1"
        and env["PATH"] == "/bin"
    )


def test_select_variants() -> None:
    assert [v.name for v in select(["cpu"])] == ["baseline", "cpu", "baseline_again"]
    assert len(select(None)) == len(VARIANTS)
    with pytest.raises(InputError, match="unknown variant"):
        select(["fastest"])


def test_real_worker_without_torch_reports_one_usage_error() -> None:
    config = {
        "variant": BY_NAME["baseline"].to_dict(),
        "workload": {"count": 1, "rounds": 1},
        "model": {
            "requested": "qwen2_vl",
            "model_type": "qwen2_vl",
            "source": "family",
            "path": None,
        },
    }
    code = (
        NO_TORCH + "from vramdoctor.abtest.worker import main\n"
        f"sys.exit(main([{json.dumps(json.dumps(config))}]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@VD ")]
    assert len(lines) == 1
    record = json.loads(lines[0][5:])
    assert record["kind"] == "error" and "pip install 'vramdoctor[gpu]'" in record["message"]
