"""The growth model's and the inside evidence's reason codes in words.

`series_words(s)` words a `SeriesResult` whose reason comes from the growth model
(`vramdoctor.stats.growth`: converging, steady_or_converging, noisy), from the host layer's
outside rule (retention_or_leak) or from the inside evidence (live_grew, live_flat,
outside_malloc); None for the older codes, which `vramdoctor.soak.report.series` words.
`undecided_words(reason)` says why a layer is still undecided; `suggestion_for(reasons)` what
to run to decide. Every number keeps its unit; every claim says what it rests on.
"""

from __future__ import annotations

from collections.abc import Iterable

from vramdoctor.judge.results import LayerResult, SeriesResult, SoakAnalysis
from vramdoctor.soak.report.text import count, known, rate, value
from vramdoctor.units import format_count, format_percent

__all__ = [
    "DECIDE_HOST",
    "inconclusive_extra",
    "series_words",
    "suggestion_for",
    "undecided_words",
]

DECIDE_HOST = (
    "to decide, run the server with vramdoctor's agent inside (soak --launch, or PYTHONPATH="
    "$(vramdoctor agent-path)): glibc's own counters tell bytes in use from bytes kept; or "
    "restart it with MALLOC_ARENA_MAX=2: retention goes away, a leak stays"
)

_EVIDENCE = {
    "cuda_allocated": "live tensors (the CUDA caching allocator's allocated bytes)",
    "glibc_in_use": "bytes in use by malloc (glibc mallinfo2)",
    "py_blocks": "Python objects (allocated blocks)",
    "py_traced": "Python allocations traced by tracemalloc",
}


def _incs(s: SeriesResult) -> str:
    return ", ".join(value(d, s.unit, signed=True) for d in s.increments)


def _rounds_more(s: SeriesResult) -> str:
    n = s.steps_to_decide
    if n is None:
        return "more rounds of the same traffic would tell"
    return f"about {format_count(n, 'more rounds' if n != 1 else 'more round')} of the same traffic would tell, should the growth go on as it is"


def series_words(s: SeriesResult) -> str | None:
    """Why the series got its verdict, for the codes of the growth model and the evidence."""
    u = s.unit
    r = s.reason
    if r == "converging":
        share = f"{format_percent(s.ratio, 0)} of the one before" if known(s.ratio) else "less"
        bound = ""
        if known(s.bound):
            bound = f" towards a bound of about {value(s.bound, u)}"
            hi, lo = s.bound_hi, s.bound
            if known(hi) and hi is not None and lo is not None and hi > lo * 1.001 + 1e-9:
                bound += f" (at most {value(hi, u)} at the slowest convergence the rounds allow)"
        return (
            f"rose {value(s.growth, u, signed=True)}, each round adding a shrinking share "
            f"({share}; increments {_incs(s)}): a cache or an allocator filling{bound}, not a leak"
        )
    if r == "steady_or_converging":
        return (
            f"grows {rate(s.slope_per_request, u)} per request (increments {_incs(s)}), but "
            f"{format_count(s.settled_rounds, 'rounds')} cannot yet tell a steady leak from a "
            f"cache converging towards a bound: {_rounds_more(s)}"
        )
    if r == "noisy":
        return (
            f"the level moves about {value(s.noise, u)} from round to round (increments "
            f"{_incs(s)}), as much as any trend: neither a leak nor caching can be claimed"
        )
    if r == "retention_or_leak":
        return (
            f"anonymous memory grows {rate(s.slope_per_request, u)} per request, steadily "
            f"(increments {_incs(s)}); from outside the process, an allocator keeping freed "
            f"memory (glibc's malloc arenas, which this process uses) and a leak look the same, "
            f"so this is not called a leak; {DECIDE_HOST}"
        )
    if r == "outside_malloc":
        return (
            f"RssAnon grows {rate(s.slope_per_request, u)} per request beyond what glibc holds "
            "(its bytes in use and kept are flat), and Python's own counters were not read: "
            "Python's object allocator or direct mappings; soak --trace-python decides"
        )
    if r == "live_grew":
        what = _EVIDENCE.get(s.evidence_kind or "", "live bytes")
        return (
            f"{what} grow {rate(s.slope_per_request, u)} per request in every round after the "
            "first, read inside the process: a leak"
        )
    if r == "live_flat":
        what = _EVIDENCE.get(s.evidence_kind or "", "live bytes")
        return (
            f"rose {value(s.growth, u, signed=True)} while {what} stayed flat, read inside the "
            "process: memory kept for reuse, not a leak"
        )
    return None


def undecided_words(reason: str) -> str | None:
    """Why a layer is undecided, for the codes `vramdoctor.soak.report.sentences` lacks."""
    return {
        "steady_or_converging": (
            "it grows, but the rounds cannot yet tell a steady leak from a cache converging "
            "towards a bound: more rounds tell"
        ),
        "retention_or_leak": (
            "anonymous memory grows steadily; from outside the process allocator retention "
            "and a leak look the same: the agent inside the server, or MALLOC_ARENA_MAX=2, tells"
        ),
        "outside_malloc": (
            "the growth is outside glibc's counters and Python's were not read: --trace-python tells"
        ),
    }.get(reason)


def suggestion_for(reasons: Iterable[str]) -> str | None:
    """What to run for the undecided reasons only evidence (not more rounds) can decide."""
    rs = set(reasons)
    if "retention_or_leak" in rs:
        return DECIDE_HOST.removeprefix("to decide, ")  # said after "to decide:"
    if "outside_malloc" in rs:
        return "soak again with --trace-python: Python's own allocations tell a leak of objects from retention"
    return None


def _arenas_still_coming(lay: LayerResult) -> str:
    """For host growth that new malloc arenas could hold while glibc was still adding them:
    why it is undecided and what decides."""
    if lay.layer != "host" or lay.explanation != "malloc_arenas":
        return ""
    proc = next((p for p in lay.host_processes if p.series == lay.main_series), None)
    counts = ""
    if proc is not None and proc.arenas_first is not None and proc.arenas_last is not None:
        counts = f" ({count(proc.arenas_first, 'arena')} -> {count(proc.arenas_last, 'arena')})"
    return (
        f"; glibc was still adding malloc arenas{counts} while it grew: the new arenas could "
        "keep that much freed heap, and a leak beside them would look the same until the "
        f"count stops, so more rounds tell; {DECIDE_HOST}"
    )


def inconclusive_extra(lay: LayerResult, a: SoakAnalysis) -> str:
    """What an undecided layer's sentence adds: why host growth that new arenas could hold is
    undecided, and the growth per aborted request when every round abandoned some streams
    (the growth is measured; which requests cause it is not)."""
    arenas = _arenas_still_coming(lay) if lay.verdict == "INCONCLUSIVE" else ""
    if lay.rate_per_aborted_request is None:
        return arenas
    share = sum(r.aborted or 0 for r in a.rounds if r.life >= 0 and r.reached)
    reached = sum(r.reached for r in a.rounds if r.life >= 0 and r.reached)
    return arenas + (
        f"; {rate(lay.rate_per_aborted_request, lay.unit)} per aborted request, should only "
        f"the {format_count(share, 'streams')} of {format_count(reached, 'requests')} the client "
        "abandoned cause it (soak again with --abort-fraction 0 to tell)"
    )
