"""The reference server's host-memory modes keep their truth, checked from inside the process
(glibc's own mallinfo2 counters and /proc/self/status in GET /reference/info) under real
traffic: real threads, real PIL decoding, real malloc. These are the servers soak and watch are
judged against, so their physics must hold whatever the analysis says."""

from __future__ import annotations

import time

import pytest
from support.refserver import MIB, RefProc, Traffic

pytestmark = pytest.mark.skipif(
    not __import__("sys").platform.startswith("linux"), reason="glibc counters: Linux only"
)


def _rounds(srv: RefProc, n_rounds: int, per_round: int = 30) -> list[dict]:
    traffic = Traffic(srv.url)
    out = []
    for _ in range(n_rounds):
        assert set(traffic.round(per_round)) == {200}
        time.sleep(0.3)  # idle: every request's buffers are freed
        out.append(srv.info())
    return out


def _mib(rows: list[dict], path: tuple[str, str]) -> list[float]:
    return [r[path[0]][path[1]] / MIB for r in rows]


def test_retention_in_use_flat_while_rss_and_kept_free_bytes_grow() -> None:
    """Thread per connection, PNGs of varying size, glibc defaults: glibc's bytes in use are
    flat once the bounded feature cache is full, while the free bytes it keeps and RssAnon
    climb far beyond them: allocator retention that looks like a leak from outside. (How fast
    it climbs depends on the threads' interleaving: in one round or over several.)"""
    with RefProc("retention") as srv:
        start = srv.info()
        rows = _rounds(srv, 6)
    in_use = _mib(rows, ("malloc", "in_use_bytes"))
    kept = _mib(rows, ("malloc", "free_kept_bytes"))
    anon = _mib(rows, ("proc", "rss_anon_bytes"))
    assert rows[-1]["truth"]["layers"]["host"]["verdict"] == "CACHING"
    assert max(in_use[1:]) - min(in_use[1:]) < 2.0, in_use  # live bytes: flat
    assert in_use[-1] < 60  # the 40 MiB cache and the interpreter
    grown_anon = anon[-1] - start["proc"]["rss_anon_bytes"] / MIB
    grown_kept = kept[-1] - start["malloc"]["free_kept_bytes"] / MIB
    assert grown_anon > 150, anon  # outside: a large growth, no live bytes behind it
    assert grown_kept > 100, kept  # the growth is what glibc keeps
    assert grown_anon > 3 * (in_use[-1] - start["malloc"]["in_use_bytes"] / MIB)
    assert rows[-1]["requests"] == 6 * 30


def test_retention_under_malloc_arena_max_2_keeps_far_less_and_has_no_trend() -> None:
    """The same server and traffic with MALLOC_ARENA_MAX=2: the same bytes in use, RssAnon
    without a trend and far below the default's (the arenas were what kept it)."""
    levels = {}
    for name, env in (("default", {}), ("capped", {"MALLOC_ARENA_MAX": "2"})):
        with RefProc("retention", env=env) as srv:
            levels[name] = _rounds(srv, 6)
    capped = levels["capped"]
    in_use = _mib(capped, ("malloc", "in_use_bytes"))
    anon = _mib(capped, ("proc", "rss_anon_bytes"))
    default_anon = _mib(levels["default"], ("proc", "rss_anon_bytes"))
    assert max(in_use[1:]) - min(in_use[1:]) < 2.0, in_use
    assert in_use[-1] == pytest.approx(
        _mib(levels["default"], ("malloc", "in_use_bytes"))[-1], abs=3
    )
    # Far below the default's (just below). Its own shape under load is not asserted: with the
    # suite 4 at a time on 2 cores it rose by 66 MiB of jitter in one run and crept up by
    # 0.01-11 MiB a round after a 133 MiB rise in another (CI, 2026-12-02).
    assert default_anon[-1] - anon[-1] > 100, (default_anon, anon)
    # Two arenas at most, but one arena chains another 64 MiB heap when its heap fills (and a
    # thread stack can fall on a 64 MiB boundary): fewer heaps than the default's, not <= 2
    # (CI read 3, 2026-12-02).
    assert capped[-1]["arena_heaps"] < levels["default"][-1]["arena_heaps"], (
        capped[-1]["arena_heaps"],
        levels["default"][-1]["arena_heaps"],
    )


