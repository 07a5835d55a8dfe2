"""Soak analysis on synthetic but physical runs: the events and samples a real soak writes.

Each run is built the way the protocol records it (baseline, K rounds of load, an idle window
after each), with memory that behaves like the thing it models: a caching allocator that rises
and plateaus, a leak that grows with every request, transient load peaks that vanish at idle,
measurement noise, a one-time step, a KV page leak that shows only in KV usage.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from vramdoctor.analysis.soak import (
    CACHING,
    INCONCLUSIVE,
    LEAK,
    STABLE,
    Thresholds,
    analyse,
    classify_series,
)
from vramdoctor.model import (
    Event,
    GpuMemory,
    GpuSample,
    HostProcessMemory,
    HostSample,
    MetricsSample,
    ProcessGpuMemory,
)

TOTAL = 81559.0


def synth(
    level: Callable[[int, float], float],
    *,
    rounds: int = 4,
    n: int = 50,
    idle: float = 10.0,
    load: float = 8.0,
    interval: float = 0.5,
    noise: float = 0.0,
    seed: int = 0,
    peak: float = 300.0,
    host_level: Callable[[int, float], float] | None = None,
    kv: Callable[[int, float], float] | None = None,
    requests: list[int] | None = None,
    pid: int = 4242,
) -> list[object]:
    """Records of a soak. level(k, frac) is the settled memory (MiB) after k rounds plus frac of
    the next round; during load a transient `peak` (activations) adds on top and is gone at idle."""
    rng = np.random.default_rng(seed)
    recs: list[object] = []
    t = 1000.0
    reqs = requests or [n] * rounds

    def sample(k: int, frac: float, busy: bool) -> None:
        v = level(k, frac) + (peak if busy else 0.0) + rng.normal(0, noise)
        used = 600.0 + v
        recs.append(GpuSample(t=t, wall=t, source="nvml",
                              gpus=[GpuMemory(0, TOTAL, used + 1000, TOTAL - used - 1000)],
                              processes=[ProcessGpuMemory(pid, 0, used, name="python3")]))
        if host_level is not None:
            recs.append(HostSample(t=t, wall=t, processes=[
                HostProcessMemory(pid, host_level(k, frac) + rng.normal(0, noise / 4), "python3", "server")]))
        if kv is not None:
            recs.append(MetricsSample(t=t, wall=t, flavour="sglang",
                                      values={"kv_usage_ratio": kv(k, frac) + (0.3 if busy else 0.0)}))

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


def caching(size: float, rounds_to_fill: int = 1) -> Callable[[int, float], float]:
    """An allocator cache: fills over the first rounds to `size`, then stays there."""
    return lambda k, f: size * min(1.0, (k + f) / rounds_to_fill)


def leak(per_request: float, n: int = 50, cache: float = 140.0) -> Callable[[int, float], float]:
    return lambda k, f: cache * min(1.0, k + f) + per_request * n * (k + f)


def test_caching_plateau_after_one_round_is_caching() -> None:
    r = analyse(synth(caching(140.0)))
    assert r.verdict == CACHING
    assert r.leak_mib_per_request is None
    proc = next(s for s in r.series if s.key == "gpu0/pid4242")
    assert proc.verdict == CACHING
    assert proc.growth == pytest.approx(140.0, abs=1.0)
    assert "flat" in r.sentence


def test_caching_that_needs_two_rounds_is_not_a_leak() -> None:
    r = analyse(synth(caching(226.0, rounds_to_fill=2), noise=1.0))
    assert r.verdict == CACHING


def test_linear_leak_is_leak_with_the_rate_and_the_culprit() -> None:
    r = analyse(synth(leak(19.3)))
    assert r.verdict == LEAK
    assert r.leak_mib_per_request == pytest.approx(19.3, rel=0.02)
    assert r.culprit["pid"] == 4242
    assert r.culprit["gpu"] == 0
    assert r.culprit["layer"] == "allocator"
    # 50 requests in 8 s of load: 22500 requests/hour while sending.
    assert r.requests_per_hour == pytest.approx(50 / 8 * 3600, rel=0.01)
    assert r.leak_mib_per_hour == pytest.approx(19.3 * 22500, rel=0.02)
    assert r.hours_to_oom == pytest.approx(r.free_mib / r.leak_mib_per_hour, rel=1e-6)
    assert r.free_mib is not None and r.free_mib < TOTAL


def test_small_leak_under_noise_is_found() -> None:
    # 0.5 MiB/request x 50 = 25 MiB a round, noise sigma 2 MiB inside the idle windows.
    r = analyse(synth(leak(0.5), noise=2.0, seed=3))
    assert r.verdict == LEAK
    assert r.leak_mib_per_request == pytest.approx(0.5, rel=0.25)


@pytest.mark.parametrize("seed", range(5))
def test_noise_alone_is_stable(seed: int) -> None:
    r = analyse(synth(lambda k, f: 0.0, noise=1.0, seed=seed))
    assert r.verdict == STABLE


def test_one_time_step_is_not_a_leak() -> None:
    # A new size class cached in round 3 (e.g. a larger batch), flat afterwards.
    r = analyse(synth(lambda k, f: 140.0 * min(1.0, k + f) + (90.0 if k + f >= 2.5 else 0.0), rounds=5))
    assert r.verdict != LEAK
    assert r.verdict == CACHING


def test_decaying_growth_is_not_a_leak() -> None:
    # Approaching a plateau: increments 80, 40, 20, 10 MiB. Not proportional to requests.
    r = analyse(synth(lambda k, f: 160.0 * (1 - 0.5 ** (k + f)), rounds=5))
    assert r.verdict in (CACHING, INCONCLUSIVE)
    assert r.verdict != LEAK


def test_two_rounds_of_growth_are_inconclusive_and_say_what_to_run() -> None:
    r = analyse(synth(leak(2.0), rounds=2))
    assert r.verdict == INCONCLUSIVE
    assert r.suggestion is not None and "--rounds" in r.suggestion


def test_host_ram_leak_is_reported_as_host_memory() -> None:
    recs = synth(caching(140.0), host_level=lambda k, f: 900.0 + 1.0 * 50 * (k + f))
    recs.append({"kind": "host_memory", "t": 1.0, "wall": 1.0, "total_mib": 64000.0, "available_mib": 32000.0})
    raw = [r for r in recs if isinstance(r, dict)]
    r = analyse([x for x in recs if not isinstance(x, dict)], raw_host=raw)
    assert r.verdict == LEAK
    assert r.culprit["layer"] == "host_ram"
    assert r.culprit["series"] == "rss/pid4242"
    assert r.leak_mib_per_request == pytest.approx(1.0, rel=0.05)
    assert r.free_mib == 32000.0
    assert "host RAM" in r.sentence
    gpu = next(s for s in r.series if s.key == "gpu0/pid4242")
    assert gpu.verdict == CACHING


def test_kv_usage_creeping_at_idle_is_a_kv_page_leak() -> None:
    # VRAM is flat (the KV pool is preallocated); KV usage at idle creeps up 0.04 a round.
    r = analyse(synth(lambda k, f: 0.0, kv=lambda k, f: 0.04 * (k + f)))
    assert r.verdict == LEAK
    assert r.culprit["layer"] == "kv_pages"
    assert r.hours_to_oom is not None and r.hours_to_oom > 0


def test_kv_usage_returning_to_zero_is_stable() -> None:
    r = analyse(synth(lambda k, f: 0.0, kv=lambda k, f: 0.0))
    assert r.verdict == STABLE


def test_json_has_the_schema_keys_and_is_finite() -> None:
    r = analyse(synth(leak(3.0), noise=0.5))
    d = r.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert d["schema"] == "vramdoctor.soak/1"
    for key in ("verdict", "leak_mib_per_request", "leak_mib_per_hour", "hours_to_oom", "culprit",
                "rounds", "series"):
        assert key in d
    assert set(d["culprit"]) >= {"pid", "name", "gpu", "layer"}
    assert len(d["rounds"]) == 4
    assert d["rounds"][0]["requests"] == 50
    assert "gpu0/pid4242" in d["rounds"][0]["settled_mib"]
    assert "NaN" not in text


def test_short_last_round_does_not_fake_a_plateau() -> None:
    # Interrupted in round 4 after 3 requests: the last increment is tiny because few requests
    # reached the server, not because growth stopped.
    r = analyse(synth(lambda k, f: 2.0 * 50 * min(k + f, 3) + (2.0 * 3 if k + f > 3 else 0.0),
                      requests=[50, 50, 50, 3]))
    assert r.verdict == LEAK


def test_classify_needs_growth_above_the_floor() -> None:
    c = classify_series(100.0, [100.5, 101.0, 101.4, 101.9], [50, 100, 150, 200], [[1.0]] * 4,
                        floor=2.0, th=Thresholds())
    assert c["verdict"] == STABLE
    c = classify_series(100.0, [100.5, 101.0, 101.4, 101.9], [50, 100, 150, 200], [[1.0]] * 4,
                        floor=0.1, th=Thresholds())
    assert c["verdict"] == LEAK


def test_stray_context_is_noted() -> None:
    recs = synth(caching(140.0))
    for r in recs:
        if isinstance(r, GpuSample):
            r.gpus.append(GpuMemory(1, TOTAL, 1100.0, TOTAL - 1100.0))
            r.processes.append(ProcessGpuMemory(4242, 1, 512.0, name="python3"))
    res = analyse(recs)
    assert any("stray CUDA context" in n and "GPU 1" in n for n in res.notes)


def test_cli_default_floor_is_the_analysis_default() -> None:
    from vramdoctor.cli.soak import MIN_GROWTH_MIB

    assert Thresholds().min_growth_mib == MIN_GROWTH_MIB


def test_allocator_leak_with_kv_back_to_zero_says_it_is_not_kv_pages() -> None:
    r = analyse(synth(leak(3.0), kv=lambda k, f: 0.0))
    assert r.verdict == LEAK and r.culprit["layer"] == "allocator"
    assert "not KV pages" in r.sentence


def test_big_process_rss_jitter_is_not_a_leak_but_a_big_rss_leak_is() -> None:
    # A 4 GiB API-server process whose settled RSS steps up by 3-6 MiB a round at random
    # (heap jitter), and the same process leaking 1 MiB per request.
    steps = [0.0, 0.0, 4.0, 7.5, 13.0]
    jitter = lambda k, f: 4096.0 + steps[min(int(k + f), 4)]  # noqa: E731
    r = analyse(synth(lambda k, f: 0.0, host_level=jitter))
    rss = next(s for s in r.series if s.kind == "rss")
    assert rss.threshold == pytest.approx(4096.0 * 0.0025)
    assert rss.verdict != LEAK
    r = analyse(synth(lambda k, f: 0.0, host_level=lambda k, f: 4096.0 + 50 * (k + f)))
    assert r.verdict == LEAK and r.culprit["layer"] == "host_ram"


def test_a_process_that_appears_mid_run_is_a_step_from_zero() -> None:
    # A second process (a new CUDA context, 512 MiB) shows up on GPU 0 during round 2 and
    # stays: a one-time step, not a leak, and not an unknown either.
    recs = synth(caching(140.0), rounds=5)
    start = next(r.t for r in recs if isinstance(r, Event) and r.name == "round_start" and r.data["round"] == 2)
    for r in recs:
        if isinstance(r, GpuSample) and r.t >= start:
            r.processes.append(ProcessGpuMemory(777, 0, 512.0, name="python3"))
    res = analyse(recs)
    s = next(s for s in res.series if s.key == "gpu0/pid777")
    assert s.baseline == 0.0 and s.settled[0] == 0.0 and s.settled[1] == 512.0
    assert s.verdict == CACHING
    assert res.verdict == CACHING
