"""Whose memory it is, and a layer added from outside.

Runs built the way soak records them (tests/soak/test_soak_analysis.synth): another user's
process on the server's GPU (parent pid 1, not in the port owner's tree) that grows; MIG
slices of one GPU from an exporter (dcgm-exporter labels GPU_I_ID/GPU_I_PROFILE) where one
slice leaks and the other swings by thousands of MiB; a toy memory layer registered from this
file, judged and reported like the built-in ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from test_soak_analysis import TOTAL, caching, synth

from vramdoctor.judge import layers
from vramdoctor.judge.layers import LayerContext, worst_layer
from vramdoctor.judge.results import LayerResult
from vramdoctor.judge.series import Series
from vramdoctor.samples import Event, GpuMemory, GpuSample, MetricsSample, ProcessGpuMemory
from vramdoctor.soak.analysis import analyse_soak
from vramdoctor.soak.report import soak_json

N = 50


def _round_of(recs: list[object], t: float) -> float:
    """Rounds completed by `t` plus the share of the round in progress (for a steady leak)."""
    ends = sorted(e.t for e in recs if isinstance(e, Event) and e.name == "round_end")
    return float(sum(1 for e in ends if e <= t))


def _add_tenant(recs: list[object], *, scope: str | None, mib_per_round: float) -> None:
    for r in recs:
        if isinstance(r, GpuSample):
            used = 900.0 + mib_per_round * _round_of(recs, r.t)
            r.processes.append(
                ProcessGpuMemory(
                    777, 0, used, name="python3", scope=scope, uid=1001, username="alice", ppid=1
                )
            )
            r.gpus[0].used_mib += used
            r.gpus[0].free_mib -= used
            if scope is not None:
                r.processes[0].scope = "server"


def test_another_tenants_growing_process_never_decides_nor_is_the_culprit() -> None:
    # The server caches (+140 MiB in round 1); alice's notebook on the same GPU grows 50 MiB
    # a round. Before: named the server's culprit, LEAK.
    recs = synth(caching(140.0), rounds=5)
    _add_tenant(recs, scope="tenant", mib_per_round=50.0)
    res = analyse_soak(recs)
    vram = res.layers["vram"]
    assert vram.verdict == "CACHING" and vram.culprit is None and res.exit_code == 0
    assert vram.tenants == ["gpu0/pid777"]
    tenant = next(s for s in res.series if s.key == "gpu0/pid777")
    assert not tenant.decides and tenant.scope == "tenant" and tenant.verdict == "LEAK"
    device = next(s for s in res.series if s.key == "gpu0")
    assert device.verdict == "CACHING"  # judged with the tenant's memory taken out
    notes = " ".join(soak_json(res)["notes"])
    assert "pid 777" in notes and "another tenant" in notes and "alice" in notes


def test_without_scopes_every_process_is_the_servers_as_before() -> None:
    recs = synth(caching(140.0), rounds=5)
    _add_tenant(recs, scope=None, mib_per_round=50.0)
    vram = analyse_soak(recs).layers["vram"]
    assert vram.verdict == "LEAK" and vram.culprit is not None and vram.culprit.pid == 777


def _mig_run(leak_mib_per_round: float, swing: float, seed: int = 1) -> list[object]:
    """GPU 0 in two MIG slices from an exporter (no processes): GI 1 holds 20 GiB and leaks;
    GI 2 holds 40 GiB and swings by `swing` MiB from sample to sample."""
    rng = np.random.default_rng(seed)
    recs = synth(None, rounds=5, requests_total=lambda t: 0.0)
    t_end = [e.t for e in recs if isinstance(e, Event)]
    times = np.arange(min(t_end), max(t_end) + 0.5, 0.5)
    for t in times:
        k = _round_of(recs, float(t))
        a = 20_480.0 + leak_mib_per_round * k
        b = 40_960.0 + float(rng.uniform(-swing, swing))
        recs.append(
            GpuSample(
                t=float(t),
                wall=float(t),
                source="dcgm",
                gpus=[
                    GpuMemory(
                        0, 40_000.0, a, 40_000.0 - a, gpu_instance_id=1, mig_profile="3g.40gb"
                    ),
                    GpuMemory(
                        0, 80_000.0, b, 80_000.0 - b, gpu_instance_id=2, mig_profile="4g.80gb"
                    ),
                ],
            )
        )
    return recs


def test_mig_slices_are_judged_apart_and_the_culprit_names_the_slice() -> None:
    # Before: one series keyed by the GPU index; noise of thousands of MiB; STABLE, exit 0.
    res = analyse_soak(_mig_run(leak_mib_per_round=1.0 * N, swing=2000.0))
    vram = res.layers["vram"]
    assert vram.verdict == "LEAK" and res.exit_code == 1
    assert vram.culprit is not None and vram.culprit.series == "gpu0-gi1"
    assert vram.culprit.gpu == 0 and vram.culprit.gpu_instance == 1
    assert vram.culprit.device is not None and "GI 1" in vram.culprit.device
    assert vram.rate_per_request == pytest.approx(1.0, rel=0.02)
    other = next(s for s in res.series if s.key == "gpu0-gi2")
    assert other.verdict != "LEAK"
    assert "GI 1" in soak_json(res)["layers"]["vram"]["summary"]


def test_a_device_total_without_processes_says_it_cannot_take_tenants_out() -> None:
    res = analyse_soak(synth(caching(140.0), device_only=True))
    assert "tenants_in_device_total" in res.layers["vram"].caveats


class ToyLayer:
    """A memory layer from outside: a gauge the server exports as `toy_mib`."""

    name = "toy"
    unit = "MiB"

    def extract(self, records: Sequence[Any]) -> dict[str, Series]:
        s = Series("toy/pool", "toy", "toy", "MiB")
        s.points = [
            (r.t, float(r.values["toy_mib"]))
            for r in records
            if isinstance(r, MetricsSample) and "toy_mib" in r.values
        ]
        return {s.key: s} if s.points else {}

    def judge(self, ctx: LayerContext) -> LayerResult:
        return worst_layer(
            self.name, self.unit, [s for s in ctx.series if s.layer == "toy"], ctx.life
        )


@pytest.fixture
def toy() -> Any:
    layers.register(ToyLayer())
    yield
    layers.unregister("toy")


def test_a_layer_registered_from_outside_is_judged_and_reported(toy: Any) -> None:
    recs = synth(caching(140.0), requests_total=lambda t: 0.0)
    for r in recs:
        if isinstance(r, MetricsSample):
            r.values["toy_mib"] = 10.0 + 0.4 * N * _round_of(recs, r.t)
    res = analyse_soak(recs)
    assert list(res.layers) == ["vram", "kv", "host", "toy"]
    toy_layer = res.layers["toy"]
    assert toy_layer.verdict == "LEAK" and toy_layer.rate_per_request == pytest.approx(0.4)
    assert res.verdict == "LEAK" and res.layers["vram"].verdict == "CACHING"
    d = soak_json(res)
    assert d["layers"]["toy"]["verdict"] == "LEAK" and "toy" in d["layers"]["toy"]["summary"]


def test_the_registry_refuses_duplicates_and_non_layers(toy: Any) -> None:
    with pytest.raises(ValueError):
        layers.register(ToyLayer())
    with pytest.raises(ValueError):
        layers.register(object())  # type: ignore[arg-type]
    assert layers.get("toy").name == "toy" and "toy" in layers.names()
    with pytest.raises(KeyError):
        layers.get("nope")


def test_without_a_toy_gauge_the_toy_layer_is_not_measured(toy: Any) -> None:
    res = analyse_soak(synth(caching(140.0)))
    assert res.layers["toy"].verdict == "NOT_MEASURED" and res.verdict == "CACHING"
    assert TOTAL > 0
