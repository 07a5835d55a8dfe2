"""Analysis of recorded ab-test results: a real run recorded on an H200 (tests/fixtures/abtest)
and hand-made record series for the growth verdict."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from vramdoctor.abtest.analysis import GROWTH_TOLERANCE_MIB, analyse, grows, growth_per_round
from vramdoctor.record import read_run

RUN = Path(__file__).parents[1] / "fixtures" / "abtest" / "h200-qwen2_5_vl.jsonl"


@pytest.fixture(scope="module")
def recorded():
    run = read_run(RUN)
    records = [r for r in run.records if isinstance(r, dict)]
    return run, records, analyse(records)


def test_recorded_run_is_complete_and_has_every_variant(recorded) -> None:
    run, _, result = recorded
    assert run.command == "ab-test" and run.status == "complete"
    names = [v["variant"] for v in result["variants"]]
    assert names == [
        "baseline",
        "scoped_pool",
        "empty_cache",
        "expandable_segments",
        "cpu",
        "escaped_unguarded",
        "escaped_guarded",
    ]
    assert all(v["status"] == "ok" for v in result["variants"])


def test_latency_and_levels_are_computed_from_the_records(recorded) -> None:
    _, records, result = recorded
    for v in result["variants"]:
        lat = [
            r["latency_ms"]
            for r in records
            if r["kind"] == "abtest.request" and r["variant"] == v["variant"]
        ]
        assert v["requests"] == len(lat) > 0
        assert v["p50_ms"] == pytest.approx(statistics.median(lat))
        ctx = next(
            r for r in records if r["kind"] == "abtest.context" and r["variant"] == v["variant"]
        )
        rounds = [
            r for r in records if r["kind"] == "abtest.round" and r["variant"] == v["variant"]
        ]
        assert [row["nvml_above_context_mib"] for row in v["rounds"]] == [
            pytest.approx(r["nvml_mib"] - ctx["context_mib"]) for r in rounds
        ]
    base = result["variants"][0]
    for v in result["variants"]:
        assert v["overhead_pct"] == pytest.approx((v["p50_ms"] / base["p50_ms"] - 1) * 100)


def test_recorded_escape_cases(recorded) -> None:
    _, _, result = recorded
    by = {v["variant"]: v for v in result["variants"]}
    unguarded, guarded = by["escaped_unguarded"], by["escaped_guarded"]
    assert unguarded["verdict"] == "grows" and unguarded["growth_per_round_mib"] > 100
    assert guarded["verdict"] == "bounded" and guarded["escaped_mib"] > 0
    assert unguarded["escaped_mib"] == 0  # nothing watches the unguarded pool: it cannot count
    assert guarded["held_after_idle_mib"] < unguarded["held_after_idle_mib"] / 10
    assert result["targets"]["escape_detected_with_bytes"] and result["targets"]["guard_bounded"]


def test_recorded_recommendation_is_a_bounded_mitigation(recorded) -> None:
    _, _, result = recorded
    rec = result["recommendation"]
    by = {v["variant"]: v for v in result["variants"]}
    assert rec["variant"] in by and by[rec["variant"]]["mitigation"]
    assert by[rec["variant"]]["verdict"] == "bounded"
    assert rec["variant"] not in ("baseline", "escaped_unguarded", "escaped_guarded")


def test_recorded_ipc_arm(recorded) -> None:
    _, records, result = recorded
    arms = {a["mode"]: a for a in result["ipc"]}
    assert set(arms) == {"no-redirect", "redirect"}
    for arm in arms.values():
        assert arm["all_correct"] and arm["error"] is None
    # cross-check one figure against the raw census
    raw = next(r for r in records if r["kind"] == "abtest.ipc" and r["mode"] == "no-redirect")
    consumer = raw["consumers"][0]
    on_producer = sum(
        p["used_mib"]
        for p in raw["census_opened"]["processes"]
        if p["pid"] == consumer["pid"] and p["gpu"] == raw["producer_gpu"]
    )
    assert arms["no-redirect"]["extra_on_producer_gpu_per_consumer_mib"] == pytest.approx(
        on_producer
    )
    assert arms["no-redirect"]["extra_on_producer_gpu_per_consumer_mib"] > 300
    assert arms["redirect"]["extra_on_producer_gpu_per_consumer_mib"] == 0
    assert all(c["redirect_applied"] for c in arms["redirect"]["consumers"])
    # the census covers every GPU; only the no-redirect consumer shows up on the producer's GPU
    for mode, arm in arms.items():
        gpu0 = next(g for g in arm["census"] if g["gpu"] == arm["producer_gpu"])
        roles = sorted(p["role"] for p in gpu0["processes"])
        assert roles == (["consumer", "producer"] if mode == "no-redirect" else ["producer"])
        assert len(arm["census"]) == len(raw["census_opened"]["gpus"])


def _records(
    name: str, levels: list[float], context: float = 600.0, latency: float = 4.0, **start
) -> list[dict]:
    recs = [
        {
            "kind": "abtest.variant",
            "variant": name,
            "event": "start",
            "title": name,
            "config": {"mitigation": start.get("mitigation", True)},
        },
        {"kind": "abtest.context", "variant": name, "context_mib": context},
    ]
    for r, level in enumerate(levels):
        for i in range(5):
            recs.append(
                {
                    "kind": "abtest.request",
                    "variant": name,
                    "round": r,
                    "i": i,
                    "latency_ms": latency + i * 0.1,
                    "nvml_mib": context + level,
                    "torch_reserved_mib": level,
                }
            )
        recs.append(
            {
                "kind": "abtest.round",
                "variant": name,
                "round": r,
                "nvml_mib": context + level,
                "torch_reserved_mib": level,
            }
        )
    recs.append(
        {
            "kind": "abtest.idle",
            "variant": name,
            "nvml_mib": context + levels[-1],
            "torch_reserved_mib": levels[-1],
        }
    )
    recs.append({"kind": "abtest.variant", "variant": name, "event": "end", "status": "ok"})
    return recs


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        ([140, 226, 226, 226], False),  # caching: rises once, then flat (gpu-probe.md)
        ([678, 1352, 2026, 2700], True),  # leak: a new high every round
        ([176, 118, 158, 144], False),  # noise around a level
        ([0, 0, 0, 0], False),
        ([100, 150, 200, 205], False),  # slowing: last round is no real new high
        ([100, 120, 140, 160, 180], True),  # slow but steady leak
    ],
)
def test_grows(levels: list[float], expected: bool) -> None:
    assert grows(levels) is expected


def test_growth_per_round_skips_the_warm_up_round() -> None:
    assert growth_per_round([500, 10, 10, 10]) == 0
    assert growth_per_round([5]) is None
    assert growth_per_round([5, 25]) == 20


def test_recommendation_prefers_cheap_bounded_mitigation() -> None:
    recs = (
        _records("baseline", [140, 226, 226, 226], mitigation=False)
        + _records("scoped_pool", [0, 0, 0, 0], latency=4.1)
        + _records("cpu", [-600, -600, -600, -600], latency=12.0)
        + _records("escaped_unguarded", [678, 1352, 2026, 2700], mitigation=False)
    )
    result = analyse(recs)
    assert result["recommendation"]["variant"] == "scoped_pool"
    assert {v["variant"]: v["verdict"] for v in result["variants"]} == {
        "baseline": "bounded",
        "scoped_pool": "bounded",
        "cpu": "bounded",
        "escaped_unguarded": "grows",
    }
    assert result["targets"]["scoped_pool_within_8mib_of_context"]
    pool = result["variants"][1]
    assert pool["overhead_pct"] == pytest.approx((4.3 / 4.2 - 1) * 100)
    assert result["targets"]["scoped_pool_overhead_within_5pct"]


def test_baseline_again_measures_drift_and_widens_the_cheap_limit() -> None:
    recs = (
        _records("baseline", [140, 226, 226, 226], mitigation=False, latency=4.0)
        + _records("scoped_pool", [0, 0, 0, 0], latency=4.8)
        + _records("expandable_segments", [60, 80, 82, 82], latency=4.0)
        + _records("baseline_again", [140, 226, 226, 226], mitigation=False, latency=4.9)
    )
    result = analyse(recs)
    assert result["latency_noise_pct"] == pytest.approx((5.1 / 4.2 - 1) * 100)
    # +19% for the pool is inside this run's 21% drift: it holds 0 MiB, so it wins
    assert result["recommendation"]["variant"] == "scoped_pool"
    assert result["variants"][-1]["variant"] == "baseline_again"
    without = analyse([r for r in recs if r["variant"] != "baseline_again"])
    assert without["latency_noise_pct"] is None
    assert without["recommendation"]["variant"] == "expandable_segments"


def test_failed_variant_is_a_problem_and_never_recommended() -> None:
    recs = [
        *_records("baseline", [10, 10, 10], mitigation=False),
        {
            "kind": "abtest.variant",
            "variant": "scoped_pool",
            "event": "start",
            "title": "t",
            "config": {},
        },
        {
            "kind": "abtest.variant",
            "variant": "scoped_pool",
            "event": "end",
            "status": "failed",
            "message": "worker exited with code 3",
        },
    ]
    result = analyse(recs)
    pool = result["variants"][1]
    assert pool["status"] == "failed" and pool["verdict"] == "n/a"
    assert result["problem"] and result["recommendation"]["variant"] is None
    assert json.dumps(result)  # JSON-serialisable as --json prints it


def test_tolerance_is_documented_in_mib() -> None:
    assert GROWTH_TOLERANCE_MIB == 8.0


def test_single_gpu_ipc_arm_says_it_needs_two_and_checks_the_round_trip() -> None:
    census = {
        "processes": [
            {"pid": 11, "gpu": 0, "used_mib": 530.0},
            {"pid": 12, "gpu": 0, "used_mib": 650.0},
        ]
    }
    recs = [
        {
            "kind": "abtest.ipc",
            "mode": "same-gpu",
            "skipped_cross_gpu": True,
            "note": "the IPC redirect arm needs two GPUs; checked the single-GPU round trip only",
        },
        {
            "kind": "abtest.ipc",
            "mode": "same-gpu",
            "redirect": True,
            "producer_gpu": 0,
            "consumer_gpus": [0],
            "producer": {"pid": 11, "pool_bytes": 128 << 20, "oversize_went_cpu": True},
            "consumers": [
                {
                    "pid": 12,
                    "gpu": 0,
                    "peer_access": True,
                    "redirect_applied": False,
                    "slice_correct": True,
                    "tensor_correct": True,
                }
            ],
            "census_before": census,
            "census_opened": census,
        },
    ]
    result = analyse(recs)
    assert result["ipc_notes"] == [recs[0]["note"]]
    (arm,) = result["ipc"]
    assert arm["mode"] == "same-gpu" and arm["all_correct"] and arm["pool_mib"] == 128
    assert arm["extra_on_producer_gpu_per_consumer_mib"] is None  # no other GPU to measure
    assert arm["consumers"][0]["on_own_gpu_mib"] == 650.0


def test_wrong_data_is_reported() -> None:
    recs = [
        {
            "kind": "abtest.ipc",
            "mode": "redirect",
            "producer_gpu": 0,
            "producer": {},
            "consumers": [{"pid": 5, "gpu": 1, "slice_correct": True, "tensor_correct": False}],
            "census_opened": {"processes": []},
        }
    ]
    (arm,) = analyse(recs)["ipc"]
    assert not arm["all_correct"] and arm["extra_on_producer_gpu_per_consumer_mib"] == 0


def test_without_nvml_attribution_falls_back_to_pytorch_reserved(tmp_path) -> None:
    from vramdoctor.abtest.report import write_chart

    recs = _records("baseline", [140, 226, 226, 226], mitigation=False)
    for r in recs:
        if "nvml_mib" in r:
            r["nvml_mib"] = None  # NVML listed no process with our PID
        if r["kind"] == "abtest.context":
            r["context_mib"] = None
    result = analyse(recs)
    (v,) = result["variants"]
    assert v["memory_basis"] == "pytorch-reserved"
    assert [row["nvml_above_context_mib"] for row in v["rounds"]] == [None] * 4
    assert v["held_after_idle_mib"] == 226 and v["max_above_context_after_request_mib"] == 226
    assert v["verdict"] == "bounded"
    png = write_chart(
        result, {"baseline": [r for r in recs if r["kind"] == "abtest.request"]}, tmp_path / "c.png"
    )
    assert png.read_bytes()[:4] == b"\x89PNG"