def test_host_leak_grows_glibc_in_use_bytes_by_its_rate() -> None:
    """The retention server plus a real malloc leak: in-use bytes grow 256 KiB per request."""
    with RefProc("host-leak", "--leak-kib", "256") as srv:
        rows = _rounds(srv, 4)
    in_use = [r["malloc"]["in_use_bytes"] for r in rows]
    per_request = (in_use[-1] - in_use[1]) / (2 * 30)  # rounds 3 and 4
    assert per_request == pytest.approx(256 * 1024, rel=0.1)
    assert rows[-1]["leak_bytes_per_request"] == 256 * 1024
    host = rows[-1]["truth"]["layers"]["host"]
    assert host["verdict"] == "LEAK" and host["bytes_per_request"] == 256 * 1024
    assert rows[-1]["kept_bytes"] == 4 * 30 * 256 * 1024


def test_host_leak_fixed_by_the_servers_env_knob() -> None:
    """REFERENCE_FREE_REQUEST_BUFFERS=1 releases what it would keep: in use flat, truth says so."""
    env = {"REFERENCE_FREE_REQUEST_BUFFERS": "1"}
    with RefProc("host-leak", "--leak-kib", "256", env=env) as srv:
        rows = _rounds(srv, 3)
    in_use = _mib(rows, ("malloc", "in_use_bytes"))
    assert max(in_use[1:]) - min(in_use[1:]) < 2.0
    assert rows[-1]["kept_bytes"] == 0 and rows[-1]["release_buffers"] is True
    assert rows[-1]["truth"]["layers"]["host"]["verdict"] != "LEAK"


def test_converging_cache_adds_a_shrinking_share_each_round_up_to_its_bound() -> None:
    """Tiles admitted on a sampled miss: each round adds less, towards the bound; the live
    bytes (glibc in use) follow the cache."""
    with RefProc("converging", "--admit-probability", "0.05") as srv:
        rows = _rounds(srv, 7)
    cache = [r["cache_bytes"] / MIB for r in rows]
    bound = rows[-1]["cache_bound_bytes"] / MIB
    steps = [b - a for a, b in zip([0.0, *cache], cache, strict=False)]
    assert bound == pytest.approx(112, abs=1)  # 64 + 48 tiles of 1 MiB (448x448, 448x336)
    assert 0 < cache[-1] <= bound
    # geometric: the first rounds add most, the last ones little; never more than before by much
    assert sum(steps[:2]) > 2 * sum(steps[-2:]), steps
    assert steps[-1] < steps[0] / 2, steps
    in_use = _mib(rows, ("malloc", "in_use_bytes"))
    assert (in_use[-1] - in_use[0]) == pytest.approx(cache[-1] - cache[0], abs=6)
    assert rows[-1]["truth"]["layers"]["host"]["verdict"] == "CACHING"


def test_background_thread_grows_in_idle_time_not_per_request() -> None:
    """No requests at all: the background allocator still grows the heap at its rate."""
    with RefProc("background", "--background-kib-per-s", "2048") as srv:
        first = srv.info()
        time.sleep(3.0)
        second = srv.info()
    grown = second["background_bytes"] - first["background_bytes"]
    seconds = second["background_seconds"] - first["background_seconds"]
    assert second["requests"] == 0
    assert grown / seconds == pytest.approx(2048 * 1024, rel=0.15)
    anon = second["proc"]["rss_anon_bytes"] - first["proc"]["rss_anon_bytes"]
    assert anon == pytest.approx(grown, rel=0.3)
    in_use = second["malloc"]["in_use_bytes"] - first["malloc"]["in_use_bytes"]
    assert in_use == pytest.approx(grown, rel=0.15)
    host = second["truth"]["layers"]["host"]
    assert host["verdict"] == "LEAK" and host["growth"] == "time"
    assert host["bytes_per_hour"] == 2048 * 1024 * 3600
