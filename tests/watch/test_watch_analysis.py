"""watch's rolling analysis on recorded histories with known truth (tests/fixtures/fleet/histories.py).

Every history is production-shaped (bursty traffic with a daily cycle, transient activations,
NVML's whole-MiB resolution); the truth is the scenario that generated it.
"""

from __future__ import annotations

import tracemalloc

import pytest
from fixtures.fleet.histories import T0, History, Proc, records

from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.samples import PROCESS_APPEARED, PROCESS_EXITED, SERVER_REPLACED
from vramdoctor.stats.trend import CACHING, INCONCLUSIVE, low_envelope, low_envelope_arrays
from vramdoctor.watch import LEAK, STABLE, WatchConfig, WatchState, classify, replay


def _run(
    h: History,
    at_hours: list[float],
    config: WatchConfig | None = None,
    starts: dict[int, float] | None = None,
) -> tuple[dict[float, object], list[object]]:
    state = WatchState(config or WatchConfig())
    if starts:
        state.set_start_times(starts)
    out: dict[float, object] = {}
    events: list[object] = []
    want = sorted(at_hours)
    for r in records(h):
        events += state.ingest(r)
        if want and r.kind == "metrics" and r.wall >= T0 + want[0] * 3600:
            out[want.pop(0)] = state.analyse(r.wall)
    return out, events


def _series(result, layer: str, pid: int | None = None):
    return next(s for s in result.series if s.layer == layer and (pid is None or s.pid == pid))


def test_a_leak_that_starts_after_hours_is_stable_before_and_leak_after_with_the_true_rate() -> (
    None
):
    h = History(
        hours=12,
        step_s=15,
        procs=[Proc(pid=100, name="sglang::scheduler", leak_mib_per_request=0.02, leak_from_h=5.0)],
    )
    res, _ = _run(h, [4.9, 12.0])
    before, after = _series(res[4.9], "vram", 100), _series(res[12.0], "vram", 100)
    assert before.verdict == STABLE
    assert after.verdict == LEAK and res[12.0].verdict == LEAK
    assert after.mode.startswith(
        "quiet"
    )  # compared at the quietest quarter, against served requests
    assert after.growth_per_request == pytest.approx(0.02, rel=0.15)
    rph = res[12.0].requests_per_hour
    assert after.growth_per_hour == pytest.approx(0.02 * rph, rel=0.15)
    free = res[12.0].gpus[0]["free_mib"]
    assert after.hours_to_oom == pytest.approx(free / after.growth_per_hour, rel=1e-6)
    assert res[12.0].culprit is after


def test_a_restart_that_drops_memory_is_an_event_not_a_trend() -> None:
    h = History(
        hours=12,
        step_s=15,
        procs=[
            Proc(pid=300, name="vllm", cache_mib=1500, cache_fill_h=0.5, end_h=6.0),
            Proc(pid=301, name="vllm", cache_mib=1500, cache_fill_h=0.5, start_h=6.1),
        ],
    )
    res, events = _run(h, [11.0], starts={300: T0 - 86400})
    names = [e.name for e in events]
    assert names == [PROCESS_EXITED, PROCESS_APPEARED, SERVER_REPLACED]
    replaced = events[2].data
    assert (replaced["old_pid"], replaced["new_pid"]) == (300, 301)
    r = res[11.0]
    new, old = _series(r, "vram", 301), _series(r, "vram", 300)
    assert not old.alive and new.alive
    assert new.warmup_until == pytest.approx(T0 + 6.1 * 3600 + 1800, abs=30)
    assert r.verdict != LEAK and all(s.verdict != LEAK for s in r.series)


def test_a_caching_plateau_after_warm_up_is_not_a_leak() -> None:
    h = History(
        hours=10,
        step_s=15,
        procs=[Proc(pid=200, name="python3", gpu=1, cache_mib=4000, cache_fill_h=1.5)],
    )
    res, _ = _run(h, [10.0], starts={200: T0})
    s = _series(res[10.0], "vram", 200)
    assert s.verdict in (CACHING, STABLE)
    assert res[10.0].verdict != LEAK


def test_caching_still_filling_inside_the_window_is_called_caching_once_it_levels_off() -> None:
    # The process started before watch (start unknown): its first hour of caching is in the window.
    h = History(
        hours=6, step_s=15, procs=[Proc(pid=200, name="python3", cache_mib=4000, cache_fill_h=1.0)]
    )
    res, _ = _run(h, [6.0])
    assert _series(res[6.0], "vram", 200).verdict == CACHING


