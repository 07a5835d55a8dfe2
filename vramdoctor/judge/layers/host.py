"""The host RAM layer: each server process's RSS, split by kind, with glibc's arenas in view.

Host memory caches too, and from outside the process its caching and a leak can look the
same. glibc gives each thread that allocates its own malloc arena (up to MALLOC_ARENA_MAX, 8 x
cores by default on 64-bit), reserves arena heaps in 64 MiB units and keeps freed memory in
them; fragmentation inside existing arenas, the main heap and mmap'd chunks retains memory
as well (measured on an H200 host: glibc's bytes in use flat from round 3 while RssAnon grew
357 -> 693 MiB, linear over rounds, and the growth did not fit the new arenas' heaps). A
threaded server's RSS can then grow round after round for hundreds of requests, bounded only
by the arena cap. PyTorch's pinned host memory (CUDA host allocations) shows as RssShmem and
is cached like VRAM. RSS that grows in RssFile only (mapped weights and libraries paged in as
requests touch them) is bounded by the files and reclaimable.

The rule, per server process (RSS decides; kinds, arenas and inside evidence explain):

1. Growth inside idle windows at the rate of the rounds' growth is a leak in time (no
   allocator retains memory while nothing allocates): LEAK `grew_with_time`.
2. Growing anonymous memory that new arenas explain (the count rose, the growth fits in what
   their heaps hold, it stopped within two rounds of the last new arena): CACHING
   `malloc_arenas`.
3. Growth in RssFile only, the heap flat: CACHING `file_backed`.
4. Steady growth in anonymous memory (or of unknown kind) in a process whose allocator could
   keep it (below) is NOT called a leak from outside: allocator retention
   and a leak look the same there. INCONCLUSIVE `retention_or_leak`, with the rate a leak
   would have; the report gives both ways to decide (run with the agent in the server: its
   glibc counters tell bytes in use from bytes kept; restart with MALLOC_ARENA_MAX=2: the
   retention goes away, a leak stays). Exit code 0. Every process's allocator could keep
   it: a flat count of arenas rules nothing out, since glibc retains inside the arenas it
   has, in the main heap and under the mmap threshold, and that retention can grow steadily
   for many rounds (a server warm before a watch has a flat count; calling that
   growth a leak gave a false LEAK on a healthy server in about 1 of 8 watches here).
5. Where the agent ran in the process (`vramdoctor.judge.inside`), what is live decides
   instead: glibc's bytes in use, Python's allocated blocks and (with --trace-python)
   tracemalloc's bytes that grow steadily are a LEAK; growth with all of them flat is CACHING
   `arena_retention` (glibc keeps the freed bytes); anonymous growth beyond what glibc holds
   with Python's counters not read is INCONCLUSIVE `outside_malloc`.

Where the kinds or the arenas could not be read (another user, a container), that is a
caveat; a growing /dev/shm decides on its own (files in tmpfs no process's RSS has to show).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vramdoctor.judge.layers.vram import time_driven_rate, worst
from vramdoctor.judge.results import (
    C_NO_ARENAS,
    C_NO_KINDS,
    CACHING,
    HOST,
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    R_CONVERGING,
    R_GREW_WITH_TIME,
    R_NO_LEVEL,
    R_NOISY,
    R_RETENTION_OR_LEAK,
    R_ROSE_THEN_FLAT,
    R_STEADY_OR_CONVERGING,
    R_STILL_CHANGING,
    R_TRANSIENT,
    X_FILE_BACKED,
    X_MALLOC_ARENAS,
    X_PINNED,
    Culprit,
    HostProcessResult,
    LayerResult,
    Projection,
    SeriesResult,
    Thresholds,
)
from vramdoctor.samples import HostSample
from vramdoctor.verdicts import Evidence

if TYPE_CHECKING:
    from vramdoctor.judge.layers import LayerContext
    from vramdoctor.judge.series import Series


# Undecided reasons of a series whose level is still going up (the arena and file rules may
# explain that growth as well as a LEAK's).
_GROWING = (R_STILL_CHANGING, R_STEADY_OR_CONVERGING, R_NOISY)


def _pairs(s: SeriesResult | None) -> list[float | None]:
    """The series' reference (baseline) followed by its settled levels."""
    if s is None:
        return []
    return [s.baseline, *s.settled]


