"""What soak users see: the live view while it runs, and the final report.

The analysis (`vramdoctor.judge`) gives numbers and codes; this module turns them
into sentences, tables, sparklines, a chart and the `--json` object (schema
`vramdoctor.soak/2`, documented in docs/soak.md). Every number is formatted by
`vramdoctor.units` with its unit. The headline answers the VRAM question first, then names
every other layer that is not STABLE or CACHING; it is built from the same layer results as
the table, so the two cannot disagree. Nothing is cut at 80 columns or when piped: cells wrap,
the verdict column never shrinks, sparklines sit on their own line with their range printed.
"""

from __future__ import annotations

import base64
import html
import math
import statistics
import threading
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from vramdoctor.errors import InputError
from vramdoctor.judge.results import (
    C_KV_RATIO_ONLY,
    C_NO_ARENAS,
    C_NO_KINDS,
    C_NOT_IDLE_FILTERED,
    C_PAGE_SIZE_ASSUMED,
    CACHING,
    HOST,
    INCONCLUSIVE,
    KV,
    LAYERS,
    LEAK,
    NOT_MEASURED,
    SCHEMA,
    STABLE,
    VRAM,
    X_FILE_BACKED,
    X_KV_RESIDUE,
    X_MALLOC_ARENAS,
    X_PINNED,
    X_STRAY_CONTEXT,
    HostProcessResult,
    LayerResult,
    SeriesResult,
    SoakAnalysis,
    Undecided,
    finite,
)
from vramdoctor.judge.series import kv_usage
from vramdoctor.render.charts import LeakFit, Line, Span, memory_chart
from vramdoctor.render.charts import Panel as ChartPanel
from vramdoctor.samples import GpuSample, HostSample, MetricsSample
from vramdoctor.units import (
    format_bytes,
    format_count,
    format_duration,
    format_mib,
    format_percent,
    mib_to_bytes,
)

if TYPE_CHECKING:
    from vramdoctor.record import Run

_BLOCKS = "▁▂▃▄▅▆▇█"
VERDICT_STYLE = {
    LEAK: "bold red",
    CACHING: "bold yellow",
    STABLE: "bold green",
    INCONCLUSIVE: "bold magenta",
    NOT_MEASURED: "dim",
}
LAYER_NAMES = {VRAM: "VRAM", KV: "KV pool", HOST: "host RAM"}


# --- numbers with their units -----------------------------------------------------------------


def _ok(v: float | None) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def size(mib: float | None, *, signed: bool = False) -> str:
    """A size given in MiB in the unit that reads best ("13.7 MiB", "64.0 KiB", "1.5 GiB")."""
    if not _ok(mib):
        return "-"
    assert mib is not None
    return format_bytes(mib_to_bytes(mib), signed=signed)


def value(v: float | None, unit: str, *, signed: bool = False) -> str:
    """One value of a series in its unit."""
    if not _ok(v):
        return "-"
    assert v is not None
    if unit == "MiB":
        return format_mib(v, 0 if abs(v) >= 100 else 1, signed=signed)
    if unit == "ratio":
        return ("+" if signed and v > 0 else "") + format_percent(v, 2) + " of the pool"
    text = (
        count(round(v, 1), unit[:-1], unit)
        if unit.endswith("s")
        else format_count(round(v, 1), unit)
    )
    return ("+" + text) if signed and v > 0 else text


def count(n: float | None, singular: str, plural: str | None = None) -> str:
    """A count with its unit in the right number: "1 page", "4 pages", "0.5 pages"."""
    word = singular if n == 1 else (plural or singular + "s")
    return format_count(n, word)


def rate(v: float | None, unit: str) -> str:
    """A rate per request in its unit ("13.7 MiB", "64 tokens", "0.20 % of the pool")."""
    if not _ok(v):
        return "-"
    assert v is not None
    if unit == "MiB":
        return size(v)
    if unit == "ratio":
        return format_percent(v, 3) + " of the pool"
    return format_count(round(v, 2), unit)


# --- series ----------------------------------------------------------------------------------


def label(s: SeriesResult) -> str:
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
        "kv": f"KV pool {s.pool}" if s.unit != "ratio" else "KV usage",
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
        if _ok(s.creep_floor_per_request):
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
    return r


# --- layers ----------------------------------------------------------------------------------


def _rounds_text(a: SoakAnalysis) -> str:
    n = len([r for r in a.rounds if r.reached and r.life >= 0])
    return format_count(n, "round" if n == 1 else "rounds")


def _main(lay: LayerResult) -> SeriesResult | None:
    return next((s for s in lay.series if s.key == lay.main_series), None)


def _projection_text(lay: LayerResult) -> str:
    p = lay.projection
    if p is None or not _ok(p.requests):
        return ""
    assert p.requests is not None
    what = "the KV pool is full" if lay.layer == KV else "out of memory"
    left = {
        "gpu_free": f"{size(p.capacity_left)} free on the GPU",
        "host_available": f"{size(p.capacity_left)} of host RAM available",
        "kv_free_tokens": f"{value(p.capacity_left, 'tokens')} free",
        "kv_free_ratio": f"{value(p.capacity_left, 'ratio')} free",
    }.get(p.capacity_of, "")
    text = f"{what} after ~{format_count(round(p.requests), 'more requests')} at this rate ({left})"
    if _ok(p.hours) and _ok(p.production_rate_rps):
        assert p.hours is not None and p.production_rate_rps is not None
        src = (
            "given"
            if p.production_rate_source == "argument"
            else "the server's own counter before the soak"
        )
        text += (
            f", about {format_duration(p.hours * 3600.0)} at "
            f"{format_count(round(p.production_rate_rps, 3), 'requests/s')} ({src})"
        )
    return text


def _who(lay: LayerResult) -> str:
    c = lay.culprit
    s = _main(lay)
    if c is not None and c.pid is not None:
        where = f" on GPU {c.gpu}" if c.gpu is not None else ""
        return f"pid {c.pid} ({c.name or '?'}){where}"
    if s is not None:
        return label(s)
    return LAYER_NAMES[lay.layer]


def _arena_text(p: HostProcessResult, cpus: int | None) -> str:
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


