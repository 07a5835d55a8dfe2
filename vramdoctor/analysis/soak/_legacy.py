"""Soak analysis: leak, caching or stable, from a recorded run. Pure: no I/O, no clock.

The physics this encodes:
- A caching allocator (PyTorch's, glibc's, a bounded cache) keeps freed memory for reuse and
  does not give it back when idle. So memory that stays up after an idle window is not a leak.
- Replaying the *same* traffic in rounds separates the two: caching rises in the first round
  or two and then stays flat (the same requests fit in what is already cached); a leak grows
  in every round, by an amount proportional to the requests of that round.
- So the evidence is the *settled level* after each round (median of the late part of each idle
  window, once frees have landed), fitted against cumulative requests with a robust slope
  (Theil-Sen, scipy) and a trend test (Kendall tau, scipy). The first round is warm-up and is
  left out of the slope whenever there are enough rounds; growth must continue to the last
  round without decaying, and be larger than the noise measured inside the idle windows.
- KV pages are preallocated by SGLang/vLLM: a KV page leak does not grow VRAM, it shows as KV
  usage that does not return to ~0 at idle and creeps up round after round.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import kendalltau, theilslopes

from ...model import REACHED_SERVER, Event, GpuSample, HostSample, MetricsSample
from ..census import CONTEXT_MIB

SCHEMA_V1 = "vramdoctor.soak/1"

LEAK = "LEAK"
CACHING = "CACHING"
STABLE = "STABLE"
INCONCLUSIVE = "INCONCLUSIVE"
_RANK = {LEAK: 3, INCONCLUSIVE: 2, CACHING: 1, STABLE: 0}


@dataclass(frozen=True)
class Thresholds:
    """What counts as growth. Memory series are MiB; the KV series is a 0..1 ratio."""

    min_growth_mib: float = 2.0  # below this a change is resolution (NVML/DCGM report whole MiB)
    noise_k: float = 4.0  # growth must exceed noise_k x the noise measured inside idle windows
    min_growth_kv: float = 0.02  # 2 % of the KV pool
    rss_rel_floor: float = 0.0025  # host RSS: growth must also exceed 0.25 % of the level
    settle_fraction: float = 0.5  # settled level: median of the last half of each idle window
    decay_ratio: float = 0.5  # a leak's last increment is at least this share of its rate
    trend_p: float = 0.05  # Kendall tau p-value over the settled samples of rounds 2..K
    trend_min_samples: int = 12  # below this many settled samples the trend test cannot veto


@dataclass
class Window:
    kind: str  # "baseline", "load", "idle"
    round: int  # 0 for the baseline
    start: float
    end: float | None


@dataclass
class SeriesInfo:
    key: str
    kind: str  # "gpu" (device), "gpu_process", "rss", "kv"
    unit: str  # "MiB" or "ratio"
    pid: int | None = None
    gpu: int | None = None
    name: str | None = None
    role: str | None = None


@dataclass(kw_only=True)
class SeriesResult(SeriesInfo):
    baseline: float | None
    settled: list[float | None]  # per round
    last: float | None
    growth: float | None  # last settled - baseline
    noise: float
    threshold: float
    slope_per_request: float | None
    slope_ci: tuple[float, float] | None
    tau: float | None
    tau_p: float | None
    increments: list[float]
    verdict: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["slope_ci"] = list(self.slope_ci) if self.slope_ci else None
        return _finite(d)


@dataclass
class RoundInfo:
    round: int
    sent: int
    ok: int
    errors: int
    reached: int
    error_kinds: dict[str, int]
    load_s: float | None
    complete: bool
    messages: list[str] = field(default_factory=list)  # a few distinct error messages


@dataclass
class SoakResult:
    verdict: str
    sentence: str
    leak_mib_per_request: float | None
    leak_mib_per_hour: float | None
    hours_to_oom: float | None
    culprit: dict[str, Any]
    rounds: list[RoundInfo]
    series: list[SeriesResult]
    windows: list[Window]
    suggestion: str | None
    requests_per_hour: float | None
    free_mib: float | None
    notes: list[str] = field(default_factory=list)
    status: str = "complete"
    # Every series' (t, value) samples as analysed, for the reports' charts (not in to_dict).
    points: dict[str, list[tuple[float, float]]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        settled: list[dict[str, float]] = [{} for _ in self.rounds]
        for s in self.series:
            for i, v in enumerate(s.settled[: len(settled)]):
                if v is not None:
                    settled[i][s.key] = round(v, 3)
        return _finite({
            "schema": SCHEMA_V1,
            "verdict": self.verdict,
            "sentence": self.sentence,
            "leak_mib_per_request": self.leak_mib_per_request,
            "leak_mib_per_hour": self.leak_mib_per_hour,
            "hours_to_oom": self.hours_to_oom,
            "culprit": self.culprit,
            "suggestion": self.suggestion,
            "requests_per_hour": self.requests_per_hour,
            "free_mib": self.free_mib,
            "status": self.status,
            "notes": self.notes,
            "rounds": [
                {"round": r.round, "requests": r.sent, "ok": r.ok, "errors": r.errors,
                 "error_kinds": r.error_kinds, "error_messages": r.messages, "complete": r.complete,
                 "settled_mib": settled[i]}
                for i, r in enumerate(self.rounds)
            ],
            "series": [s.to_dict() for s in self.series],
        })


def _finite(obj: Any) -> Any:
    """JSON has no NaN/inf: map them to null, numpy scalars to Python ones."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# --- protocol marks ------------------------------------------------------------------------

