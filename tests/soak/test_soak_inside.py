"""Evidence from inside the server's processes decides:
runs built the way soak records them (tests/soak/test_soak_analysis.synth), with the
agent's InsideSample at the end of the baseline and of every idle window, holding what each
allocator counts as it does in a real process:

- glibc retention (measured on an H200 host): bytes in use level off after round 2 while the
  free bytes glibc keeps and RssAnon keep growing, arenas 4 -> 36;
- a real host leak through malloc: bytes in use grow 256 KiB per request;
- a leak of small Python objects (vLLM #44175: a list appended on every block): pymalloc's
  arenas are mmap'd outside glibc's counters, so bytes in use stay flat while Python's
  allocated blocks and RssAnon grow;
- PyTorch's caching allocator settling: live tensors +224 KiB,
  reserved +74, +70, +28, +14 MiB; NVML follows the reserve;
- a live tensor leak of 1 MiB per request; memory outside the allocator (NCCL-style) growing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_soak_analysis import flat, synth

from vramdoctor.samples import MIB, Event, GpuSample, InsideSample
from vramdoctor.soak.analysis import analyse_soak
from vramdoctor.soak.report import headline, soak_json

PID = 4242
N = 50  # requests per round in synth


def add_inside(recs: list[object], pid: int, at: Callable[[int], dict[str, object]]) -> None:
    """One InsideSample per idle-window end (and the baseline's end): `at(round)` gives its
    parts (cuda, glibc, python, pinned) as the agent writes them (bytes)."""
    for e in [r for r in recs if isinstance(r, Event)]:
        if e.name in ("idle_end", "baseline_end"):
            rnd = int(e.data.get("round", 0))
            recs.append(InsideSample(t=e.t, wall=e.wall, pid=pid, round=rnd, **at(rnd)))  # type: ignore[arg-type]


def glibc(in_use_mib: float, kept_mib: float, mmap_mib: float = 0.0) -> dict[str, object]:
    """mallinfo2 as the agent reports it: in use = uordblks + hblkhd, kept = fordblks,
    arena = uordblks + fordblks (heap bytes from the system), mmap = hblkhd."""
    heap_in_use = in_use_mib - mmap_mib
    return {
        "in_use_bytes": int(in_use_mib * MIB),
        "free_kept_bytes": int(kept_mib * MIB),
        "mmap_bytes": int(mmap_mib * MIB),
        "arena_bytes": int((heap_in_use + kept_mib) * MIB),
        "keepcost": 0,
        "call_ms": 0.02,
    }


def python(blocks: float) -> dict[str, object]:
    return {"allocated_blocks": int(blocks), "tracing": False}


# --- host RAM ---------------------------------------------------------------------------------

# Retention as measured: bytes in use 134, 214, 321, 321, 321 MiB; kept 0, 6, 37, 82, 106
# MiB; RssAnon 8 -> 693 MiB, linear over the rounds (the rest of it outside malloc's counters:
# thread stacks, Python's arenas, libraries' mappings); arenas 4 -> 36.
IN_USE = [2.0, 134.0, 214.0, 321.0, 321.0, 321.0, 321.0]
KEPT = [0.0, 6.0, 20.0, 37.0, 82.0, 106.0, 126.0]


def _retention_run() -> list[object]:
    def anon(k: int, f: float) -> float:
        return 8.0 + 114.0 * k

    recs = synth(
        flat(),
        rounds=6,
        host_level=lambda k, f: 350.0 + anon(k, f),
        host_kinds={"anon": anon, "file": flat(300.0), "shmem": flat(50.0)},
        arenas=lambda k, f: 4 + 6 * k,
    )
    add_inside(recs, PID, lambda k: {"glibc": glibc(IN_USE[k], KEPT[k]), "python": python(250_000)})
    return recs


def test_retention_outside_is_undecided_and_inside_is_caching_named() -> None:
    # Without the agent: never LEAK (the new arenas' heaps can hold it: malloc arenas, or
    # retention or a leak). With it: CACHING, arena retention, decided inside.
    outside = analyse_soak([r for r in _retention_run() if not isinstance(r, InsideSample)])
    assert outside.layers["host"].verdict != "LEAK"
    assert outside.layers["host"].decided_by == "rounds"
    res = analyse_soak(_retention_run(), {"cpu_count": 16})
    host = res.layers["host"]
    assert host.verdict == "CACHING" and host.reason == "live_flat"
    assert host.explanation == "arena_retention" and host.decided_by == "inside_glibc"
    assert res.exit_code == 0 and res.undecided == []
    text = soak_json(res)["layers"]["host"]["summary"]
    assert "inside the process" in text and "flat" in text


def test_a_malloc_leak_is_found_in_five_rounds_with_the_agent() -> None:
    # 256 KiB per request kept through malloc, 5 rounds of 50: live bytes grow 12.5 MiB a round.
    # Four rounds are not enough for live bytes alone: a cache that fills at a fixed rate is as
    # linear until it is full (seen on an H200: 9.0 MiB a round for four rounds, then flat).
    recs = synth(
        flat(),
        rounds=5,
        host_level=lambda k, f: 400.0 + 12.5 * k,
        host_kinds={"anon": lambda k, f: 60.0 + 12.5 * k},
        arenas=lambda k, f: 2 + k,  # threads come: from outside this is retention or a leak
    )
    add_inside(recs, PID, lambda k: {"glibc": glibc(40.0 + 12.5 * k, 3.0), "python": python(2e5)})
    res = analyse_soak(recs)
    host = res.layers["host"]
    assert host.verdict == "LEAK" and host.reason == "live_grew"
    assert host.decided_by == "inside_glibc" and res.exit_code == 1
    assert host.rate_mib_per_request == pytest.approx(0.25, rel=0.02)
    assert host.culprit is not None and host.culprit.pid == PID
    assert "bytes in use by malloc" in soak_json(res)["layers"]["host"]["summary"]


def test_python_objects_that_grow_outside_malloc_are_a_leak_not_retention() -> None:
    # pymalloc's arenas are outside mallinfo2: bytes in use flat, allocated blocks +30,000 a
    # round, RssAnon +8 MiB a round.
    recs = synth(
        flat(),
        rounds=5,
        host_level=lambda k, f: 500.0 + 8.0 * k,
        host_kinds={"anon": lambda k, f: 150.0 + 8.0 * k},
        arenas=lambda k, f: 3,
    )
    add_inside(
        recs, PID, lambda k: {"glibc": glibc(90.0, 10.0), "python": python(400_000 + 30_000 * k)}
    )
    host = analyse_soak(recs).layers["host"]
    assert host.verdict == "LEAK" and host.reason == "live_grew"
    assert host.decided_by == "inside_python"
    assert host.rate_mib_per_request == pytest.approx(8.0 / N, rel=0.05)  # RssAnon's rate


def test_python_blocks_that_grow_while_the_rss_stays_flat_are_no_leak() -> None:
    # Seen on the H200 (transformers serve, 2026-12-02): glibc's bytes in use and the RSS flat
    # after round 1, Python's blocks +1,200 a round (about 100 a request: at most 50 KiB a
    # request at 512 bytes a block). A count is not bytes: with nothing of the process's
    # memory growing it cannot make the layer a LEAK, and there is no rate to give.
    recs = synth(
        flat(),
        rounds=6,
        host_level=lambda k, f: 900.0 if k == 0 else 1500.0,
        host_kinds={"anon": lambda k, f: 300.0 if k == 0 else 800.0},
        arenas=lambda k, f: 25,
    )
    add_inside(
        recs,
        PID,
        lambda k: {
            "glibc": glibc(229.0 if k == 0 else 896.5, 7.0),
            "python": python(2_117_168 + (3_830 + 1_200 * (k - 1) if k else 0)),
        },
    )
    host = analyse_soak(recs).layers["host"]
    assert host.verdict in ("CACHING", "STABLE"), (host.verdict, host.reason)
    assert host.decided_by == "inside_glibc"
    # The same blocks beside an RSS that grows 8 MiB a round are Python's objects growing.
    recs = synth(
        flat(),
        rounds=6,
        host_level=lambda k, f: 900.0 + 8.0 * k,
        host_kinds={"anon": lambda k, f: 300.0 + 8.0 * k},
        arenas=lambda k, f: 25,
    )
    add_inside(
        recs, PID, lambda k: {"glibc": glibc(896.5, 7.0), "python": python(2e6 + 16_000 * k)}
    )
    host = analyse_soak(recs).layers["host"]
    assert host.verdict == "LEAK" and host.decided_by == "inside_python"
    assert host.rate_mib_per_request == pytest.approx(8.0 / N, rel=0.05)


SUCCESSOR = 6161  # a handover's successor: started beside the server, takes its socket later


def test_a_successor_starting_beside_the_server_is_judged_in_its_own_life() -> None:
    # Seen on the H200 (reference server, handover restart, 2026-12-02): the successor started
    # in round 1 as the server's child and read 103, 129, 151 MiB in use while it imported and
    # set up CUDA; it took the socket after round 4. Its start-up grows with time, not with the
    # old life's requests: that life is judged on the old server alone (flat: STABLE).
    recs = synth(
        flat(),
        rounds=6,
        host_level=flat(400.0),
        host_kinds={"anon": flat(150.0)},
        arenas=lambda k, f: 2,
    )
    end4 = next(
        r.t for r in recs if isinstance(r, Event) and r.name == "idle_end" and r.data["round"] == 4
    )
    add_inside(
        recs,
        PID,
        lambda k: {"glibc": glibc(90.0, 2.0), "python": python(400_000)},
    )
    recs = [r for r in recs if not (isinstance(r, InsideSample) and r.t > end4)]
    marks = len(recs)
    add_inside(
        recs,
        SUCCESSOR,
        lambda k: {
            "glibc": glibc(80.0 + 24.0 * k if k <= 4 else 176.0, 4.0),
            "python": python(4e5 * min(k, 4)),
        },
    )
    recs[marks:] = [r for r in recs[marks:] if isinstance(r, InsideSample) and r.round >= 1]
    recs.append(
        Event(
            t=end4 - 0.1,
            wall=end4 - 0.1,
            name="server_replaced",
            data={"old_pid": PID, "new_pid": SUCCESSOR},
        )
    )
    res = analyse_soak(recs)
    assert res.server_replaced and len(res.lives) == 2
    host = res.layers["host"]
    assert host.verdict != "LEAK", (host.verdict, host.reason, host.culprit)
    life0 = [s for s in res.series if s.life == 0 and s.pid == SUCCESSOR]
    assert life0 == []  # the successor's series belong to its own life


def test_growth_beyond_what_glibc_holds_is_undecided_until_python_is_read() -> None:
    # glibc in use and kept flat, RssAnon +8 MiB a round outside them: Python's objects (their
    # arenas are outside glibc's counters) decide; unread, the growth is undecided.
    recs = synth(
        flat(),
        rounds=5,
        host_level=lambda k, f: 500.0 + 8.0 * k,
        host_kinds={"anon": lambda k, f: 150.0 + 8.0 * k},
        arenas=lambda k, f: 3,
    )
    bare = list(recs)
    add_inside(recs, PID, lambda k: {"glibc": glibc(90.0, 10.0)})
    host = analyse_soak(recs).layers["host"]
    assert host.verdict == "INCONCLUSIVE" and host.reason == "outside_malloc"
    # With Python's blocks read and flat, nothing live grows: kept memory, not a leak.
    add_inside(bare, PID, lambda k: {"glibc": glibc(90.0, 10.0), "python": python(400_000)})
    host = analyse_soak(bare).layers["host"]
    assert host.verdict == "CACHING" and host.reason == "live_flat"


def test_without_glibc_counters_the_outside_rule_stands() -> None:
    # jemalloc preloaded: the agent reports glibc None; Python's blocks flat cannot say more.
    recs = _retention_run()
    for r in recs:
        if isinstance(r, InsideSample):
            r.glibc = None
            r.error = "malloc is replaced by libjemalloc.so.2"
    host = analyse_soak(recs).layers["host"]
    assert host.verdict != "LEAK" and host.decided_by == "rounds"


def test_live_bytes_that_fill_at_a_fixed_rate_are_no_leak_in_four_rounds() -> None:
    # Seen on the H200 (reference retention server, thread per connection, 2026-12-02): glibc's
    # bytes in use grew exactly 9.0 MiB a round for four rounds, then stopped at 389 MiB. Four
    # rounds of a cache filling at a fixed rate are as linear as a leak: not a LEAK (the
    # adaptive rounds go on); the rounds after it, flat, make it caching.
    in_use = [349.0, 358.0, 367.0, 376.0, 385.0, 389.1, 389.1, 389.1, 389.1]

    def run(rounds: int) -> object:
        recs = synth(
            flat(),
            rounds=rounds,
            host_level=lambda k, f: 900.0 + 40.0 * min(k, 5),
            host_kinds={"anon": lambda k, f: 400.0 + 40.0 * min(k, 5)},
            arenas=lambda k, f: 4 + 4 * min(k, 5),
        )
        add_inside(
            recs, PID, lambda k: {"glibc": glibc(in_use[k], 20.0 * k), "python": python(4e5)}
        )
        return analyse_soak(recs).layers["host"]

    assert run(4).verdict == "INCONCLUSIVE"
    host = run(8)
    assert host.verdict == "CACHING" and host.decided_by == "inside_glibc", host
    # And a leak under a cache that fills (+12 MiB a round while it fills, +3 after: the
    # reference host-leak server on the H200) is found at the leak's own rate.
    leak_in_use = [349.1, 361.2, 373.2, 385.2, 397.2, 404.2, 407.2, 410.2, 413.2, 416.2]
    recs = synth(
        flat(),
        rounds=9,
        host_level=lambda k, f: 900.0 + 30.0 * k,
        host_kinds={"anon": lambda k, f: 400.0 + 30.0 * k},
        arenas=lambda k, f: 4 + 4 * min(k, 5),
    )
    add_inside(recs, PID, lambda k: {"glibc": glibc(leak_in_use[k], 20.0), "python": python(4e5)})
    host = analyse_soak(recs).layers["host"]
    assert host.verdict == "LEAK" and host.decided_by == "inside_glibc", host
    assert host.rate_mib_per_request == pytest.approx(3.0 / N, rel=0.05)


HELPER = 5353  # a helper daemonised out of the port owner's tree (double fork + setsid)


def _helper_run(helper_in_use: Callable[[int], float]) -> list[object]:
    """The port owner (PID) flat from outside and inside; a helper the host sampler never saw
    (outside the tree) reports through the run's agent directory: glibc's bytes in use as
    `helper_in_use(round)` MiB (128 KiB per request kept in the daemon)."""
    recs = synth(
        flat(),
        rounds=5,
        host_level=flat(60.0),
        host_kinds={"anon": flat(20.0)},
        arenas=lambda k, f: 1,
    )
    add_inside(recs, PID, lambda k: {"glibc": glibc(4.0, 0.5), "python": python(70_000)})
    marks = len(recs)
    add_inside(
        recs, HELPER, lambda k: {"glibc": glibc(helper_in_use(k), 0.2), "python": python(65_000)}
    )
    for r in recs[marks:]:
        if isinstance(r, InsideSample):
            r.program = "helper_daemon.py"
    return recs


def test_a_helper_outside_the_tree_that_reports_inside_evidence_decides_the_host_layer() -> None:
    # The daemon's leak, measured by the agent inside it, decides: LEAK, never STABLE.
    res = analyse_soak(_helper_run(lambda k: 3.2 + 0.125 * N * k))
    host = res.layers["host"]
    assert host.verdict == "LEAK" and host.reason == "live_grew"
    assert host.decided_by == "inside_glibc" and res.exit_code == 1
    assert host.rate_mib_per_request == pytest.approx(0.125, rel=0.02)
    assert host.culprit is not None and host.culprit.pid == HELPER
    assert host.culprit.name == "helper_daemon.py"
    assert f"pid {HELPER} (helper_daemon.py)" in soak_json(res)["layers"]["host"]["summary"]


def test_a_flat_helper_outside_the_tree_leaves_the_host_layer_as_it_was() -> None:
    res = analyse_soak(_helper_run(lambda k: 3.2))
    assert res.layers["host"].verdict == "STABLE" and res.exit_code == 0


# --- VRAM -------------------------------------------------------------------------------------

SETTLING = [0.0, 74.0, 144.0, 172.0, 186.0, 193.0]  # reserved growth: fragmentation settling


def _vram_run(
    *, live: Callable[[int], float], reserved: Callable[[int], float], nvml: Callable[[int], float]
) -> list[object]:
    recs = synth(lambda k, f: nvml(k), rounds=5, peak=40.0)
    add_inside(
        recs,
        PID,
        lambda k: {
            "cuda": [
                {
                    "device": 0,
                    "allocated_bytes": int(live(k) * MIB),
                    "reserved_bytes": int(reserved(k) * MIB),
                    "active_bytes": int(live(k) * MIB),
                    "inactive_split_bytes": int(0.7 * (reserved(k) - live(k)) * MIB),
                }
            ]
        },
    )
    return recs


def test_allocator_slack_that_settles_with_live_tensors_flat_is_caching() -> None:
    # The caching allocator settling: live +224 KiB, slack +74, +70, +28, +14 MiB; never LEAK.
    recs = _vram_run(
        live=lambda k: 300.0 + (0.22 if k else 0.0),
        reserved=lambda k: 320.0 + SETTLING[k],
        nvml=lambda k: 320.0 + SETTLING[k],
    )
    res = analyse_soak(recs)
    vram = res.layers["vram"]
    assert vram.verdict == "CACHING" and vram.decided_by == "inside_cuda"
    assert vram.explanation in ("fragmentation", "allocator_cache")
    assert res.verdict == "CACHING" and res.exit_code == 0
    assert "live tensors" in soak_json(res)["layers"]["vram"]["summary"]


def test_live_tensors_that_grow_are_a_leak_at_their_own_rate() -> None:
    recs = _vram_run(
        live=lambda k: 300.0 + 1.0 * N * k,
        reserved=lambda k: 320.0 + 2.0 * ((1.0 * N * k + 1) // 2),
        nvml=lambda k: 320.0 + 2.0 * ((1.0 * N * k + 1) // 2),
    )
    vram = analyse_soak(recs).layers["vram"]
    assert vram.verdict == "LEAK" and vram.reason == "live_grew"
    assert vram.rate_per_request == pytest.approx(1.0, rel=0.01)
    assert (
        vram.culprit is not None and vram.culprit.pid == PID and vram.culprit.cause == "allocator"
    )


def test_memory_outside_the_caching_allocator_is_judged_on_its_own() -> None:
    # Reserve and live flat after round 1; NVML grows 20 MiB a round (NCCL buffers, a
    # extension's own cudaMalloc): the allocator's counters cannot excuse it.
    recs = _vram_run(
        live=lambda k: 300.0,
        reserved=lambda k: 320.0 + (40.0 if k else 0.0),
        nvml=lambda k: 320.0 + (40.0 if k else 0.0) + 20.0 * k,
    )
    vram = analyse_soak(recs).layers["vram"]
    assert vram.verdict == "LEAK" and vram.culprit is not None
    assert vram.culprit.cause == "outside_allocator"
    assert vram.rate_per_request == pytest.approx(20.0 / N, rel=0.02)


def test_headline_names_the_evidence_that_decided() -> None:
    res = analyse_soak(_retention_run())
    assert headline(res).startswith("CACHING:")
    assert soak_json(res)["layers"]["host"]["decided_by"] == "inside_glibc"


def test_gpu_samples_are_untouched_by_inside_evidence() -> None:
    recs = _vram_run(live=lambda k: 300.0, reserved=lambda k: 320.0, nvml=lambda k: 320.0)
    assert sum(isinstance(r, GpuSample) for r in recs) > 0
    assert analyse_soak(recs).layers["vram"].verdict == "STABLE"