def layer_sentence(lay: LayerResult, a: SoakAnalysis) -> str:
    """One layer's verdict as a sentence with its numbers and units."""
    name = LAYER_NAMES[lay.layer]
    s = _main(lay)
    if lay.verdict == NOT_MEASURED:
        why = {
            VRAM: "no GPU source: NVML on the server's host, or --gpu-metrics",
            KV: "the server exports no KV gauge; SGLang needs --enable-metrics",
            HOST: "the server's processes are not visible from here",
        }[lay.layer]
        return f"{name}: not measured ({why})."
    if lay.verdict == LEAK:
        return _leak_sentence(lay, a)
    if lay.verdict == INCONCLUSIVE:
        reason = series_reason(s) if s is not None else "no series decided"
        where = f"{label(s)}: " if s is not None else ""
        return f"{name}: INCONCLUSIVE: {where}{reason}."
    if lay.layer == HOST:
        proc = next((p for p in lay.host_processes if p.series == lay.main_series), None)
        if proc is not None and proc.explanation == X_MALLOC_ARENAS:
            return (
                f"{name}: CACHING: RSS of pid {proc.pid} ({proc.name or '?'}) grew "
                f"{size(proc.rss_growth_mib, signed=True)}: {_arena_text(proc, a.cpu_count)}."
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
    if lay.layer == KV and lay.explanation == X_KV_RESIDUE and s is not None:
        return (
            f"{name}: {lay.verdict}: {label(s)} holds {value(s.last, s.unit)} at idle (0 running, "
            f"0 queued) that do not grow with requests: held and not released, but not a leak "
            "(a healthy idle pool holds 0)."
        )
    if lay.verdict == STABLE:
        if lay.layer == KV and s is not None:
            return (
                f"{name}: STABLE: {value(s.last, s.unit)} used at idle after every round (healthy)."
            )
        thr = value(s.threshold, s.unit) if s is not None else "the noise"
        return f"{name}: STABLE: no series moved beyond {thr} across {_rounds_text(a)} of identical traffic."
    growth = value(s.growth, s.unit, signed=True) if s is not None else "-"
    where = label(s) if s is not None else name
    why = "memory kept for reuse, not a leak"
    if lay.layer == HOST:
        proc = next((p for p in lay.host_processes if p.series == lay.main_series), None)
        if (
            proc is not None
            and proc.arenas_first is not None
            and proc.arenas_last is not None
            and proc.arenas_last > proc.arenas_first
        ):
            why = (
                f"glibc's malloc arenas ({count(proc.arenas_first, 'arena')} -> "
                f"{count(proc.arenas_last, 'arena')}) keep freed heap: host-allocator caching, not a leak"
            )
    return (
        f"{name}: CACHING: {where} rose {growth} and then stayed flat across {_rounds_text(a)} of "
        f"identical traffic: {why}."
    )


def _time_leak_sentence(lay: LayerResult) -> str:
    """A leak driven by time: per hour, idle included; hours to the capacity at that rate."""
    name = LAYER_NAMES[lay.layer]
    per_hour = rate(lay.rate_per_hour, lay.unit)
    p = lay.projection
    proj = ""
    if p is not None and _ok(p.hours):
        assert p.hours is not None
        left = {
            "gpu_free": "the GPU's free memory",
            "host_available": "the available host RAM",
            "kv_free_tokens": "the KV pool's free tokens",
        }.get(p.capacity_of, "the capacity")
        proj = f"; {left} is used up in about {format_duration(p.hours * 3600.0)} at this rate"
    who = _who(lay)
    return (
        f"{name}: LEAK: {who} grows {per_hour} per hour with time, also inside the idle "
        f"windows with no request in flight: a leak driven by time (a timer, a log or "
        f"buffer that fills), not by requests; the rate per request "
        f"({rate(lay.rate_per_request, lay.unit)}) is only an average at the soak's load{proj}."
    )


def _leak_sentence(lay: LayerResult, a: SoakAnalysis) -> str:
    if lay.rate_per_hour is not None:
        return _time_leak_sentence(lay)
    name = LAYER_NAMES[lay.layer]
    proj = _projection_text(lay)
    proj = f"; {proj}" if proj else ""
    if lay.rate_per_aborted_request is not None:
        share = sum(r.aborted or 0 for r in a.rounds if r.life >= 0 and r.reached)
        reached = sum(r.reached for r in a.rounds if r.life >= 0 and r.reached)
        proj += (
            f"; {rate(lay.rate_per_aborted_request, lay.unit)} per aborted request, should only "
            f"the {format_count(share, 'streams')} of {format_count(reached, 'requests')} the "
            f"client abandoned leak (soak again with --abort-fraction 0 to tell)"
        )
    ci = ""
    if lay.rate_ci is not None:
        ci = (
            f" (90 % interval {rate(lay.rate_ci[0], lay.unit)} to {rate(lay.rate_ci[1], lay.unit)})"
        )
    if lay.layer == KV:
        pool = next((p for p in lay.kv_pools if p.series == lay.main_series), None)
        if pool is not None and pool.unit == "tokens":
            parts = []
            if pool.page_size_tokens and _ok(pool.pages_per_request):
                parts.append(
                    f"{count(round(pool.pages_per_request or 0.0, 2), 'page')} of "
                    f"{format_count(pool.page_size_tokens, 'tokens')}"
                )
            if _ok(pool.mib_per_request):
                parts.append(size(pool.mib_per_request))
            what = rate(pool.tokens_per_request, "tokens") + (
                f" ({', '.join(parts)})" if parts else ""
            )
        else:
            what = rate(lay.rate_per_request, lay.unit)
        return (
            f"{name} {lay.culprit.pool if lay.culprit else ''}: LEAK: {what} stay used at idle "
            f"per request{ci}, with no request running or queued: KV pages never freed (the "
            f"pool is preallocated, so this never shows in nvidia-smi){proj}."
        )
    if lay.layer == HOST:
        proc = next((p for p in lay.host_processes if p.series == lay.main_series), None)
        kind = ""
        if proc is not None and proc.growth_kind == "shmem":
            kind = " in RssShmem (pinned or shared host memory that is never released)"
        elif proc is not None and proc.growth_kind == "anon":
            kind = " in anonymous memory (heap)"
            if proc.arenas_first is not None and proc.arenas_first == proc.arenas_last:
                kind += ", with the malloc arena count flat: not allocator caching"
            elif proc.arenas_first is not None:
                kind += ", beyond what new malloc arenas explain"
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
            f"{name}: LEAK: RSS of {_who(lay)} grows {rate(lay.rate_per_request, 'MiB')} per "
            f"request{ci}{kind} in every round of identical traffic{caveat}{proj}."
        )
    cause = (
        "a stray CUDA context"
        if lay.culprit and lay.culprit.cause == X_STRAY_CONTEXT
        else "allocator memory that is never freed"
    )
    kv = a.layers.get(KV)
    if kv is not None and kv.verdict in (STABLE, CACHING):
        cause += " (the KV pool is back to its idle level: not KV pages, but preprocessing or activations)"
    return (
        f"{name}: LEAK: GPU memory of {_who(lay)} grows {rate(lay.rate_per_request, 'MiB')} per "
        f"request{ci} in every round of identical traffic: {cause}{proj}."
    )