def windows_from_events(events: list[Event]) -> list[Window]:
    """Baseline, load and idle windows from the protocol events (open ones have end=None)."""
    out: list[Window] = []
    open_: dict[tuple[str, int], Window] = {}
    starts = {"baseline_start": "baseline", "round_start": "load", "idle_start": "idle"}
    ends = {"baseline_end": "baseline", "round_end": "load", "idle_end": "idle"}
    for ev in events:
        rnd = int(ev.data.get("round", 0))
        if ev.name in starts:
            w = Window(starts[ev.name], rnd, ev.t, None)
            open_[(w.kind, rnd)] = w
            out.append(w)
        elif ev.name in ends:
            w = open_.pop((ends[ev.name], rnd), None)
            if w is not None:
                w.end = ev.t
    return out


def rounds_from_events(events: list[Event]) -> list[RoundInfo]:
    rounds: dict[int, RoundInfo] = {}
    starts: dict[int, float] = {}
    for ev in events:
        if ev.name == "round_start":
            rnd = int(ev.data.get("round", 0))
            starts[rnd] = ev.t
            rounds[rnd] = RoundInfo(rnd, 0, 0, 0, 0, {}, None, False)
        elif ev.name == "round_end":
            rnd = int(ev.data.get("round", 0))
            kinds = {k: int(v) for k, v in (ev.data.get("outcomes") or {}).items()}
            sent = int(ev.data.get("sent", sum(kinds.values())))
            ok = int(kinds.get("ok", 0))
            reached = sum(kinds.get(k, 0) for k in REACHED_SERVER)
            rounds[rnd] = RoundInfo(
                rnd, sent, ok, sent - ok, reached,
                {k: v for k, v in kinds.items() if k != "ok" and v},
                ev.t - starts[rnd] if rnd in starts else None,
                bool(ev.data.get("complete", True)),
                [str(m) for m in ev.data.get("errors") or []],
            )
    return [rounds[k] for k in sorted(rounds)]


# --- series --------------------------------------------------------------------------------

# Stable names of vramdoctor.sources.server_metrics (the first is the current one).
KV_USAGE_NAMES = ("kv_usage_ratio", "kv_usage")
KV_POOL_GIB_NAMES = ("kv_cache_memory_gib", "kv_cache_mem_gib")


def kv_usage(sample: MetricsSample) -> float | None:
    """The KV pool usage ratio 0..1 of a /metrics sample, if the server publishes one."""
    for name in KV_USAGE_NAMES:
        v = sample.values.get(name)
        if v is not None and math.isfinite(v):
            return float(v)
    return None