def _growth(s: SeriesResult | None) -> float | None:
    return None if s is None else s.growth


def _noisy(s: SeriesResult, th: Thresholds) -> bool:
    """Undecided because the levels move more than the floor from round to round (stats)."""
    return s.noise > 0 and s.threshold > 0 and s.noise * th.noise_k >= s.threshold * 0.99


def floor_for_rss(s: SeriesResult, th: Thresholds) -> float:
    """The RSS floor (judge.floor_for): --min-growth-mib, or 0.25 % of the level if larger."""
    level = s.baseline if s.baseline is not None else s.last
    return (
        max(th.min_growth_mib, th.rss_rel_floor * level) if level is not None else th.min_growth_mib
    )


def _levelled_off(s: SeriesResult, floor: float) -> bool:
    """The fitted rate after round 1 gives less than the floor a round: the level went up and
    stays, moving around it (arenas can explain that; not growth that goes on)."""
    return s.round_growth is not None and s.round_growth <= floor


@dataclass
class _Proc:
    """One process's host series, by kind."""

    rss: SeriesResult
    anon: SeriesResult | None
    shmem: SeriesResult | None
    file: SeriesResult | None
    arenas: SeriesResult | None
    reserved: SeriesResult | None
    writable: SeriesResult | None
    threads_max: int | None

    @property
    def growth_kind(self) -> str | None:
        """Which kind grew most ("anon", "file", "shmem"), None when none grew."""
        kinds = {
            k: g
            for k, g in (
                ("anon", _growth(self.anon)),
                ("file", _growth(self.file)),
                ("shmem", _growth(self.shmem)),
            )
            if g is not None
        }
        return max(kinds, key=lambda k: kinds[k]) if kinds and max(kinds.values()) > 0 else None

    @property
    def missing(self) -> list[str]:
        out: list[str] = []
        if self.anon is None and self.shmem is None and self.file is None:
            out.append(C_NO_KINDS)
        if self.arenas is None:
            out.append(C_NO_ARENAS)
        return out


def _arena_fits(p: _Proc) -> bool:
    """The arena count rose and the (anonymous) growth fits in what the arenas' heaps grew by
    (writable, where /proc/PID/maps showed it; else what the new arenas reserve): only then
    may glibc's arenas be named as what holds the growth (a 60 MiB object loaded once while
    the arenas' heaps grew 3 MiB is not theirs)."""
    if p.arenas is None:
        return False
    grow = p.anon if p.anon is not None and p.anon.settled_rounds >= 2 else p.rss
    pairs = [(gv, av) for gv, av in zip(_pairs(grow), _pairs(p.arenas), strict=False)]
    rows = [(gv, av) for gv, av in pairs if gv is not None and av is not None]
    g = [gv for gv, _ in rows]
    a = [av for _, av in rows]
    if len(rows) < 2 or a[-1] <= a[0]:
        return False
    h = grow.threshold or p.rss.threshold
    last_rise = max(i for i in range(1, len(a)) if a[i] > a[i - 1])
    if sum(1 for i in range(last_rise + 1, len(g)) if g[i] - g[i - 1] > h) >= 2:
        return False  # it went on growing after glibc stopped adding arenas: not theirs
    growth = max(g) - g[0]
    w = [v for v in _pairs(p.writable) if v is not None]
    if len(w) >= 2:
        return growth <= (max(w) - w[0]) + h
    r = [v for v in _pairs(p.reserved) if v is not None]
    return len(r) >= 2 and growth <= (max(r) - r[0]) + h


