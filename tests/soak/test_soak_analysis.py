"""Soak analysis on synthetic but physical runs: the events and samples a real soak writes.

Each run is built the way the protocol records it (baseline, K rounds of load, an idle window
after each), with memory that behaves like the thing it models: a caching allocator that rises
and plateaus, a leak that grows with every request, transient load peaks that vanish at idle,
measurement noise, a one-time step, glibc arenas that appear with threads, a KV pool whose
used tokens at idle creep up one page per request, a server that dies. The analysis is pure,
so building its input here is building what the sampler records.
"""

from __future__ import annotations

import json
import random
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from vramdoctor.judge import (
    CACHING,
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    STABLE,
    Thresholds,
    classify_series,
)
from vramdoctor.samples import (
    MIB,
    PROCESS_APPEARED,
    PROCESS_EXITED,
    SERVER_DIED,
    SERVER_REPLACED,
    Event,
    GpuMemory,
    GpuSample,
    HostProcessMemory,
    HostSample,
    InsideSample,
    KvPoolSample,
    MetricsSample,
    ProcessGpuMemory,
)
from vramdoctor.soak.analysis import analyse_soak
from vramdoctor.soak.report import headline, soak_json

TOTAL = 81559.0
Level = Callable[[int, float], float]


def synth(
    level: Level | None,
    *,
    rounds: int = 4,
    n: int = 50,
    idle: float = 10.0,
    load: float = 8.0,
    interval: float = 0.5,
    noise: float = 0.0,
    seed: int = 0,
    peak: float = 300.0,
    host_level: Level | None = None,
    host_kinds: dict[str, Level] | None = None,
    arenas: Callable[[int, float], int] | None = None,
    kv: dict[str, Level] | None = None,
    kv_total: float = 200_000.0,
    kv_page: int | None = 64,
    kv_ratio: Level | None = None,
    requests: list[int] | None = None,
    requests_total: Callable[[float], float] | None = None,
    pid: int = 4242,
    device_only: bool = False,
) -> list[object]:
    """Records of a soak. level(k, frac) is the settled memory (MiB) after k rounds plus frac of
    the next round; during load a transient `peak` (activations) adds on top and is gone at idle.
    KV pools hold `kv[pool](k, frac)` tokens at idle plus the running requests' tokens."""
    rng = np.random.default_rng(seed)
    recs: list[object] = []
    t = 1000.0
    reqs = requests or [n] * rounds

    def sample(k: int, frac: float, busy: bool) -> None:
        if level is not None:
            v = level(k, frac) + (peak if busy else 0.0) + rng.normal(0, noise)
            used = 600.0 + v
            procs = [] if device_only else [ProcessGpuMemory(pid, 0, used, name="python3")]
            recs.append(
                GpuSample(
                    t=t,
                    wall=t,
                    source="nvml",
                    gpus=[GpuMemory(0, TOTAL, used + 1000, TOTAL - used - 1000)],
                    processes=procs,
                )
            )
        if host_level is not None:
            kinds = {name: f(k, frac) for name, f in (host_kinds or {}).items()}
            n_arenas = arenas(k, frac) if arenas is not None else None
            recs.append(
                HostSample(
                    t=t,
                    wall=t,
                    processes=[
                        HostProcessMemory(
                            pid,
                            host_level(k, frac) + rng.normal(0, noise / 4),
                            "python3",
                            "server",
                            rss_anon_mib=kinds.get("anon"),
                            rss_file_mib=kinds.get("file"),
                            rss_shmem_mib=kinds.get("shmem"),
                            threads=8,
                            malloc_arenas=n_arenas,
                            malloc_arena_reserved_mib=None if n_arenas is None else 64.0 * n_arenas,
                        )
                    ],
                )
            )
        if kv is not None or kv_ratio is not None or requests_total is not None:
            running = 4.0 if busy else 0.0
            pools = [
                KvPoolSample(
                    name,
                    f(k, frac) + (1024.0 * running),
                    total_tokens=kv_total,
                    running_requests=running,
                    queued_requests=0.0,
                    page_size_tokens=kv_page,
                    source="sglang:kv_used_tokens",
                )
                for name, f in (kv or {}).items()
            ]
            values = {}
            if kv_ratio is not None:
                values = {
                    "kv_usage_ratio": kv_ratio(k, frac) + (0.3 if busy else 0.0),
                    "running_requests": running,
                    "queued_requests": 0.0,
                }
            recs.append(
                MetricsSample(
                    t=t,
                    wall=t,
                    flavour="sglang",
                    values=values,
                    kv=pools,
                    requests_total=requests_total(t) if requests_total else None,
                )
            )

    def ev(name: str, **data: object) -> None:
        recs.append(Event(t=t, wall=t, name=name, data=data))

    def window(seconds: float, k: int, busy: bool) -> None:
        nonlocal t
        steps = int(seconds / interval)
        for i in range(steps):
            sample(k, (i + 1) / steps if busy else 0.0, busy)
            t += interval

    ev("baseline_start", round=0)
    window(idle, 0, False)
    ev("baseline_end", round=0)
    for k in range(1, rounds + 1):
        ev("round_start", round=k)
        window(load, k - 1, True)
        ev("round_end", round=k, sent=reqs[k - 1], outcomes={"ok": reqs[k - 1]}, complete=True)
        ev("idle_start", round=k)
        window(idle, k, False)
        ev("idle_end", round=k)
    return recs


def with_agent(recs: list[object], in_use: Level, pid: int = 4242) -> list[object]:
    """`recs` plus the agent's glibc counters at each idle-window end (and the baseline's):
    bytes in use `in_use(k, 0)` MiB after k rounds. From outside alone a steady heap is
    retention_or_leak; what is live inside decides."""
    for e in [r for r in recs if isinstance(r, Event)]:
        if e.name in ("idle_end", "baseline_end"):
            k = int(e.data.get("round", 0))
            glibc = {"in_use_bytes": int(in_use(k, 0.0) * MIB), "free_kept_bytes": 0,
                     "mmap_bytes": 0, "arena_bytes": int(in_use(k, 0.0) * MIB)}  # fmt: skip
            recs.append(InsideSample(t=e.t, wall=e.wall, pid=pid, round=k, glibc=glibc))
    return recs


