"""Turn an ab-test's recorded records into per-variant figures, verdicts and a recommendation.

Pure: takes the records (dicts as written to the run file) and returns plain data, so
`vramdoctor report RUN.jsonl` recomputes exactly what the live run printed. Memory is judged
against the process's bare CUDA context (NVML, measured before the first request), growth
per round over the rounds after the first (the first fills the caches).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np
from scipy import stats

from vramdoctor.units import MIB, format_mib

# A variant "grows" when its memory rises by more than this per round after the first.
GROWTH_TOLERANCE_MIB = 8.0
# The scoped-pool target: within this of the bare CUDA context after every request.
CONTEXT_TOLERANCE_MIB = 8.0
# A mitigation costing more than this in p50 latency is only recommended when nothing else bounds memory.
MAX_RECOMMENDED_OVERHEAD_PCT = 10.0


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def above_context_mib(record: dict[str, Any], context_mib: float | None) -> float:
    """MiB a request or round record holds above the CUDA context: NVML minus the context, or
    PyTorch reserved where NVML could not attribute the worker's memory (context_mib None)."""
    if context_mib is None:
        return float(record.get("torch_reserved_mib") or 0.0)
    return float(record["nvml_mib"]) - context_mib


def grows(levels: list[float], tolerance: float = GROWTH_TOLERANCE_MIB) -> bool:
    """Still growing: a positive trend after the first round AND a new high in the last round.

    Caching rises while new image sizes arrive and then stays put (the last round is no new
    high); a leak sets a new high every round. Noise (parked pools coming and going) gives a
    slope without a new high.
    """
    slope = growth_per_round(levels)
    if slope is None or slope <= tolerance:
        return False
    return levels[-1] > max(levels[:-1]) + tolerance


def growth_per_round(levels: list[float]) -> float | None:
    """Theil-Sen slope (MiB per round) over the rounds after the first; None with < 2 rounds."""
    tail = levels[1:] if len(levels) >= 3 else levels
    if len(tail) < 2:
        return None
    if len(tail) == 2:
        return float(tail[1] - tail[0])
    slope = stats.theilslopes(tail, np.arange(len(tail)))[0]
    return float(slope)