def _short(lay: LayerResult) -> str:
    """The layer in a few words, for the headline."""
    name = LAYER_NAMES[lay.layer]
    s = _main(lay)
    if lay.verdict == LEAK:
        if lay.layer == KV:
            pool = next((p for p in lay.kv_pools if p.series == lay.main_series), None)
            if pool is not None and pool.unit == "tokens":
                pages = (
                    f" ({count(round(pool.pages_per_request or 0.0, 2), 'page')})"
                    if pool.page_size_tokens and _ok(pool.pages_per_request)
                    else ""
                )
                return f"the KV pool leaks {rate(pool.tokens_per_request, 'tokens')}{pages} per request"
        if lay.rate_per_hour is not None:
            return f"{name} leaks {rate(lay.rate_per_hour, lay.unit)} per hour with time, idle included ({_who(lay)})"
        return f"{name} leaks {rate(lay.rate_per_request, lay.unit)} per request ({_who(lay)})"
    if lay.verdict == CACHING:
        growth = value(s.growth, s.unit, signed=True) if s is not None else ""
        if lay.layer == HOST and lay.explanation == X_MALLOC_ARENAS:
            return f"host RAM grows with malloc arenas ({growth}): allocator caching, not a leak"
        if s is not None and s.reason == "fell_back":
            return f"{name} is caching, not leaking (rose, then fell back: {growth} from the start)"
        if s is not None and s.reason == "bounded":
            return f"{name} is caching, not leaking (up and down within a band: {growth} from the start)"
        if s is not None and (s.growth or 0.0) <= 0:
            return f"{name} is caching, not leaking (no rise: {growth} from the start)"
        return f"{name} is caching, not leaking (rose {growth}, then flat)"
    if lay.verdict == STABLE:
        return f"{name} is stable"
    if lay.verdict == INCONCLUSIVE:
        return f"{name} is undecided ({series_reason(s) if s is not None else lay.reason})"
    return f"{name} not measured"


def headline(a: SoakAnalysis) -> str:
    """The run in one sentence: VRAM first, then every other layer not STABLE or CACHING."""
    first = f" (first error: {a.first_error})" if a.first_error else ""
    if a.no_request_succeeded and a.verdict != LEAK:
        return f"INCONCLUSIVE: no request succeeded, so memory was never exercised{first}."
    parts = [_short(a.layers[VRAM])]
    vram_measured = a.layers[VRAM].verdict != NOT_MEASURED
    for name in (KV, HOST):
        lay = a.layers.get(name)
        if lay is not None and (
            lay.verdict in (LEAK, INCONCLUSIVE)
            or (not vram_measured and lay.verdict != NOT_MEASURED)
        ):
            parts.append(_short(lay))
    died = ""
    if a.server_died:
        life = next((lf for lf in a.lives if lf.ended_by == "server_died"), None)
        why = f" ({life.reason})" if life is not None and life.reason else ""
        rnd = _death_round(a)
        died = (
            f"the server died{why}"
            + (f" during round {rnd}" if rnd else "")
            + ": the rounds after it carry no verdict; "
        )
    if a.no_request_succeeded:
        # One verdict, one headline: the requests failed or timed out, but they reached the
        # server (model.REACHED_SERVER) and memory grew with them.
        reached = sum(r.reached for r in a.rounds)
        sent = sum(r.sent for r in a.rounds)
        died += (
            f"no request completed{first}, but {reached:,} of "
            f"{count(sent, 'request')} reached the server; "
        )
    return f"{a.verdict}: {died}" + "; ".join(parts) + "."


def _death_round(a: SoakAnalysis) -> int | None:
    life = next((lf for lf in a.lives if lf.ended_by == "server_died"), None)
    if life is None or life.end_t is None:
        return None
    for w in a.windows:
        if w.start <= life.end_t and (w.end is None or life.end_t <= w.end) and w.round:
            return w.round
    return None


def undecided_text(u: Undecided) -> str:
    """Why a layer is still undecided, for the live view and the report."""
    name = LAYER_NAMES.get(u.layer, u.layer)
    return (
        name
        + ": "
        + {
            "too_few_rounds": "too few rounds settled: caching and a leak look the same until round 3",
            "still_changing": "still changing, but not at a steady rate: more rounds tell a plateau from a leak",
            "noisy": (
                "the levels move more than the floor within idle windows or from round to round: "
                "more rounds (or a longer --idle) tell a trend from the noise"
            ),
            "no_settled_level": "no idle window completed yet",
            "never_idle": "never idle (requests running or queued in every idle window)",
            "no_request_succeeded": "no request succeeded",
            "server_died": "the server died",
        }.get(u.reason, u.reason)
    )


def suggestion(a: SoakAnalysis) -> str | None:
    """What to run to decide, when something is undecided or broken."""
    if a.server_died:
        return (
            "the server died during the soak: look in its log for an out-of-memory error "
            "(vramdoctor diagnose LOGFILE), then soak again"
        )
    if a.no_request_succeeded:
        return (
            "fix the traffic first: check --model (the server's model id), --api-key, --api, "
            "and that the server accepts images (or use --text-only)"
        )
    if not a.undecided:
        aborted = sum(r.aborted or 0 for r in a.rounds)
        if aborted and a.verdict == LEAK:
            # Every round has the same share of aborts, so the rate alone cannot say which
            # requests leak: a second soak without aborts can.
            return (
                "some requests in every round were abandoned mid-stream: soak again with "
                "--abort-fraction 0; if the leak goes away, the requests the client abandons "
                "cause it (memory or KV pages not released after a disconnect)"
            )
        return None
    n = len(a.rounds)
    per = max((r.sent for r in a.rounds), default=0)
    reasons = {u.reason for u in a.undecided}
    if "noisy" in reasons:
        return (
            "memory is noisy inside the idle windows: run with a longer --idle (e.g. 30) so "
            "levels settle, and keep other work off the GPU"
        )
    if n < 3:
        return f"run at least 4 rounds: vramdoctor soak --rounds {max(4, n + 2)} (same --requests)"
    return (
        f"run more rounds of the same traffic, e.g. --rounds {2 * n} --requests {per or 50}: "
        "caching flattens, a leak keeps growing"
    )