def caching(size: float, rounds_to_fill: int = 1) -> Level:
    """An allocator cache: fills over the first rounds to `size`, then stays there."""
    return lambda k, f: size * min(1.0, (k + f) / rounds_to_fill)


def leak(per_request: float, n: int = 50, cache: float = 140.0) -> Level:
    return lambda k, f: cache * min(1.0, k + f) + per_request * n * (k + f)


def flat(value: float = 0.0) -> Level:
    return lambda k, f: value


# --- VRAM --------------------------------------------------------------------------------------


def test_caching_plateau_after_one_round_is_caching() -> None:
    r = analyse_soak(synth(caching(140.0)))
    assert r.verdict == CACHING and r.layers["vram"].verdict == CACHING
    assert r.layers["vram"].rate_per_request is None
    proc = next(s for s in r.series if s.key == "gpu0/pid4242")
    assert proc.verdict == CACHING and proc.growth == pytest.approx(140.0, abs=1.0)
    assert r.layers["kv"].verdict == NOT_MEASURED and r.layers["host"].verdict == NOT_MEASURED
    assert r.exit_code == 0 and r.decided


def test_caching_that_needs_two_rounds_is_not_a_leak() -> None:
    assert analyse_soak(synth(caching(226.0, rounds_to_fill=2), noise=1.0)).verdict == CACHING


def test_linear_leak_is_leak_with_rate_interval_culprit_and_projection_in_requests() -> None:
    r = analyse_soak(synth(leak(19.3)))
    vram = r.layers["vram"]
    assert r.verdict == LEAK and vram.verdict == LEAK and r.exit_code == 1
    assert vram.rate_per_request == pytest.approx(19.3, rel=0.02)
    assert vram.rate_ci is not None and vram.rate_ci[0] <= 19.3 <= vram.rate_ci[1] + 1e-9
    assert vram.culprit is not None and vram.culprit.pid == 4242 and vram.culprit.gpu == 0
    assert vram.culprit.cause == "allocator"
    p = vram.projection
    assert p is not None and p.capacity_of == "gpu_free"
    assert p.requests == pytest.approx(p.capacity_left / vram.rate_per_request, rel=1e-9)
    assert p.hours is None  # no production rate: never hours at the soak's burst load


def test_a_creep_under_the_floor_is_never_headlined_as_not_leaking() -> None:
    # 1 MiB a round after the cache filled: under the 2 MiB floor, so CACHING, but the rounds
    # only bound a leak; the headline must not claim more than the layer's sentence.
    r = analyse_soak(synth(leak(0.02), rounds=5))
    s = next(x for x in r.series if x.key == "gpu0/pid4242")
    assert r.verdict == CACHING and s.creep_floor_per_request is not None
    assert s.creep_floor_per_request >= 0.02  # the bound covers the truth
    line = headline(r)
    assert "not leaking" not in line and "is not ruled out" in line, line
    assert "cannot be ruled out" in soak_json(r)["layers"]["vram"]["summary"]
    # with no creep at all the plain wording stays
    assert "caching, not leaking" in headline(analyse_soak(synth(caching(140.0), rounds=5)))


def test_small_leak_under_noise_is_found() -> None:
    r = analyse_soak(synth(leak(0.5), noise=2.0, seed=3))
    assert r.verdict == LEAK
    assert r.layers["vram"].rate_per_request == pytest.approx(0.5, rel=0.25)


@pytest.mark.parametrize("seed", range(5))
def test_noise_alone_is_stable(seed: int) -> None:
    assert analyse_soak(synth(flat(), noise=1.0, seed=seed)).verdict == STABLE


def test_one_time_step_is_not_a_leak() -> None:
    r = analyse_soak(
        synth(lambda k, f: 140.0 * min(1.0, k + f) + (90.0 if k + f >= 2.5 else 0.0), rounds=5)
    )
    assert r.verdict == CACHING


def test_decaying_growth_is_not_a_leak() -> None:
    r = analyse_soak(synth(lambda k, f: 160.0 * (1 - 0.5 ** (k + f)), rounds=5))
    assert r.verdict in (CACHING, INCONCLUSIVE)


@pytest.mark.parametrize("pattern", [[0, 60, 40, 60, 40, 60, 40, 60], [0, 48, 0, 48, 0, 48, 0]])
def test_a_level_that_breathes_within_a_band_is_bounded_caching(pattern: list[float]) -> None:
    # A cache trimmed every other round: up and down, no trend, no new high.
    r = analyse_soak(synth(lambda k, f: pattern[k], rounds=len(pattern) - 1))
    assert r.layers["vram"].verdict == CACHING


def test_a_staircase_leak_every_other_round_is_never_called_bounded() -> None:
    steps = [0, 50, 50, 100, 100, 150, 150, 200]
    r = analyse_soak(synth(lambda k, f: steps[k], rounds=len(steps) - 1))
    assert r.layers["vram"].verdict in (LEAK, INCONCLUSIVE)


def test_two_rounds_of_growth_are_undecided_and_say_so() -> None:
    r = analyse_soak(synth(leak(2.0), rounds=2))
    assert r.verdict == INCONCLUSIVE
    assert r.undecided_layers() == {"vram": "too_few_rounds"}
    assert not r.decided and r.exit_code == 0


def test_short_last_round_does_not_fake_a_plateau() -> None:
    r = analyse_soak(
        synth(
            lambda k, f: 2.0 * 50 * min(k + f, 3) + (2.0 * 3 if k + f > 3 else 0.0),
            requests=[50, 50, 50, 3],
        )
    )
    assert r.verdict == LEAK


def test_classify_needs_growth_above_the_floor() -> None:
    levels = [100.5, 101.0, 101.5, 102.0, 102.5]
    # Each level measured as the median of samples 0.01 MiB apart: the level noise is known.
    measured = [[v - 0.01, v, v + 0.01] for v in levels]
    reqs = [50, 100, 150, 200, 250]
    c = classify_series(100.0, levels[:4], reqs[:4], measured[:4], floor=2.0)
    assert c.verdict == STABLE
    c = classify_series(100.0, levels, reqs, measured, floor=0.1)
    assert c.verdict == LEAK and c.model == "steady"
    levels = [100.5, 101.0, 101.4, 101.9]
    # One sample per level says nothing about the noise: four rounds cannot then rule out a
    # cache converging towards a bound (the residuals of three increments are all there is),
    # so the growth is undecided and says about how many more rounds would decide it.
    c = classify_series(100.0, levels, [50, 100, 150, 200], [[1.0]] * 4, floor=0.1)
    assert c.verdict == INCONCLUSIVE and c.reason == "steady_or_converging"
    assert c.steps_to_decide is not None and 1 <= c.steps_to_decide <= 12


