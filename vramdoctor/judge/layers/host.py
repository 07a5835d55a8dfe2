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

from vramdoctor.judge.layers.vram import time_driven_rate, worst
from vramdoctor.judge.results import (
    C_NO_ARENAS,
    C_NO_KINDS,
    CACHING,
    HOST,
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    R_GREW_WITH_TIME,
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


def _arena_explains(
    rss: SeriesResult,
    anon: SeriesResult | None,
    arenas: SeriesResult,
    reserved: SeriesResult | None,
    writable: SeriesResult | None = None,
) -> bool:
    """Growth that new malloc arenas explain: the arena count rose, the (anonymous) growth is
    above the floor and fits in what the arenas hold (what their heaps have grown to, where
    /proc/PID/maps showed it; else what they reserve), and it did not go on for two rounds
    after the last round that added an arena (growth with the arena count flat is not the
    arenas). Arenas keep freed memory in their own heaps: growth outside the heaps (a leak
    in the main heap or in mmap'd blocks) is not theirs, however many threads came."""
    grow = anon if anon is not None and anon.settled_rounds >= 2 else rss
    g = _pairs(grow)
    a = _pairs(arenas)
    r = _pairs(reserved)
    w = _pairs(writable)
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
    last_rise = (
        max(i for i in range(1, len(rows)) if rows[i][1] > rows[i - 1][1])
        if any(rows[i][1] > rows[i - 1][1] for i in range(1, len(rows)))
        else 0
    )
    grew_after = sum(1 for i in range(last_rise + 1, len(rows)) if rows[i][0] - rows[i - 1][0] > h)
    if grew_after >= 2:
        return False  # kept growing for rounds after glibc stopped adding arenas
    if w0 is not None and w1 is not None:
        return g1 - g0 <= (w1 - w0) + h
    if r0 is None or r1 is None:
        return False
    return g1 - g0 <= (r1 - r0) + h


def host_layer(
    series: list[SeriesResult],
    life: int,
    available_mib: float | None,
    cpu_count: int | None,
    th: Thresholds,
    *,
    arena_max: int | None = None,
) -> LayerResult:
    """The host RAM verdict of one life from its judged series (RSS decides; kinds explain).
    `arena_max`: MALLOC_ARENA_MAX set in the server's environment (else glibc's 8 x cores)."""
    mine = [s for s in series if s.layer == HOST]
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
        writable = by.get(f"arena_wmib/pid{pid}")
        missing = []
        if anon is None and shmem is None and file_ is None:
            missing.append(C_NO_KINDS)
        if arenas is None:
            missing.append(C_NO_ARENAS)
        kinds = {
            k: g
            for k, g in (
                ("anon", _growth(anon)),
                ("file", _growth(file_)),
                ("shmem", _growth(shmem)),
            )
            if g is not None
        }
        growth_kind = (
            max(kinds, key=lambda k: kinds[k]) if kinds and max(kinds.values()) > 0 else None
        )
        explanation = None
        # Growth inside idle windows (no request in flight) is no allocator's caching.
        growing = (
            rss.decides
            and rss.reason != R_GREW_WITH_TIME
            and (
                rss.verdict == LEAK
                or (rss.verdict == INCONCLUSIVE and rss.reason == R_STILL_CHANGING)
            )
        )
        if (
            growing
            and arenas is not None
            and growth_kind in (None, "anon")
            and (not _noisy(rss, th) or _levelled_off(rss, floor_for_rss(rss, th)))
            and _arena_explains(rss, anon, arenas, reserved, writable)
        ):
            explanation = X_MALLOC_ARENAS
            rss.verdict = CACHING
        elif (
            growing
            and growth_kind == "file"
            and anon is not None
            and anon.verdict != LEAK
            and (shmem is None or shmem.verdict != LEAK)
        ):
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
        procs.append(
            HostProcessResult(
                pid=pid if pid is not None else -1,
                name=rss.name,
                role=rss.role,
                rss_growth_mib=rss.growth,
                anon_growth_mib=_growth(anon),
                file_growth_mib=_growth(file_),
                shmem_growth_mib=_growth(shmem),
                arenas_first=int(a_levels[0]) if a_levels else None,
                arenas_last=int(a_levels[-1]) if a_levels else None,
                arena_reserved_growth_mib=_growth(reserved),
                arena_bound=bound,
                arena_bound_set=arena_max is not None,
                growth_kind=growth_kind,
                explanation=explanation,
                missing=missing,
                series=rss.key,
            )
        )
    deciding = [s for s in rss_series if s.decides] + [
        s for s in mine if s.kind == "dev_shm" and s.decides
    ]
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
            caveats=sorted(caveats),
        )
    cands = [s for s in deciding if s.verdict == verdict]
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
        caveats=sorted(caveats),
        main_series=top.key,
        explanation=top.explanation,
    )
    if verdict == LEAK:
        proc = next((p for p in procs if p.series == top.key), None)
        cause = (
            "dev_shm"
            if top.kind == "dev_shm"
            else "pinned_host_memory"
            if proc is not None and proc.growth_kind == "shmem"
            else "host_ram"
        )
        lay.culprit = Culprit(top.key, pid=top.pid, name=top.name, cause=cause)
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