def _arena_explains(p: _Proc) -> bool:
    """Growth that new malloc arenas explain: the arena count rose, the (anonymous) growth is
    above the floor and fits in what the arenas hold (what their heaps have grown to, where
    /proc/PID/maps showed it; else what they reserve), and it did not go on for two rounds
    after the last round that added an arena (growth with the arena count flat is not the
    arenas). Arenas keep freed memory in their own heaps: growth outside the heaps (a leak
    in the main heap or in mmap'd blocks) is not theirs, however many threads came."""
    rss, anon = p.rss, p.anon
    if p.arenas is None:
        return False
    grow = anon if anon is not None and anon.settled_rounds >= 2 else rss
    g = _pairs(grow)
    a = _pairs(p.arenas)
    r = _pairs(p.reserved)
    w = _pairs(p.writable)
    if len(g) != len(a):
        return False
    rows = [
        (gv, av, r[i] if i < len(r) else None, w[i] if i < len(w) else None)
        for i, (gv, av) in enumerate(zip(g, a, strict=True))
        if gv is not None and av is not None
    ]
    if len(rows) < 2:
        return False
    (g0, a0, r0, w0), (g1, a1, r1, w1) = rows[0], rows[-1]
    h = grow.threshold or rss.threshold
    if a1 <= a0 or g1 - g0 <= h:
        return False
    rises = [i for i in range(1, len(rows)) if rows[i][1] > rows[i - 1][1]]
    last_rise = max(rises) if rises else 0
    grew_after = sum(1 for i in range(last_rise + 1, len(rows)) if rows[i][0] - rows[i - 1][0] > h)
    if grew_after >= 2:
        return False  # kept growing for rounds after glibc stopped adding arenas
    if w0 is not None and w1 is not None:
        return g1 - g0 <= (w1 - w0) + h
    if r0 is None or r1 is None:
        return False
    return g1 - g0 <= (r1 - r0) + h


def _still_rising(p: _Proc) -> bool:
    """The RSS grew beyond its threshold in the last round and the arena count rose in the
    last two rounds: the arenas' growth has not stopped, so neither has what they explain."""
    rss = p.rss
    if not rss.increments or rss.increments[-1] <= rss.threshold:
        return False
    a = [v for v in _pairs(p.arenas) if v is not None]
    if len(a) < 2:
        return False
    before = a[-3] if len(a) >= 3 else a[0]  # the count before the last two rounds
    return max(a[-2:]) > before


def _growing(rss: SeriesResult) -> bool:
    """The RSS goes up in a way the arena and file rules may explain (not growth in time)."""
    return (
        rss.decides
        and rss.reason != R_GREW_WITH_TIME
        and (rss.verdict == LEAK or (rss.verdict == INCONCLUSIVE and rss.reason in _GROWING))
    )


def _outside(p: _Proc, th: Thresholds) -> None:
    """Explain one process's RSS growth from outside (rules 2-4 of the module), in place."""
    rss = p.rss
    kind = p.growth_kind
    explanation = None
    if (
        _growing(rss)
        and kind in (None, "anon")
        and (not _noisy(rss, th) or _levelled_off(rss, floor_for_rss(rss, th)))
        and _arena_explains(p)
    ):
        explanation = X_MALLOC_ARENAS
        if _still_rising(p):
            # glibc was still adding arenas and the RSS still grew in the last round: the new
            # arenas can hold the growth so far, and so can a leak beside them; undecided, so
            # adaptive rounds run until the count stops (then growth that goes on is not theirs).
            rss.verdict, rss.reason = INCONCLUSIVE, R_STILL_CHANGING
        else:
            rss.verdict = CACHING
    elif (
        _growing(rss)
        and kind == "file"
        and p.anon is not None
        and p.anon.verdict != LEAK
        and (p.shmem is None or p.shmem.verdict != LEAK)
    ):
        # Mapped files (weights, libraries) paged in as requests touch them: bounded by the
        # files' size and reclaimable by the kernel; the heap did not grow.
        explanation = X_FILE_BACKED
        rss.verdict = CACHING
    elif rss.verdict == LEAK and rss.reason != R_GREW_WITH_TIME and kind in (None, "anon"):
        # From outside, an allocator's retention and a leak look the same (rule 4): new arenas
        # are one way glibc keeps freed memory; fragmentation inside the arenas it has, in the
        # main heap and under the mmap threshold glibc raises after each freed large chunk are
        # others, and /proc shows none of them apart from live bytes. A flat arena count rules
        # nothing out (a server warm before a watch has one).
        rss.verdict, rss.reason = INCONCLUSIVE, R_RETENTION_OR_LEAK
    elif (
        rss.verdict == CACHING
        and rss.reason in (R_ROSE_THEN_FLAT, R_CONVERGING)
        and kind in (None, "anon")
        and _arena_fits(p)
    ):
        # It rose and stopped (or converges) while new arenas' heaps grew by at least as much.
        explanation = X_MALLOC_ARENAS
    elif rss.verdict == CACHING and kind == "shmem":
        explanation = X_PINNED
    rss.explanation = explanation
    if rss.decided_by is None and rss.verdict != NOT_MEASURED:
        rss.decided_by = Evidence.TIME if rss.reason == R_GREW_WITH_TIME else Evidence.ROUNDS