def test_stray_context_is_reported() -> None:
    recs = synth(caching(140.0))
    for r in recs:
        if isinstance(r, GpuSample):
            r.gpus.append(GpuMemory(1, TOTAL, 1100.0, TOTAL - 1100.0))
            r.processes.append(ProcessGpuMemory(4242, 1, 512.0, name="python3"))
    res = analyse_soak(recs)
    assert res.layers["vram"].stray_contexts == ["gpu1/pid4242"]
    assert any("stray CUDA context" in n and "GPU 1" in n for n in soak_json(res)["notes"])


def test_cli_default_floor_is_the_analysis_default() -> None:
    from vramdoctor.cli.soak import MIN_GROWTH_MIB

    assert Thresholds().min_growth_mib == MIN_GROWTH_MIB


def test_a_process_that_appears_mid_run_and_stays_is_a_step_from_zero() -> None:
    recs = synth(caching(140.0), rounds=5)
    start = next(
        r.t
        for r in recs
        if isinstance(r, Event) and r.name == "round_start" and r.data["round"] == 2
    )
    for r in recs:
        if isinstance(r, GpuSample) and r.t >= start:
            r.processes.append(ProcessGpuMemory(777, 0, 512.0, name="python3"))
    res = analyse_soak(recs)
    s = next(s for s in res.series if s.key == "gpu0/pid777")
    assert s.baseline == 0.0 and s.settled[0] == 0.0 and s.settled[1] == 512.0
    assert s.verdict == CACHING and s.decides and s.presence == "appeared"
    assert res.verdict == CACHING


# --- a process that starts, fails and exits in round 1 never decides ----------


def _add_failed_second_server(recs: list[object], *, with_events: bool) -> None:
    """A second server process that starts during round 1, holds a CUDA context and RSS for a
    few seconds, fails to bind the port and exits."""
    start = next(r.t for r in recs if isinstance(r, Event) and r.name == "round_start")
    end = start + 4.0
    for r in recs:
        if isinstance(r, GpuSample) and start <= r.t <= end:
            r.processes.append(ProcessGpuMemory(999, 0, 520.0, name="python3"))
            r.gpus[0].used_mib += 520.0
        if isinstance(r, HostSample) and start <= r.t <= end:
            r.processes.append(HostProcessMemory(999, 700.0, "python3", "server"))
    if with_events:
        recs.append(
            Event(
                t=start,
                wall=start,
                name=PROCESS_APPEARED,
                data={"pid": 999, "name": "python3", "gpu": 0},
            )
        )
        recs.append(
            Event(t=end, wall=end, name=PROCESS_EXITED, data={"pid": 999, "name": "python3"})
        )


@pytest.mark.parametrize("with_events", [True, False], ids=["events", "samples-only"])
def test_a_process_that_exits_in_round_one_does_not_decide(with_events: bool) -> None:
    # Truth: GPU 520 -> 768 MiB then flat, RSS flat after round 1 (transformers serve).
    recs = synth(
        lambda k, f: -80.0 + 248.0 * min(1.0, k + f),
        host_level=lambda k, f: 900.0 + 30 * min(1.0, k + f),
        peak=100.0,
    )
    _add_failed_second_server(recs, with_events=with_events)
    res = analyse_soak(recs)
    assert res.verdict == CACHING, [(s.key, s.verdict, s.reason) for s in res.series]
    for key in ("gpu0/pid999", "rss/pid999"):
        s = next(s for s in res.series if s.key == key)
        assert not s.decides and s.reason == "transient" and s.presence == "transient"
    assert any(c.pid == 999 for c in res.process_changes)
    d = soak_json(res)
    assert any("pid 999" in n and "appeared and exited in round 1" in n for n in d["notes"])
    assert res.undecided == []


def test_workers_that_pile_up_each_flat_are_a_device_leak() -> None:
    # A server that starts a new 500 MiB worker every round and never stops the old ones: each
    # process is a flat step, the GPU's total grows every round with the requests.
    recs = synth(caching(140.0), rounds=5)
    starts = sorted(r.t for r in recs if isinstance(r, Event) and r.name == "round_start")
    for r in recs:
        if isinstance(r, GpuSample):
            for i, t in enumerate(starts):
                if r.t >= t + 1.0:
                    r.processes.append(ProcessGpuMemory(7000 + i, 0, 500.0, name="worker"))
                    r.gpus[0].used_mib += 500.0
    res = analyse_soak(recs)
    vram = res.layers["vram"]
    assert vram.verdict == LEAK and vram.culprit is not None and vram.culprit.series == "gpu0"
    assert vram.rate_per_request == pytest.approx(10.0, rel=0.05)


# --- glibc malloc arenas are host-allocator caching, not a leak --------------


def _arena_run(
    rounds: int = 10,
    *,
    arenas_rise: bool = True,
    growth_per_round: float = 24.0,
    stop_after: int | None = None,
) -> list[object]:
    """A thread-per-connection server decoding PNGs: VRAM +50 MiB then flat; RSS +24 MiB
    every round of 30 requests as glibc gives new threads new arenas (one more each round);
    with `stop_after` K, glibc adds no arena after round K and the RSS stays where it is."""

    def rounds_in(k: int) -> int:
        return k if stop_after is None else min(k, stop_after)

    def arenas(k: int, f: float) -> int:
        return 2 + (rounds_in(k) if arenas_rise else 0)

    return synth(
        caching(50.0),
        rounds=rounds,
        n=30,
        host_level=lambda k, f: 900.0 + growth_per_round * rounds_in(k),
        host_kinds={
            "anon": lambda k, f: 500.0 + growth_per_round * rounds_in(k),
            "file": flat(350.0),
            "shmem": flat(50.0),
        },
        arenas=arenas,
    )


