"""One series judged over the rounds of one server life: settled levels, presence, verdict."""

from __future__ import annotations

from dataclasses import dataclass

from vramdoctor.judge.results import (
    KV,
    LEAK,
    R_GREW_WITH_TIME,
    R_NEVER_IDLE,
    R_NO_LEVEL,
    R_TRANSIENT,
    SeriesResult,
    Thresholds,
    Window,
)
from vramdoctor.judge.series import Series, appeared_from_zero, late, settled_levels
from vramdoctor.stats.rounds import SeriesFit, classify_series, time_driven

# Series of one process: present for fewer than two settled rounds, they are reported as
# appeared/exited and never decide a layer.
PROCESS_KINDS = frozenset(
    {"gpu_process", "rss", "rss_anon", "rss_file", "rss_shmem", "arenas", "arena_mib", "arena_wmib"}
)


@dataclass
class LifeRounds:
    """The rounds of one server life and the requests that reached the server up to each."""

    life: int
    run_rounds: list[int]  # every round of the run, for the per-round table
    rounds: list[int]  # the rounds of this life
    cum_requests: list[float]  # per round of this life
    with_baseline: bool  # the run's baseline window belongs to this life (the first)


def floor_for(s: Series, th: Thresholds, level: float | None) -> float:
    """Smallest change that counts, in the series' unit. GPU memory moves in exact allocator
    blocks (absolute floor); a large process's RSS jitters with its heap (glibc arenas, GC), so
    there the floor also scales with the level (0.25 % of 4 GiB is 10 MiB a round); one arena;
    one KV page (the pool's real resolution, never a share of the pool)."""
    if s.kind == "kv":
        if s.unit == "ratio":
            if s.total_tokens:
                return (s.page_size_tokens or th.default_page_tokens) / s.total_tokens
            return th.kv_ratio_floor
        return float(s.page_size_tokens or th.default_page_tokens)
    if s.kind == "arenas":
        return 0.5
    if s.kind in ("rss", "rss_anon", "rss_file", "rss_shmem", "dev_shm") and level is not None:
        return max(th.min_growth_mib, th.rss_rel_floor * level)
    return th.min_growth_mib


def resolution_of(s: Series, th: Thresholds, level: float | None) -> float:
    """The measurement's own step, in the series' unit: NVML and the exporters report whole
    MiB; a KV count is whole tokens; an arena count whole arenas. A large process's RSS
    moves from round to round with its heap (glibc, the garbage collector) by about 0.25 % of
    its level, which no idle window shows: that jitter is its step (else whole 4 KiB pages)."""
    if s.kind in ("gpu", "gpu_process"):
        return 1.0
    if s.kind == "kv":
        return 1.0 if s.unit == "tokens" else 0.0
    if s.kind == "arenas":
        return 1.0
    page = 4.0 / 1024.0
    if s.kind in ("rss", "rss_anon", "rss_file", "rss_shmem", "dev_shm") and level is not None:
        return max(page, th.rss_rel_floor * abs(level))
    return page


def _presence(
    s: Series, windows: list[Window], rounds: list[int], fraction: float
) -> tuple[int, str]:
    """(settled rounds where the series really had samples, whole/appeared/exited/transient)."""
    vals = s.levels_from
    present = sum(
        1 for w in windows if w.kind == "idle" and w.round in rounds and late(vals, w, fraction)
    )
    if not s.points:
        return 0, "transient"
    base_end = next((w.end for w in windows if w.kind == "baseline" and w.end is not None), None)
    last_idle = max(
        (w for w in windows if w.kind == "idle" and w.end is not None and w.round in rounds),
        key=lambda w: w.round,
        default=None,
    )
    appeared = base_end is not None and s.points[0][0] >= base_end
    exited = last_idle is not None and not late(s.points, last_idle, fraction)
    presence = (
        "transient"
        if appeared and exited
        else "appeared"
        if appeared
        else "exited"
        if exited
        else "whole"
    )
    return present, presence


def _time_rate(
    s: Series,
    windows: list[Window],
    lr: LifeRounds,
    th: Thresholds,
    levels: list[float | None],
    ref: float | None,
) -> float | None:
    """The rate (the series' unit per second) at which the level grows inside the life's
    idle windows where that explains the settled levels' growth over the elapsed time
    (`time_driven`), else None."""
    frac = th.settle_fraction
    # Growth while idle (no request in flight) at the rate that explains the rounds' growth:
    # a leak driven by time, not by requests (a log buffer, a timer's allocations).
    idle = [w for w in windows if w.kind == "idle" and w.round in lr.rounds and w.end is not None]
    mids = {w.round: w.end - (w.end - w.start) * frac / 2 for w in idle if w.end is not None}
    times = [mids.get(r) for r in lr.rounds]
    return time_driven(s.levels_from, idle, levels, times, floor=floor_for(s, th, ref))