def notes(a: SoakAnalysis) -> list[str]:
    """Everything the reader should know besides the verdicts."""
    out: list[str] = []
    if not a.rounds:
        out.append("no round was started")
    sent = sum(r.sent for r in a.rounds)
    errors = sum(r.errors for r in a.rounds)
    if errors:
        by_kind: dict[str, int] = defaultdict(int)
        for r in a.rounds:
            for k, n in r.error_kinds.items():
                by_kind[k] += n
        words = {"http_error": "HTTP error", "timeout": "timeout", "connection": "connection error"}
        split = ", ".join(
            count(n, words.get(k, k.replace("_", " ") + " error"))
            for k, n in sorted(by_kind.items())
            if n
        )
        reached = sum(r.reached for r in a.rounds)
        out.append(
            f"{format_count(errors, 'requests')} of {format_count(sent, 'requests')} failed "
            f"({format_percent(errors / sent if sent else 0.0, 0)} error share"
            + (f": {split}" if split else "")
            + "); rates are per request that reached the "
            f"server ({format_count(reached, 'requests')}, failed ones included)"
        )
        if sum(r.ok for r in a.rounds) < 0.5 * sent and not a.no_request_succeeded:
            out.append("most requests failed: the memory seen reflects failed requests")
    if any(r.reached == 0 for r in a.rounds):
        out.append("in some rounds no request reached the server")
    aborted = sum(r.aborted or 0 for r in a.rounds)
    if aborted:
        out.append(f"{format_count(aborted, 'requests')} were abandoned by the client mid-stream")
    for life in a.lives:
        if life.ended_by == "server_replaced":
            out.append(
                f"the server was replaced (a new pid owns the port) after life {life.index + 1}: "
                "each life was analysed on its own rounds"
            )
    cut = [r.round for r in a.rounds if r.life < 0]
    if cut:
        out.append(
            "rounds without a verdict (cut by the server's death or replacement): "
            + ", ".join(str(c) for c in cut)
        )
    changes: dict[int, list[Any]] = {}
    for c in a.process_changes:
        changes.setdefault(c.pid, []).append(c)
    for pid, cs in changes.items():
        kinds = {c.change for c in cs}
        what = (
            "appeared and exited"
            if "transient" in kinds or {"appeared", "exited"} <= kinds
            else "appeared"
            if "appeared" in kinds
            else "exited"
        )
        rounds = sorted({c.round for c in cs if c.round})
        when = (" in round " + " and ".join(str(r) for r in rounds)) if rounds else ""
        first = cs[0]
        gpu = next((f" on GPU {c.gpu}" for c in cs if c.gpu is not None), "")
        name = next((c.name for c in cs if c.name), None) or first.name
        out.append(
            f"pid {pid} ({name or '?'}){gpu} {what}{when}: reported, judged only if it "
            "stayed for 2 settled rounds"
        )
    vram = a.layers.get(VRAM)
    if vram is not None:
        for key in vram.stray_contexts:
            s = next((x for x in vram.series if x.key == key), None)
            if s is not None:
                out.append(
                    f"pid {s.pid} ({s.name or '?'}) holds a context-sized {size(s.last)} on "
                    f"GPU {s.gpu}, not its main GPU: a stray CUDA context"
                )
    for name in LAYERS:
        lay = a.layers.get(name)
        if lay is None:
            continue
        for caveat in lay.caveats:
            out.append(
                LAYER_NAMES[name]
                + ": "
                + {
                    C_NO_KINDS: "no RssAnon/RssFile/RssShmem (not recorded, or /proc/PID/status of another "
                    "user or a container): judged on total RSS only",
                    C_NO_ARENAS: "no malloc arena counts (not recorded, or /proc/PID/maps unreadable): "
                    "growth from new glibc arenas cannot be ruled out",
                    C_PAGE_SIZE_ASSUMED: (
                        "the server does not say its KV page size: the rate is in tokens "
                        "only (SGLang's default page is 1 token, vLLM's 16)"
                    ),
                    C_KV_RATIO_ONLY: "pool size unknown: judged on the usage ratio, not tokens",
                    C_NOT_IDLE_FILTERED: "no running/queued gauges: idle samples could not be checked for "
                    "requests in flight",
                }.get(caveat, caveat)
            )
    leak_proj = any(lay.projection is not None for lay in a.layers.values())
    if leak_proj and a.production_rate_rps is None:
        out.append(
            "no production request rate: time to out of memory is given in requests, not "
            "hours (pass --production-rate REQ_PER_S; the soak's own burst load of "
            f"{format_count(round(a.observed_requests_per_hour or 0.0), 'requests/hour')} says "
            "nothing about production)"
        )
    if a.source_errors:
        out.append(f"{format_count(a.source_errors, 'source errors')} recorded (see the run file)")
    if a.collector_failed:
        out.append(
            f"sampling stopped: {a.collector_failed}; the verdict covers what was sampled before"
        )
    if a.status not in ("complete",):
        out.append(f"run {a.status}: the report covers what was measured")
    out += a.notes
    return out


# --- JSON ------------------------------------------------------------------------------------