def test_arena_growth_is_host_caching_with_its_bound_and_how_to_confirm() -> None:
    # New arenas in rounds 1-4 hold the growth; then the count stops and so does the RSS.
    res = analyse_soak(_arena_run(8, stop_after=4), {"cpu_count": 16})
    host = res.layers["host"]
    assert host.verdict == CACHING and host.explanation == "malloc_arenas"
    assert res.layers["vram"].verdict == CACHING
    assert res.verdict == CACHING and res.exit_code == 0
    proc = host.host_processes[0]
    assert proc.arenas_first == 2 and proc.arenas_last == 6 and proc.arena_bound == 128
    text = soak_json(res)["layers"]["host"]["summary"]
    assert "MALLOC_ARENA_MAX=2" in text and "jemalloc" in text and "128 arenas" in text


def test_growth_while_glibc_still_adds_arenas_is_undecided_and_asks_for_more_rounds() -> None:
    # Arenas 10, 11, 11, 12 and a real 64 KiB/request leak beside them are never "allocator
    # caching, not a leak" after 4 rounds, with no extra round. The arenas can
    # hold the growth so far, and so can a leak: while both go on, it is undecided (never
    # LEAK, never "not a leak"), and the adaptive rounds are asked for more.
    for run in (_arena_run(4), _arena_run(10)):
        res = analyse_soak(run, {"cpu_count": 16})
        host = res.layers["host"]
        assert host.verdict == INCONCLUSIVE and host.reason == "still_changing"
        assert host.explanation == "malloc_arenas" and host.culprit is None
        assert res.undecided_layers() == {"host": "still_changing"} and res.exit_code == 0
        text = soak_json(res)["layers"]["host"]["summary"]
        assert "not a leak" not in text and "still adding malloc arenas" in text
        assert "MALLOC_ARENA_MAX=2" in text and "agent" in text


def test_the_servers_own_malloc_arena_max_is_the_bound() -> None:
    res = analyse_soak(
        _arena_run(8, stop_after=4), {"config": {"cpu_count": 16, "server_malloc_arena_max": 32}}
    )
    proc = res.layers["host"].host_processes[0]
    assert proc.arena_bound == 32 and proc.arena_bound_set
    assert "MALLOC_ARENA_MAX=32" in soak_json(res)["layers"]["host"]["summary"]


def test_the_same_growth_with_a_flat_arena_count_is_never_called_a_leak_from_outside() -> None:
    # glibc retains inside the arenas it has, in the main heap and under a raised mmap
    # threshold, steadily for many rounds; a flat arena count (a server warm before the run)
    # rules none of it out. From outside this is undecided, at the rate a leak would have,
    # with both ways to decide.
    res = analyse_soak(_arena_run(arenas_rise=False), {"cpu_count": 16})
    host = res.layers["host"]
    assert host.verdict == INCONCLUSIVE and host.reason == "retention_or_leak", host
    assert host.rate_per_request == pytest.approx(24.0 / 30, rel=0.05)
    assert res.verdict != LEAK and res.exit_code == 0
    text = soak_json(res)["layers"]["host"]["summary"]
    assert "MALLOC_ARENA_MAX=2" in text and "agent" in text, text


def test_arenas_added_every_other_round_still_explain_the_growth() -> None:
    recs = synth(
        caching(50.0),
        rounds=10,
        n=30,
        host_level=lambda k, f: 900.0 + 24.0 * k,
        host_kinds={"anon": lambda k, f: 500.0 + 24.0 * k},
        arenas=lambda k, f: 2 + (k + 1) // 2,
    )
    host = analyse_soak(recs, {"cpu_count": 16}).layers["host"]
    # Explained by the arenas (never LEAK), but both still go on: undecided until they stop.
    assert host.explanation == "malloc_arenas" and host.verdict == INCONCLUSIVE
    stops = synth(
        caching(50.0),
        rounds=10,
        n=30,
        host_level=lambda k, f: 900.0 + 24.0 * min(k, 6),
        host_kinds={"anon": lambda k, f: 500.0 + 24.0 * min(k, 6)},
        arenas=lambda k, f: 2 + (min(k, 6) + 1) // 2,
    )
    assert analyse_soak(stops, {"cpu_count": 16}).layers["host"].verdict == CACHING


def test_growth_that_goes_on_after_the_arenas_stop_appearing_is_retention_or_a_leak() -> None:
    # Arenas appear in rounds 1-3 (the first connections), then the count is flat while the
    # heap keeps growing 24 MiB a round: not the new arenas, but glibc also retains inside
    # existing arenas and the main heap (measured on an H200 host, in-use bytes flat): from
    # outside the process that and a leak look the same. Not LEAK, and says how to decide.
    recs = synth(
        caching(50.0),
        rounds=8,
        n=30,
        host_level=lambda k, f: 900.0 + 24.0 * k,
        host_kinds={"anon": lambda k, f: 500.0 + 24.0 * k},
        arenas=lambda k, f: 2 + min(k, 3),
    )
    res = analyse_soak(recs, {"cpu_count": 16})
    host = res.layers["host"]
    assert host.verdict == INCONCLUSIVE and host.reason == "retention_or_leak"
    assert host.explanation != "malloc_arenas" and host.culprit is None
    assert host.rate_per_request == pytest.approx(24.0 / 30, rel=0.05)  # what a leak would be
    assert res.exit_code == 0 and res.undecided_layers() == {"host": "retention_or_leak"}
    text = soak_json(res)["layers"]["host"]["summary"]
    assert "MALLOC_ARENA_MAX=2" in text and "agent" in text


def test_growth_beyond_what_new_arenas_reserve_is_not_explained_by_them() -> None:
    # 200 MiB a round with one new 64 MiB arena a round: more than the new arenas can hold,
    # so not "malloc arenas"; retention beyond them is still possible: undecided from outside.
    res = analyse_soak(_arena_run(growth_per_round=200.0), {"cpu_count": 16})
    host = res.layers["host"]
    assert host.explanation != "malloc_arenas"
    assert host.verdict == INCONCLUSIVE and host.reason == "retention_or_leak"


