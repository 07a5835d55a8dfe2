"""`analyse_soak`: a recorded soak run -> one verdict per memory layer and the run's verdict.

Pure: no I/O, no clock. Records are put in time order first (a run file whose lines came out
of order gives the same answer), non-finite values are skipped, the run is split into server
lives at deaths and replacements, every series is judged over the rounds of its life, each
layer (vram.py, kv.py, host.py) turns its series into a verdict, and verdict.py applies the
overall rule.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vramdoctor.judge import layers as judge_layers
from vramdoctor.judge.inside import HeldBy, InsidePoints, inside_points, judge_inside
from vramdoctor.judge.layers import LayerContext, RunFacts
from vramdoctor.judge.results import (
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    R_NO_TRAFFIC,
    R_RETENTION_OR_LEAK,
    R_SERVER_DIED,
    LayerResult,
    Life,
    ProcessChange,
    RoundInfo,
    SeriesResult,
    SoakAnalysis,
    Thresholds,
    Undecided,
    Window,
)
from vramdoctor.judge.run_verdict import baseline_request_rate, overall_verdict, undecided
from vramdoctor.judge.series import Series, extract_series, kv_pool_mib, tenant_pids, without
from vramdoctor.judge.series_verdict import LifeRounds, judge
from vramdoctor.judge.timeline import (
    lives_from_events,
    process_changes_from_events,
    round_at,
    rounds_from_events,
    windows_from_events,
)
from vramdoctor.samples import COLLECTOR_FAILED, SERVER_DIED, SERVER_REPLACED, SOURCE_ERROR, Event


def _t(r: Any) -> float:
    t = r.get("t") if isinstance(r, dict) else getattr(r, "t", None)
    return float(t) if isinstance(t, (int, float)) and math.isfinite(t) else math.inf


def _host_available(raw: list[dict[str, Any]]) -> float | None:
    for r in reversed(raw):
        v = r.get("available_mib")
        if isinstance(v, (int, float)) and math.isfinite(v):
            return float(v)
    return None


def _cpu_count(header: dict[str, Any] | None) -> int | None:
    h = header or {}
    for v in (h.get("cpu_count"), (h.get("config") or {}).get("cpu_count")):
        if isinstance(v, int) and v > 0:
            return v
    return None


def _arena_max(header: dict[str, Any] | None) -> int | None:
    """MALLOC_ARENA_MAX set in the server's environment, as the run header recorded it."""
    v = ((header or {}).get("config") or {}).get("server_malloc_arena_max")
    return v if isinstance(v, int) and v > 0 else None


def analyse_soak(
    records: list[Any],
    header: dict[str, Any] | None = None,
    *,
    production_rate_rps: float | None = None,
    raw_host: list[dict[str, Any]] | None = None,
    status: str = "complete",
    th: Thresholds | None = None,
    cpu_count: int | None = None,
    held_by: Mapping[int, Sequence[HeldBy]] | None = None,
) -> SoakAnalysis:
    """Analyse a soak run's records (GpuSample, HostSample, MetricsSample, Event, in any order).

    `header` is the run file's header (pool size from the server's info, cpu_count);
    `production_rate_rps` the request rate production sees (hours to OOM are given only at
    it, or at the server's own counter rate measured in the baseline window); `raw_host` the
    run's `host_memory` records (available host RAM); `status` the run's end status. Returns
    a `SoakAnalysis`; never raises on odd values (NaN, missing windows, no rounds), and never
    lets numpy or scipy print a warning (values near the float limit overflow to inf quietly).
    """
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _analyse(
            records, header, production_rate_rps, raw_host, status, th, cpu_count, held_by
        )