def soak_json(a: SoakAnalysis) -> dict[str, Any]:
    """The `--json` object, schema `vramdoctor.soak/2` (docs/soak.md, "JSON")."""
    lead = next((a.layers[n] for n in LAYERS if a.layers[n].verdict == LEAK), None)
    culprit = None
    if lead is not None and lead.culprit is not None:
        culprit = {**lead.culprit.to_dict(), "layer": lead.layer}
    layers = {}
    for name in LAYERS:
        lay = a.layers[name]
        layers[name] = {**lay.to_dict(), "summary": layer_sentence(lay, a)}
    settled: list[dict[str, float]] = [{} for _ in a.rounds]
    for s in a.series:
        for i, v in enumerate(s.settled[: len(settled)]):
            if _ok(v):
                assert v is not None
                settled[i][s.key] = round(v, 3)
    return finite(
        {
            "schema": SCHEMA,
            "verdict": a.verdict,
            "headline": headline(a),
            "healthy": a.healthy,
            "exit_code": a.exit_code,
            "status": a.status,
            "interrupted": a.interrupted,
            "stopped_by": a.stopped_by,
            "layers": layers,
            "undecided": [
                {
                    "layer": u.layer,
                    "reason": u.reason,
                    "series": u.series,
                    "text": undecided_text(u),
                }
                for u in a.undecided
            ],
            "leak_mib_per_request": lead.rate_mib_per_request if lead is not None else None,
            "culprit": culprit,
            "suggestion": suggestion(a),
            "server_died": a.server_died,
            "server_replaced": a.server_replaced,
            "collector_failed": a.collector_failed,
            "lives": [
                {
                    "index": lf.index,
                    "pid": lf.pid,
                    "ended_by": lf.ended_by,
                    "reason": lf.reason,
                    "rounds": lf.rounds,
                }
                for lf in a.lives
            ],
            "production_rate_rps": a.production_rate_rps,
            "production_rate_source": a.production_rate_source,
            "observed_requests_per_hour": a.observed_requests_per_hour,
            "notes": notes(a),
            "rounds": [
                {
                    "round": r.round,
                    "requests": r.sent,
                    "ok": r.ok,
                    "errors": r.errors,
                    "reached": r.reached,
                    "error_kinds": r.error_kinds,
                    "error_messages": r.messages,
                    "complete": r.complete,
                    "life": r.life,
                    "streamed": r.streamed,
                    "aborted": r.aborted,
                    "settled": settled[i],
                }
                for i, r in enumerate(a.rounds)
            ],
            "series": [s.to_dict() for s in a.series],
            "process_changes": [
                {"pid": c.pid, "change": c.change, "round": c.round, "name": c.name, "gpu": c.gpu}
                for c in a.process_changes
            ],
        }
    )


# --- sparklines ------------------------------------------------------------------------------


def sparkline(values: list[float], width: int = 40, *, min_span: float = 0.0) -> str:
    """Unicode sparkline of the values (resampled to `width`). The scale spans at least
    `min_span`, so jitter below a series' floor never draws full height."""
    vals = [v for v in values if _ok(v)]
    if not vals:
        return ""
    if len(vals) > width:
        step = len(vals) / width
        vals = [vals[int(i * step)] for i in range(width)]
    lo, hi = min(vals), max(vals)
    span = max(hi - lo, min_span)
    if span < 1e-9:
        return _BLOCKS[0] * len(vals)
    return "".join(_BLOCKS[min(7, int((v - lo) / span * 7.999))] for v in vals)


def time_sparkline(
    values: list[tuple[float, float]], t0: float, t1: float, width: int, *, min_span: float = 0.0
) -> str:
    """A sparkline on a time axis: one cell per (t1-t0)/width seconds (last value in the cell;
    blank before the first sample), so cells line up with `phase_strip`."""
    pts = [(t, v) for t, v in values if _ok(t) and _ok(v)]
    if not pts or t1 <= t0:
        return " " * width
    step = (t1 - t0) / width
    cells: list[float | None] = [None] * width
    for t, v in pts:
        cells[min(width - 1, max(0, int((t - t0) / step)))] = v
    last: float | None = None
    for i, cell in enumerate(cells):
        if cell is None:
            cells[i] = last
        else:
            last = cell
    vals = [v for v in cells if v is not None]
    lo, hi = min(vals), max(vals)
    span = max(hi - lo, min_span)
    out = []
    for cell in cells:
        if cell is None:
            out.append(" ")
        elif span < 1e-9:
            out.append(_BLOCKS[0])
        else:
            out.append(_BLOCKS[min(7, int((cell - lo) / span * 7.999))])
    return "".join(out)


def phase_strip(a: SoakAnalysis, t0: float, t1: float, width: int) -> str:
    """The protocol on the same time axis: round digits while loading, '.' idle, 'b' baseline."""
    if t1 <= t0:
        return " " * width
    step = (t1 - t0) / width
    cells = [" "] * width
    for w in a.windows:
        end = w.end if w.end is not None else t1
        lo = max(0, int((w.start - t0) / step))
        hi = min(width, max(lo + 1, int((end - t0) / step + 0.5)))
        ch = {"load": str(w.round % 10), "idle": ".", "baseline": "b"}.get(w.kind, " ")
        for i in range(lo, hi):
            if cells[i] == " " or w.kind == "load":
                cells[i] = ch
    return "".join(cells)


def _time_range(a: SoakAnalysis) -> tuple[float, float] | None:
    starts = [p[0][0] for p in a.points.values() if p] + [w.start for w in a.windows]
    ends = [p[-1][0] for p in a.points.values() if p] + [
        w.end for w in a.windows if w.end is not None
    ]
    starts = [t for t in starts if _ok(t)]
    ends = [t for t in ends if _ok(t)]
    if not starts or not ends or max(ends) <= min(starts):
        return None
    return min(starts), max(ends)


# --- live view -------------------------------------------------------------------------------


