"""fleet's pure parts without a database: chunking, URLs and credentials, lives, the change
point, ranking, the labels of each exporter, matchers. Each test is one fault kind."""

from __future__ import annotations

import base64
import itertools

import numpy as np
import pytest

from vramdoctor.errors import InputError
from vramdoctor.fleet import FleetConfig, FleetSeries, analyse
from vramdoctor.fleet.analysis import Screen, lives
from vramdoctor.fleet.families import family, gpu_of, host_of, mig_of, slot_of, uuid_of
from vramdoctor.fleet.promql import check_matchers, rules
from vramdoctor.fleet.report import compact_duration, format_value
from vramdoctor.redact import redact_text
from vramdoctor.sources.prometheus import MAX_POINTS_PER_SERIES, PrometheusClient, chunk_bounds
from vramdoctor.stats.changepoint import fit_hinge, growth_since

H = 3600.0


def test_chunks_cover_the_range_once_and_stay_under_the_limit() -> None:
    start, end, step = 1000.0, 1000.0 + 7 * 86400, 15.0
    chunks = chunk_bounds(start, end, step, 10_000)
    assert chunks[0][0] == start and chunks[-1][1] == end
    steps = [round((e - s) / step) + 1 for s, e in chunks]
    assert max(steps) <= 10_000 < MAX_POINTS_PER_SERIES
    assert sum(steps) == round((end - start) / step) + 1  # every step exactly once
    assert all(b[0] == a[1] + step for a, b in itertools.pairwise(chunks))


@pytest.mark.parametrize(
    ("start", "end", "step"),
    [
        (0.0, 7 * 86400.0, 1e-300),
        (0.0, 1e300, 15.0),
        (0.0, 86400.0, 0.0),
        (0.0, float("inf"), 1.0),
        (5.0, 1.0, 1.0),
    ],
)
def test_no_range_makes_the_chunking_loop_stall(start: float, end: float, step: float) -> None:
    with pytest.raises(InputError):
        chunk_bounds(start, end, step, 10_000)


def test_api_paths_join_the_urls_path_and_credentials_are_registered() -> None:
    c = PrometheusClient(
        "https://ops:s3cret-pw@mimir.example:8080/prometheus/?org=a&access_token=T0k3nValue"
    )
    ep = c._endpoint
    assert (
        ep.url("/api/v1/query")
        == "https://mimir.example:8080/prometheus/api/v1/query?org=a&access_token=T0k3nValue"
    )
    assert ep.auth == ("ops", "s3cret-pw")
    assert "s3cret-pw" not in c.shown_url and "T0k3nValue" not in c.shown_url
    b64 = base64.b64encode(b"ops:s3cret-pw").decode()
    said = redact_text(
        f"proxy: denied Authorization: Basic {b64} for ops:s3cret-pw token=T0k3nValue"
    )
    assert b64 not in said and "s3cret-pw" not in said and "T0k3nValue" not in said
    assert (
        PrometheusClient("prom:9090")._endpoint.url("/api/v1/query")
        == "http://prom:9090/api/v1/query"
    )
    assert (
        PrometheusClient("http://prom:9090/graph")._endpoint.url("/api/v1/query")
        == "http://prom:9090/api/v1/query"
    )
    for bad in ("", "ftp://x", "http://:9090", "http://host:notaport"):
        with pytest.raises(InputError):
            PrometheusClient(bad)


def _series(
    hours: float,
    f,
    *,
    layer: str = "device",
    host: str = "h",
    gpu: str = "0",
    seed: int = 1,
    noise: float = 2.0,
) -> FleetSeries:
    rng = np.random.default_rng(seed)
    t = np.arange(1.0, hours + 1) * H
    v = np.array([f(x / H) for x in t]) + rng.normal(0, noise, len(t))
    return FleetSeries(
        host=host, layer=layer, unit="MiB", source="dcgm-exporter", t=t, v=v, gpu=gpu
    )


def test_a_gap_is_a_gap_and_a_release_is_a_drop_within_a_life() -> None:
    cfg = FleetConfig()
    s = _series(72, lambda h: 30_000 + (1500 if h % 5 < 3 else 0))  # a cache given back every 5 h
    keep = ~((s.t > 20 * H) & (s.t < 26 * H))  # six hours with no samples at all
    s.t, s.v = s.t[keep], s.v[keep]
    assert len(lives(s, s.t, s.v, cfg)) == 1
    (row,) = analyse([s], start=0.0, end=72 * H, step_s=300.0, config=cfg).rows
    assert row.restarts == 0 and row.gaps and row.verdict != "LEAK"