def _analyse(
    records: list[Any],
    header: dict[str, Any] | None,
    production_rate_rps: float | None,
    raw_host: list[dict[str, Any]] | None,
    status: str,
    th: Thresholds | None,
    cpu_count: int | None,
    held_by: Mapping[int, Sequence[HeldBy]] | None,
) -> SoakAnalysis:
    th = th or Thresholds()
    recs = sorted((r for r in records if _t(r) != math.inf), key=_t)
    events = [r for r in recs if isinstance(r, Event)]
    windows = windows_from_events(events)
    rounds = rounds_from_events(events)
    lives = lives_from_events(events, windows, rounds, -math.inf)
    changes = process_changes_from_events(events, windows)
    raw = extract_series(recs)

    facts = _run_facts(recs, header, raw_host, cpu_count)
    cpus = facts.cpu_count
    _add_layer_series(raw, recs)
    run = _RunEvidence(
        lives,
        [r.round for r in rounds],
        raw,
        inside_points(recs),
        windows,
        recs,
        header,
        facts,
        th,
        held_by or {},
    )
    per_life, all_series = _judge_lives(run, rounds)
    layers = _merge(per_life)

    no_success, died = _no_request_succeeded(rounds), _server_died(lives)
    verdict, open_layers = _run_outcome(layers, rounds, th, no_success=no_success, died=died)

    load_s = sum(r.load_s or 0.0 for r in rounds)
    reached = sum(r.reached for r in rounds)
    rate, rate_src = _production_rate(production_rate_rps, recs, windows)
    _rate_per_aborted_request(layers, rounds)
    _project_at_rate(layers, rate, rate_src)

    collector_failed = _collector_failed(events)
    first_error = next((m for r in rounds for m in r.messages), None)
    changes += _series_changes(all_series, changes, windows)
    return SoakAnalysis(
        verdict=verdict,
        layers=layers,
        rounds=rounds,
        windows=windows,
        lives=lives,
        series=all_series,
        process_changes=changes,
        undecided=open_layers,
        status=status,
        server_died=died,
        server_replaced=any(life.ended_by == SERVER_REPLACED for life in lives),
        collector_failed=collector_failed,
        source_errors=sum(1 for e in events if e.name == SOURCE_ERROR),
        no_request_succeeded=no_success,
        first_error=first_error,
        observed_requests_per_hour=reached / load_s * 3600.0 if load_s > 0 and reached else None,
        production_rate_rps=rate,
        production_rate_source=rate_src,
        cpu_count=cpus,
        points={k: s.points for k, s in raw.items()},
        stopped_by=next(
            (str(e.data.get("by")) for e in reversed(events) if e.name == "stopped"), None
        ),
    )


def _run_facts(
    recs: list[Any],
    header: dict[str, Any] | None,
    raw_host: list[dict[str, Any]] | None,
    cpu_count: int | None,
) -> RunFacts:
    """The run's facts the layers read: available host RAM, CPU count, arena cap, KV pool."""
    return RunFacts(
        available_mib=_host_available(raw_host or []),
        cpu_count=cpu_count or _cpu_count(header),
        arena_max=_arena_max(header),
        pool_mib=kv_pool_mib(recs, header),
    )


def _add_layer_series(raw: dict[str, Series], recs: list[Any]) -> None:
    """Adds to `raw` the series a layer added from outside extracts (never replacing one);
    returns nothing."""
    for layer in judge_layers.all_layers():  # series a layer added from outside
        for key, series in layer.extract(recs).items():
            raw.setdefault(key, series)


@dataclass(frozen=True)
class _RunEvidence:
    """What every life of a run is judged from: its lives, the run's round numbers, the raw
    series by key, the agent's inside points, the idle windows, the records, the header and
    facts of the run, the thresholds and the held-by stacks by pid."""

    lives: list[Life]
    run_rounds: list[int]
    raw: dict[str, Series]
    points: dict[str, InsidePoints]
    windows: list[Window]
    recs: list[Any]
    header: dict[str, Any] | None
    facts: RunFacts
    th: Thresholds
    held_by: Mapping[int, Sequence[HeldBy]]


def _judge_lives(
    run: _RunEvidence, rounds: list[RoundInfo]
) -> tuple[list[dict[str, LayerResult]], list[SeriesResult]]:
    """Every server life with rounds (the first life always) judged on its own: the layer
    results of each life, and every judged series of all lives, in life order."""
    all_series: list[SeriesResult] = []
    per_life: list[dict[str, LayerResult]] = []
    for life in run.lives:
        life_rounds = [r for r in rounds if r.life == life.index]
        if not life_rounds and life.index > 0:
            continue
        layers_of_life, judged = _judge_life(run, life, life_rounds)
        per_life.append(layers_of_life)
        all_series += judged
    return per_life, all_series


