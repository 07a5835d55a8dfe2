"""The host RAM layer: each server process's RSS, split by kind, with glibc's arenas in view.

Host memory caches too. glibc gives each thread that allocates its own malloc arena (up to
MALLOC_ARENA_MAX, 8 x cores by default on 64-bit), reserves arena heaps in 64 MiB units and
keeps freed memory in them: a thread-per-connection server's RSS then grows round after round
as new arenas appear, bounded by the arena cap. That is allocator caching, not a leak; it
stops at the cap and vanishes with MALLOC_ARENA_MAX=2 or jemalloc. PyTorch's pinned host
memory (CUDA host allocations) shows as RssShmem and is cached the same way as VRAM. RSS that
grows in RssFile only (mapped weights and libraries paged in as requests touch them) is
bounded by the files and reclaimable: not a leak either.

So an RSS series that grows is explained as arena caching when the arena count rose, the
anonymous growth fits in what the new arenas reserve, and growth did not go on for two rounds
after the last round that added an arena; growth with the arena count flat, or beyond the new
arenas' reservation, stays a leak. Where the kinds or
the arenas could not be read (another user, a container), the verdict is on RSS, with the
missing part as a caveat.
"""

from __future__ import annotations

from .results import (
    C_NO_ARENAS,
    C_NO_KINDS,
    CACHING,
    HOST,
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    R_NO_LEVEL,
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
from .vram import worst


def _pairs(s: SeriesResult | None) -> list[float | None]:
    """The series' reference (baseline) followed by its settled levels."""
    if s is None:
        return []
    return [s.baseline, *s.settled]


def _growth(s: SeriesResult | None) -> float | None:
    return None if s is None else s.growth


def _arena_explains(rss: SeriesResult, anon: SeriesResult | None, arenas: SeriesResult,
                    reserved: SeriesResult | None) -> bool:
    """Growth that new malloc arenas explain: the arena count rose, the (anonymous) growth
    fits in what the arenas reserve, and it did not go on for two rounds after the last round
    that added an arena (growth with the arena count flat is not the arenas)."""
    grow = anon if anon is not None and anon.settled_rounds >= 2 else rss
    g = _pairs(grow)
    a = _pairs(arenas)
    r = _pairs(reserved)
    if len(g) != len(a):
        return False
    rows = [(gv, av, r[i] if i < len(r) else None) for i, (gv, av) in enumerate(zip(g, a, strict=True))
            if gv is not None and av is not None]
    if len(rows) < 2:
        return False
    (g0, a0, r0), (g1, a1, r1) = rows[0], rows[-1]
    if a1 <= a0 or g1 - g0 <= 0:
        return False
    h = grow.threshold or rss.threshold
    last_rise = max(i for i in range(1, len(rows)) if rows[i][1] > rows[i - 1][1]) if any(
        rows[i][1] > rows[i - 1][1] for i in range(1, len(rows))) else 0
    grew_after = sum(1 for i in range(last_rise + 1, len(rows)) if rows[i][0] - rows[i - 1][0] > h)
    if grew_after >= 2:
        return False  # kept growing for rounds after glibc stopped adding arenas
    if r0 is None or r1 is None:
        return False
    return g1 - g0 <= (r1 - r0) + h


def host_layer(series: list[SeriesResult], life: int, available_mib: float | None,
               cpu_count: int | None, th: Thresholds, *, arena_max: int | None = None) -> LayerResult:
    """The host RAM verdict of one life from its judged series (RSS decides; kinds explain).
    `arena_max`: MALLOC_ARENA_MAX set in the server's environment (else glibc's 8 x cores)."""
    mine = [s for s in series if s.layer == HOST]
    by = {s.key: s for s in mine}
    rss_series = [s for s in mine if s.kind == "rss"]
    if not rss_series:
        return LayerResult(HOST, NOT_MEASURED, R_NO_LEVEL, "MiB", series=mine, life=life)
    for s in mine:
        if s.kind != "rss":
            s.decides = False  # kinds, arenas and /dev/shm explain; RSS decides
    procs: list[HostProcessResult] = []
    caveats: set[str] = set()
    bound = arena_max or (th.arenas_per_core * cpu_count if cpu_count else None)
    for rss in rss_series:
        pid = rss.pid
        anon = by.get(f"rss_anon/pid{pid}")
        shmem = by.get(f"rss_shmem/pid{pid}")
        file_ = by.get(f"rss_file/pid{pid}")
        arenas = by.get(f"arenas/pid{pid}")
        reserved = by.get(f"arena_mib/pid{pid}")
        missing = []
        if anon is None and shmem is None and file_ is None:
            missing.append(C_NO_KINDS)
        if arenas is None:
            missing.append(C_NO_ARENAS)
        kinds = {k: g for k, g in (("anon", _growth(anon)), ("file", _growth(file_)),
                                   ("shmem", _growth(shmem))) if g is not None}
        growth_kind = max(kinds, key=lambda k: kinds[k]) if kinds and max(kinds.values()) > 0 else None
        explanation = None
        growing = rss.decides and (rss.verdict == LEAK or (rss.verdict == INCONCLUSIVE and rss.reason == R_STILL_CHANGING))
        if growing and arenas is not None and growth_kind in (None, "anon") \
                and _arena_explains(rss, anon, arenas, reserved):
            explanation = X_MALLOC_ARENAS
            rss.verdict = CACHING
        elif growing and growth_kind == "file" and anon is not None and anon.verdict != LEAK \
                and (shmem is None or shmem.verdict != LEAK):
            # Mapped files (weights, libraries) paged in as requests touch them: bounded by the
            # files' size and reclaimable by the kernel; the heap did not grow.
            explanation = X_FILE_BACKED
            rss.verdict = CACHING
        elif rss.verdict == CACHING and growth_kind == "shmem":
            explanation = X_PINNED
        rss.explanation = explanation
        if rss.decides:
            caveats.update(missing)
        a_levels = [v for v in _pairs(arenas) if v is not None]
        procs.append(HostProcessResult(
            pid=pid if pid is not None else -1, name=rss.name, role=rss.role,
            rss_growth_mib=rss.growth, anon_growth_mib=_growth(anon),
            file_growth_mib=_growth(file_), shmem_growth_mib=_growth(shmem),
            arenas_first=int(a_levels[0]) if a_levels else None,
            arenas_last=int(a_levels[-1]) if a_levels else None,
            arena_reserved_growth_mib=_growth(reserved), arena_bound=bound,
            arena_bound_set=arena_max is not None,
            growth_kind=growth_kind, explanation=explanation, missing=missing, series=rss.key))
    deciding = [s for s in rss_series if s.decides]
    verdict = worst(deciding)
    order = {"rss": 0, "rss_anon": 1, "rss_shmem": 2, "rss_file": 3, "arenas": 4, "arena_mib": 5}
    mine.sort(key=lambda s: (not s.decides, order.get(s.kind, 6), -(s.growth or 0.0), s.key))
    if verdict is None:
        return LayerResult(HOST, INCONCLUSIVE, R_TRANSIENT, "MiB", series=mine, life=life,
                           host_processes=procs, caveats=sorted(caveats))
    cands = [s for s in deciding if s.verdict == verdict]
    top = max(cands, key=lambda s: (s.slope_per_request or 0.0) if verdict == LEAK else abs(s.growth or 0.0))
    lay = LayerResult(HOST, verdict, top.reason, "MiB", growth=top.growth, life=life,
                      series=mine, host_processes=procs, caveats=sorted(caveats),
                      main_series=top.key, explanation=top.explanation)
    if verdict == LEAK:
        proc = next(p for p in procs if p.series == top.key)
        cause = "pinned_host_memory" if proc.growth_kind == "shmem" else "host_ram"
        lay.culprit = Culprit(top.key, pid=top.pid, name=top.name, cause=cause)
        lay.rate_per_request = lay.rate_mib_per_request = top.slope_per_request
        lay.rate_ci = top.slope_ci
        rate = top.slope_per_request
        lay.projection = Projection(
            capacity_left=available_mib, capacity_of="host_available",
            requests=available_mib / rate if available_mib is not None and rate and rate > 0 else None)
    return lay
