"""One verdict vocabulary for soak, watch and fleet: the verdicts, and the codes that say why.

Every command that judges memory answers with one `Verdict` per series, per memory layer and
per run, and with codes (never sentences: each command's report words them) that say why.
The string values are what run files, `--json` documents and exporters have always carried
("LEAK", "grew_every_round", ...): a `Verdict` or a code *is* its string (``Verdict.LEAK ==
"LEAK"``, ``json.dumps(Verdict.LEAK) == '"LEAK"'``, ``f"{Verdict.LEAK}" == "LEAK"``), so code
that compares or prints strings keeps working.

    from vramdoctor.verdicts import Verdict, Reason, worst

    worst([Verdict.CACHING, Verdict.LEAK]) is Verdict.LEAK
    Verdict("CACHING").rank          # 1: LEAK 3 > INCONCLUSIVE 2 > CACHING 1 > STABLE 0
    Verdict.NOT_MEASURED.measured    # False: no source measured that layer

The verdicts, most serious first:

- LEAK: memory that is live (or, from outside, memory whose growth only a leak explains) grows
  steadily with the requests, or with time; its rate's interval excludes zero. Exit code 1.
- INCONCLUSIVE: the evidence cannot decide yet; `Reason` says why and what would decide
  (more rounds; the agent inside the process; `MALLOC_ARENA_MAX=2`). Exit code 0.
- CACHING: memory rose and stays, or converges towards a bound, and is held by a cache or an
  allocator (named by an `Explanation`). Exit code 0.
- STABLE: no change beyond the series' floor and noise. Exit code 0.
- NOT_MEASURED: no source measured the layer (no /metrics: no KV layer). Never decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

__all__ = [
    "RANK",
    "VERDICTS",
    "Caveat",
    "Evidence",
    "Explanation",
    "Reason",
    "Verdict",
    "worst",
]


class _Code(str, Enum):
    """A code that is its own string value, in comparisons, JSON and f-strings alike."""

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class Verdict(_Code):
    """The answer for one series, one memory layer or one run."""

    LEAK = "LEAK"
    INCONCLUSIVE = "INCONCLUSIVE"
    CACHING = "CACHING"
    STABLE = "STABLE"
    NOT_MEASURED = "NOT_MEASURED"

    @property
    def rank(self) -> int:
        """Seriousness: LEAK 3, INCONCLUSIVE 2, CACHING 1, STABLE 0, NOT_MEASURED -1."""
        return RANK.get(self, -1)

    @property
    def measured(self) -> bool:
        """False only for NOT_MEASURED."""
        return self is not Verdict.NOT_MEASURED

    @property
    def problem(self) -> bool:
        """True for LEAK: the one verdict that makes a run unhealthy (exit code 1)."""
        return self is Verdict.LEAK


RANK: dict[str, int] = {
    Verdict.LEAK: 3,
    Verdict.INCONCLUSIVE: 2,
    Verdict.CACHING: 1,
    Verdict.STABLE: 0,
}
"""Verdict -> seriousness, for sorting (keys compare equal to the bare strings too)."""

VERDICTS: tuple[Verdict, ...] = (
    Verdict.LEAK,
    Verdict.INCONCLUSIVE,
    Verdict.CACHING,
    Verdict.STABLE,
)
"""Every measured verdict, most serious first."""


def worst(verdicts: Iterable[str]) -> Verdict | None:
    """The most serious of `verdicts` (strings or `Verdict`s; NOT_MEASURED and unknown
    strings are skipped), None when none is measured."""
    best: Verdict | None = None
    for v in verdicts:
        try:
            cur = Verdict(v)
        except ValueError:
            continue
        if cur.measured and (best is None or cur.rank > best.rank):
            best = cur
    return best


class Reason(_Code):
    """Why a series or a layer got its verdict (`SeriesResult.reason`, `LayerResult.reason`)."""

    # STABLE
    FLAT = "flat"  # every settled level within the floor of the reference
    # CACHING
    ROSE_THEN_FLAT = "rose_then_flat"  # rose (in the first rounds), the last rounds are flat
    CONVERGING = "converging"  # each round adds a shrinking share: a bound is projected
    FELL_BACK = "fell_back"  # rose, then came down (caches give back; leaks never do)
    BOUNDED = "bounded"  # up and down within a band, no trend, no new high
    LIVE_FLAT = "live_flat"  # inside evidence: live bytes flat, only kept/reserved bytes grew
    # LEAK
    GREW_EVERY_ROUND = "grew_every_round"  # steady growth per request, convergence ruled out
    GREW_WITH_TIME = "grew_with_time"  # steady growth in time, inside idle windows too
    LIVE_GREW = "live_grew"  # inside evidence: live bytes grow steadily with the requests
    # INCONCLUSIVE
    NO_LEVEL = "no_settled_level"  # no idle window completed
    NO_REFERENCE = "no_reference"  # one level and no baseline
    ONE_ROUND = "one_round_only"  # flat, but one round
    TOO_FEW_ROUNDS = "too_few_rounds"  # rose, too few rounds to tell its shape
    STILL_CHANGING = "still_changing"  # changing without a shape the rounds can name
    STEADY_OR_CONVERGING = "steady_or_converging"  # grows; the rounds cannot yet tell a
    # steady rate from a cache converging towards a bound (more rounds decide)
    RETENTION_OR_LEAK = "retention_or_leak"  # host: anonymous memory grows steadily, which
    # an allocator's retention and a leak both give; from outside they look the same
    OUTSIDE_MALLOC = "outside_malloc"  # host, inside evidence: the growth is outside glibc's
    # counters (Python's object allocator, direct mmaps): --trace-python decides
    TRANSIENT = "transient"  # a process present for fewer than 2 settled rounds
    NEVER_IDLE = "never_idle"  # KV: no idle sample with 0 running and 0 queued requests
    NO_TRAFFIC = "no_request_succeeded"  # the run's traffic never exercised memory
    SERVER_DIED = "server_died"  # no settled round before the server died
    NOISY = "noisy"  # undecided: the levels move more than the floor from round to round
    # watch and fleet (comparable points over time rather than rounds)
    TOO_FEW_POINTS = "too_few_points"  # fewer comparable points than the test needs
    WARMING_UP = "warming_up"  # a life that started less than the warm-up ago
    STOPPED_REPORTING = "stopped_reporting"  # the series ended before the range's end: stale


class Explanation(_Code):
    """What holds growth that is not a leak (`LayerResult.explanation`)."""

    MALLOC_ARENAS = "malloc_arenas"  # host: new glibc arenas keep freed heap
    ARENA_RETENTION = "arena_retention"  # host, inside: glibc keeps freed bytes, in use flat
    PINNED = "pinned_host_memory"  # host: RssShmem levels off: PyTorch's pinned host cache
    FILE_BACKED = "file_backed"  # host: RssFile grew (mapped files paged in), heap flat
    KV_RESIDUE = "kv_idle_residue"  # KV: used tokens at idle, flat: held, not growing
    STRAY_CONTEXT = "stray_context"  # VRAM: a context-sized footprint on another GPU
    ALLOCATOR_CACHE = "allocator_cache"  # VRAM, inside: reserved grew, allocated flat
    FRAGMENTATION = "fragmentation"  # VRAM, inside: free pieces of split segments grew
    CONVERGING_CACHE = "converging_cache"  # a cache filling towards its cap (bound projected)
    LIVE_CACHE = "live_cache"  # inside: live bytes that converge (a bounded cache of objects)


class Evidence(_Code):
    """Which evidence decided a layer's verdict (`LayerResult.decided_by`)."""

    INSIDE_CUDA = "inside_cuda"  # torch.cuda.memory_stats in the process (allocated, reserved)
    INSIDE_GLIBC = "inside_glibc"  # glibc mallinfo2() in the process (in use, free kept)
    INSIDE_PYTHON = "inside_python"  # tracemalloc in the process (--trace-python)
    ROUNDS = "rounds"  # the settled levels after each round, from outside the process
    TIME = "time"  # growth inside idle windows, from outside the process
    KV_COUNT = "kv_count"  # the server's own used-token count at idle


class Caveat(_Code):
    """What the analysis could not see (`LayerResult.caveats`)."""

    NO_KINDS = "rss_kinds_unreadable"  # /proc/PID/status kinds missing: judged on RSS
    NO_ARENAS = "malloc_arenas_unreadable"  # /proc/PID/maps unreadable: arenas not ruled out
    PAGE_SIZE_ASSUMED = "page_size_assumed"  # KV page size unknown: tokens only, no pages
    KV_RATIO_ONLY = "kv_ratio_only"  # KV pool size unknown: judged on the usage ratio
    NOT_IDLE_FILTERED = "kv_idle_unverified"  # no running/queued gauges: idle not verified
    TENANTS_IN_DEVICE = "tenants_in_device_total"  # a device total holds other tenants' memory
    # that no per-process series lets us take out
    INSIDE_PARTIAL = "inside_evidence_partial"  # the agent missed some rounds or processes
