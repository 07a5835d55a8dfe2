"""fleet's pure parts without a Prometheus: chunk bounds, restart cuts, warm-up, ranking, labels."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vramdoctor.errors import InputError
from vramdoctor.fleet import FleetConfig, FleetSeries, analyse
from vramdoctor.fleet.analysis import segments
from vramdoctor.fleet.collect import FAMILIES, check_matchers, host_of, to_series
from vramdoctor.sources.prometheus import MAX_POINTS_PER_SERIES, RangeSeries, chunk_bounds


def test_chunks_cover_the_range_once_and_stay_under_the_limit() -> None:
    start, end, step = 1000.0, 1000.0 + 7 * 86400, 15.0
    chunks = chunk_bounds(start, end, step, 10_000)
    assert chunks[0][0] == start and chunks[-1][1] == end
    steps = [round((e - s) / step) + 1 for s, e in chunks]
    assert max(steps) <= 10_000 < MAX_POINTS_PER_SERIES
    assert sum(steps) == round((end - start) / step) + 1  # every step exactly once
    assert all(b[0] == a[1] + step for a, b in itertools.pairwise(chunks))


def _series(
    hours: float, f, *, step_s: float = 300.0, host: str = "h", gpu: str = "0", seed: int = 1
) -> FleetSeries:
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, hours * 3600, step_s)
    v = np.array([f(x / 3600.0) for x in t]) + rng.normal(0, 2.0, len(t))
    return FleetSeries(
        host=host, layer="device", unit="MiB", source="dcgm-exporter", t=t, v=v, gpu=gpu
    )


def test_a_restart_is_cut_and_warm_up_skipped_so_refilling_caches_are_not_a_leak() -> None:
    # 2 days: 30 GiB + 4 GiB cache; restart at hour 30 (drops to ~0.5 GiB for 10 min), then the
    # weights reload and the cache refills over 1.5 hours, then flat.
    def level(h: float) -> float:
        if h < 30:
            return 34_000.0
        if h < 30.2:
            return 500.0
        return 30_000.0 + 4000.0 * min(1.0, (h - 30.2) / 1.5)

    s = _series(48, level)
    assert (
        len(segments(s.t, s.v, FleetConfig())) == 2
    )  # cut at the drop; the down time opens the new piece
    (row,) = analyse([s], start=0.0, end=48 * 3600, step_s=300.0, free={("h", "0"): 40_000.0}).rows
    assert row.restarts == 1 and row.warmup_skipped and row.verdict != "LEAK"
    assert row.analysed_from is not None and row.analysed_from >= 30 * 3600 + 7200


def test_rows_rank_leaks_first_soonest_out_of_memory_first() -> None:
    slow = _series(72, lambda h: 30_000 + 20 * h, host="a", seed=2)
    fast = _series(72, lambda h: 30_000 + 80 * h, host="b", seed=3)
    flat = _series(72, lambda h: 30_000.0, host="c", seed=4)
    res = analyse(
        [flat, slow, fast],
        start=0.0,
        end=72 * 3600,
        step_s=300.0,
        free={("a", "0"): 5_000.0, ("b", "0"): 40_000.0, ("c", "0"): 1_000.0},
    )
    assert [r.host for r in res.rows] == ["a", "b", "c"]  # a runs out first despite growing slower
    a, b, c = res.rows
    assert a.growth_per_hour == pytest.approx(20, rel=0.1) and b.growth_per_hour == pytest.approx(
        80, rel=0.1
    )
    assert a.hours_to_oom == pytest.approx(5_000 / a.growth_per_hour)
    assert c.verdict == "STABLE" and c.hours_to_oom is None


def test_labels_map_to_hosts_and_pods_as_each_exporter_writes_them() -> None:
    assert (
        host_of({"Hostname": "n1", "instance": "10.0.0.1:9400"}) == "n1"
    )  # dcgm-exporter releases
    assert host_of({"hostname": "n2", "instance": "10.0.0.2:9400"}) == "n2"  # dcgm-exporter main
    assert host_of({"instance": "gpu-d:9835"}) == "gpu-d"
    dcgm = next(f for f in FAMILIES if f.name == "DCGM_FI_DEV_FB_USED")
    t = np.array([0.0, 60.0])
    rows = [
        RangeSeries(
            {"gpu": "0", "Hostname": "n1", "pod": p, "namespace": "ns"}, t, np.array([1.0, 2.0]) * i
        )
        for i, p in ((1, "a"), (3, "b"))
    ]
    merged = to_series(dcgm, rows, virtual_gpus=False)
    assert len(merged) == 1 and merged[0].v.tolist() == [
        3.0,
        6.0,
    ]  # one GPU: the larger per timestamp
    pods = to_series(dcgm, rows, virtual_gpus=True)
    assert sorted(s.pod for s in pods) == ["ns/a", "ns/b"] and {s.layer for s in pods} == {"pod"}


def test_bad_matchers_are_refused_in_one_line() -> None:
    assert check_matchers(['cluster="prod"', 'node=~"gpu-.*"']) == [
        'cluster="prod"',
        'node=~"gpu-.*"',
    ]
    with pytest.raises(InputError, match="PromQL label matcher"):
        check_matchers(['cluster="prod"} or vector(1) or {a="b"'])
