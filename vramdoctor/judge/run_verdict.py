"""The run's verdict from its layers, what is still undecided, and the production rate.

Overall rule (documented in docs/soak.md, "Run verdict"):
1. LEAK if any layer is LEAK (VRAM, KV pool or host RAM: each runs out on its own);
2. else INCONCLUSIVE if any measured layer is INCONCLUSIVE (one undecided layer leaves the
   question open), or if no layer was measured, or if no request succeeded;
3. else CACHING if any layer is CACHING;
4. else STABLE.
A server that died is never healthy (exit 1) whatever the verdict of the rounds before it.

The projection in hours needs a production request rate: the caller's, or the server's own
request counter growing during the baseline window, before soak sent anything. The soak's
own burst load says nothing about production and is never used.
"""

from __future__ import annotations

from typing import Any

from vramdoctor.judge.results import (
    CACHING,
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    R_NO_REFERENCE,
    R_ONE_ROUND,
    STABLE,
    U_NO_LEVEL,
    U_NOISY,
    U_STILL_CHANGING,
    U_TOO_FEW_ROUNDS,
    LayerResult,
    Thresholds,
    Undecided,
    Window,
)
from vramdoctor.samples import MetricsSample


def overall_verdict(layers: dict[str, LayerResult], *, no_request_succeeded: bool = False) -> str:
    """The documented rule above, over every layer judged (the registry's: vram, kv, host
    and any added from outside)."""
    verdicts = [lay.verdict for lay in layers.values()]
    if LEAK in verdicts:
        return LEAK
    measured = [v for v in verdicts if v != NOT_MEASURED]
    if not measured or no_request_succeeded or INCONCLUSIVE in measured:
        return INCONCLUSIVE
    if CACHING in measured:
        return CACHING
    return STABLE


def undecided(layers: dict[str, LayerResult], th: Thresholds) -> list[Undecided]:
    """Measured layers that are INCONCLUSIVE, each with why (results.U_*): what more rounds
    of the same traffic could decide."""
    out: list[Undecided] = []
    for name, lay in layers.items():
        if lay.verdict != INCONCLUSIVE:
            continue
        top = next((s for s in lay.series if s.key == lay.main_series), None)
        reason = lay.reason
        if reason in (R_ONE_ROUND, R_NO_REFERENCE):
            reason = U_TOO_FEW_ROUNDS
        elif (
            top is not None
            and reason == U_STILL_CHANGING
            and top.noise * th.noise_k > top.threshold * 0.99
            and top.noise > 0
        ):
            reason = U_NOISY
        elif reason not in (U_TOO_FEW_ROUNDS, U_STILL_CHANGING):
            reason = reason or U_NO_LEVEL
        lay.undecided_reason = reason
        out.append(Undecided(name, reason, lay.main_series))
    return out


def baseline_request_rate(records: list[Any], windows: list[Window]) -> float | None:
    """Requests per second the server finished on its own during the baseline window (its
    request counter's growth before soak sent anything), or None when it shows no traffic."""
    base = next((w for w in windows if w.kind == "baseline"), None)
    if base is None:
        return None
    end = base.end
    first_load = min((w.start for w in windows if w.kind == "load"), default=None)
    if end is None or (first_load is not None and first_load < end):
        end = first_load
    pts = [
        (r.t, float(r.requests_total))
        for r in records
        if isinstance(r, MetricsSample)
        and r.requests_total is not None
        and isinstance(r.requests_total, (int, float))
        and r.requests_total == r.requests_total
        and (end is None or r.t <= end)
    ]
    if len(pts) < 2:
        return None
    (t0, c0), (t1, c1) = pts[0], pts[-1]
    if t1 <= t0 or c1 <= c0:
        return None
    return (c1 - c0) / (t1 - t0)
