"""The host RAM layer's sentences: RSS of the server's processes by kind (/proc status and maps).

Growth that is not a leak has a name here: new glibc malloc arenas that keep freed heap,
mapped files paged in (RssFile), PyTorch's pinned host memory (RssShmem that levels off). A
leak says in which kind it grows and whether the arena count rules allocator caching out.
"""

from __future__ import annotations

from types import MappingProxyType

from vramdoctor.judge.results import (
    C_NO_ARENAS,
    C_NO_KINDS,
    HOST,
    X_FILE_BACKED,
    X_MALLOC_ARENAS,
    X_PINNED,
    HostProcessResult,
    LayerResult,
    SoakAnalysis,
)
from vramdoctor.soak.report.layers.base import LayerBlock, held_text, inside, main_series, who
from vramdoctor.soak.report.text import count, rate, size

__all__ = ["HostBlock", "arena_text"]


def arena_text(p: HostProcessResult, cpus: int | None) -> str:
    """Why new malloc arenas are caching, bounded by MALLOC_ARENA_MAX (the server's own, or
    glibc's default of 8 x `cpus` cores), and how to confirm it."""
    if p.arena_bound and p.arena_bound_set:
        bound = f"the server's MALLOC_ARENA_MAX={p.arena_bound} ({count(p.arena_bound, 'arena')})"
    elif p.arena_bound and cpus:
        bound = f"MALLOC_ARENA_MAX, by default 8 x {count(cpus, 'core')} = {count(p.arena_bound, 'arena')}"
    else:
        bound = "MALLOC_ARENA_MAX (by default 8 x the cores)"
    return (
        f"glibc created new malloc arenas ({count(p.arenas_first, 'arena')} -> "
        f"{count(p.arenas_last, 'arena')}, {size(p.arena_reserved_growth_mib, signed=True)} "
        f"reserved) and keeps freed heap in them: host-allocator caching, bounded by {bound}, "
        "not a leak; to confirm, restart the server with MALLOC_ARENA_MAX=2 (or jemalloc): "
        "the growth should stop"
    )


_LIVE = {
    "glibc_in_use": "bytes in use by malloc (glibc's own count, mallinfo2)",
    "py_blocks": "Python objects (sys.getallocatedblocks: their arenas are outside glibc's count)",
    "py_traced": "Python allocations traced by tracemalloc",
    "pinned_in_use": "pinned host memory handed out",
}


def _retention_text(name: str, lay: LayerResult, proc: HostProcessResult) -> str:
    """Growth with every live count flat, read inside: what glibc (or PyTorch's pinned
    allocator) keeps, and how to confirm."""
    who_ = f"pid {proc.pid} ({proc.name or '?'})"
    if lay.explanation == X_PINNED:
        return (
            f"{name}: CACHING: RSS of {who_} grew {size(proc.shmem_growth_mib, signed=True)} in "
            "RssShmem while the pinned host memory handed out stayed flat, read inside the "
            "process: PyTorch's pinned host allocator keeps the freed blocks, not a leak."
        )
    kept = inside(lay, "glibc_kept")
    in_use = inside(lay, "glibc_in_use")
    blocks = inside(lay, "py_blocks")
    flat = "malloc's bytes in use" + (" and Python's objects" if blocks is not None else "")
    in_use_growth = f" ({size(in_use.growth, signed=True)})" if in_use is not None else ""
    kept_text = (
        f"; glibc's free lists grew {size(kept.growth, signed=True)}" if kept is not None else ""
    )
    return (
        f"{name}: CACHING: RSS of {who_} grew {size(proc.rss_growth_mib, signed=True)} while "
        f"{flat} stayed flat{in_use_growth}, read inside the process by vramdoctor's agent: the "
        f"growth is memory kept for reuse, not held (glibc's arena retention{kept_text}; the "
        "rest outside malloc's counters: thread stacks, Python's arenas, libraries' "
        "mappings), not a leak; MALLOC_ARENA_MAX=2 (or malloc_trim) gives it back."
    )


def _process(lay: LayerResult) -> HostProcessResult | None:
    return next((p for p in lay.host_processes if p.series == lay.main_series), None)


FEW_ROUNDS = 8
"""Up to this many rounds, a LEAK read from live bytes says a filling cache looks the same."""