def threads_max(records: Sequence[Any]) -> dict[int, int]:
    """pid -> the most threads any host sample saw in the process (/proc/PID/status)."""
    out: dict[int, int] = {}
    for r in records:
        if isinstance(r, HostSample):
            for hp in r.processes:
                n = hp.threads
                if isinstance(n, int) and n > out.get(hp.pid, 0):
                    out[hp.pid] = n
    return out


def _process_result(p: _Proc, bound: int | None, arena_max: int | None) -> HostProcessResult:
    rss = p.rss
    a_levels = [v for v in _pairs(p.arenas) if v is not None and math.isfinite(v)]
    return HostProcessResult(
        pid=rss.pid if rss.pid is not None else -1,
        name=rss.name,
        role=rss.role,
        rss_growth_mib=rss.growth,
        anon_growth_mib=_growth(p.anon),
        file_growth_mib=_growth(p.file),
        shmem_growth_mib=_growth(p.shmem),
        arenas_first=int(a_levels[0]) if a_levels else None,
        arenas_last=int(a_levels[-1]) if a_levels else None,
        arena_reserved_growth_mib=_growth(p.reserved),
        arena_bound=bound,
        arena_bound_set=arena_max is not None,
        growth_kind=p.growth_kind,
        explanation=rss.explanation,
        missing=p.missing,
        series=rss.key,
    )


def host_layer(
    series: list[SeriesResult],
    life: int,
    available_mib: float | None,
    cpu_count: int | None,
    th: Thresholds,
    *,
    arena_max: int | None = None,
    records: Sequence[Any] = (),
    inside: Any = None,
) -> LayerResult:
    """The host RAM verdict of one life from its judged series (RSS decides; kinds explain).
    `arena_max`: MALLOC_ARENA_MAX set in the server's environment (else glibc's 8 x cores);
    `records`: the run's records (thread counts); `inside`: the inside evidence of the
    life (`vramdoctor.judge.inside.InsideEvidence`), which decides where the agent ran."""
    mine = [s for s in series if s.layer == HOST]
    if inside is not None:  # the agent's counters: evidence beside the outside series
        mine += [s for s in inside.series.values() if s.layer == HOST]
    by = {s.key: s for s in mine}
    rss_series = [s for s in mine if s.kind == "rss"]
    if not rss_series:
        return LayerResult(HOST, NOT_MEASURED, R_NO_LEVEL, "MiB", series=mine, life=life)
    for s in mine:
        # Kinds and arenas explain; RSS decides, and so does /dev/shm when it grows: files in
        # tmpfs are host memory that no process's RSS has to show (a writer that unmapped or
        # exited leaves them behind), so a growing /dev/shm is a host leak of its own.
        if s.kind != "rss" and not (s.kind == "dev_shm" and s.verdict in (LEAK, CACHING)):
            s.decides = False
    threads = threads_max(records)
    procs: list[HostProcessResult] = []
    caveats: set[str] = set()
    bound = arena_max or (th.arenas_per_core * cpu_count if cpu_count else None)
    for rss in rss_series:
        pid = rss.pid
        p = _Proc(
            rss,
            by.get(f"rss_anon/pid{pid}"),
            by.get(f"rss_shmem/pid{pid}"),
            by.get(f"rss_file/pid{pid}"),
            by.get(f"arenas/pid{pid}"),
            by.get(f"arena_mib/pid{pid}"),
            by.get(f"arena_wmib/pid{pid}"),
            threads.get(pid) if pid is not None else None,
        )
        decided_inside = (
            inside is not None
            and rss.decides
            and rss.scope != "tenant"
            and inside.decide_host(p.rss, p.anon, p.shmem, th)
        )
        if not decided_inside:
            _outside(p, th)
        if rss.decides:
            caveats.update(p.missing)
        procs.append(_process_result(p, bound, arena_max))
    deciding = [s for s in rss_series if s.decides] + [
        s for s in mine if s.kind == "dev_shm" and s.decides
    ]
    if inside is not None:
        # A process that reports inside evidence through the run's agent directory is a server
        # process (the agent writes only there), sampled from outside or not: a helper
        # daemonised out of the port owner's tree is one. Its live bytes decide for it.
        sampled = {s.pid for s in rss_series}
        tenants = {s.pid for s in series if s.scope == "tenant"}
        for pid in sorted(inside.pids - sampled - tenants):
            top = inside.decide_unsampled(pid)
            if top is not None:
                deciding.append(top)
    lay = _layer(mine, deciding, procs, sorted(caveats), life, available_mib)
    lay.tenants = [
        s.key
        for s in sorted(rss_series, key=lambda s: (-(s.growth or 0.0), s.key))
        if s.scope == "tenant"
    ]
    if lay.culprit is not None and inside is not None and lay.culprit.pid is not None:
        lay.culprit.held_by = [
            h.to_dict() for h in inside.held_by.get(lay.culprit.pid, ()) if h.memory != "cuda"
        ]
    return lay


