"""watch's comparable moments judged by soak's judge, and its verdicts as watch's rows. Pure.

One analysis for soak and watch: the idle windows a server makes by itself
(`watch.rounds`), or the quiet moments of one that is never idle, are written as the protocol
soak's run files hold (a baseline window, then for each round its load and its idle window,
with the requests the server's own counter served in between) and judged by
`vramdoctor.soak.analysis.analyse_soak`: the same growth model (`vramdoctor.stats.growth`),
the same lives (a replaced server starts a new life), the same scope rules (another tenant's
process is listed, never decides, never the culprit; a device total without it), the same MIG
slices (a slice is a GPU of its own), the same host rule (anonymous growth that allocator
retention could explain is not called a leak from outside) and the same inside evidence
(the agent's counters at each idle window's end decide where they exist).

Without a request counter (no /metrics, or a server that exports none) no round can be
counted: each series is then fitted against time with the same growth model
(`time_rows`), and only growth in time can be called (a level that stopped rising may be a
leak that stopped with the traffic: INCONCLUSIVE, never CACHING).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vramdoctor.judge.results import (
    HOST,
    KV,
    LEAK,
    VRAM,
    LayerResult,
    SeriesResult,
    SoakAnalysis,
    Thresholds,
)
from vramdoctor.samples import Event
from vramdoctor.verdicts import Reason, Verdict
from vramdoctor.watch.result import LayerView, SeriesVerdict, rank_key
from vramdoctor.watch.rounds import IdleWindow

__all__ = [
    "MEMORY_LAYER",
    "WATCH_LAYER",
    "analyse_windows",
    "culprit_of",
    "layer_views",
    "protocol_records",
    "rows_from_analysis",
    "time_fit",
]

# The judge's series kinds -> the watch layer names (the exporter's `layer` label).
WATCH_LAYER = {
    "gpu_process": "vram",
    "gpu": "device",
    "rss": "rss",
    "rss_anon": "rss_anon",
    "rss_file": "rss_file",
    "rss_shmem": "rss_shmem",
    "kv": "kv",
    "dev_shm": "dev_shm",
}
MEMORY_LAYER = {
    "vram": VRAM,
    "device": VRAM,
    "rss": HOST,
    "rss_anon": HOST,
    "rss_file": HOST,
    "rss_shmem": HOST,
    "dev_shm": HOST,
    "kv": KV,
}
_TINY = 1e-6


def protocol_records(windows: Sequence[IdleWindow], events: Sequence[Event]) -> list[Any]:
    """The windows as a soak run's records: baseline (the first window), then per window a
    round (its load from the previous window's end, `reached` = the requests served in
    between) and its idle window with the samples taken in it; the agent's records at each
    window's end as that round's; the server's life events in between."""
    if not windows:
        return []
    out: list[Any] = []

    def mark(name: str, t: float, wall: float, **data: Any) -> None:
        out.append(Event(t=t, wall=wall, name=name, data=data))

    first = windows[0]
    mark("baseline_start", *_start(first), round=0)
    _window_records(out, first, 0)
    mark("baseline_end", first.end_t, first.end_wall, round=0)
    for k in range(1, len(windows)):
        prev, w = windows[k - 1], windows[k]
        reached = max(0, round(w.served - prev.served))
        mark("round_start", prev.end_t + _TINY, prev.end_wall, round=k)
        mark(
            "round_end",
            w.start_t - _TINY,
            w.start_wall,
            round=k,
            sent=reached,
            outcomes={"ok": reached},
            complete=True,
        )
        mark("idle_start", *_start(w), round=k)
        _window_records(out, w, k)
        mark("idle_end", w.end_t, w.end_wall, round=k)
    lo, hi = first.start_t, windows[-1].end_t
    out += [e for e in events if lo <= e.t <= hi]
    return out


def _start(w: IdleWindow) -> tuple[float, float]:
    """An idle window starts, for the judge, at its first settled sample."""
    if w.settled_t is not None:
        return w.settled_t - _TINY, w.settled_wall if w.settled_wall is not None else w.start_wall
    return w.start_t, w.start_wall


def _window_records(out: list[Any], w: IdleWindow, round_index: int) -> None:
    out += w.all_records()
    for rec in w.inside.values():
        out.append(dataclasses.replace(rec, round=round_index, window="idle_end"))