class HostBlock(LayerBlock):
    """RSS by kind per process; /dev/shm; malloc arenas as the host allocator's cache."""

    layer = HOST
    display = "host RAM"
    not_measured = "the server's processes are not visible from here"
    caveats = MappingProxyType(
        {
            C_NO_KINDS: "no RssAnon/RssFile/RssShmem (not recorded, or /proc/PID/status of another "
            "user or a container): judged on total RSS only",
            C_NO_ARENAS: "no malloc arena counts (not recorded, or /proc/PID/maps unreadable): "
            "growth from new glibc arenas cannot be ruled out",
        }
    )

    def leak(self, lay: LayerResult, a: SoakAnalysis, *, ci: str, proj: str) -> str:
        name = self.display
        s = main_series(lay)
        if s is not None and s.reason == "live_grew":
            what = _LIVE.get(s.evidence_kind or "", "live bytes")
            rounds = sum(1 for r in a.rounds if r.reached and r.life >= 0)
            filling = ""
            if rounds <= FEW_ROUNDS:
                # live bytes cannot tell a leak from a cache of live objects that has not reached
                # its cap yet (a 60 x 512 KiB cache, filling over six rounds, read
                # LEAK after five): said while the rounds are few
                filling = (
                    f"; in {rounds} rounds a cache of live objects still filling at this rate "
                    f"looks the same until it is full (more --rounds tell)"
                )
            return (
                f"{name}: LEAK: {what} of {who(lay)} grow {rate(lay.rate_per_request, 'MiB')} per "
                f"request{ci} in every round of identical traffic, read inside the process by "
                f"vramdoctor's agent: memory held, not kept for reuse{held_text(lay)}{filling}{proj}."
            )
        proc = _process(lay)
        kind = ""
        if proc is not None and proc.growth_kind == "shmem":
            kind = " in RssShmem (pinned or shared host memory that is never released)"
        elif proc is not None and proc.growth_kind == "anon":
            # (from outside, steady heap growth is retention_or_leak: a LEAK here grew in time or
            # was read inside, and the arena count says nothing either way)
            kind = " in anonymous memory (heap)"
        caveat = ""
        if proc is not None and C_NO_ARENAS in proc.missing:
            caveat = (
                " (malloc arenas could not be read: to rule allocator caching out, restart "
                "with MALLOC_ARENA_MAX=2)"
            )
        if lay.culprit is not None and lay.culprit.cause == "dev_shm":
            return (
                f"{name}: LEAK: /dev/shm grows {rate(lay.rate_per_request, 'MiB')} per request{ci} "
                f"in every round of identical traffic: files in shared memory (tmpfs) that no "
                f"process's RSS shows; list them with `ls -la /dev/shm`{proj}."
            )
        return (
            f"{name}: LEAK: RSS of {who(lay)} grows {rate(lay.rate_per_request, 'MiB')} per "
            f"request{ci} in every round of identical traffic{kind}{caveat}{proj}."
        )

    def explained(self, lay: LayerResult, a: SoakAnalysis) -> str | None:
        name = self.display
        proc = _process(lay)
        s = main_series(lay)
        if s is not None and s.reason == "live_flat" and proc is not None:
            return _retention_text(name, lay, proc)
        if proc is not None and proc.explanation == X_MALLOC_ARENAS:
            return (
                f"{name}: CACHING: RSS of pid {proc.pid} ({proc.name or '?'}) grew "
                f"{size(proc.rss_growth_mib, signed=True)}: {arena_text(proc, a.cpu_count)}."
            )
        if proc is not None and proc.explanation == X_FILE_BACKED:
            return (
                f"{name}: CACHING: RSS of pid {proc.pid} ({proc.name or '?'}) grew "
                f"{size(proc.file_growth_mib, signed=True)} in RssFile while its heap (RssAnon) did "
                "not: mapped files (weights, libraries) paged in as requests touch them, bounded "
                "by the files' size and reclaimable by the kernel, not a leak."
            )
        if proc is not None and proc.explanation == X_PINNED:
            return (
                f"{name}: CACHING: RSS of pid {proc.pid} ({proc.name or '?'}) grew "
                f"{size(proc.shmem_growth_mib, signed=True)} in RssShmem and levelled off: CUDA "
                "pinned host memory kept by PyTorch's host allocator (the host twin of VRAM "
                "caching), not a leak."
            )
        return super().explained(lay, a)

    def caching_why(self, lay: LayerResult) -> str | None:
        # Arenas are named only where the judge found their heaps grew enough to hold the
        # growth (explanation malloc_arenas), never because the count rose beside it.
        proc = _process(lay)
        if (
            proc is not None
            and X_MALLOC_ARENAS in (lay.explanation, proc.explanation)
            and proc.arenas_first is not None
            and proc.arenas_last is not None
            and proc.arenas_last > proc.arenas_first
        ):
            return (
                f"glibc's malloc arenas ({count(proc.arenas_first, 'arena')} -> "
                f"{count(proc.arenas_last, 'arena')}) keep freed heap: host-allocator caching, not a leak"
            )
        return None

    def short_caching(self, lay: LayerResult, growth: str) -> str | None:
        if lay.explanation == X_MALLOC_ARENAS:
            return f"host RAM grows with malloc arenas ({growth}): allocator caching, not a leak"
        return None


BLOCK = HostBlock()