def test_host_growth_without_readable_kinds_or_arenas_is_undecided_with_a_caveat() -> None:
    # /proc/PID/status and maps unreadable (another user, a container): RSS grows steadily,
    # and nothing rules out the allocator keeping it. Judged on RSS, not called a leak.
    res = analyse_soak(
        synth(caching(140.0), host_level=lambda k, f: 900.0 + 1.0 * 50 * (k + f)),
        raw_host=[{"kind": "host_memory", "t": 1.0, "available_mib": 32000.0}],
    )
    host = res.layers["host"]
    assert host.verdict == INCONCLUSIVE and host.reason == "retention_or_leak"
    assert host.main_series == "rss/pid4242" and host.culprit is None
    assert host.rate_per_request == pytest.approx(1.0, rel=0.05)
    assert "rss_kinds_unreadable" in host.caveats and "malloc_arenas_unreadable" in host.caveats
    assert host.projection is not None and host.projection.capacity_left == 32000.0
    assert res.layers["vram"].verdict == CACHING and res.exit_code == 0
    assert headline(res).startswith("INCONCLUSIVE: VRAM is caching")


def test_steady_host_growth_with_a_flat_known_arena_is_undecided_outside_a_leak_inside() -> None:
    # One arena, seen and flat: from outside, retention inside it and a leak look the same;
    # the agent's bytes in use growing with the requests decide LEAK.
    def run(agent: bool) -> Any:
        recs = synth(
            caching(140.0),
            rounds=5,  # live bytes need five rounds (judge.inside.INSIDE_MIN_STEADY_STEPS)
            host_level=lambda k, f: 900.0 + 1.0 * 50 * (k + f),
            arenas=lambda k, f: 1,
        )
        recs = with_agent(recs, lambda k, f: 100.0 + 50.0 * k) if agent else recs
        return analyse_soak(
            recs, raw_host=[{"kind": "host_memory", "t": 1.0, "available_mib": 32000.0}]
        )

    host = run(agent=False).layers["host"]
    assert host.verdict == INCONCLUSIVE and host.reason == "retention_or_leak", host
    res = run(agent=True)
    host = res.layers["host"]
    assert host.verdict == LEAK and host.culprit is not None
    assert host.culprit.series == "rss/pid4242" and host.decided_by == "inside_glibc"
    assert host.rate_per_request == pytest.approx(1.0, rel=0.05)
    assert headline(res).startswith("LEAK: VRAM is caching") and "host RAM leaks" in headline(res)


def test_pinned_host_memory_that_levels_off_is_named() -> None:
    res = analyse_soak(
        synth(
            caching(140.0),
            host_level=lambda k, f: 900.0 + 256.0 * min(1.0, k + f),
            host_kinds={
                "anon": flat(500.0),
                "file": flat(350.0),
                "shmem": lambda k, f: 50.0 + 256.0 * min(1.0, k + f),
            },
            arenas=lambda k, f: 2,
        )
    )
    host = res.layers["host"]
    assert host.verdict == CACHING and host.explanation == "pinned_host_memory"
    assert "pinned host memory" in soak_json(res)["layers"]["host"]["summary"]


def test_rss_growing_in_mapped_files_only_is_not_a_leak_but_heap_growth_is() -> None:
    # Weights mmapped from safetensors paged in as requests touch them: RssFile grows, the
    # heap does not.
    def run(anon: Level, file_: Level) -> object:
        return analyse_soak(
            synth(
                caching(140.0),
                host_level=lambda k, f: 900.0 + anon(k, f) + file_(k, f),
                host_kinds={
                    "anon": lambda k, f: 500.0 + anon(k, f),
                    "file": lambda k, f: 350.0 + file_(k, f),
                    "shmem": flat(50.0),
                },
                arenas=lambda k, f: 2,
            )
        )

    res = run(flat(), lambda k, f: 40.0 * k)
    assert res.layers["host"].verdict == CACHING and res.layers["host"].explanation == "file_backed"
    assert "RssFile" in soak_json(res)["layers"]["host"]["summary"]
    res = run(lambda k, f: 40.0 * k, flat())  # the heap grows: not file-backed, undecided
    assert res.layers["host"].verdict == INCONCLUSIVE and res.layers["host"].explanation is None


def test_big_process_rss_jitter_is_not_a_leak_but_a_big_rss_leak_is() -> None:
    steps = [0.0, 0.0, 4.0, 7.5, 13.0]
    r = analyse_soak(synth(flat(), host_level=lambda k, f: 4096.0 + steps[min(int(k + f), 4)]))
    rss = next(s for s in r.series if s.kind == "rss")
    assert rss.threshold == pytest.approx(4096.0 * 0.0025) and rss.verdict != LEAK
    # A 4 GiB RSS moves by ~0.25 % from round to round with its heap: that jitter is the
    # level's noise, so telling 50 MiB a round from a converging cache takes a fifth round.
    r = analyse_soak(
        with_agent(
            synth(
                flat(),
                rounds=5,
                host_level=lambda k, f: 4096.0 + 50 * (k + f),
                arenas=lambda k, f: 1,
            ),
            lambda k, f: 1000.0 + 50.0 * k,
        )
    )
    assert r.verdict == LEAK and r.layers["host"].verdict == LEAK


# --- KV pages, in tokens, one page is the floor -------------------------------

ISSUE_SERIES = [0.0, 1920.0, 3840.0, 5760.0, 7680.0]  # sglang:num_used_tokens at idle


def test_the_issue_kv_page_leak_in_a_200k_pool_is_a_leak_in_tokens_pages_and_mib() -> None:
    recs = synth(
        flat(), n=30, kv={"full": lambda k, f: ISSUE_SERIES[k]}, kv_total=200_000.0, kv_page=64
    )
    for r in recs:  # SGLang: 64 tokens of a 7B model's KV, 128 KiB per 64-token page -> 2 KiB/token
        if isinstance(r, MetricsSample):
            for p in r.kv:
                p.bytes_per_token = 2048.0
    res = analyse_soak(recs)
    kv = res.layers["kv"]
    assert kv.verdict == LEAK and res.verdict == LEAK and res.exit_code == 1
    pool = kv.kv_pools[0]
    assert pool.tokens_per_request == pytest.approx(64.0, rel=0.01)
    assert pool.pages_per_request == pytest.approx(1.0, rel=0.01)
    assert pool.mib_per_request == pytest.approx(0.125, rel=0.01)
    assert res.layers["vram"].verdict == STABLE  # preallocated: NVML never moves
    assert kv.projection is not None
    assert kv.projection.requests == pytest.approx((200_000 - 7680) / 64, rel=0.01)
    text = headline(res)
    assert text.startswith("LEAK: VRAM is stable") and "KV pool leaks 64 tokens" in text


