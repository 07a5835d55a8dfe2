"""The IPC arm with N consumers on real GPUs: a producer on GPU 0 and one consumer on each other
visible GPU, without and with the redirect, NVML census while every consumer holds the memory.

Run on the GPU machine: `python3 -m pytest -m gpu tests/abtest/test_abtest_ipc_gpu.py -v`.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs 2 or more CUDA GPUs", allow_module_level=True)

from vramdoctor.abtest.analysis import analyse  # noqa: E402
from vramdoctor.abtest.gpumem import census  # noqa: E402
from vramdoctor.abtest.ipc_arm import run_ipc_arm, run_ipc_subprocess  # noqa: E402
from vramdoctor.sources.nvml import NvmlSource  # noqa: E402

N = torch.cuda.device_count()


def _check_arms(records: list[dict], n: int) -> dict[str, dict]:
    arms = {a["mode"]: a for a in analyse(records)["ipc"]}
    assert set(arms) == {"no-redirect", "redirect"}, records
    for mode, arm in arms.items():
        assert arm["error"] is None, arm["error"]
        assert [c["gpu"] for c in arm["consumers"]] == list(range(1, n))
        assert arm["all_correct"], arm["consumers"]
        assert all(c["held_during_census"] for c in arm["consumers"])
        # every consumer was in the census on its own GPU, with at least a CUDA context
        assert all(c["on_own_gpu_mib"] and c["on_own_gpu_mib"] > 100 for c in arm["consumers"]), (
            mode
        )
    none, redirect = arms["no-redirect"], arms["redirect"]
    context = none["consumer_context_mib"]
    assert context and context > 100
    # without the redirect: a CUDA context per consumer on the producer's GPU
    assert all(c["on_producer_gpu_mib"] >= 0.8 * context for c in none["consumers"]), none[
        "consumers"
    ]
    assert none["extra_on_producer_gpu_contexts"] >= 0.8 * (n - 1)
    # with it: nothing, wherever peer access let it apply
    peers = [c for c in redirect["consumers"] if c["peer_access"]]
    assert all(c["redirect_applied"] and c["on_producer_gpu_mib"] == 0 for c in peers), redirect[
        "consumers"
    ]
    if len(peers) == n - 1:
        assert redirect["extra_on_producer_gpu_total_mib"] == 0
    return arms


def test_ipc_arm_with_every_visible_gpu() -> None:
    records: list[dict] = []
    run_ipc_arm(N, census, records.append)
    _check_arms(records, N)


def test_ipc_arm_process_over_the_line_protocol_capped_at_two_gpus() -> None:
    """`python -m vramdoctor.abtest.ipc_arm NVML_COUNT --max-gpus 2`, as `ab-test --ipc-gpus 2` runs it."""
    with NvmlSource() as source:
        nvml_count = len(source.devices())
    records: list[dict] = []
    assert run_ipc_subprocess(nvml_count, records.append, max_gpus=2) == 0, records
    arms = _check_arms(records, 2)
    assert {a["gpu_count"] for a in arms.values()} == {2}