class LiveView:
    """Rich live display fed by the collector (samples) and the load (request outcomes)."""

    def __init__(self, console: Console, rounds: int, per_round: int, history: int = 120) -> None:
        self.console = console
        self.rounds = rounds
        self.per_round = per_round
        self._series: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=history))
        self._units: dict[str, str] = {}
        self._lock = threading.Lock()
        self.errors: dict[str, int] = defaultdict(int)
        self.phase = "starting"
        self.undecided: list[str] = []
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._t_rounds = self.progress.add_task("rounds", total=rounds)
        self._t_reqs = self.progress.add_task("requests (round)", total=per_round)
        # Live redraws from _render 4 times a second (and once at exit); feeding it data does
        # not rebuild the display for every sample.
        self._live = Live(
            get_renderable=self._render, console=console, refresh_per_second=4, transient=False
        )

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.__exit__(*exc)

    def _add(self, key: str, v: float | None, unit: str) -> None:
        if _ok(v):
            assert v is not None
            self._series[key].append(float(v))
            self._units[key] = unit

    def on_sample(self, source: str, record: Any) -> None:
        with self._lock:
            if isinstance(record, GpuSample):
                for g in record.gpus:
                    self._add(f"GPU {g.index} used", g.used_mib, "MiB")
                for p in record.processes:
                    self._add(f"GPU {p.gpu} pid {p.pid} {p.name or ''}".strip(), p.used_mib, "MiB")
            elif isinstance(record, HostSample):
                for hp in record.processes:
                    self._add(f"RSS pid {hp.pid} {hp.name or ''}".strip(), hp.rss_mib, "MiB")
            elif isinstance(record, MetricsSample):
                if record.kv:
                    for pool in record.kv:
                        self._add(f"KV pool {pool.pool}", pool.used_tokens, "tokens")
                elif (kv := kv_usage(record)) is not None:
                    self._add("KV usage", kv, "ratio")

    def on_result(self, _req: Any, outcome: Any) -> None:
        with self._lock:
            if not outcome.ok:
                self.errors[outcome.kind] += 1
        self.progress.advance(self._t_reqs)

    def on_state(self, state: Any) -> None:
        self.phase = state.phase
        if state.phase == "load" and len(state.results) < state.round:
            self.progress.update(
                self._t_reqs, completed=0, description=f"requests (round {state.round})"
            )
        self.progress.update(self._t_rounds, completed=len(state.results))
        if state.phase_ends_at and state.phase in ("idle", "baseline"):
            left = max(0.0, state.phase_ends_at - time.monotonic())
            self.phase = f"{state.phase} ({format_duration(left)} left)"

    def on_analysis(self, analysis: SoakAnalysis) -> None:
        """After each round (adaptive soak): which layers are still undecided and why."""
        self.undecided = [undecided_text(u) for u in analysis.undecided]

    def _render(self) -> Group:
        table = Table(box=None, show_header=True, pad_edge=False)
        table.add_column("series", overflow="fold")
        table.add_column("now", justify="right", no_wrap=True)
        table.add_column("history", no_wrap=True)
        with self._lock:
            items = [(k, list(v), self._units.get(k, "MiB")) for k, v in self._series.items() if v]
        gpus = [i for i in items if i[0].endswith(" used")]
        procs = sorted((i for i in items if " pid " in i[0]), key=lambda i: -i[1][-1])[:4]
        kv = [i for i in items if i[0].startswith("KV")]
        for key, vals, unit in gpus + procs + kv:
            table.add_row(
                key,
                value(vals[-1], unit),
                sparkline(vals, width=24, min_span=2.0 if unit == "MiB" else 0.0),
            )
        errs = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        parts: list[Any] = [Text(f"phase: {self.phase}   errors: {errs}"), self.progress, table]
        for u in self.undecided:
            parts.append(Text(f"undecided: {u}", style="magenta"))
        return Group(*parts)


# --- final report ----------------------------------------------------------------------------


def figures(a: SoakAnalysis) -> list[tuple[str, str]]:
    """The run's key figures as (name, value with unit) rows."""
    rows = [("verdict", a.verdict)]
    for name in LAYERS:
        lay = a.layers[name]
        if lay.verdict == LEAK and lay.rate_per_hour is not None:
            rows.append(
                (
                    f"{LAYER_NAMES[name]} leak per hour (with time, idle included)",
                    rate(lay.rate_per_hour, lay.unit),
                )
            )
            if lay.projection is not None and _ok(lay.projection.hours):
                assert lay.projection.hours is not None
                rows.append(
                    (
                        f"{LAYER_NAMES[name]} runs out",
                        f"in about {format_duration(lay.projection.hours * 3600.0)} at this rate",
                    )
                )
            rows.append((f"{LAYER_NAMES[name]} culprit", _who(lay)))
        elif lay.verdict == LEAK:
            rows.append(
                (
                    f"{LAYER_NAMES[name]} leak per request",
                    rate(lay.rate_per_request, lay.unit)
                    + (
                        f" ({size(lay.rate_mib_per_request)})"
                        if lay.unit != "MiB" and _ok(lay.rate_mib_per_request)
                        else ""
                    ),
                )
            )
            proj = _projection_text(lay)
            if proj:
                rows.append((f"{LAYER_NAMES[name]} runs out", proj))
            rows.append((f"{LAYER_NAMES[name]} culprit", _who(lay)))
    if a.production_rate_rps is not None:
        rows.append(
            ("production rate", format_count(round(a.production_rate_rps, 3), "requests/s"))
        )
    if a.observed_requests_per_hour:
        rows.append(
            (
                "soak load",
                format_count(round(a.observed_requests_per_hour), "requests/hour")
                + " while sending (burst: not projected)",
            )
        )
    rows.append(
        (
            "rounds",
            f"{format_count(len(a.rounds), 'rounds')} "
            f"({format_count(sum(r.sent for r in a.rounds), 'requests')}, "
            f"{format_count(sum(r.errors for r in a.rounds), 'errors')})",
        )
    )
    return rows


def _levels_text(s: SeriesResult) -> str:
    vals = [value(v, s.unit) for v in s.settled]
    base = value(s.baseline, s.unit)
    return f"{base} -> " + ", ".join(vals)


def _shown_series(lay: LayerResult, limit: int) -> list[SeriesResult]:
    """The series worth a table row: deciding ones, then evidence that moved."""
    deciding = [s for s in lay.series if s.decides]
    culprit = lay.main_series
    deciding.sort(key=lambda s: (s.key != culprit, -abs(s.growth or 0.0), s.key))
    rest = [
        s
        for s in lay.series
        if not s.decides
        and (s.kind in ("gpu", "rss_anon", "rss_shmem", "arenas") or s.presence != "whole")
    ]
    return (deciding + rest)[:limit]


