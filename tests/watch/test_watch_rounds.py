"""What counts in an idle window (watch/rounds.py): only what /metrics confirms was idle.

A sample, or an agent's inside record, counts in an idle window only when it was taken while
the server was idle by its /metrics before and after it, and only once the stretch settled
(`settle_s` after it began). Traffic that resumed between two scrapes must not reach the
judge: the host's and the allocators' counters then hold the buffers of requests in flight.
"""

from __future__ import annotations

from vramdoctor.samples import HostProcessMemory, HostSample, InsideSample, MetricsSample
from vramdoctor.watch.rounds import PassiveRounds

MIB = 1024 * 1024


def metrics(t: float, inflight: float, served: float) -> MetricsSample:
    values = {"running_requests": inflight, "queued_requests": 0.0}
    return MetricsSample(t=t, wall=1000.0 + t, flavour="vllm", values=values, requests_total=served)


def host(t: float, mib: float) -> HostSample:
    return HostSample(t=t, wall=1000.0 + t, processes=[HostProcessMemory(pid=7, rss_mib=mib)])


def inside(t: float, in_use_mib: float) -> InsideSample:
    return InsideSample(t=t, wall=1000.0 + t, pid=7, glibc={"in_use_bytes": in_use_mib * MIB})


def rounds() -> PassiveRounds:
    return PassiveRounds(
        min_idle_s=1.0, max_rounds=24, window_samples=24, window_s=3600.0, settle_s=0.5
    )


def test_a_sample_counts_only_between_two_idle_scrapes_of_one_stretch_after_it_settled() -> None:
    r = rounds()
    r.metrics(metrics(0.0, 2, 10), 10)  # busy
    r.metrics(metrics(1.0, 0, 12), 12)  # idle from here
    r.sample(host(1.2, 900.0))  # not settled yet (settle_s 0.5)
    r.metrics(metrics(1.4, 0, 12), 12)
    r.sample(host(1.7, 500.0))  # settled, idle before and after: counts
    r.metrics(metrics(2.0, 0, 12), 12)
    r.metrics(metrics(2.5, 0, 12), 12)
    r.sample(host(2.7, 800.0))  # traffic resumed before the next scrape: left out
    r.metrics(metrics(3.0, 3, 12), 12)
    (w,) = r.windows(1003.0)
    assert [s.processes[0].rss_mib for s in w.records["host"]] == [500.0]
    assert w.settled_wall == 1001.7


def test_an_inside_record_measured_after_the_last_idle_scrape_is_left_out_and_said() -> None:
    r = rounds()
    r.metrics(metrics(0.0, 0, 10), 10)
    r.sample(host(0.6, 500.0))
    r.metrics(metrics(0.8, 0, 10), 10)
    r.metrics(metrics(1.2, 0, 10), 10)
    assert r.current() is not None  # watch asks the agent now
    assert r.inside(inside(1.1, 40.0))  # measured while idle: kept
    assert r.inside(inside(1.3, 64.0))  # after the last idle scrape: held ...
    r.metrics(metrics(1.6, 4, 10), 10)  # ... and traffic had resumed: left out
    (w,) = r.windows(1002.0)
    assert w.inside[7].glibc == {"in_use_bytes": 40.0 * MIB}
    assert r.inside_dropped == 1
    # measured before the stretch settled (or before it began): never attached to it
    r.metrics(metrics(5.0, 0, 20), 20)
    r.sample(host(5.6, 500.0))
    r.metrics(metrics(6.2, 0, 20), 20)
    assert not r.inside(inside(4.9, 80.0)) and not r.inside(inside(5.2, 80.0))
    assert r.inside_dropped == 3


def test_an_inside_record_held_for_the_next_scrape_counts_when_the_stretch_goes_on() -> None:
    r = rounds()
    r.metrics(metrics(0.0, 0, 10), 10)
    r.sample(host(0.6, 500.0))
    r.metrics(metrics(1.2, 0, 10), 10)
    assert r.inside(inside(1.3, 42.0))
    r.metrics(metrics(1.6, 0, 10), 10)  # still idle, nothing finished: it counts
    r.metrics(metrics(2.0, 1, 10), 10)
    (w,) = r.windows(1002.0)
    assert w.inside[7].glibc == {"in_use_bytes": 42.0 * MIB} and r.inside_dropped == 0


def test_a_kept_idle_sample_carries_the_most_threads_the_round_saw() -> None:
    # A thread-per-connection server has 2 threads at idle and many while it serves: the
    # judge's host rule reads the most threads any sample saw, so the idle samples watch hands
    # it carry the round's (from /proc, while the round ran).
    r = rounds()
    r.metrics(metrics(0.0, 0, 10), 10)
    r.sample(host(0.6, 500.0))
    r.metrics(metrics(1.2, 0, 10), 10)
    r.metrics(metrics(1.5, 3, 10), 10)  # the round
    busy = HostSample(t=1.7, wall=1001.7, processes=[HostProcessMemory(7, 540.0, threads=9)])
    r.sample(busy)
    r.metrics(metrics(2.0, 3, 12), 12)
    r.metrics(metrics(2.5, 0, 14), 14)  # idle again
    r.sample(HostSample(t=3.1, wall=1003.1, processes=[HostProcessMemory(7, 520.0, threads=2)]))
    r.metrics(metrics(3.6, 0, 14), 14)
    first, second = r.windows(1004.0)
    assert first.records["host"][0].processes[0].threads is None  # nothing seen before it
    kept = second.records["host"][0].processes[0]
    assert kept.threads == 9 and kept.rss_mib == 520.0
