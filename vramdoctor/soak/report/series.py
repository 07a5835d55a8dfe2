"""One series in words: its label ("RssAnon pid 812 sglang::scheduler") and why it got its
verdict, with its numbers (`SeriesResult.reason` codes of `vramdoctor.judge.results`)."""

from __future__ import annotations

from vramdoctor.judge.results import SeriesResult
from vramdoctor.soak.report.text import count, known, rate, value

__all__ = ["label", "series_reason"]


def label(s: SeriesResult) -> str:
    """The series as a reader names it: the device, the process (pid and name) and the kind;
    a kind this report does not know (a layer added from outside) by its key."""
    who = f"pid {s.pid} {s.name or ''}".strip()
    return {
        "gpu": f"GPU {s.gpu} (device)",
        "gpu_process": f"GPU {s.gpu} {who}",
        "rss": f"RSS {who}",
        "rss_anon": f"RssAnon {who}",
        "rss_file": f"RssFile {who}",
        "rss_shmem": f"RssShmem {who}",
        "arenas": f"malloc arenas {who}",
        "arena_mib": f"arena reserve {who}",
        "dev_shm": "/dev/shm",
        "kv": (f"KV pool {s.pool}" if s.pool and s.pool != "kv" else "KV pool")
        if s.unit != "ratio"
        else "KV usage",
    }.get(s.kind, s.key)


def _last_increment(s: SeriesResult) -> float | None:
    return s.increments[-1] if s.increments else None


def series_reason(s: SeriesResult) -> str:
    """Why the series got its verdict, with its numbers."""
    u = s.unit
    ref = "baseline" if s.baseline is not None else "first round"
    inc = _last_increment(s)
    r = s.reason
    if r == "flat":
        return f"every settled level within {value(s.threshold, u)} of the {ref}"
    if r == "rose_then_flat":
        text = (
            f"rose {value(s.growth, u, signed=True)} then flat (last round "
            f"{value(inc, u, signed=True)}, within {value(s.threshold, u)})"
        )
        if known(s.creep_floor_per_request):
            text += (
                f"; a leak under {rate(s.creep_floor_per_request, u)} per request cannot be "
                "ruled out at this load"
            )
        return text
    if r == "fell_back":
        return (
            f"rose, then fell back (last round {value(inc, u, signed=True)}): bounded, not growing"
        )
    if r == "bounded":
        lo = min((v for v in s.settled if v is not None), default=None)
        hi = max((v for v in s.settled if v is not None), default=None)
        return (
            f"moved up and down between {value(lo, u)} and {value(hi, u)} with no trend and no "
            "new high in the last rounds: bounded, not growing"
        )
    if r == "grew_every_round":
        return (
            f"grew {rate(s.slope_per_request, u)} per request in every round after the first, "
            f"in proportion to requests (last round {value(inc, u, signed=True)})"
        )
    if r == "no_settled_level":
        return "no settled level (no idle window completed)"
    if r == "no_reference":
        return (
            "one settled level and no baseline: nothing to compare it with (idle windows "
            "shorter than the sampling --interval?)"
        )
    if r == "one_round_only":
        return "flat, but only 1 round settled: 2 rounds are needed to call it stable"
    if r == "too_few_rounds":
        return (
            f"rose {value(s.growth, u, signed=True)} but only "
            f"{count(s.settled_rounds, 'round')} settled: caching and a leak look the "
            "same until round 3"
        )
    if r == "still_changing":
        incs = ", ".join(value(d, u, signed=True) for d in s.increments)
        return f"still changing in the last round ({value(inc, u, signed=True)}) but not steadily (increments {incs})"
    if r == "transient":
        what = {
            "appeared": "appeared during the run",
            "exited": "exited during the run",
            "transient": "appeared and exited during the run",
        }.get(s.presence, "came and went")
        return (
            f"{what}, present for {count(s.settled_rounds, 'settled round')}: "
            "reported, never decides"
        )
    if r == "never_idle":
        return "never idle (requests running or queued in every idle window)"
    if r == "no_request_succeeded":
        return "no request succeeded, so memory was never exercised"
    if r == "server_died":
        return "the server died before a round settled"
    from vramdoctor.soak.report.reasons import series_words  # the growth model's codes

    words = series_words(s)
    return words if words is not None else r