def render(a: SoakAnalysis, console: Console) -> None:
    """The terminal report: headline, layers, figures, settled levels, time chart, notes."""
    style = VERDICT_STYLE.get(a.verdict, "bold")
    console.print(Panel(Text(headline(a), style=style), title="vramdoctor soak", expand=False))
    lt = Table(
        title="verdict per memory layer", title_justify="left", show_lines=True, expand=False
    )
    lt.add_column("layer", no_wrap=True)
    lt.add_column("verdict", no_wrap=True, min_width=len("INCONCLUSIVE"))
    lt.add_column("why", overflow="fold", ratio=1)
    for name in LAYERS:
        lay = a.layers[name]
        sentence = layer_sentence(lay, a)
        lt.add_row(
            LAYER_NAMES[name],
            Text(lay.verdict.replace("_", " "), style=VERDICT_STYLE.get(lay.verdict, "")),
            Text(sentence.split(": ", 2)[-1] if lay.verdict != NOT_MEASURED else sentence),
        )
    console.print(lt)
    fig = Table(box=None, show_header=False, pad_edge=False)
    fig.add_column(style="dim", no_wrap=True)
    fig.add_column(overflow="fold")
    for k, v in figures(a):
        fig.add_row(k, v)
    console.print(fig)
    if a.rounds:
        t = Table(
            title="settled level after each round (baseline -> rounds 1..N; late idle window median)",
            title_justify="left",
            show_lines=False,
        )
        t.add_column("series", overflow="fold", ratio=2)
        t.add_column("verdict", no_wrap=True, min_width=len("INCONCLUSIVE"))
        t.add_column("levels", overflow="fold", ratio=3)
        t.add_column("rate/request", overflow="fold", ratio=1)
        for name in LAYERS:
            for s in _shown_series(a.layers[name], 6):
                verdict = s.verdict if s.decides else "(evidence)"
                t.add_row(
                    label(s),
                    Text(verdict, style=VERDICT_STYLE.get(s.verdict, "") if s.decides else "dim"),
                    _levels_text(s),
                    rate(s.slope_per_request, s.unit)
                    if s.verdict == LEAK and s.kind != "arenas"
                    else "-",
                )
        reqs = ", ".join(
            f"{r.sent}" + (f" ({r.errors} failed)" if r.errors else "") for r in a.rounds
        )
        t.add_row("requests per round", "", reqs, "", style="dim")
        console.print(t)
    _render_time_chart(a, console)
    for n in notes(a):
        console.print(f"note: {n}", style="dim", markup=False, highlight=False)
    sugg = suggestion(a)
    if sugg:
        console.print(f"to decide: {sugg}", style="bold", markup=False, highlight=False)


def _render_time_chart(a: SoakAnalysis, console: Console) -> None:
    rng = _time_range(a)
    if rng is None:
        return
    t0, t1 = rng
    width = max(20, min(72, console.width - 2))
    console.print(
        f"time: {format_duration(t1 - t0)} from left to right; b baseline, 1-9 load round, "
        ". idle; each line's own range is printed above it",
        style="dim",
        markup=False,
        highlight=False,
    )
    console.print("  " + phase_strip(a, t0, t1, width), markup=False, highlight=False, style="dim")
    for name in LAYERS:
        for s in _shown_series(a.layers[name], 4):
            pts = a.points.get(s.key, [])
            vals = [v for _, v in pts if _ok(v)]
            if not vals:
                continue
            line = time_sparkline(pts, t0, t1, width, min_span=s.threshold)
            lo, hi = min(vals), max(vals)
            console.print(
                f"{label(s)}: {value(lo, s.unit)} to {value(hi, s.unit)}",
                markup=False,
                highlight=False,
            )
            console.print("  " + line, markup=False, highlight=False)


# --- files -----------------------------------------------------------------------------------


def _fits(a: SoakAnalysis) -> list[LeakFit]:
    """The leaking layers' settled levels against cumulative requests, with capacity."""
    out = []
    cum, total = [], 0.0
    for r in a.rounds:
        total += r.reached
        cum.append(total)
    for name in LAYERS:
        lay = a.layers[name]
        s = _main(lay)
        if lay.verdict != LEAK or s is None or not _ok(s.slope_per_request):
            continue
        assert s.slope_per_request is not None
        pts = [(c, v) for c, v in zip(cum, s.settled, strict=False) if v is not None and _ok(v)]
        if s.baseline is not None:
            pts.insert(0, (0.0, s.baseline))
        if not pts:
            continue
        # The Theil-Sen line through the median point of the levels it was fitted on.
        xs = [p[0] for p in pts[1:]] or [p[0] for p in pts]
        ys = [p[1] for p in pts[1:]] or [p[1] for p in pts]
        intercept = statistics.median(
            y - s.slope_per_request * x for x, y in zip(xs, ys, strict=True)
        )
        cap = None
        p = lay.projection
        if p is not None and _ok(p.capacity_left) and s.last is not None:
            assert p.capacity_left is not None
            cap = s.last + p.capacity_left
        out.append(
            LeakFit(
                label(s) if s.kind == "kv" else f"{LAYER_NAMES[name]} {label(s)}",
                s.unit,
                pts,
                s.slope_per_request,
                intercept,
                cap,
            )
        )
    return out


def chart_png(a: SoakAnalysis, title: str) -> bytes:
    """The chart described in `vramdoctor.render.charts`, as PNG bytes."""
    rng = _time_range(a)
    t0 = rng[0] if rng else 0.0
    end_all = rng[1] if rng else t0
    spans = []
    for w in a.windows:
        end = w.end if w.end is not None else end_all
        text = (
            f"round {w.round}" if w.kind == "load" else ("baseline" if w.kind == "baseline" else "")
        )
        spans.append(Span(w.kind, w.start - t0, end - t0, text))
    idle_mid = {
        w.round: ((w.start + (w.end or w.start)) / 2 - t0) for w in a.windows if w.kind == "idle"
    }
    panels = []
    for name in LAYERS:
        lay = a.layers[name]
        lines = []
        for s in _shown_series(lay, 5):
            if s.kind in ("arenas",):
                continue
            settled = [
                (idle_mid[r.round], v)
                for r, v in zip(a.rounds, s.settled, strict=False)
                if v is not None and r.round in idle_mid
            ]
            lines.append(
                Line(
                    f"{label(s)} [{s.verdict if s.decides else 'evidence'}]",
                    [(t - t0, v) for t, v in a.points.get(s.key, [])],
                    s.unit,
                    settled,
                )
            )
        unit = lay.unit if lay.unit != "ratio" else "share of the pool"
        panels.append(ChartPanel(f"{LAYER_NAMES[name]}: {lay.verdict}", unit, lines))
    return memory_chart(panels, spans, title, fits=_fits(a))