def test_one_page_per_request_in_a_million_token_pool_is_found_in_four_rounds() -> None:
    res = analyse_soak(
        synth(
            flat(), n=30, kv={"full": lambda k, f: 64.0 * 30 * k}, kv_total=1_000_000.0, kv_page=64
        )
    )
    kv = res.layers["kv"]
    assert kv.verdict == LEAK
    assert kv.rate_per_request == pytest.approx(64.0, rel=0.10)


def test_kv_creep_under_a_page_per_round_is_still_a_leak_when_every_round_adds() -> None:
    # 2 tokens per request x 30 requests: 60 tokens a round, under one 64-token page, but an
    # exact count that rises every round with nothing running.
    res = analyse_soak(
        synth(flat(), n=30, kv={"full": lambda k, f: 60.0 * k}, kv_total=1_000_000.0, kv_page=64)
    )
    assert res.layers["kv"].verdict == LEAK
    assert res.layers["kv"].rate_per_request == pytest.approx(2.0, rel=0.01)
    # A residue that appears once and stays is not.
    res = analyse_soak(synth(flat(), n=30, kv={"full": lambda k, f: 60.0 * min(k, 1)}, kv_page=64))
    assert res.layers["kv"].verdict == STABLE


def test_kv_mib_per_request_from_the_pools_size_when_the_server_gives_no_bytes_per_token() -> None:
    # SGLang 0.5.17+: sglang:kv_cache_memory_usage_gb (GiB) of a 1,000,000-token pool.
    recs = synth(
        flat(), n=30, kv={"full": lambda k, f: 64.0 * 30 * k}, kv_total=1_000_000.0, kv_page=64
    )
    for r in recs:
        if isinstance(r, MetricsSample):
            r.values["kv_cache_memory_gib"] = 61.0
    pool = analyse_soak(recs).layers["kv"].kv_pools[0]
    assert pool.bytes_per_token == pytest.approx(61.0 * 2**30 / 1_000_000)
    assert pool.mib_per_request == pytest.approx(64 * 61.0 * 1024 / 1_000_000, rel=1e-6)


def test_kv_page_size_unknown_gives_tokens_only_and_says_so() -> None:
    # SGLang's default page is 1 token, vLLM's 16: an unknown page size is not assumed.
    res = analyse_soak(
        synth(
            flat(), n=30, kv={"kv": lambda k, f: 64.0 * 30 * k}, kv_total=1_000_000.0, kv_page=None
        )
    )
    kv = res.layers["kv"]
    assert kv.verdict == LEAK and "page_size_assumed" in kv.caveats
    assert kv.kv_pools[0].tokens_per_request == pytest.approx(64.0, rel=0.05)
    assert kv.kv_pools[0].pages_per_request is None and kv.kv_pools[0].page_size_tokens is None


def test_each_kv_pool_is_judged_on_its_own() -> None:
    res = analyse_soak(
        synth(
            flat(),
            n=30,
            kv={"full": flat(0.0), "swa": lambda k, f: 16.0 * 30 * k},
            kv_total=500_000.0,
            kv_page=16,
        )
    )
    kv = res.layers["kv"]
    assert kv.verdict == LEAK and kv.culprit is not None and kv.culprit.pool == "swa"
    full = next(s for s in kv.series if s.pool == "full")
    assert full.verdict == STABLE


def test_flat_nonzero_kv_residue_is_reported_not_a_leak() -> None:
    res = analyse_soak(synth(flat(), kv={"full": lambda k, f: 640.0 * min(1.0, k)}, kv_page=64))
    kv = res.layers["kv"]
    assert kv.verdict == CACHING and kv.explanation == "kv_idle_residue"
    assert "holds 640 tokens at idle" in soak_json(res)["layers"]["kv"]["summary"]


def test_kv_samples_with_running_requests_are_not_settled_levels() -> None:
    # Requests still finishing early in each idle window: the pool is busy there, not leaking.
    recs = synth(flat(), kv={"full": flat(0.0)}, kv_page=64)
    idle_starts = [r.t for r in recs if isinstance(r, Event) and r.name == "idle_start"]
    for r in recs:
        if isinstance(r, MetricsSample) and any(s <= r.t < s + 9.0 for s in idle_starts):
            r.kv[0].running_requests = 1.0
            r.kv[0].used_tokens = 5000.0
    assert analyse_soak(recs).layers["kv"].verdict == STABLE


def test_a_kv_pool_that_is_never_idle_is_undecided_and_says_why() -> None:
    recs = synth(flat(), kv={"full": flat(0.0)}, kv_page=64)
    for r in recs:
        if isinstance(r, MetricsSample):
            r.kv[0].queued_requests = 2.0  # production traffic keeps it busy
    res = analyse_soak(recs)
    assert res.layers["kv"].verdict == INCONCLUSIVE
    assert res.undecided_layers() == {"kv": "never_idle"}


def test_ratio_only_kv_uses_the_pool_size_when_known_and_never_a_2_percent_floor() -> None:
    # The /1 analysis: 0.0096 a round stayed under its 2 %-of-pool floor and was called STABLE.
    recs = synth(flat(), n=30, kv_ratio=lambda k, f: 1920.0 * k / 200_000.0)
    for r in recs:
        if isinstance(r, MetricsSample):
            r.values["max_total_tokens"] = 200_000.0
    kv = analyse_soak(recs).layers["kv"]
    assert kv.verdict == LEAK and kv.rate_per_request == pytest.approx(64.0, rel=0.01)


# --- projection in requests; hours only at a production rate -------------------


def test_hours_only_at_a_stated_production_rate() -> None:
    res = analyse_soak(synth(leak(19.3)), production_rate_rps=2.0)
    p = res.layers["vram"].projection
    assert p is not None and p.production_rate_source == "argument"
    assert p.hours == pytest.approx(p.requests / 7200.0, rel=1e-9)


def test_hours_at_the_servers_own_request_rate_before_the_soak() -> None:
    # Production traffic of 0.25 requests/s seen in the server's counter during the baseline.
    res = analyse_soak(synth(leak(19.3), requests_total=lambda t: 1000.0 + 0.25 * (t - 1000.0)))
    assert res.production_rate_source == "server_counter"
    assert res.production_rate_rps == pytest.approx(0.25, rel=0.05)
    p = res.layers["vram"].projection
    assert p is not None and p.hours == pytest.approx(p.requests / (0.25 * 3600), rel=0.05)