def extract_series(records: list[Any]) -> tuple[dict[str, SeriesInfo], dict[str, list[tuple[float, float]]]]:
    """Every memory series in the run: each GPU, each process on each GPU, each process's RSS, KV."""
    info: dict[str, SeriesInfo] = {}
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        if isinstance(r, GpuSample):
            for g in r.gpus:
                key = f"gpu{g.index}"
                info.setdefault(key, SeriesInfo(key, "gpu", "MiB", gpu=g.index, name=g.name))
                points[key].append((r.t, g.used_mib))
            for p in r.processes:
                if p.used_mib is None:
                    continue
                key = f"gpu{p.gpu}/pid{p.pid}"
                si = info.setdefault(key, SeriesInfo(key, "gpu_process", "MiB", pid=p.pid, gpu=p.gpu))
                si.name = si.name or p.name
                points[key].append((r.t, p.used_mib))
        elif isinstance(r, HostSample):
            for p in r.processes:
                key = f"rss/pid{p.pid}"
                si = info.setdefault(key, SeriesInfo(key, "rss", "MiB", pid=p.pid, role=p.role))
                si.name = si.name or p.name
                points[key].append((r.t, p.rss_mib))
        elif isinstance(r, MetricsSample):
            kv = kv_usage(r)
            if kv is not None:
                info.setdefault("kv_usage", SeriesInfo("kv_usage", "kv", "ratio"))
                points["kv_usage"].append((r.t, float(kv)))
    return info, dict(points)


def _late(values: list[tuple[float, float]], w: Window, fraction: float) -> list[float]:
    if w.end is None:
        return []
    start = w.end - (w.end - w.start) * fraction
    return [v for t, v in values if start <= t <= w.end]


def settled_levels(
    values: list[tuple[float, float]], windows: list[Window], rounds: list[int], fraction: float
) -> tuple[float | None, list[float | None], list[list[float]]]:
    """(baseline level, settled level per round, the samples each level came from)."""
    baseline = None
    by_round: dict[int, list[float]] = {}
    for w in windows:
        if w.kind == "baseline":
            xs = _late(values, w, max(fraction, 0.8))
            if xs:
                baseline = float(np.median(xs))
        elif w.kind == "idle" and w.round in rounds:
            by_round[w.round] = _late(values, w, fraction)
    levels = [float(np.median(by_round[r])) if by_round.get(r) else None for r in rounds]
    samples = [by_round.get(r, []) for r in rounds]
    return baseline, levels, samples


def _noise(groups: list[list[float]]) -> float:
    """Pooled robust spread of samples around their own window's median (MAD x 1.4826)."""
    resid = [x - float(np.median(g)) for g in groups if len(g) >= 3 for x in g]
    if len(resid) < 3:
        return 0.0
    return float(1.4826 * np.median(np.abs(resid)))