def write_report_file(a: SoakAnalysis, path: Path, *, target: str | None = None) -> None:
    """FILE.png: the chart. FILE.html: headline, layers, figures, levels and the chart inlined."""
    suffix = path.suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise InputError(f"--report {path}: use a .html or .png file name")
    title = f"vramdoctor soak: {a.verdict}" + (f" — {target}" if target else "")
    png = chart_png(a, title)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if suffix == ".png":
            path.write_bytes(png)
            return
        path.write_text(_html(a, png, title), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write report {path}: {exc.strerror}") from None


def _html(a: SoakAnalysis, png: bytes, title: str) -> str:
    e = html.escape
    layers = "".join(
        f"<tr><th>{e(LAYER_NAMES[n])}</th><td class='{e(a.layers[n].verdict)}'>{e(a.layers[n].verdict)}</td>"
        f"<td style='text-align:left'>{e(layer_sentence(a.layers[n], a))}</td></tr>"
        for n in LAYERS
    )
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in figures(a))
    head = "".join(f"<th>r{r.round}</th>" for r in a.rounds)
    body = ""
    for n in LAYERS:
        for s in _shown_series(a.layers[n], 12):
            cells = "".join(f"<td>{e(value(v, s.unit))}</td>" for v in s.settled)
            body += (
                f"<tr><td>{e(label(s))}</td><td>{e(value(s.baseline, s.unit))}</td>{cells}"
                f"<td>{e(rate(s.slope_per_request, s.unit) if s.verdict == LEAK and s.kind != 'arenas' else '-')}</td>"
                f"<td class='{e(s.verdict)}'>{e(s.verdict if s.decides else '(evidence)')}</td>"
                f"<td style='text-align:left'>{e(series_reason(s))}</td></tr>"
            )
    reqs = "".join(f"<td>{r.sent} ({r.errors} failed)</td>" for r in a.rounds)
    note_items = "".join(f"<li>{e(n)}</li>" for n in notes(a))
    sugg = suggestion(a)
    sugg_html = f"<p><b>To decide:</b> {e(sugg)}</p>" if sugg else ""
    img = base64.b64encode(png).decode("ascii")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{e(title)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
th{{background:#f4f4f4}}.LEAK{{color:#b00;font-weight:bold}}.CACHING{{color:#a60}}
.STABLE{{color:#080}}.INCONCLUSIVE{{color:#808}}.sentence{{font-size:1.2em;padding:.6em;border-left:4px solid #888}}</style>
</head><body><h1>{e(title)}</h1>
<p class="sentence {e(a.verdict)}">{e(headline(a))}</p>{sugg_html}
<h2>Verdict per memory layer</h2><table>{layers}</table>
<table>{rows}</table>
<img alt="memory over time per layer, rounds shaded; leak fit against requests" src="data:image/png;base64,{img}" style="max-width:100%">
<h2>Settled level after each round</h2>
<table><tr><th>series</th><th>baseline</th>{head}<th>rate / request</th><th>verdict</th><th>why</th></tr>
{body}<tr><td>requests</td><td></td>{reqs}<td></td><td></td><td></td></tr></table>
<ul>{note_items}</ul>
<p style="color:#777">Shaded orange: load rounds; blue: idle windows; dots: settled levels; red line:
the fitted leak and its projection to capacity (in requests).
Generated by vramdoctor; the run file re-creates this report with <code>vramdoctor report RUN.jsonl</code>.</p>
</body></html>
"""


# --- a recorded run, end to end -----------------------------------------------------------------


def report_run(
    run: Run,
    *,
    json_out: bool,
    report_file: Path | None,
    run_path: Path | None = None,
    production_rate_rps: float | None = None,
    analysis: SoakAnalysis | None = None,
) -> int:
    """Analyse a soak run file and print its report (or `--json`); write `report_file` when
    given. Used at the end of `soak` and by `vramdoctor report RUN.jsonl`. Returns the exit
    code: 0 healthy, 1 a problem (LEAK in any layer, the server died, sampling failed).
    `analysis` is the run's analysis when the caller has it already (soak's adaptive rounds)."""
    from vramdoctor.attribution.report import render_run_attribution, run_attribution_json
    from vramdoctor.judge import Thresholds
    from vramdoctor.soak.analysis import analyse_soak
    from vramdoctor.render import console

    if report_file is not None and report_file.suffix.lower() not in (".png", ".html", ".htm"):
        raise InputError(
            f"--report {report_file}: use a .html or .png file name"
        )  # before any work
    cfg = run.header.get("config") or {}
    min_growth = cfg.get("min_growth_mib", 2.0)
    th = Thresholds(min_growth_mib=float(min_growth) if _ok(min_growth) else 2.0)
    rate_cfg = cfg.get("production_rate_rps")
    if (
        production_rate_rps is None
        and isinstance(rate_cfg, (int, float))
        and _ok(rate_cfg)
        and rate_cfg > 0
    ):
        production_rate_rps = float(rate_cfg)
    result = (
        analysis
        if analysis is not None
        else analyse_soak(
            run.records,
            run.header,
            production_rate_rps=production_rate_rps,
            raw_host=run.raw("host_memory"),
            status=run.status,
            th=th,
        )
    )
    extra = list(run.problems)  # the run file's own damage: bad lines, disorder, a full disk
    extra += run.dropped()  # what the sampler left out and why (source errors, their counts)
    if run.torn_tail:
        extra.append("the run file's last line was torn (the writer was killed); it was skipped")
    result.notes.extend(n for n in extra if n not in result.notes)
    if report_file is not None:
        try:
            write_report_file(result, report_file, target=run.header.get("target"))
        except InputError as exc:  # the measurement stands; only the extra file is missing
            console.error(str(exc))
            report_file = None
    if json_out:
        d = soak_json(result)
        d["run_file"] = str(run_path or run.path)  # the file the report was made from
        d["report_file"] = str(report_file) if report_file else None
        d["attribution"] = run_attribution_json(run)  # soak --attribute (vramdoctor.attribution)
        console.print_json(d)
    else:
        render(result, console.stdout())
        render_run_attribution(run, console.stdout())
        if run_path is not None:
            console.note(f"run file: {run_path}  (re-analyse: vramdoctor report {run_path})")
        if report_file is not None:
            console.note(f"report: {report_file}")
    return result.exit_code