def analyse_windows(
    windows: Sequence[IdleWindow],
    events: Sequence[Event],
    *,
    header: Mapping[str, Any] | None,
    th: Thresholds,
    rate_rps: float | None,
    host_memory: Mapping[str, Any] | None,
) -> SoakAnalysis:
    """soak's judge over the windows (`protocol_records`); `rate_rps` the server's own
    request rate over the window (the projections' hours), `host_memory` the latest host
    RAM record (available MiB for the host layer's time to OOM)."""
    from vramdoctor.soak.analysis import analyse_soak

    return analyse_soak(
        protocol_records(windows, events),
        dict(header) if header else None,
        production_rate_rps=rate_rps if rate_rps and rate_rps > 0 else None,
        raw_host=[dict(host_memory)] if host_memory else None,
        th=th,
    )


def _per_hour(
    per_request: float | None, ci: tuple[float, float] | None, rph: float | None
) -> tuple[float | None, tuple[float, float] | None]:
    if per_request is None or rph is None:
        return None, None
    return per_request * rph, ((ci[0] * rph, ci[1] * rph) if ci else None)


def _row(
    s: SeriesResult,
    mode: str,
    rph: float | None,
    level: Callable[[str], tuple[float | None, float | None]],
) -> SeriesVerdict:
    layer = WATCH_LAYER[s.kind]
    per_h, per_h_ci = _per_hour(s.slope_per_request, s.slope_ci, rph)
    if s.time_rate_per_s is not None:
        per_h, per_h_ci = s.time_rate_per_s * 3600.0, None
    lvl, low = level(s.key)
    return SeriesVerdict(
        key=s.key,
        layer=layer,
        memory_layer=s.layer,
        unit=s.unit,
        verdict=str(s.verdict),
        reason=str(s.reason),
        mode=mode,
        pid=s.pid,
        gpu=s.gpu,
        gpu_instance=s.gpu_instance,
        compute_instance=s.compute_instance,
        device=s.device,
        pool=s.pool,
        process=s.name,
        role=s.role,
        scope=s.scope or "server",
        username=s.username,
        decides=bool(s.decides) and (s.scope or "server") != "tenant",
        level=lvl if lvl is not None else s.last,
        floor_level=low,
        points=s.settled_rounds,
        growth=s.growth,
        growth_per_request=s.slope_per_request if s.time_rate_per_s is None else None,
        growth_per_request_ci=s.slope_ci if s.time_rate_per_s is None else None,
        growth_per_hour=per_h,
        growth_per_hour_ci=per_h_ci,
        bound=s.bound,
        model=s.model,
        explanation=s.explanation,
        decided_by=s.decided_by,
        steps_to_decide=s.steps_to_decide,
        life=s.life,
    )


def layer_views(a: SoakAnalysis, rph: float | None) -> dict[str, LayerView]:
    """One LayerView per judged layer: the judge's verdict, rate and projection."""
    out: dict[str, LayerView] = {}
    for name, lay in a.layers.items():
        out[name] = _view(lay, rph)
    return out


def _view(lay: LayerResult, rph: float | None) -> LayerView:
    per_h, per_h_ci = _per_hour(lay.rate_per_request, lay.rate_ci, rph)
    if lay.rate_per_hour is not None:
        per_h, per_h_ci = lay.rate_per_hour, None
    proj = lay.projection
    top = next((s for s in lay.series if s.key == lay.main_series), None)
    return LayerView(
        layer=lay.layer,
        verdict=str(lay.verdict),
        reason=str(lay.reason),
        unit=lay.unit,
        explanation=lay.explanation,
        decided_by=lay.decided_by,
        main_series=lay.culprit.series if lay.culprit else lay.main_series,
        rate_per_request=lay.rate_per_request if lay.rate_per_hour is None else None,
        rate_ci=lay.rate_ci if lay.rate_per_hour is None else None,
        rate_per_hour=per_h,
        rate_per_hour_ci=per_h_ci,
        hours_to_oom=proj.hours if proj is not None and lay.verdict == LEAK else None,
        capacity_left=proj.capacity_left if proj is not None else None,
        capacity_of=proj.capacity_of if proj is not None else None,
        tenants=list(lay.tenants),
        caveats=[str(c) for c in lay.caveats],
        steps_to_decide=top.steps_to_decide if top is not None else None,
    )