def test_a_process_that_exits_leaves_the_live_verdict_and_says_so() -> None:
    h = History(
        hours=8,
        step_s=15,
        procs=[
            Proc(pid=400, name="worker", gpu=0, end_h=5.0, leak_mib_per_request=0.05),
            Proc(pid=500, name="steady", gpu=1),
        ],
    )
    res, events = _run(h, [8.0])
    assert [(e.name, e.data["pid"]) for e in events] == [(PROCESS_EXITED, 400)]
    r = res[8.0]
    gone = _series(r, "vram", 400)
    assert not gone.alive and gone.hours_to_oom is None
    assert gone.verdict == LEAK  # it was leaking until it died: kept in the JSON
    assert (
        r.verdict == STABLE and r.culprit is None
    )  # the live processes decide the overall verdict


def test_memory_that_follows_the_load_is_stable_at_comparable_moments_but_a_naive_fit_calls_it_growth() -> (
    None
):
    # Activations scale with in-flight requests (300 MiB each); the daily cycle raises the load
    # through the window. Nothing is retained.
    h = History(
        hours=12,
        step_s=15,
        procs=[Proc(pid=600, name="sglang", transient_mib_per_request=300.0)],
        idle_share=0.05,
    )
    res, _ = _run(h, [12.0])
    s = _series(res[12.0], "vram", 600)
    assert s.verdict == STABLE
    assert abs(s.growth_per_hour or 0.0) < 5.0
    # The same window's 5-minute averages over time (what a dashboard shows) climb ~1 GiB,
    # a highly significant trend: only comparing comparable moments keeps it from looking like growth.
    buckets: dict[int, list[float]] = {}
    for r in records(h):
        if r.kind == "gpu" and r.wall >= T0 + 6 * 3600:
            buckets.setdefault(int(r.wall // 300), []).append(r.processes[0].used_mib)
    naive = classify([(k * 300.0, sum(v) / len(v)) for k, v in sorted(buckets.items())], x_unit="s")
    assert naive.p_value is not None and naive.p_value < 1e-6
    assert naive.growth is not None and naive.growth > 500.0


def test_kv_held_at_idle_moments_grows_per_request_and_healthy_kv_is_stable() -> None:
    leak = History(
        hours=8, step_s=15, procs=[Proc(pid=1, name="sglang")], kv_leak_tokens_per_request=0.05
    )
    ok = History(hours=8, step_s=15, procs=[Proc(pid=1, name="sglang")])
    r_leak, _ = _run(leak, [8.0])
    r_ok, _ = _run(ok, [8.0])
    kv_leak, kv_ok = _series(r_leak[8.0], "kv"), _series(r_ok[8.0], "kv")
    assert kv_leak.verdict == LEAK and kv_leak.mode == "idle"
    assert kv_leak.growth_per_request == pytest.approx(0.05, rel=0.15)
    assert kv_leak.hours_to_oom is not None
    assert kv_ok.verdict == STABLE and r_ok[8.0].kv_idle_used_tokens == {"full": 0.0}


def test_without_server_metrics_the_verdict_is_over_time_and_the_note_says_why() -> None:
    h = History(hours=8, step_s=15, procs=[Proc(pid=100, name="p", leak_mib_per_request=0.02)])
    state = WatchState()
    for r in records(h):
        if r.kind != "metrics":
            state.ingest(r)
    res = state.analyse(r.wall)
    s = _series(res, "vram", 100)
    assert s.mode == "time" and s.growth_per_request is None and s.verdict == LEAK
    assert any("no server /metrics" in n for n in res.notes)


def test_state_stays_bounded_for_a_week_with_churning_processes() -> None:
    config = WatchConfig(bucket_s=60, max_buckets=120, max_series=64, max_events=50)
    state = WatchState(config)
    h = History(hours=2, step_s=15, procs=[Proc(pid=1, name="a"), Proc(pid=2, name="b", gpu=1)])
    base = records(h)
    tracemalloc.start()
    peaks = []
    for day in range(7):
        for rec in base:
            rec.wall += 2 * 3600  # the same two hours, again and again: a week of samples
            if rec.kind == "host":
                for p in rec.processes:
                    p.pid += 1000 * day  # and new PIDs every "day"
            state.ingest(rec)
        state.analyse(rec.wall)
        peaks.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    assert state.series_count <= config.max_series
    assert all(len(t.series) <= config.max_buckets for t in state._tracks.values())
    assert len(state._events) <= config.max_events
    assert peaks[-1] < peaks[1] * 1.5  # flat after the first days, not growing with run length


def test_a_recorded_watch_run_file_replays_to_the_same_verdict(tmp_path) -> None:
    h = History(
        hours=10,
        step_s=30,
        procs=[Proc(pid=100, name="p", leak_mib_per_request=0.03, leak_from_h=3.0)],
    )
    recs = records(h)
    path = tmp_path / "watch.jsonl"
    with RunWriter(path, make_header("watch", argv=["vramdoctor", "watch"])) as w:
        for r in recs:
            w.write(r)
    live = WatchState()
    for r in recs:
        live.ingest(r)
    expected = live.analyse(recs[-1].wall)
    again = replay(read_run(path).records)
    assert again.verdict == expected.verdict == LEAK
    assert _series(again, "vram", 100).growth_per_request == pytest.approx(
        _series(expected, "vram", 100).growth_per_request
    )


def test_classify_refuses_to_call_too_few_points_and_the_low_envelope_takes_block_minima() -> None:
    assert classify([(0, 1.0), (1, 2.0)]).verdict == INCONCLUSIVE
    assert classify([]).level is None
    env = low_envelope([(0, 5.0), (10, 3.0), (61, 9.0), (100, 7.0), (130, 8.0)], 60)
    assert env == [(10, 3.0), (100, 7.0), (130, 8.0)]


def test_the_vectorised_low_envelope_matches_the_plain_one() -> None:
    import numpy as np

    rng = np.random.default_rng(5)
    t = np.sort(rng.random(3000) * 20_000)
    v = np.round(rng.random(3000) * 40)  # ties inside blocks: the first minimum wins in both
    assert low_envelope_arrays(t, v, 60.0) == low_envelope(
        list(zip(t.tolist(), v.tolist(), strict=True)), 60.0
    )


def test_a_device_level_source_gives_a_device_series_with_its_time_to_oom() -> None:
    # dcgm-exporter: no process rows, only the GPU's used/free. The server leaks 0.02 MiB a request.
    h = History(hours=8, step_s=15, procs=[Proc(pid=100, name="p", leak_mib_per_request=0.02)])
    state = WatchState()
    for r in records(h):
        if r.kind == "gpu":
            r.processes = []
            r.source = "dcgm"
        if r.kind != "host":
            state.ingest(r)
    res = state.analyse(r.wall)
    (dev,) = [s for s in res.series if s.layer == "device"]
    assert not [s for s in res.series if s.layer == "vram"]
    assert dev.verdict == LEAK and dev.gpu == 0 and dev.mode.startswith("quiet")
    assert dev.growth_per_request == pytest.approx(0.02, rel=0.15)
    assert dev.hours_to_oom == pytest.approx(
        res.gpus[0]["free_mib"] / dev.growth_per_hour, rel=1e-6
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_a_server_that_is_never_idle_still_shows_its_leak_and_not_its_load(seed: int) -> None:
    # Saturated around the clock (no idle moment, 20 requests in flight at the daily peak),
    # activations of 150 MiB a request in flight that follow the load through the day. Only the
    # first process leaks (0.01 MiB a request); the per-minute load cost is taken out.
    leak = History(
        hours=10,
        step_s=15,
        procs=[Proc(pid=1, name="s", leak_mib_per_request=0.01, transient_mib_per_request=150)],
        idle_share=0.0,
        peak_inflight=20,
        seed=seed,
    )
    flat = History(
        hours=10,
        step_s=15,
        procs=[
            Proc(pid=1, name="s", cache_mib=3000, cache_fill_h=1.0, transient_mib_per_request=150)
        ],
        idle_share=0.0,
        peak_inflight=20,
        seed=seed,
    )
    r_leak, _ = _run(leak, [10.0])
    r_flat, _ = _run(flat, [10.0])
    s_leak, s_flat = _series(r_leak[10.0], "vram", 1), _series(r_flat[10.0], "vram", 1)
    assert s_leak.mode == "quiet, load-adjusted" and s_leak.verdict == LEAK
    assert s_leak.growth_per_request == pytest.approx(0.01, rel=0.15)
    assert s_flat.verdict != LEAK


def test_a_level_that_does_not_follow_the_load_is_not_adjusted() -> None:
    # PyTorch's caching allocator: NVML's level stays put while requests come and go.
    h = History(
        hours=8,
        step_s=15,
        procs=[Proc(pid=1, name="s", leak_mib_per_request=0.02, transient_mib_per_request=0.0)],
    )
    res, _ = _run(h, [8.0])
    s = _series(res[8.0], "vram", 1)
    assert s.mode == "quiet" and s.verdict == LEAK


def test_without_a_request_counter_a_level_that_stopped_rising_is_not_called_caching() -> None:
    # Against time alone, memory that rose and then stopped looks the same whether a cache
    # filled or a per-request leak stopped with the traffic: watch must not say CACHING.
    h = History(
        hours=5, step_s=15, procs=[Proc(pid=210, name="python3", cache_mib=3000, cache_fill_h=2.5)]
    )
    state = WatchState(WatchConfig())
    state.set_start_times({210: T0})
    for r in records(h):
        if r.kind != "metrics":  # a server without /metrics: no request counter
            state.ingest(r)
    s = _series(state.analyse(T0 + 5 * 3600), "vram", 210)
    assert s.mode == "time"
    assert s.verdict == INCONCLUSIVE and "request counter" in s.reason