def test_a_server_with_no_traffic_of_its_own_gives_no_hours() -> None:
    res = analyse_soak(synth(leak(19.3), requests_total=lambda t: 1000.0))
    assert res.production_rate_rps is None
    assert res.layers["vram"].projection.hours is None
    assert "hour" not in headline(res)


# --- the headline answers VRAM first and agrees with the table -----------------


def test_device_only_vram_leak_leads_the_headline_before_a_host_leak() -> None:
    # dcgm-exporter (device level, no processes) + a local server whose RSS also leaks.
    res = analyse_soak(
        with_agent(
            synth(
                leak(1.12),
                rounds=5,  # the host leak is decided by live bytes: five rounds
                device_only=True,
                host_level=lambda k, f: 900.0 + 50 * (k + f),
                arenas=lambda k, f: 1,
            ),
            lambda k, f: 100.0 + 50.0 * k,
        )
    )
    assert res.layers["vram"].verdict == LEAK and res.layers["host"].verdict == LEAK
    text = headline(res)
    assert text.startswith("LEAK: VRAM leaks") and "host RAM leaks" in text
    assert text.index("VRAM") < text.index("host RAM")


@pytest.mark.parametrize("case", range(6))
def test_headline_never_contradicts_the_layer_table(case: int) -> None:
    runs = [
        synth(caching(140.0), host_level=lambda k, f: 900.0 + 50 * (k + f)),
        synth(leak(3.0), host_level=flat(900.0)),
        synth(flat(), kv={"full": lambda k, f: 64.0 * 50 * k}),
        synth(leak(2.0), rounds=2),
        synth(caching(140.0), kv={"full": flat(0.0)}, host_level=flat(900.0)),
        _arena_run(),
    ]
    res = analyse_soak(runs[case], {"cpu_count": 4})
    text = headline(res)
    assert text.startswith(res.verdict + ":")
    words = {
        LEAK: "leaks",
        CACHING: "is caching",
        STABLE: "is stable",
        INCONCLUSIVE: "is undecided",
    }
    vram = res.layers["vram"]
    assert text.split(": ", 1)[1].startswith("VRAM " + words[vram.verdict])
    for name, lay in res.layers.items():
        if name != "vram" and lay.verdict == LEAK:
            assert "leaks" in text.split(";", 1)[1]


# --- a server that dies is never healthy --------------------------------------


def _kill_in_round(recs: list[object], rnd: int, *, name: str = SERVER_DIED) -> None:
    """The server dies in the middle of round `rnd`: memory samples of its process stop."""
    start = next(
        r.t
        for r in recs
        if isinstance(r, Event) and r.name == "round_start" and r.data["round"] == rnd
    )
    t_dead = start + 3.0
    recs[:] = [r for r in recs if not (isinstance(r, (GpuSample, HostSample)) and r.t > t_dead)]
    recs.append(
        Event(t=t_dead, wall=t_dead, name=name, data={"reason": "connection refused", "pid": 4242})
    )


@pytest.mark.parametrize("event", [SERVER_DIED, "server_gone"])
def test_a_server_that_dies_mid_run_is_not_healthy(event: str) -> None:
    recs = synth(caching(140.0), rounds=4)
    _kill_in_round(recs, 3, name=event)
    res = analyse_soak(recs)
    assert res.server_died and not res.healthy and res.exit_code == 1
    assert [r.life for r in res.rounds] == [0, 0, -1, -1]
    assert res.undecided == []  # more rounds cannot help a dead server
    d = soak_json(res)
    assert d["server_died"] is True and d["exit_code"] == 1
    assert "the server died (connection refused) during round 3" in d["headline"]
    assert "diagnose" in d["suggestion"]


def test_a_replaced_server_is_analysed_per_life() -> None:
    # Life 1 (pid 4242) caches for 3 rounds; a supervisor restarts it as pid 5151 which leaks.
    recs = synth(caching(140.0), rounds=6)
    start4 = next(
        r.t
        for r in recs
        if isinstance(r, Event) and r.name == "round_start" and r.data["round"] == 4
    )
    for r in recs:
        if isinstance(r, GpuSample) and r.t >= start4:
            k = sum(
                1 for e in recs if isinstance(e, Event) and e.name == "round_end" and e.t <= r.t
            )
            used = 600.0 + 20.0 * 50 * max(0, k - 3)
            r.processes = [ProcessGpuMemory(5151, 0, used, name="python3")]
            r.gpus[0].used_mib = used + 1000.0
    recs.append(
        Event(t=start4, wall=start4, name=SERVER_REPLACED, data={"old_pid": 4242, "new_pid": 5151})
    )
    res = analyse_soak(recs)
    assert res.server_replaced and len(res.lives) == 2
    assert res.lives[0].rounds == [1, 2, 3] and res.lives[1].rounds == [4, 5, 6]
    vram = res.layers["vram"]
    assert vram.verdict == LEAK and vram.life == 1 and vram.culprit.pid == 5151
    assert vram.rate_per_request == pytest.approx(20.0, rel=0.05)


# --- order and NaN ------------------------------------------------------------


def test_records_out_of_order_give_the_same_verdict_and_rate() -> None:
    recs = synth(leak(3.0), noise=0.5)
    ordered = analyse_soak(recs)
    shuffled = list(recs)
    random.Random(7).shuffle(shuffled)
    for lines in (list(reversed(recs)), shuffled):  # reversed: the /1 analysis said INCONCLUSIVE
        res = analyse_soak(lines)
        assert res.verdict == ordered.verdict == LEAK
        assert res.layers["vram"].rate_per_request == pytest.approx(
            ordered.layers["vram"].rate_per_request
        )