def classify_series(
    baseline: float | None,
    levels: list[float | None],
    cum_requests: list[float],
    samples: list[list[float]],
    *,
    floor: float,
    th: Thresholds = Thresholds(),
) -> dict[str, Any]:
    """Verdict for one series from its settled levels after each round (see module docstring).

    `cum_requests[k]` is the number of requests that reached the server up to round k; a round
    where none did (server gone) carries no evidence about growth per request and is skipped.
    """
    noise = _noise(samples)
    h = max(floor, th.noise_k * noise)
    out: dict[str, Any] = {"noise": noise, "threshold": h, "slope": None, "ci": None,
                           "tau": None, "tau_p": None, "increments": [], "growth": None}
    pts = []
    prev_c = 0.0
    for c, v, smp in zip(cum_requests, levels, samples, strict=False):
        if v is not None and (c > prev_c or not pts):
            pts.append((c, v, smp))
        prev_c = c
    if not pts:
        return {**out, "verdict": INCONCLUSIVE, "reason": "no settled level (no idle window completed)"}
    if baseline is None and len(pts) < 2:  # one level and nothing to compare it with
        return {**out, "verdict": INCONCLUSIVE,
                "reason": "one settled level and no baseline: nothing to compare it with "
                          "(idle windows shorter than the sampling --interval?)"}
    ref = baseline if baseline is not None else pts[0][1]
    vals = [v for _, v, _ in pts]
    growth = vals[-1] - ref
    out["growth"] = growth
    peak = max(abs(v - ref) for v in vals)
    # The first round warms caches up: fit from round 2 on when at least 2 later rounds exist.
    tail = pts[1:] if len(pts) >= 3 else pts
    incs = [b[1] - a[1] for a, b in itertools.pairwise(tail)]
    sizes = [b[0] - a[0] for a, b in itertools.pairwise(tail)]  # requests behind each increment
    out["increments"] = incs
    if len(tail) >= 2:
        res = theilslopes([v for _, v, _ in tail], [c for c, _, _ in tail], alpha=0.90)
        out["slope"] = float(res.slope)
        out["ci"] = (float(res.low_slope), float(res.high_slope))
        xs = [c for c, _, smp in tail for _ in smp]
        ys = [x for _, _, smp in tail for x in smp]
        if len(set(xs)) >= 2 and len(set(ys)) >= 2:
            tau = kendalltau(xs, ys)
            out["tau"], out["tau_p"] = float(tau.statistic), float(tau.pvalue)
    if peak <= h and len(pts) < 2:
        return {**out, "verdict": INCONCLUSIVE,
                "reason": "flat, but only 1 round settled: run at least 2 rounds to call it stable"}
    if peak <= h:
        return {**out, "verdict": STABLE,
                "reason": f"every settled level within {h:.3g} of the baseline"}
    if len(pts) < 3:
        return {**out, "verdict": INCONCLUSIVE,
                "reason": f"rose {growth:+.3g} but only {len(pts)} round(s) settled: caching "
                          "and a leak look the same until round 3"}
    slope, ci = out["slope"], out["ci"]
    all_sizes = [b[0] - a[0] for a, b in itertools.pairwise([(0.0, None, None), *pts])]
    typical = float(np.median(all_sizes))  # the planned round size, robust to one short round
    round_growth = (slope or 0.0) * typical  # growth a normal round gives at the fitted rate
    # Each increment scaled to a normal round, so a short last round is judged fairly.
    scaled = [d * typical / n for d, n in zip(incs, sizes, strict=True)]
    last, last_n = incs[-1], sizes[-1]
    # The trend test needs samples to have power (4 points cannot reach p < 0.05): with few
    # settled samples it is reported but does not veto; the slope's CI and the increments decide.
    n_trend = sum(len(smp) for _, _, smp in tail)
    trend_ok = n_trend < th.trend_min_samples or (
        out["tau"] is not None and out["tau"] > 0 and out["tau_p"] < th.trend_p)
    if (
        slope is not None and ci is not None and ci[0] > 0 and round_growth > h
        and all(d > h / 2 for d in scaled) and scaled[-1] >= th.decay_ratio * round_growth
        and trend_ok
    ):
        return {**out, "verdict": LEAK,
                "reason": f"grew {round_growth:.3g} every round after the first, "
                          f"in proportion to requests (last round {last:+.3g})"}
    full_last = last_n >= 0.5 * typical  # a plateau needs a real round of traffic to show it
    if full_last and abs(last) <= h and (max(incs[-2:]) <= h or abs(last) <= h / 2):
        reason = f"rose {growth:+.3g} then flat (last round {last:+.3g}, within {h:.3g})"
        if slope is not None and ci is not None and ci[0] > 0 and typical > 0:
            reason += (f"; a creep of {round_growth:.2g} a round stays under the {h:.2g} floor: "
                       f"a leak under {h / typical:.2g} per request cannot be ruled out at this load")
        return {**out, "verdict": CACHING, "reason": reason}
    if full_last and last < -h:
        return {**out, "verdict": CACHING,
                "reason": f"rose then fell back (last round {last:+.3g}): bounded, not growing"}
    return {**out, "verdict": INCONCLUSIVE,
            "reason": f"still changing in the last round ({last:+.3g}) but not steadily "
                      f"(increments {', '.join(f'{d:+.3g}' for d in incs)})"}


# --- the run -------------------------------------------------------------------------------

def _floor(si: SeriesInfo, th: Thresholds, level: float | None) -> float:
    """Smallest growth that counts. GPU memory moves in exact allocator blocks, so its floor is
    absolute; a large process's RSS jitters with its heap (glibc arenas, GC), so there the
    floor also scales with the level (0.25 % of 4 GiB is 10 MiB a round)."""
    if si.kind == "kv":
        return th.min_growth_kv
    if si.kind == "rss" and level is not None:
        return max(th.min_growth_mib, th.rss_rel_floor * level)
    return th.min_growth_mib