def test_an_emptied_gpu_ends_a_life_but_only_device_memory_empties() -> None:
    cfg = FleetConfig()

    def level(h: float) -> float:
        return 300.0 if 30 <= h < 31 else (40_000.0 + (50 * (h - 31) if h >= 31 else 100 * h))

    s = _series(72, level)
    ls = lives(s, s.t, s.v, cfg)
    assert [x.began for x in ls] == ["range start", "emptied"]
    (row,) = analyse([s], start=0.0, end=72 * H, step_s=300.0, config=cfg).rows
    assert row.restarts == 1 and row.warmup_skipped and row.verdict == "LEAK"
    assert row.growth_per_hour_ci[0] <= 50 <= row.growth_per_hour_ci[1]  # the current life's rate
    kv = FleetSeries(
        host="h", layer="kv", unit="tokens", source="SGLang", t=s.t, v=np.where(s.v < 1000, 0, 64.0)
    )
    assert len(lives(kv, kv.t, kv.v, cfg)) == 1  # an empty KV pool at idle is health, not a restart


@pytest.mark.parametrize("before", ["leak", "cache"])
def test_a_restart_hides_a_leak_but_does_not_fix_it(before: str) -> None:
    # a GPU leaking 40 MiB/h for six days, emptied by a restart 5 hours before the end: the new
    # life is too young to judge, so its last whole life decides (benchmarks/fleet_scale.py's
    # 10k case missed such a GPU as "warming up"); a cache that filled before is no such thing
    cfg = FleetConfig()
    end_h = 150.0

    def level(h: float) -> float:
        if 145 <= h < 145.2:
            return 300.0
        if h >= 145.2:
            return 40_000.0 + 100 * (h - 145.2)
        return 40_000.0 + (40 * h if before == "leak" else 2_000 * min(h / 10, 1.0))

    s = _series(end_h, level)
    (row,) = analyse([s], start=0.0, end=end_h * H, step_s=300.0, config=cfg).rows
    assert row.restarts == 1
    if before == "cache":
        assert row.verdict == "INCONCLUSIVE" and row.reason == "warming_up", row.why
        return
    assert row.verdict == "LEAK" and row.reason == "grew_last_life", row.why
    assert row.growth_per_hour_ci[0] <= 40 <= row.growth_per_hour_ci[1]  # the last life's rate
    assert row.analysed_to is not None and row.analysed_to < 145 * H  # judged on that life only
    assert "life before" in row.why and "warm-up" in row.why
    (with_free,) = analyse(
        [s], start=0.0, end=end_h * H, step_s=300.0, config=cfg, free={("h", "0", ""): 20_000.0}
    ).rows
    assert with_free.hours_to_oom is not None and "assumes this life grows" in with_free.why


def test_a_late_leak_is_a_change_point_and_its_interval_covers_the_truth() -> None:
    # 40 histories of one late leak (flat for 5 days, then 191 MiB/h; busy hours raise some
    # floors): the change point is found every time, and the 95 % interval of the rate from
    # after it covers the truth about 95 % of the time (the whole-range slope never would)
    truth, start_h, covered = 191.0, 120.0, 0
    for seed in range(40):
        s = _series(168, lambda h: 30_000 + truth * max(0.0, h - start_h), seed=seed, noise=4.0)
        rng = np.random.default_rng(seed + 50)
        s.v = s.v + (rng.random(len(s.v)) < 0.05) * rng.random(len(s.v)) * 600
        (row,) = analyse(
            [s], start=0.0, end=168 * H, step_s=300.0, free={("h", "0", ""): 40_000.0}
        ).rows
        assert row.verdict == "LEAK" and row.reason == "grew_since_change", seed
        assert abs(row.growing_since - start_h * H) <= 2 * H, seed
        assert row.growth_per_hour == pytest.approx(truth, rel=0.02), seed
        lo, hi = row.growth_per_hour_ci
        covered += lo <= truth <= hi
        assert row.hours_to_oom == pytest.approx(40_000.0 / row.growth_per_hour)
    assert covered >= 34  # 95 % nominal; 34 of 40 or more happens with probability > 0.99
    whole = growth_since(s.t, s.v, 0.0)
    assert whole.hi * H < truth  # what the old whole-range slope said: under-rated


@pytest.mark.parametrize("seed", range(8))
def test_a_steady_slow_leak_is_steady_not_faster_in_the_second_half(seed: int) -> None:
    s = _series(168, lambda h: 30_000 + 8.0 * h, seed=seed, noise=3.0)
    (row,) = analyse([s], start=0.0, end=168 * H, step_s=300.0).rows
    assert row.verdict == "LEAK" and row.reason == "grew_with_time" and row.growing_since is None
    assert row.growth_per_hour_ci[0] <= 8.0 <= row.growth_per_hour_ci[1]