def test_nan_and_huge_values_are_skipped_without_numpy_warnings() -> None:
    recs = synth(leak(3.0))
    for i, r in enumerate(recs):
        if isinstance(r, GpuSample) and i % 7 == 0:
            r.processes[0].used_mib = float("nan")
            r.gpus[0].used_mib = float("inf")
    recs.append(HostSample(t=1001.0, wall=1001.0, processes=[HostProcessMemory(1, 1e308, "x")]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = analyse_soak(recs)
        d = soak_json(res)
    assert res.layers["vram"].verdict == LEAK
    json.dumps(d, allow_nan=False)


def test_json_is_schema_2_with_three_layers_and_finite() -> None:
    d = soak_json(
        analyse_soak(synth(leak(3.0), noise=0.5, kv={"full": flat(0.0)}, host_level=flat(900.0)))
    )
    json.dumps(d, allow_nan=False)
    assert d["schema"] == "vramdoctor.soak/2"
    assert set(d["layers"]) == {"vram", "kv", "host"}
    for lay in d["layers"].values():
        assert {
            "verdict",
            "rate_per_request",
            "rate_ci",
            "unit",
            "culprit",
            "evidence",
            "undecided_reason",
            "summary",
            "projection",
        } <= set(lay)
    assert d["verdict"] == "LEAK" and d["culprit"]["layer"] == "vram"
    assert len(d["rounds"]) == 4 and "gpu0/pid4242" in d["rounds"][0]["settled"]
    assert any(s["id"] == "kv/full" and s["unit"] == "tokens" for s in d["series"])


def test_planned_aborts_are_traffic_not_errors() -> None:
    recs = synth(leak(3.0))
    for r in recs:
        if isinstance(r, Event) and r.name == "round_end":
            r.data["outcomes"] = {"ok": 40, "aborted": 10}
            r.data["aborted"], r.data["streamed"] = 10, 10
    res = analyse_soak(recs)
    assert [(x.ok, x.errors, x.reached, x.aborted) for x in res.rounds] == [(50, 0, 50, 10)] * 4
    assert res.layers["vram"].rate_per_request == pytest.approx(3.0, rel=0.02)
    d = soak_json(res)
    assert any("abandoned by the client" in n for n in d["notes"])
    assert "--abort-fraction 0" in d["suggestion"]


def test_no_request_succeeded_is_inconclusive_not_stable() -> None:
    recs = synth(flat())
    for r in recs:
        if isinstance(r, Event) and r.name == "round_end":
            r.data["outcomes"] = {"http_error": 50}
            r.data["errors"] = ["HTTP 404: model not found"]
    res = analyse_soak(recs)
    assert res.verdict == INCONCLUSIVE and res.no_request_succeeded
    assert "no request succeeded" in headline(res) and "404" in headline(res)


def _with_arena_heaps(recs: list[object], writable: Callable[[int], float]) -> list[object]:
    """Give every host sample the arena heaps' writable MiB that /proc/PID/maps shows, as
    `writable(arena count)`."""
    for r in recs:
        if isinstance(r, HostSample):
            for p in r.processes:
                if p.malloc_arenas is not None:
                    p.malloc_arena_writable_mib = writable(p.malloc_arenas)
    return recs


def test_a_one_time_rise_beside_new_arenas_that_cannot_hold_it_does_not_name_them() -> None:
    # A 60 MiB object loaded at the first request while glibc gave the handler
    # threads 3 more arenas whose heaps grew 3 MiB: CACHING, but not "glibc's arenas keep it".
    recs = synth(
        flat(),
        rounds=4,
        n=30,
        host_level=lambda k, f: 20.0 + (62.0 if k else 0.0),
        host_kinds={"anon": lambda k, f: 10.0 + (62.0 if k else 0.0)},
        arenas=lambda k, f: 4 if k else 1,
    )
    res = analyse_soak(_with_arena_heaps(recs, lambda n: 0.3 + 1.0 * (n - 1)), {"cpu_count": 2})
    host = res.layers["host"]
    assert host.verdict == CACHING and host.explanation != "malloc_arenas"
    text = soak_json(res)["layers"]["host"]["summary"]
    assert "arena" not in text and "stayed flat" in text
    # The same rise with arena heaps that grew by as much: the arenas are named.
    recs = synth(
        flat(),
        rounds=4,
        n=30,
        host_level=lambda k, f: 20.0 + (62.0 if k else 0.0),
        host_kinds={"anon": lambda k, f: 10.0 + (62.0 if k else 0.0)},
        arenas=lambda k, f: 4 if k else 1,
    )
    res = analyse_soak(_with_arena_heaps(recs, lambda n: 0.3 + 21.0 * (n - 1)), {"cpu_count": 2})
    assert res.layers["host"].explanation == "malloc_arenas"
    assert "malloc arenas" in soak_json(res)["layers"]["host"]["summary"]


def test_levels_that_swing_are_never_said_to_have_stayed_flat() -> None:
    # A buffer flushed every 70 requests: 32.9, 44.8, 29.3, 41.1, 25.4 MiB.
    levels = [22.0, 32.9, 44.8, 29.3, 41.1, 25.4]
    recs = synth(
        flat(),
        rounds=5,
        n=30,
        host_level=lambda k, f: levels[k],
        host_kinds={"anon": lambda k, f: levels[k] - 10.0},
        arenas=lambda k, f: 4 if k else 1,
    )
    res = analyse_soak(recs, {"cpu_count": 2})
    host = res.layers["host"]
    assert host.verdict == CACHING, host
    text = soak_json(res)["layers"]["host"]["summary"]
    assert "stayed flat" not in text and "moved between" in text and "arena" not in text


def test_an_undecided_port_owner_speaks_for_the_layer_over_a_recycled_worker() -> None:
    # The front keeps 128 KiB/request for 8 rounds (threads come: retention or a
    # leak from outside); a worker forked in round 6 is a step of +32 MiB judged on 2 rounds.
    # The layer names the port owner and its rate, not the two-round worker's growth.
    recs = synth(
        flat(),
        rounds=8,
        n=30,
        host_level=lambda k, f: 20.0 + 3.75 * k,
        host_kinds={"anon": lambda k, f: 10.0 + 3.75 * k},
        arenas=lambda k, f: 4 if k else 1,
    )
    start = [r.t for r in recs if isinstance(r, Event) and r.name == "round_start"][6]
    for r in recs:
        if isinstance(r, HostSample) and r.t >= start:
            r.processes.append(
                HostProcessMemory(5151, 40.0, "python3", "child", rss_anon_mib=30.0, threads=1)
            )
    res = analyse_soak(recs, {"cpu_count": 2})
    host = res.layers["host"]
    assert host.verdict == INCONCLUSIVE and host.main_series == "rss/pid4242", host.main_series
    assert host.reason == "retention_or_leak"
    assert host.rate_per_request == pytest.approx(3.75 / 30, rel=0.05)