def _appeared(values: list[tuple[float, float]], windows: list[Window], rounds: list[int],
              baseline: float | None, levels: list[float | None],
              fraction: float) -> tuple[float | None, list[float | None]]:
    """A process that first shows up after the baseline held nothing before: 0 MiB there.
    (A new process on the GPU is a step of the whole footprint, not a missing measurement.)"""
    if not values:
        return baseline, levels
    first_t = values[0][0]
    base_end = next((w.end for w in windows if w.kind == "baseline" and w.end is not None), None)
    if baseline is not None or base_end is None or first_t <= base_end:
        return baseline, levels
    # Absent for most of a window's settled (late) half: the level there is 0.
    absent_until = {w.round: w.end - (w.end - w.start) * fraction / 2 for w in windows
                    if w.kind == "idle" and w.end is not None}
    fixed = [0.0 if r in absent_until and first_t > absent_until[r] else v
             for r, v in zip(rounds, levels, strict=True)]
    return 0.0, fixed


def _last_free(records: list[Any], gpu: int | None) -> float | None:
    for r in reversed(records):
        if isinstance(r, GpuSample):
            for g in r.gpus:
                if gpu is None or g.index == gpu:
                    return g.free_mib
    return None


def _host_available(raw: list[dict[str, Any]]) -> float | None:
    for r in reversed(raw):
        if isinstance(r.get("available_mib"), (int, float)):
            return float(r["available_mib"])
    return None


def _main_gpus(series: list[SeriesResult]) -> dict[int | None, int | None]:
    """pid -> the GPU where the process holds most memory (the first, on a tie)."""
    best: dict[int | None, tuple[int | None, float]] = {}
    for s in series:
        if s.kind == "gpu_process" and s.last is not None and (s.pid not in best or s.last > best[s.pid][1]):
            best[s.pid] = (s.gpu, s.last)
    return {pid: gpu for pid, (gpu, _) in best.items()}


def stray_contexts(
    series: list[SeriesResult], lo: float = CONTEXT_MIB[0], hi: float = CONTEXT_MIB[1]
) -> list[SeriesResult]:
    """Context-sized footprints of a process on a GPU that is not its main one."""
    main = _main_gpus(series)
    return [
        s for s in series
        if s.kind == "gpu_process" and s.last is not None and lo <= s.last <= hi
        and main.get(s.pid) is not None and main[s.pid] != s.gpu
    ]


