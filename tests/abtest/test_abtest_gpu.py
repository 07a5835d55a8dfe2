"""The ab-test worker and IPC arm on a real GPU (small workload)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from vramdoctor.abtest.analysis import analyse  # noqa: E402
from vramdoctor.abtest.gpumem import census  # noqa: E402
from vramdoctor.abtest.ipc_arm import run_ipc_arm  # noqa: E402


def test_ipc_arm_reads_back_correct_data() -> None:
    records: list[dict] = []
    run_ipc_arm(torch.cuda.device_count(), census, records.append)
    result = analyse(records)
    assert result["ipc"], records
    for arm in result["ipc"]:
        assert arm["error"] is None and arm["all_correct"], arm
    modes = {a["mode"]: a for a in result["ipc"]}
    if "redirect" in modes:
        assert modes["redirect"]["extra_on_producer_gpu_per_consumer_mib"] < 50
        assert modes["no-redirect"]["extra_on_producer_gpu_per_consumer_mib"] > 200


def test_cli_scoped_pool_at_context_escape_grows_guard_bounded(tmp_path) -> None:
    """One real `vramdoctor ab-test` run (small workload) checked end to end through --json."""
    out = tmp_path / "run.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "ab-test",
            "--model",
            "Qwen/Qwen2-VL-2B-Instruct",
            "--count",
            "12",
            "--rounds",
            "3",
            "--max-side",
            "1536",
            "--idle",
            "0.5",
            "--variants",
            "scoped_pool,escaped_unguarded,escaped_guarded",
            "--no-ipc",
            "--json",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    by = {v["variant"]: v for v in data["variants"]}
    assert list(by) == [
        "baseline",
        "scoped_pool",
        "escaped_unguarded",
        "escaped_guarded",
        "baseline_again",
    ]
    assert all(v["status"] == "ok" for v in by.values()), [v["message"] for v in by.values()]
    assert by["scoped_pool"]["max_above_context_after_request_mib"] <= 8.0
    assert by["escaped_unguarded"]["verdict"] == "grows"
    assert (
        by["escaped_guarded"]["verdict"] == "bounded" and by["escaped_guarded"]["escaped_mib"] > 1
    )
    assert (
        by["escaped_guarded"]["held_after_idle_mib"]
        < by["escaped_unguarded"]["held_after_idle_mib"] / 4
    )
    assert out.exists()