def _layer(
    mine: list[SeriesResult],
    deciding: list[SeriesResult],
    procs: list[HostProcessResult],
    caveats: list[str],
    life: int,
    available_mib: float | None,
) -> LayerResult:
    """The layer's verdict from its deciding series, the culprit and the projection."""
    verdict = worst(deciding)
    order = {"rss": 0, "rss_anon": 1, "rss_shmem": 2, "rss_file": 3, "arenas": 4, "arena_mib": 5}
    mine.sort(key=lambda s: (not s.decides, order.get(s.kind, 6), -(s.growth or 0.0), s.key))
    if verdict is None:
        return LayerResult(
            HOST,
            INCONCLUSIVE,
            R_TRANSIENT,
            "MiB",
            series=mine,
            life=life,
            host_processes=procs,
            caveats=caveats,
        )
    cands = [s for s in deciding if s.verdict == verdict]
    if verdict == INCONCLUSIVE:
        # Undecided: the series with the most settled rounds speaks for the layer (the port
        # owner over a recycled worker that lived two rounds), then the larger growth (MiB:
        # never a rate per request against a growth).
        top = max(cands, key=lambda s: (s.settled_rounds, abs(s.growth or 0.0)))
    else:
        top = max(
            cands,
            key=lambda s: (s.slope_per_request or 0.0) if verdict == LEAK else abs(s.growth or 0.0),
        )
    lay = LayerResult(
        HOST,
        verdict,
        top.reason,
        "MiB",
        growth=top.growth,
        life=life,
        series=mine,
        host_processes=procs,
        caveats=caveats,
        main_series=top.key,
        explanation=top.explanation,
        decided_by=top.decided_by,
    )
    if verdict == LEAK or top.reason == R_RETENTION_OR_LEAK:
        proc = next((p for p in procs if p.series == top.key), None)
        cause = (
            "dev_shm"
            if top.kind == "dev_shm"
            else "pinned_host_memory"
            if proc is not None and proc.growth_kind == "shmem"
            else "host_ram"
        )
        if verdict == LEAK:
            lay.culprit = Culprit(top.key, pid=top.pid, name=top.name, cause=cause)
        # A retention-or-leak keeps the rate a leak would have, and its projection: the
        # report says it is one of two readings.
        lay.rate_per_request = lay.rate_mib_per_request = top.slope_per_request
        lay.rate_ci = top.slope_ci
        rate = top.slope_per_request
        lay.projection = Projection(
            capacity_left=available_mib,
            capacity_of="host_available",
            requests=available_mib / rate
            if available_mib is not None and rate and rate > 0
            else None,
        )
        time_driven_rate(lay, top)
    return lay


class HostLayer:
    """The host RAM layer behind the registry's signature (`vramdoctor.judge.layers.Layer`)."""

    name = HOST
    unit = "MiB"

    def extract(self, records: Sequence[Any]) -> dict[str, Series]:
        """None of its own: host series come from `judge.series.extract_series`."""
        return {}

    def judge(self, ctx: LayerContext) -> LayerResult:
        f = ctx.facts
        return host_layer(
            ctx.series,
            ctx.life,
            f.available_mib,
            f.cpu_count,
            ctx.th,
            arena_max=f.arena_max,
            records=ctx.records,
            inside=ctx.inside,
        )


LAYER = HostLayer()
