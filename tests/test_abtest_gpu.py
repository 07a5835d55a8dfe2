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
from vramdoctor.abtest.models import resolve_model  # noqa: E402
from vramdoctor.abtest.runner import run_variants  # noqa: E402
from vramdoctor.abtest.variants import select  # noqa: E402
from vramdoctor.abtest.workload import WorkloadSpec  # noqa: E402


def test_scoped_pool_variant_stays_at_context_and_escape_grows() -> None:
    choice = resolve_model("Qwen/Qwen2-VL-2B-Instruct")
    config = {
        "model": {"requested": choice.requested, "model_type": choice.model_type, "source": choice.source, "path": None},
        "workload": WorkloadSpec(count=12, rounds=3, max_side=1536).to_dict(),
        "gpu": 0,
        "idle_s": 0.5,
    }
    records: list[dict] = []
    outcomes = run_variants(select(["scoped_pool", "escaped_unguarded", "escaped_guarded"]), config, records.append)
    assert [o.status for o in outcomes] == ["ok"] * 4, [o.message for o in outcomes]
    result = analyse(records)
    by = {v["variant"]: v for v in result["variants"]}
    assert by["scoped_pool"]["max_above_context_after_request_mib"] <= 8.0
    assert by["escaped_unguarded"]["verdict"] == "grows"
    assert by["escaped_guarded"]["verdict"] == "bounded"
    assert by["escaped_guarded"]["escaped_mib"] > 0


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


def test_cli_no_ipc_json_exit_code(tmp_path) -> None:
    out = tmp_path / "run.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "ab-test", "--model", "qwen2_vl", "--count", "6", "--rounds", "2",
         "--variants", "scoped_pool", "--no-ipc", "--idle", "0.2", "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    assert [v["variant"] for v in data["variants"]] == ["baseline", "scoped_pool"]
    assert out.exists()