def _variant_summary(name: str, recs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    start = next(iter(recs.get("abtest.variant", [])), {})
    ends = [r for r in recs.get("abtest.variant", []) if r.get("event") == "end"]
    end = ends[-1] if ends else {}
    context = (recs.get("abtest.context") or [{}])[0]
    requests = recs.get("abtest.request", [])
    rounds = sorted(recs.get("abtest.round", []), key=lambda r: r["round"])
    idles = recs.get("abtest.idle") or []
    idle = idles[-1] if idles else None
    errors = recs.get("abtest.error", [])
    status = end.get("status") or ("error" if errors else ("incomplete" if requests else "not run"))
    raw_context = context.get("context_mib")
    # NVML attributes memory to our PID unless the worker ran in another PID namespace; then
    # every figure falls back to PyTorch's reserved memory (the allocator's view, no context).
    nvml_ok = raw_context is not None and all(
        r.get("nvml_mib") is not None for r in [*requests, *rounds]
    )
    context_mib = float(raw_context) if nvml_ok and raw_context is not None else None
    requests_t = [r for r in requests if r.get("latency_ms") is not None]
    latencies = [float(r["latency_ms"]) for r in requests_t]

    def level(r: dict[str, Any]) -> float:
        return above_context_mib(r, context_mib)

    above = [level(r) for r in requests]
    round_rows = [
        {
            "round": r["round"],
            "torch_reserved_mib": r.get("torch_reserved_mib"),
            "torch_peak_reserved_mib": r.get("torch_peak_reserved_mib"),
            "nvml_mib": r.get("nvml_mib"),
            "nvml_above_context_mib": level(r) if nvml_ok else None,
        }
        for r in rounds
    ]
    levels = [level(r) for r in rounds]
    reserved_levels = [float(r.get("torch_reserved_mib") or 0.0) for r in rounds]
    growth = growth_per_round(levels)
    growth_reserved = growth_per_round(reserved_levels)
    verdict = (
        "n/a" if status != "ok" or growth is None else ("grows" if grows(levels) else "bounded")
    )
    escaped = max([int(r.get("escaped_bytes") or 0) for r in [*requests, *rounds]] or [0])
    return {
        "variant": name,
        "title": start.get("title"),
        "status": status,
        "message": end.get("message") or (errors[-1].get("message") if errors else None),
        "pid": context.get("pid"),
        "processor": context.get("processor"),
        "alloc_conf": context.get("alloc_conf"),
        "context_mib": raw_context,
        "bare_context_mib": context.get("bare_context_mib"),
        # "nvml" (process memory above its CUDA context) or "pytorch-reserved" (fallback).
        "memory_basis": "nvml" if nvml_ok else "pytorch-reserved",
        "requests": len(requests_t),
        "rounds": round_rows,
        "growth_per_round_mib": growth,
        "growth_per_round_torch_reserved_mib": growth_reserved,
        "held_after_idle_mib": None
        if idle is None or (nvml_ok and idle.get("nvml_mib") is None)
        else level(idle),
        "torch_reserved_after_idle_mib": None if idle is None else idle.get("torch_reserved_mib"),
        "max_above_context_after_request_mib": max(above) if above else None,
        "escaped_mib": escaped / MIB,
        "p50_ms": _percentile(latencies, 50),
        "p99_ms": _percentile(latencies, 99),
        "verdict": verdict,
        "mitigation": bool((start.get("config") or {}).get("mitigation", True)),
    }


def _recommend(variants: list[dict[str, Any]], noise_pct: float | None = None) -> dict[str, Any]:
    usable = [
        v
        for v in variants
        if v["status"] == "ok"
        and v["mitigation"]
        and v["verdict"] == "bounded"
        and v["held_after_idle_mib"] is not None
    ]
    if not usable:
        return {"variant": None, "reason": "no mitigation finished with bounded memory"}
    # An overhead inside this run's measured drift is not a measured cost.
    limit = max(MAX_RECOMMENDED_OVERHEAD_PCT, noise_pct or 0.0)
    cheap = [v for v in usable if (v["overhead_pct"] or 0.0) <= limit]
    pool = cheap or usable
    best = min(pool, key=lambda v: (round(v["held_after_idle_mib"] / 8), v["p50_ms"] or 0.0))
    over = best["overhead_pct"]
    reason = (
        f"holds {format_mib(best['held_after_idle_mib'], 0)} above its CUDA context after idle, "
        f"bounded across rounds, p50 {best['p50_ms']:.2f} ms"
        + (f" ({over:+.1f}% vs baseline)" if over is not None else "")
    )
    if not cheap:
        reason += f"; every bounded mitigation costs more than {limit:.0f}% p50"
    return {"variant": best["variant"], "title": best["title"], "reason": reason}


def _ipc_summary(record: dict[str, Any]) -> dict[str, Any]:
    producer_gpu = record.get("producer_gpu", 0)
    consumers = record.get("consumers") or []
    opened = record.get("census_opened") or {}
    before = record.get("census_before") or {}
    producer = record.get("producer") or {}
    # The census counts GPUs by NVML index; the children by CUDA ordinal ("census_gpu" maps one
    # to the other by UUID where the arm recorded it).
    producer_census_gpu = producer.get("census_gpu", producer_gpu)
    measured = "census_opened" in record  # no census while holding: no figures, not zeros
    rows = [
        _ipc_consumer_row(c, record, opened, before, producer_census_gpu, measured)
        for c in consumers
    ]
    cross = [r["on_producer_gpu_mib"] for r in rows if r["on_producer_gpu_mib"] is not None]
    # A consumer's own CUDA context before it opened anything: the unit of "extra contexts".
    contexts = sorted(r["on_own_gpu_before_mib"] for r in rows if r["on_own_gpu_before_mib"])
    context_mib = contexts[len(contexts) // 2] if contexts else None
    total_mib = sum(cross) if cross else None
    census = _ipc_census(opened, consumers, producer)
    return {
        "mode": record.get("mode"),
        "error": record.get("error"),
        "note": record.get("note"),
        "producer_gpu": producer_gpu,
        "producer_pid": producer.get("pid"),
        "pool_mib": (producer.get("pool_bytes") or 0) / MIB,
        "oversize_went_cpu": producer.get("oversize_went_cpu"),
        "consumers": rows,
        "extra_on_producer_gpu_per_consumer_mib": (sum(cross) / len(cross)) if cross else None,
        "extra_on_producer_gpu_total_mib": total_mib,
        "consumer_context_mib": context_mib,
        # total / one consumer's context: N-1 without the redirect (one context each), 0 with it
        "extra_on_producer_gpu_contexts": total_mib / context_mib
        if total_mib is not None and context_mib
        else None,
        "gpu_count": record.get("gpu_count"),
        "all_correct": bool(rows) and all(r["correct"] for r in rows),
        # Every GPU and every process on it while the consumers held the shared memory.
        "census": census,
        "census_opened": opened,
    }


def _census_used(census: dict[str, Any], pid: int, gpu: Any) -> float:
    """MiB the census shows process `pid` using on GPU `gpu` (NVML index, as the record has
    it); 0 when absent."""
    return sum(
        float(p.get("used_mib") or 0.0)
        for p in census.get("processes", [])
        if p.get("pid") == pid and p.get("gpu") == gpu
    )


def _ipc_consumer_row(
    c: dict[str, Any],
    record: dict[str, Any],
    opened: dict[str, Any],
    before: dict[str, Any],
    producer_census_gpu: Any,
    measured: bool,
) -> dict[str, Any]:
    """One consumer's summary: what it reported, whether its data read back correct, and what
    it used on the producer's GPU and on its own while holding (None: not measured) and on
    its own before it opened anything."""
    own = c.get("census_gpu", c.get("gpu"))
    pid = c.get("pid")
    return {
        "gpu": c.get("gpu"),
        "pid": pid,
        "peer_access": c.get("peer_access"),
        "redirect_applied": c.get("redirect_applied"),
        "correct": bool(c.get("slice_correct") and c.get("tensor_correct")),
        "error": c.get("error"),
        "held_during_census": c.get("held_during_census"),
        "on_producer_gpu_mib": _census_used(opened, pid, producer_census_gpu)
        if measured and pid is not None and own != producer_census_gpu
        else None,
        "on_own_gpu_mib": _census_used(opened, pid, own) if measured and pid is not None else None,
        "on_own_gpu_before_mib": _census_used(before, pid, own)
        if pid is not None and "census_before" in record
        else None,
    }


def _ipc_census(
    opened: dict[str, Any], consumers: list[dict[str, Any]], producer: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every GPU of the census taken while the consumers held, with its used MiB and each
    process on it (pid, role: producer, consumer or other, used MiB)."""
    roles = {c.get("pid"): "consumer" for c in consumers}
    roles[producer.get("pid")] = "producer"
    return [
        {
            "gpu": g.get("index"),
            "used_mib": g.get("used_mib"),
            "processes": [
                {
                    "pid": p.get("pid"),
                    "role": roles.get(p.get("pid"), "other"),
                    "used_mib": p.get("used_mib"),
                }
                for p in opened.get("processes", [])
                if p.get("gpu") == g.get("index")
            ],
        }
        for g in opened.get("gpus", [])
    ]


def analyse(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per-variant summaries (in run order), the recommendation, and the IPC arm."""
    by_variant: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    order: list[str] = []
    ipc: list[dict[str, Any]] = []
    for rec in records:
        kind = rec.get("kind", "")
        if kind == "abtest.ipc":
            ipc.append(rec)
            continue
        name = rec.get("variant")
        if not kind.startswith("abtest.") or name is None:
            continue
        if name not in order:
            order.append(name)
        by_variant[name][kind].append(rec)
    variants = [_variant_summary(n, by_variant[n]) for n in order]
    base = next((v for v in variants if v["variant"] == "baseline" and v["p50_ms"]), None)
    for v in variants:
        v["overhead_pct"] = (
            (v["p50_ms"] / base["p50_ms"] - 1.0) * 100.0
            if base and v["p50_ms"] is not None
            else None
        )
    again = next((v for v in variants if v["variant"] == "baseline_again" and v["p50_ms"]), None)
    noise = abs(again["p50_ms"] / base["p50_ms"] - 1.0) * 100.0 if base and again else None
    targets = _targets(variants)
    ipc_rows = [_ipc_summary(r) for r in ipc if "consumers" in r or "error" in r]
    notes = [r["note"] for r in ipc if r.get("note")]
    return {
        "variants": variants,
        "recommendation": _recommend(variants, noise),
        # How far the baseline's p50 moved between the first and the last process of the run.
        "latency_noise_pct": noise,
        "targets": targets,
        "ipc": ipc_rows,
        "ipc_notes": notes,
        # a failed variant, or an IPC arm that failed or read back wrong data
        "problem": any(v["status"] != "ok" for v in variants)
        or any(a["error"] or (a["consumers"] and not a["all_correct"]) for a in ipc_rows),
    }


def _targets(variants: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, checked on this run (None where the variant did not run)."""
    by = {v["variant"]: v for v in variants}
    pool, guarded = by.get("scoped_pool"), by.get("escaped_guarded")
    unguarded = by.get("escaped_unguarded")
    out: dict[str, Any] = {}
    if pool and pool["status"] == "ok":
        out["scoped_pool_within_8mib_of_context"] = (
            pool["max_above_context_after_request_mib"] is not None
            and pool["max_above_context_after_request_mib"] <= CONTEXT_TOLERANCE_MIB
        )
        out["scoped_pool_bounded"] = pool["verdict"] == "bounded"
        out["scoped_pool_overhead_within_5pct"] = (
            pool["overhead_pct"] is not None and pool["overhead_pct"] <= 5.0
        )
    if unguarded and unguarded["status"] == "ok":
        out["escape_detected_grows_without_guard"] = unguarded["verdict"] == "grows"
    if guarded and guarded["status"] == "ok":
        out["escape_detected_with_bytes"] = guarded["escaped_mib"] > 0
        out["guard_bounded"] = guarded["verdict"] == "bounded"
    return out