def _no_request_succeeded(rounds: list[RoundInfo]) -> bool:
    """True when the run had rounds and not one request of them succeeded."""
    ok = sum(r.ok for r in rounds)
    return bool(rounds) and ok == 0


def _server_died(lives: list[Life]) -> bool:
    """True when a server life ended by the server's death."""
    return any(life.ended_by == SERVER_DIED for life in lives)


def _run_outcome(
    layers: dict[str, LayerResult],
    rounds: list[RoundInfo],
    th: Thresholds,
    *,
    no_success: bool,
    died: bool,
) -> tuple[str, list[Undecided]]:
    """The run's verdict and the layers more rounds could still decide, after the layers'
    reasons are set for a run whose requests all failed or whose server died."""
    if no_success:
        for lay in layers.values():
            # Growth the rounds did measure (requests that timed out reached the server) keeps
            # its reading; only layers with nothing to show say that no request succeeded.
            if lay.verdict not in (LEAK, NOT_MEASURED) and lay.reason != R_RETENTION_OR_LEAK:
                lay.verdict, lay.reason = INCONCLUSIVE, R_NO_TRAFFIC
    if died:
        for lay in layers.values():
            if lay.verdict == INCONCLUSIVE and not any(r.life >= 0 and r.complete for r in rounds):
                lay.reason = R_SERVER_DIED
    verdict = overall_verdict(layers, no_request_succeeded=no_success)
    # Nothing more rounds could decide once the server is dead or the traffic never worked.
    open_layers = [] if died or no_success else undecided(layers, th)
    if died or no_success:
        for lay in layers.values():
            if lay.verdict == INCONCLUSIVE:
                lay.undecided_reason = lay.reason
    return verdict, open_layers


def _production_rate(
    production_rate_rps: float | None, recs: list[Any], windows: list[Window]
) -> tuple[float | None, str | None]:
    """The production request rate and where it came from ("argument", "server_counter"),
    or (None, None) when neither gives one."""
    rate_src = None
    rate = production_rate_rps if production_rate_rps and production_rate_rps > 0 else None
    if rate is not None:
        rate_src = "argument"
    else:
        rate = baseline_request_rate(recs, windows)
        rate_src = "server_counter" if rate is not None else None
    return rate, rate_src


def _rate_per_aborted_request(layers: dict[str, LayerResult], rounds: list[RoundInfo]) -> None:
    """Sets each growing layer's rate per aborted request when every round that reached the
    server abandoned streams; returns nothing."""
    # Rounds that all abandoned streams: the leak rate per aborted request, should only the
    # aborted ones leak (the rounds record streamed/aborted counts; the report says how to tell).
    done = [r for r in rounds if r.life >= 0 and r.reached]
    aborted = sum(r.aborted or 0 for r in done)
    if done and aborted and all(r.aborted for r in done):
        for lay in layers.values():
            if (
                (lay.verdict == LEAK or lay.reason == R_RETENTION_OR_LEAK)
                and lay.rate_per_request is not None
                and lay.rate_per_hour is None
            ):
                lay.rate_per_aborted_request = (
                    lay.rate_per_request * sum(r.reached for r in done) / aborted
                )


def _project_at_rate(
    layers: dict[str, LayerResult], rate: float | None, rate_src: str | None
) -> None:
    """Puts the production rate into each layer's projection and turns its requests to out
    of memory into hours; returns nothing (no rate: the projections stay in requests)."""
    for lay in layers.values():
        if lay.projection is not None and rate is not None:
            lay.projection.production_rate_rps = rate
            lay.projection.production_rate_source = rate_src
            if lay.projection.requests is not None:
                lay.projection.hours = lay.projection.requests / (rate * 3600.0)


def _collector_failed(events: list[Event]) -> str | None:
    """The first collector failure's error text, None when the collector never failed."""
    return next(
        (
            str(e.data.get("error") or "collector failed")
            for e in events
            if e.name == COLLECTOR_FAILED
        ),
        None,
    )