def test_hinge_finds_no_change_in_a_straight_line_and_one_in_a_bend() -> None:
    x = np.arange(168) * H
    rng = np.random.default_rng(3)
    line = fit_hinge(x, 5.0 + x / H + rng.normal(0, 2, 168))
    assert line is not None and not line.chosen
    bend = fit_hinge(x, 5.0 + np.maximum(0, x - 100 * H) / H * 20 + rng.normal(0, 2, 168))
    assert bend is not None and bend.chosen and bend.accelerated and abs(bend.tau - 100 * H) < 3 * H
    assert growth_since(x, x / H * 3.0, 0.0).slope * H == pytest.approx(3.0)


def test_caching_rows_show_their_rise_and_the_level_they_settled_at() -> None:
    s = _series(144, lambda h: 30_000 + (1536 if h >= 48 else 0) + (1024 if h >= 84 else 0))
    (row,) = analyse([s], start=0.0, end=144 * H, step_s=300.0).rows
    assert row.verdict == "CACHING" and row.rise == pytest.approx(2560, rel=0.05)
    assert row.settled_level == pytest.approx(32_560, abs=20)
    assert f"+{row.rise:,.0f} MiB" in row.why and f"{row.settled_level:,.0f} MiB" in row.why


def test_rows_rank_live_leaks_first_soonest_out_of_memory_first() -> None:
    slow = _series(72, lambda h: 30_000 + 20 * h, host="a", seed=2)
    fast = _series(72, lambda h: 30_000 + 80 * h, host="b", seed=3)
    flat = _series(72, lambda h: 30_000.0, host="c", seed=4)
    gone = _series(72, lambda h: 30_000 + 300 * h, host="d", seed=5)
    gone.last_seen = 70 * H  # stopped reporting two hours before the end
    res = analyse(
        [flat, slow, fast, gone],
        start=0.0,
        end=72 * H,
        step_s=300.0,
        free={
            ("a", "0", ""): 5_000.0,
            ("b", "0", ""): 40_000.0,
            ("c", "0", ""): 1_000.0,
            ("d", "0", ""): 100.0,
        },
    )
    assert [r.host for r in res.rows] == ["a", "b", "d", "c"]
    a, b, d, c = res.rows
    assert a.hours_to_oom == pytest.approx(5_000 / a.growth_per_hour)
    assert b.growth_per_hour == pytest.approx(80, rel=0.05) and b.hours_to_oom > a.hours_to_oom
    assert d.verdict == "LEAK" and d.stale and d.hours_to_oom is None and not d.live_leak
    assert [r.host for r in res.leaks] == ["a", "b"] and c.verdict == "STABLE"


def test_impossible_readings_are_unknown_never_a_level() -> None:
    s = _series(72, lambda h: 30_000 + 50 * h)
    s.v[10:14] = -1.0
    s.v[20] = np.nan
    (row,) = analyse([s], start=0.0, end=72 * H, step_s=300.0, free={}, free_notes={}).rows
    assert row.unknown_points == 5 and row.verdict == "LEAK"
    (neg,) = analyse([s], start=0.0, end=72 * H, step_s=300.0, free={("h", "0", ""): -5.0}).rows
    assert neg.hours_to_oom is None and "impossible" in neg.free_note


def test_a_screened_series_is_stable_on_the_databases_figures() -> None:
    s = FleetSeries(
        host="h",
        layer="device",
        unit="MiB",
        source="dcgm-exporter",
        t=np.empty(0),
        v=np.empty(0),
        gpu="1",
    )
    s.screen = Screen(sd=1.5, late_slope=0.2 / H, level=30_000.0, at_start=True, late_s=86400.0)
    (row,) = analyse([s], start=0.0, end=7 * 86400, step_s=300.0).rows
    assert row.verdict == "STABLE" and row.screened and row.reason == "screened_flat"
    assert "1.5 MiB" in row.why and row.growth_per_hour == pytest.approx(0.2)


def test_labels_map_to_hosts_gpus_slices_and_slots_as_each_exporter_writes_them() -> None:
    assert host_of({"Hostname": "n1", "instance": "10.0.0.1:9400"}) == "n1"  # dcgm <= 4.8.2
    assert host_of({"hostname": "n2", "instance": "10.0.0.2:9400"}) == "n2"  # dcgm >= 4.8.3
    assert host_of({"instance": "10.0.0.9:30000"}, {"10.0.0.9": "gpu-9"}) == "gpu-9"  # a KV row
    assert host_of({"instance": "[::1]:9090"}) == "[::1]"
    assert gpu_of({"index": "0:1"}) == "0" and mig_of({"index": "0:1"}) == "1"  # nvitop MIG
    assert mig_of({"gpu": "0", "GPU_I_ID": "3"}) == "3"
    assert uuid_of({"UUID": "GPU-ABC"}) == uuid_of({"uuid": "abc"}) == "abc"  # nvidia_gpu_exporter
    dcgm = family("DCGM_FI_DEV_FB_USED")
    a = {"gpu": "0", "Hostname": "n", "GPU_I_ID": "1"}
    b = {"gpu": "0", "Hostname": "n", "GPU_I_ID": "2"}
    assert slot_of(dcgm, a, virtual_gpus=False) != slot_of(
        dcgm, b, virtual_gpus=False
    )  # MIG slices
    p1 = {"gpu": "0", "Hostname": "n", "pod": "x-1", "namespace": "ns"}
    p2 = {"gpu": "0", "Hostname": "n", "pod": "x-2", "namespace": "ns"}
    assert slot_of(dcgm, p1, virtual_gpus=False) == slot_of(dcgm, p2, virtual_gpus=False)  # lives
    assert slot_of(dcgm, p1, virtual_gpus=True) != slot_of(dcgm, p2, virtual_gpus=True)  # pods