def rows_from_analysis(
    a: SoakAnalysis,
    *,
    mode: str,
    rph: float | None,
    level: Callable[[str], tuple[float | None, float | None]],
    alive: Callable[[int], bool],
) -> list[SeriesVerdict]:
    """The judge's series as watch's rows: the kinds a table shows (VRAM per process and
    device, host RSS by kind, /dev/shm, KV pools), one row per series (the life its layer's
    verdict came from, else the latest), worst first."""
    life_of = {name: lay.life for name, lay in a.layers.items()}
    chosen: dict[str, SeriesResult] = {}
    for s in a.series:
        if s.kind not in WATCH_LAYER:
            continue
        cur = chosen.get(s.key)
        want = life_of.get(s.layer)
        if cur is None or (cur.life != want and (s.life == want or s.life > cur.life)):
            chosen[s.key] = s
    rows = [_row(s, mode, rph, level) for s in chosen.values()]
    for r in rows:
        r.alive = r.pid is None or alive(r.pid)
        if not r.alive:
            r.decides = False
    return sorted(rows, key=rank_key)


def culprit_of(
    rows: list[SeriesVerdict], layers: Mapping[str, LayerView]
) -> tuple[str | None, str | None]:
    """(series key, layer) the headline names: of the leaking layers the one that runs out
    first (else the fastest); its row carries the layer's own rate and time to OOM, so the
    headline and the table say one rate and one time."""
    leaking = [v for v in layers.values() if v.verdict == LEAK]
    if not leaking:
        return None, None
    top = min(
        leaking,
        key=lambda v: (
            v.hours_to_oom if v.hours_to_oom is not None else math.inf,
            -(v.rate_per_hour or 0.0),
        ),
    )
    for v in leaking:
        row = next((r for r in rows if r.key == v.main_series), None)
        if row is None:
            continue
        row.growth_per_request, row.growth_per_request_ci = v.rate_per_request, v.rate_ci
        row.growth_per_hour, row.growth_per_hour_ci = v.rate_per_hour, v.rate_per_hour_ci
        row.hours_to_oom = v.hours_to_oom
        row.free = v.capacity_left
        if row.verdict != LEAK:  # decided from inside (the layer's series carries it)
            row.verdict, row.decided_by = Verdict.LEAK, v.decided_by
    return top.main_series, top.layer


def time_fit(
    points: Sequence[tuple[float, float]],
    *,
    floor: float,
    blocks: int,
) -> tuple[Verdict, Reason, float | None, tuple[float, float] | None, str | None]:
    """(verdict, reason, rate per hour, its 90 % interval, model) of one series against time
    alone, by the growth model over the low envelope of `blocks` equal stretches (the level
    at the quietest moment of each). A level that stopped rising is not CACHING here: a leak
    per request that stopped with the traffic looks the same without a request counter."""
    from vramdoctor.stats.growth import fit_growth
    from vramdoctor.stats.trend import low_envelope

    pts = [(t, v) for t, v in points if math.isfinite(t) and math.isfinite(v)]
    if len(pts) < 3:
        return Verdict.INCONCLUSIVE, Reason.TOO_FEW_POINTS, None, None, None
    span = pts[-1][0] - pts[0][0]
    if span <= 0:
        return Verdict.INCONCLUSIVE, Reason.TOO_FEW_POINTS, None, None, None
    block = span / max(blocks, 3) * (1 + 1e-9)
    env = low_envelope([(t - pts[0][0], v) for t, v in pts], block)
    fit = fit_growth([x for x, _ in env], [y for _, y in env], floor=floor, step=block, x_unit="s")
    rate = fit.rate * 3600.0 if fit.rate is not None else None
    ci = (fit.rate_ci[0] * 3600.0, fit.rate_ci[1] * 3600.0) if fit.rate_ci else None
    verdict, reason = fit.verdict, fit.reason
    if verdict == Verdict.LEAK:
        reason = Reason.GREW_WITH_TIME
    elif verdict == Verdict.CACHING:
        verdict = Verdict.INCONCLUSIVE
    if len(env) < 3:
        verdict, reason = Verdict.INCONCLUSIVE, Reason.TOO_FEW_POINTS
    return verdict, reason, rate, ci, str(fit.model)