def analyse(
    records: list[Any],
    *,
    header: dict[str, Any] | None = None,
    raw_host: list[dict[str, Any]] | None = None,
    status: str = "complete",
    th: Thresholds = Thresholds(),
) -> SoakResult:
    """Settled levels, growth, rate, culprit and verdict for a soak run's records."""
    events = [r for r in records if isinstance(r, Event)]
    windows = windows_from_events(events)
    rounds = rounds_from_events(events)
    round_ids = [r.round for r in rounds]
    cum: list[float] = []
    total = 0.0
    for r in rounds:
        total += r.reached
        cum.append(total)
    info, points = extract_series(records)
    results: list[SeriesResult] = []
    for key, si in info.items():
        baseline, levels, samples = settled_levels(points[key], windows, round_ids, th.settle_fraction)
        if si.kind in ("gpu_process", "rss"):
            baseline, levels = _appeared(points[key], windows, round_ids, baseline, levels,
                                         th.settle_fraction)
        ref = baseline if baseline is not None else next((v for v in levels if v is not None), None)
        c = classify_series(baseline, levels, cum, samples, floor=_floor(si, th, ref), th=th)
        vals = [v for v in levels if v is not None]
        results.append(SeriesResult(
            **vars(si), baseline=baseline, settled=levels, last=vals[-1] if vals else None,
            growth=c["growth"], noise=c["noise"], threshold=c["threshold"],
            slope_per_request=c["slope"], slope_ci=c["ci"], tau=c["tau"], tau_p=c["tau_p"],
            increments=c["increments"], verdict=c["verdict"], reason=c["reason"],
        ))
    order = {"gpu": 0, "gpu_process": 1, "rss": 2, "kv": 3}
    results.sort(key=lambda s: (order[s.kind], -(s.growth or 0.0), s.key))

    load_s = sum(r.load_s or 0.0 for r in rounds)
    rph = total / load_s * 3600.0 if load_s > 0 and total else None
    notes: list[str] = []
    if not rounds:
        notes.append("no round was started")
    if any(r.reached == 0 for r in rounds):
        notes.append("in some rounds no request reached the server")
    errors = sum(r.errors for r in rounds)
    if errors:
        notes.append(f"{errors} of {sum(r.sent for r in rounds)} requests failed")
    strays = stray_contexts(results)
    for s in strays:
        notes.append(f"pid {s.pid} ({s.name or '?'}) holds a context-sized {s.last:.0f} MiB on "
                     f"GPU {s.gpu}, not its main GPU: a stray CUDA context")

    verdict, culprit_series = _overall(results)
    kv = next((s for s in results if s.kind == "kv"), None)
    kv_leaks = kv is not None and kv.verdict == LEAK
    leak_pr = leak_ph = hours = free = None
    culprit: dict[str, Any] = {"pid": None, "name": None, "gpu": None, "layer": None, "series": None}
    if culprit_series is not None:
        cs = culprit_series
        culprit.update(pid=cs.pid, name=cs.name, gpu=cs.gpu, series=cs.key)
        if verdict == LEAK:
            if cs.kind == "rss":
                culprit["layer"] = "host_ram"
                free = _host_available(raw_host or [])
            elif cs.kind == "kv":
                culprit["layer"] = "kv_pages"
            elif cs in strays:
                culprit["layer"] = "stray_context"
            else:
                culprit["layer"] = "kv_pages" if kv_leaks else "allocator"
            if cs.kind != "rss":
                free = _last_free(records, cs.gpu)
            if cs.kind == "kv":
                kv_mib = _kv_pool_mib(records, header)
                if kv_mib and cs.slope_per_request is not None:
                    leak_pr = cs.slope_per_request * kv_mib
                if cs.slope_per_request and rph:
                    hours = (1.0 - (cs.last or 0.0)) / (cs.slope_per_request * rph)
            else:
                leak_pr = cs.slope_per_request
            if leak_pr is not None and rph:
                leak_ph = leak_pr * rph
                if cs.kind != "kv" and free is not None and leak_ph > 0:
                    hours = free / leak_ph
    suggestion = _suggest(verdict, results, rounds, th)
    sentence = _sentence(verdict, culprit, culprit_series, leak_pr, leak_ph, hours, results, rounds)
    ok = sum(r.ok for r in rounds)
    if rounds and ok == 0 and verdict != LEAK:
        # Memory that does not move under traffic the server refused says nothing.
        first = next((m for r in rounds for m in r.messages), None)
        verdict = INCONCLUSIVE
        sentence = ("INCONCLUSIVE: no request succeeded, so memory was never exercised"
                    + (f" (first error: {first})" if first else "") + ".")
        suggestion = ("fix the traffic first: check --model (the server's model id), --api-key, "
                      "--api, and that the server accepts images (or use --text-only)")
    elif rounds and ok < 0.5 * sum(r.sent for r in rounds):
        notes.append("most requests failed: the memory seen reflects failed requests")
    return SoakResult(
        verdict=verdict, sentence=sentence, leak_mib_per_request=leak_pr,
        leak_mib_per_hour=leak_ph, hours_to_oom=hours, culprit=culprit, rounds=rounds,
        series=results, windows=windows, suggestion=suggestion, requests_per_hour=rph,
        free_mib=free, notes=notes, status=status, points=points,
    )


def _kv_pool_mib(records: list[Any], header: dict[str, Any] | None) -> float | None:
    for r in reversed(records):
        if isinstance(r, MetricsSample):
            gib = next((r.values[k] for k in KV_POOL_GIB_NAMES if r.values.get(k)), None)
            if gib:
                return float(gib) * 1024.0
    mem = ((header or {}).get("config", {}).get("server") or {}).get("memory_usage") or {}
    kv = mem.get("kvcache")
    return float(kv) * 1024.0 if isinstance(kv, (int, float)) else None


def _overall(results: list[SeriesResult]) -> tuple[str, SeriesResult | None]:
    """The run's verdict is its worst series (LEAK > INCONCLUSIVE > CACHING > STABLE); the
    culprit is the growing process series, else the device or KV series."""
    if not results:
        return INCONCLUSIVE, None
    worst = max(_RANK[s.verdict] for s in results)
    verdict = next(k for k, v in _RANK.items() if v == worst)
    cands = [s for s in results if s.verdict == verdict]
    pref = {"gpu_process": 0, "rss": 1, "kv": 2, "gpu": 3}

    def size(s: SeriesResult) -> float:
        if verdict == LEAK and s.slope_per_request is not None and s.kind != "kv":
            return s.slope_per_request
        return abs(s.growth or 0.0)

    procs = [s for s in cands if s.kind in ("gpu_process", "rss")]
    if procs:
        # VRAM before host RAM when both grow: the GPU is what runs out first in practice.
        best_gpu = [s for s in procs if s.kind == "gpu_process"]
        pool = best_gpu or procs
        return verdict, max(pool, key=size)
    return verdict, min(cands, key=lambda s: (pref[s.kind], -size(s)))