def _judge_life(
    run: _RunEvidence, life: Life, life_rounds: list[RoundInfo]
) -> tuple[dict[str, LayerResult], list[SeriesResult]]:
    """One server life: its series judged over its rounds, the inside evidence, each layer."""
    raw, windows, th, lives, run_rounds = run.raw, run.windows, run.th, run.lives, run.run_rounds
    cum, total = [], 0.0
    for r in life_rounds:
        total += r.reached
        cum.append(total)
    lr = LifeRounds(life.index, run_rounds, [r.round for r in life_rounds], cum, life.index == 0)
    # A later life's server (a handover's successor) starts up beside this life's server, on
    # the socket it inherits: its memory grows with its start (imports, weights, a CUDA
    # context), not with this life's requests. Its series belong to its own life.
    successors = {lf.pid for lf in lives[life.index + 1 :] if lf.pid not in (None, life.pid)}
    keys = [k for k in _series_of_life(raw, life.index, lives) if raw[k].pid not in successors]
    points = {k: p for k, p in run.points.items() if p.pid not in successors}
    judged = [judge(raw[k], windows, lr, th) for k in keys if raw[k].kind != "gpu"]
    # Devices are judged without the processes that exited (a worker that started and failed,
    # or one whose own series already carries its verdict) and without other tenants'
    # processes (their memory is theirs). One of the server's that appeared and is still there
    # stays in: its memory is real and the next rounds tell what it does.
    passing = (
        {
            s.pid
            for s in judged
            if s.kind == "gpu_process"
            and s.pid is not None
            and s.presence in ("exited", "transient")
        }
        | tenant_pids(raw)
        | successors
    )
    judged += [
        judge(without(raw[k], passing), windows, lr, th) for k in keys if raw[k].kind == "gpu"
    ]
    inside = None
    if points:
        inside = judge_inside(
            points,
            lr.rounds,
            lr.cum_requests,
            with_baseline=lr.with_baseline,
            run_rounds=run_rounds,
            life=life.index,
            th=th,
            held_by=run.held_by,
            nvml=[s for s in judged if s.kind == "gpu_process" and s.scope != "tenant"],
        )
    ctx = LayerContext(
        life=life.index,
        series=judged,
        raw=raw,
        records=run.recs,
        th=th,
        facts=run.facts,
        header=run.header,
        inside=inside,
    )
    layers = {layer.name: layer.judge(ctx) for layer in judge_layers.all_layers()}
    if inside is not None:  # reported with the series (evidence, never deciding)
        judged += list(inside.series.values())
    return layers, judged


def _series_of_life(raw: dict[str, Series], life: int, lives: list[Life]) -> list[str]:
    """Series that have samples inside the life (all of them when the run has one life)."""
    if len(lives) == 1:
        return list(raw)
    lf = lives[life]
    end = lf.end_t if lf.end_t is not None else math.inf
    return [k for k, s in raw.items() if any(lf.start_t <= t <= end for t, _ in s.points)]


def _merge(per_life: list[dict[str, LayerResult]]) -> dict[str, LayerResult]:
    """One result per layer over the server's lives: a LEAK in any life; else the life with
    the most settled rounds (the latest on a tie)."""
    if len(per_life) == 1:
        return per_life[0]
    out: dict[str, LayerResult] = {}
    for name in per_life[0]:
        cands = [lay[name] for lay in per_life if name in lay]
        leak = [c for c in cands if c.verdict == LEAK]
        if leak:
            out[name] = leak[0]
            continue

        def settled(c: LayerResult) -> int:
            return max((s.settled_rounds for s in c.series if s.decides), default=0)

        out[name] = max(reversed(cands), key=settled)
    return out


def _series_changes(
    series: list[SeriesResult], known: list[ProcessChange], windows: list[Window]
) -> list[ProcessChange]:
    """Processes the samples show coming or going that no event reported."""
    seen = {(c.pid, c.change) for c in known}
    out: list[ProcessChange] = []
    for s in series:
        if s.kind not in ("gpu_process", "rss") or s.pid is None or s.presence == "whole":
            continue
        if (s.pid, s.presence) in seen or (
            s.presence == "transient" and (s.pid, "appeared") in seen
        ):
            continue
        seen.add((s.pid, s.presence))
        t = s.last_t if s.presence == "exited" else s.first_t
        out.append(
            ProcessChange(
                s.pid,
                s.presence,
                t,
                None if t is None else round_at(windows, t),
                name=s.name,
                gpu=s.gpu,
                settled_rounds=s.settled_rounds,
            )
        )
    return out
