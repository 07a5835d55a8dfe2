"""The `--json` object of a soak, schema `vramdoctor.soak/2` (docs/soak.md, "JSON").

Built from the same layer results and sentences as the terminal report; every number is the
analysis's own (sizes in MiB, KV in tokens), NaN and infinities written as null (`finite`).
"""

from __future__ import annotations

from typing import Any

from vramdoctor.judge.results import LEAK, SCHEMA, SoakAnalysis, finite
from vramdoctor.soak.report.sentences import (
    headline,
    layer_order,
    layer_sentence,
    notes,
    suggestion,
    undecided_text,
)
from vramdoctor.soak.report.text import known

__all__ = ["soak_json"]


def soak_json(a: SoakAnalysis) -> dict[str, Any]:
    """The `--json` object, schema `vramdoctor.soak/2` (docs/soak.md, "JSON")."""
    order = layer_order(a)
    lead = next((a.layers[n] for n in order if a.layers[n].verdict == LEAK), None)
    culprit = None
    if lead is not None and lead.culprit is not None:
        culprit = {**lead.culprit.to_dict(), "layer": lead.layer}
    layers = _layers_doc(a, order)
    settled = _settled_per_round(a)
    doc: dict[str, Any] = finite(
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
            "undecided": _undecided_doc(a),
            "leak_mib_per_request": lead.rate_mib_per_request if lead is not None else None,
            "culprit": culprit,
            "suggestion": suggestion(a),
            "server_died": a.server_died,
            "server_replaced": a.server_replaced,
            "collector_failed": a.collector_failed,
            "lives": _lives_doc(a),
            "production_rate_rps": a.production_rate_rps,
            "production_rate_source": a.production_rate_source,
            "observed_requests_per_hour": a.observed_requests_per_hour,
            "notes": notes(a),
            "rounds": _rounds_doc(a, settled),
            "series": [s.to_dict() for s in a.series],
            "process_changes": _process_changes_doc(a),
        }
    )
    return doc


def _layers_doc(a: SoakAnalysis, order: list[str]) -> dict[str, dict[str, Any]]:
    """Each layer's result with its one-sentence summary, in report order (name -> object)."""
    layers: dict[str, dict[str, Any]] = {}
    for name in order:
        lay = a.layers[name]
        layers[name] = {**lay.to_dict(), "summary": layer_sentence(lay, a)}
    return layers


def _settled_per_round(a: SoakAnalysis) -> list[dict[str, float]]:
    """Per round, every series' settled level after it (series key -> value, 3 decimals;
    series without a known level left out)."""
    settled: list[dict[str, float]] = [{} for _ in a.rounds]
    for s in a.series:
        for i, v in enumerate(s.settled[: len(settled)]):
            if known(v):
                assert v is not None
                settled[i][s.key] = round(v, 3)
    return settled


def _undecided_doc(a: SoakAnalysis) -> list[dict[str, Any]]:
    """The layers more rounds could decide: layer, reason, series and the sentence."""
    return [
        {
            "layer": u.layer,
            "reason": u.reason,
            "series": u.series,
            "text": undecided_text(u),
        }
        for u in a.undecided
    ]


def _lives_doc(a: SoakAnalysis) -> list[dict[str, Any]]:
    """The server's lives: index, pid, what ended it and why, its rounds."""
    return [
        {
            "index": lf.index,
            "pid": lf.pid,
            "ended_by": lf.ended_by,
            "reason": lf.reason,
            "rounds": lf.rounds,
        }
        for lf in a.lives
    ]


def _rounds_doc(a: SoakAnalysis, settled: list[dict[str, float]]) -> list[dict[str, Any]]:
    """The rounds: requests and their outcomes, the life, and the settled levels after each."""
    return [
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
    ]


def _process_changes_doc(a: SoakAnalysis) -> list[dict[str, Any]]:
    """The processes that appeared or exited: pid, change, round, name, GPU."""
    return [
        {"pid": c.pid, "change": c.change, "round": c.round, "name": c.name, "gpu": c.gpu}
        for c in a.process_changes
    ]