def _suggest(verdict: str, results: list[SeriesResult], rounds: list[RoundInfo], th: Thresholds) -> str | None:
    if verdict != INCONCLUSIVE:
        return None
    n = len(rounds)
    per = max((r.sent for r in rounds), default=0)
    if n < 3:
        return f"run at least 4 rounds: vramdoctor soak --rounds {max(4, n + 2)} (same --requests)"
    noisy = any(s.verdict == INCONCLUSIVE and s.noise * th.noise_k > th.min_growth_mib for s in results)
    if noisy:
        return ("memory is noisy inside the idle windows: run with a longer --idle (e.g. 30) so "
                "levels settle, and keep other work off the GPU")
    return (f"growth has not clearly stopped or continued: run more rounds of the same traffic, "
            f"e.g. --rounds {2 * n} --requests {per or 50}; caching flattens, a leak keeps growing")


def _fmt_hours(h: float | None) -> str:
    if h is None:
        return "unknown"
    if h < 1:
        return f"{h * 60:.0f} minutes"
    if h < 48:
        return f"{h:.1f} hours"
    return f"{h / 24:.1f} days"


def _where(cs: SeriesResult | None) -> str:
    if cs is None:
        return "memory"
    if cs.kind == "rss":
        return f"host RAM (RSS) of pid {cs.pid} ({cs.name or '?'})"
    if cs.kind == "gpu_process":
        return f"GPU {cs.gpu} memory of pid {cs.pid} ({cs.name or '?'})"
    if cs.kind == "kv":
        return "KV cache usage at idle"
    return f"GPU {cs.gpu} memory"


def _kv_flat(results: list[SeriesResult]) -> str:
    """' (KV usage back to 0.01 at idle: not KV pages ...)' when the server publishes KV usage."""
    kv = next((s for s in results if s.kind == "kv" and s.last is not None), None)
    if kv is None or kv.verdict == LEAK:
        return ""
    return (f" (KV usage back to {kv.last:.2f} at idle: not KV pages, but preprocessing or "
            "activation memory)")


def _sentence(verdict: str, culprit: dict[str, Any], cs: SeriesResult | None, leak_pr: float | None,
              leak_ph: float | None, hours: float | None, results: list[SeriesResult],
              rounds: list[RoundInfo]) -> str:
    n = len([r for r in rounds if r.reached])
    where = _where(cs)
    if verdict == LEAK:
        layer = {"host_ram": "a host-RAM leak (not VRAM)", "kv_pages": "a KV page leak",
                 "allocator": "allocator memory that is never freed" + _kv_flat(results),
                 "stray_context": "a stray CUDA context"}.get(culprit.get("layer") or "", "a leak")
        rate = f"{leak_pr:.3g} MiB per request" if leak_pr is not None else "steadily"
        if cs is not None and cs.kind == "kv" and cs.slope_per_request is not None and leak_pr is None:
            rate = f"{cs.slope_per_request * 100:.3g} % of the KV pool per request"
        ph = f" ({leak_ph:.0f} MiB/hour at the observed load)" if leak_ph is not None else ""
        end = "the KV pool is full" if culprit.get("layer") == "kv_pages" and cs is not None \
            and cs.kind == "kv" else "out of memory"
        return (f"LEAK: {where} grows {rate}{ph} in every round of identical traffic; "
                f"{layer}; {end} in about {_fmt_hours(hours)}.")
    if verdict == CACHING:
        g = cs.growth if cs is not None and cs.growth is not None else 0.0
        unit = "" if cs is not None and cs.unit == "ratio" else " MiB"
        return (f"CACHING: {where} rose {g:+.1f}{unit} and then stayed flat across {_rounds(n)} of "
                "identical traffic: memory kept for reuse, not a leak.")
    if verdict == STABLE:
        return f"STABLE: no series moved beyond its noise across {_rounds(n)} of identical traffic."
    reason = cs.reason if cs is not None else "no memory series was recorded"
    return f"INCONCLUSIVE: {where}: {reason}."


def _rounds(n: int) -> str:
    return f"{n} round" if n == 1 else f"{n} rounds"