def _run_settled(
    levels_all: list[float | None], idx: list[int], levels: list[float | None]
) -> list[float | None]:
    """The settled level of every round of the run (the series' unit), this life's rounds
    (at `idx`) as judged (`levels`), the others as measured (`levels_all`)."""
    settled: list[float | None] = list(levels_all)
    for i, v in zip(idx, levels, strict=True):
        settled[i] = v
    return settled


def _reason_and_decides(
    s: Series, windows: list[Window], lr: LifeRounds, frac: float, reason: str, present: int
) -> tuple[str, bool]:
    """(the reason reported, whether the series decides its layer): a KV pool sampled at idle
    only with requests running or queued never was idle; a process present for fewer than
    two settled rounds is transient; another tenant's process never decides."""
    decides = True
    if (
        s.layer == KV
        and reason == R_NO_LEVEL
        and any(
            late(s.points, w, frac) for w in windows if w.kind == "idle" and w.round in lr.rounds
        )
    ):
        reason = R_NEVER_IDLE  # samples at idle, but every one with requests running or queued
    if s.kind in PROCESS_KINDS and present < 2:
        decides = False
        reason = R_TRANSIENT
    if s.scope == "tenant":
        decides = False  # another tenant's process: listed with its growth, never decides
    return reason, decides


def judge(s: Series, windows: list[Window], lr: LifeRounds, th: Thresholds) -> SeriesResult:
    """The series' settled levels over the whole run, its verdict over the life's rounds."""
    frac = th.settle_fraction
    vals = s.levels_from
    baseline, levels_all, samples_all = settled_levels(vals, windows, lr.run_rounds, frac)
    if not lr.with_baseline:
        baseline = None
    present, presence = _presence(s, windows, lr.rounds, frac)
    idx = [lr.run_rounds.index(r) for r in lr.rounds]
    levels = [levels_all[i] for i in idx]
    samples = [samples_all[i] for i in idx]
    if s.kind in PROCESS_KINDS and lr.with_baseline:
        baseline, levels = appeared_from_zero(vals, windows, lr.rounds, baseline, levels, frac)
    ref = baseline if baseline is not None else next((v for v in levels if v is not None), None)
    fit: SeriesFit = classify_series(
        baseline,
        levels,
        lr.cum_requests,
        samples,
        floor=floor_for(s, th, ref),
        noise_k=th.noise_k,
        resolution=resolution_of(s, th, ref),
    )
    time_rate = _time_rate(s, windows, lr, th, levels, ref)
    if time_rate is not None:
        fit.verdict, fit.reason = LEAK, R_GREW_WITH_TIME
        fit.creep_floor_per_request = None
    settled = _run_settled(levels_all, idx, levels)
    reason, decides = _reason_and_decides(s, windows, lr, frac, fit.reason, present)
    last = next((v for v in reversed(levels) if v is not None), None)
    return SeriesResult(
        key=s.key,
        layer=s.layer,
        kind=s.kind,
        unit=s.unit,
        pid=s.pid,
        gpu=s.gpu,
        name=s.name,
        role=s.role,
        pool=s.pool,
        baseline=baseline,
        settled=settled,
        last=last,
        growth=fit.growth,
        noise=fit.noise,
        threshold=fit.threshold,
        slope_per_request=fit.slope,
        slope_ci=fit.ci,
        tau=fit.tau,
        tau_p=fit.tau_p,
        increments=fit.increments,
        verdict=fit.verdict,
        reason=reason,
        creep_floor_per_request=fit.creep_floor_per_request,
        round_growth=fit.round_growth,
        time_rate_per_s=time_rate,
        settled_rounds=present,
        presence=presence,
        decides=decides,
        life=lr.life,
        first_t=s.points[0][0] if s.points else None,
        last_t=s.points[-1][0] if s.points else None,
        scope=s.scope or "server",
        gpu_instance=s.gpu_instance,
        compute_instance=s.compute_instance,
        device=s.device,
        username=s.username,
        model=fit.model,
        ratio=fit.ratio,
        ratio_ci=fit.ratio_ci,
        bound=fit.bound,
        bound_hi=fit.bound_hi,
        steps_to_decide=fit.steps_to_decide,
    )