def test_bad_matchers_are_refused_in_one_line() -> None:
    assert check_matchers(['cluster="prod"', 'node=~"gpu-.*"']) == [
        'cluster="prod"',
        'node=~"gpu-.*"',
    ]
    for bad in ('cluster="prod"} or vector(1) or {a="b"', 'a="b\nc"', "a=b"):
        with pytest.raises(InputError, match="PromQL label matcher"):
            check_matchers([bad])


def test_numbers_carry_units_and_signs_and_whole_mib_print_whole() -> None:
    assert format_value("MiB", 2048.0) == "2,048 MiB"
    assert format_value("MiB", 191.04, signed=True, per="/h") == "+191 MiB/h"
    assert format_value("MiB", 30.0, signed=True) == "+30 MiB"
    assert format_value("tokens", 64.0, signed=True, per="/h") == "+64 tokens/h"
    assert format_value("ratio", 0.125) == "12.5 %"
    assert format_value("MiB", 0.0001, signed=True) == "0 MiB"
    assert compact_duration(36 * H) == "36 hours" and compact_duration(9.3 * 86400) == "9.3 days"


def test_the_rules_name_every_family_and_pool_level_metric_operation() -> None:
    doc = rules()
    (group,) = doc["groups"]
    assert group["interval"] == "1h"
    records = [r["record"] for r in group["rules"]]
    assert "gpu:DCGM_FI_DEV_FB_USED:min_over_time1h" in records
    assert any(
        r.startswith("instance:sglang_") and r.endswith("_idle:min_over_time1h") for r in records
    )
    assert all(len(r.split(":")) == 3 for r in records)


def test_fleet_speaks_the_shared_verdict_vocabulary() -> None:
    from vramdoctor.fleet import REASONS
    from vramdoctor.verdicts import VERDICTS, Reason

    shared = {
        "flat",
        "rose_then_flat",
        "grew_with_time",
        "never_idle",
        "too_few_points",
        "warming_up",
        "still_changing",
    }
    assert shared <= {r.value for r in Reason} and shared <= set(REASONS)
    s = _series(72, lambda h: 30_000 + 50 * h)
    rows = analyse(
        [s, _series(72, lambda h: 30_000.0, host="b")], start=0.0, end=72 * H, step_s=300.0
    ).rows
    assert {r.verdict for r in rows} <= {v.value for v in VERDICTS}


def test_a_cache_that_steps_up_is_caching_and_a_leak_beside_a_step_keeps_its_rate() -> None:
    # two steps mid-range, flat between and after: what a cache allocating segments looks like
    steps = _series(168, lambda h: 60_000 + (700 if h >= 60 else 0) + (1200 if h >= 110 else 0))
    (row,) = analyse([steps], start=0.0, end=168 * H, step_s=300.0).rows
    assert row.verdict == "CACHING" and row.reason == "stepped"
    assert row.rise == pytest.approx(1900, rel=0.05) and "2 steps" in row.why
    # one step and a steady leak: the leak's rate is the slope beside the step
    both = _series(168, lambda h: 60_000 + 25 * h + (1500 if h >= 80 else 0), seed=5)
    (row,) = analyse([both], start=0.0, end=168 * H, step_s=300.0).rows
    assert row.verdict == "LEAK" and "besides 1 step" in row.why
    assert row.growth_per_hour == pytest.approx(25, rel=0.02)  # not 25 + 1500 / 168
    # a steady leak across a six-hour gap has no step in it
    gap = _series(168, lambda h: 60_000 + 40 * h, seed=6)
    keep = ~((gap.t > 70 * H) & (gap.t < 76 * H))
    gap.t, gap.v = gap.t[keep], gap.v[keep]
    (row,) = analyse([gap], start=0.0, end=168 * H, step_s=300.0).rows
    assert row.verdict == "LEAK" and "step" not in row.why and row.growing_since is None
