"""The `ab-test --server` table and recommendation, from the experiment's records. Pure.

Input: the variants' `abtest_variant` records (`experiment.VariantResult` as dicts; the last
record of a name wins) and, for each variant that ran, its soak analysis (`SoakAnalysis`, from
its run file; None when that file is gone). Output: plain data (`server_abtest`), the same live
and offline.

Per variant and layer: the verdict, the rate per request with its unit, the settled level (the
deciding series' last settled level) and the evidence that decided (the series and why). Against
the baseline: p50/p99 latency and throughput as a change in percent, what the variant stops
(a baseline LEAK that is not a LEAK here) and what it makes worse (a LEAK the baseline does not
have, or a rate 1.5 times the baseline's). The recommendation is the variant that stops the most
leaks, makes nothing worse, and costs the least p99 latency; it says what it trades. Drift is
the baseline run again last: a verdict that changed, or p50 latency more than 20 % apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vramdoctor.judge.results import LAYERS, LEAK, NOT_MEASURED, SoakAnalysis
from vramdoctor.soak.report.layers import block, display_name, main_series
from vramdoctor.soak.report.series import label, series_reason
from vramdoctor.soak.report.text import known, rate, value

__all__ = ["SCHEMA", "WORSE_RATIO", "server_abtest"]

SCHEMA = "vramdoctor.abtest-server/1"
WORSE_RATIO = 1.5  # a leak this many times the baseline's rate is "worse"
DRIFT_SHARE = 0.20  # baseline and baseline-again p50 further apart than this: drift


def _pct(new: float | None, old: float | None) -> float | None:
    if not known(new) or not known(old) or not old:
        return None
    assert new is not None and old is not None
    return 100.0 * (new - old) / old


def _layer(a: SoakAnalysis, name: str) -> dict[str, Any]:
    lay = a.layers[name]
    s = main_series(lay)
    return {
        "verdict": str(lay.verdict),
        "rate_per_request": lay.rate_per_request if lay.verdict == LEAK else None,
        "unit": lay.unit,
        "rate_text": rate(lay.rate_per_request, lay.unit) if lay.verdict == LEAK else None,
        "settled": s.last if s is not None else None,
        "settled_text": value(s.last, s.unit) if s is not None else None,
        "evidence": (
            f"not measured ({block(name).not_measured})"
            if lay.verdict == NOT_MEASURED
            else f"{label(s)}: {series_reason(s)}"
            if s is not None
            else str(lay.reason)
        ),
        "decided_by": lay.decided_by,
    }


def _layers(a: SoakAnalysis | None) -> dict[str, dict[str, Any]] | None:
    if a is None:
        return None
    return {n: _layer(a, n) for n in LAYERS if n in a.layers}


def _compare(
    row: dict[str, Any], base: dict[str, Any] | None
) -> tuple[list[str], list[str], list[str]]:
    """(what the variant stops, what it makes worse, what it changes in settled memory)."""
    stops: list[str] = []
    worse: list[str] = []
    lower: list[str] = []
    mine, theirs = row.get("layers"), (base or {}).get("layers")
    if not mine or not theirs:
        return stops, worse, lower
    for name, lay in mine.items():
        b = theirs.get(name)
        if b is None:
            continue
        shown = display_name(name)
        if b["verdict"] == LEAK and lay["verdict"] != LEAK:
            stops.append(f"the {shown} LEAK ({b['rate_text']} per request -> {lay['verdict']})")
        elif lay["verdict"] == LEAK and b["verdict"] != LEAK:
            worse.append(
                f"a {shown} LEAK the baseline does not have ({lay['rate_text']} per request)"
            )
        elif (
            lay["verdict"] == LEAK
            and known(lay["rate_per_request"])
            and known(b["rate_per_request"])
            and lay["rate_per_request"] > WORSE_RATIO * b["rate_per_request"]
        ):
            worse.append(
                f"a faster {shown} LEAK ({lay['rate_text']} per request vs {b['rate_text']})"
            )
        if (
            lay["unit"] == "MiB"
            and known(lay["settled"])
            and known(b["settled"])
            and abs(lay["settled"] - b["settled"]) >= 16.0
        ):
            delta = lay["settled"] - b["settled"]
            lower.append(f"{shown} settles {value(delta, 'MiB', signed=True)} vs the baseline")
    return stops, worse, lower


def server_abtest(
    header: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    analyses: Callable[[str], SoakAnalysis | None],
) -> dict[str, Any]:
    """The experiment as data: {"schema", "server", "kind", "rows": [per variant in run order:
    name, change, status, message, layers, latency, throughput_rps, vs_baseline, stops, worse,
    settled, log_tail], "recommendation", "drift", "problem"}. `results` the variants' records,
    `analyses(name)` the soak analysis of a variant's run file (or None)."""
    cfg = header.get("config") or {}
    planned = {v["name"]: v for v in cfg.get("variants") or []}
    last: dict[str, Mapping[str, Any]] = {}
    for r in results:
        last[str(r["name"])] = r
    order = [n for n in planned if n in last] + [n for n in last if n not in planned]
    rows: list[dict[str, Any]] = []
    for name in order:
        r = last[name]
        plan = planned.get(name, {})
        a = analyses(name) if r.get("run_file") else None
        rows.append(
            {
                "name": name,
                "change": plan.get("change", ""),
                "description": plan.get("description", ""),
                "trades": plan.get("trades", ""),
                "preset": plan.get("preset"),
                "status": r.get("status"),
                "message": r.get("message", ""),
                "run_file": r.get("run_file"),
                "log_file": r.get("log_file"),
                "log_tail": list(r.get("log_tail") or []),
                "verdict": str(a.verdict) if a is not None else None,
                "layers": _layers(a),
                "latency": dict(r.get("latency") or {}),
                "throughput_rps": r.get("throughput_rps"),
                "requests": dict(r.get("requests") or {}),
                "leftovers": list(r.get("leftovers") or []),
                "wall_s": r.get("wall_s"),
            }
        )
    base = next((x for x in rows if x["name"] == "baseline" and x["layers"]), None)
    for row in rows:
        lat, blat = row["latency"], (base or {}).get("latency") or {}
        row["vs_baseline"] = {
            "p50_pct": _pct(lat.get("p50_s"), blat.get("p50_s")),
            "p99_pct": _pct(lat.get("p99_s"), blat.get("p99_s")),
            "throughput_pct": _pct(row["throughput_rps"], (base or {}).get("throughput_rps")),
        }
        stops, worse, lower = _compare(row, base) if row is not base else ([], [], [])
        row["stops"], row["worse"], row["settled_vs_baseline"] = stops, worse, lower
    return {
        "schema": SCHEMA,
        "server": cfg.get("server"),
        "kind": cfg.get("kind"),
        "rows": rows,
        "recommendation": _recommend(rows, base),
        "drift": _drift(rows),
        "problem": any(
            x["status"] in ("failed_to_start", "crashed", "errors", "leftover") for x in rows
        ),
    }


def _cost(row: Mapping[str, Any]) -> str:
    vs = row["vs_baseline"]
    parts = []
    for key, what in (("p50_pct", "p50 latency"), ("p99_pct", "p99 latency")):
        if vs.get(key) is not None:
            parts.append(f"{vs[key]:+.0f} % {what}")
    if vs.get("throughput_pct") is not None:
        parts.append(f"{vs['throughput_pct']:+.0f} % throughput")
    return ", ".join(parts) or "no latency measured"


def _recommend(rows: Sequence[dict[str, Any]], base: dict[str, Any] | None) -> dict[str, Any]:
    """The variant to use and what it trades, or why none is recommended."""
    if base is None:
        return {
            "variant": None,
            "text": "the baseline did not run to the end: nothing to compare with",
        }
    base_leaks = [n for n, lay in (base["layers"] or {}).items() if lay["verdict"] == LEAK]
    ok = [
        r
        for r in rows
        if r["name"] not in ("baseline", "baseline-again")
        and r["status"] == "complete"
        and r["layers"]
    ]
    if not base_leaks:
        lower = [r for r in ok if r["settled_vs_baseline"] and not r["worse"]]
        text = "the baseline does not leak on any layer: no variant is needed"
        if lower:
            text += "; " + "; ".join(
                f"{r['name']}: {', '.join(r['settled_vs_baseline'])} ({_cost(r)})" for r in lower
            )
        return {"variant": None, "text": text}
    good = [r for r in ok if r["stops"] and not r["worse"]]
    if not good:
        leaks = ", ".join(display_name(n) for n in base_leaks)
        return {
            "variant": None,
            "text": (
                f"no variant stops the {leaks} LEAK without making something worse; find the code "
                "that holds it: vramdoctor soak --attribute (docs/attribute.md)"
            ),
        }

    def key(r: dict[str, Any]) -> tuple[float, float]:
        p99 = r["vs_baseline"].get("p99_pct")
        return (-len(r["stops"]), p99 if p99 is not None else 1e9)

    best = sorted(good, key=key)[0]
    trades = f"; {best['trades']}" if best.get("trades") else ""
    return {
        "variant": best["name"],
        "text": (
            f"{best['name']} ({best['change']}) stops {'; '.join(best['stops'])}; it trades "
            f"{_cost(best)}{trades}"
        ),
    }


def _drift(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    first = next((r for r in rows if r["name"] == "baseline"), None)
    again = next((r for r in rows if r["name"] == "baseline-again"), None)
    if first is None or again is None or not first["layers"] or not again["layers"]:
        return {"checked": False, "text": "the baseline did not run twice: drift not checked"}
    notes = []
    for name, lay in first["layers"].items():
        other = again["layers"].get(name)
        if other is not None and other["verdict"] != lay["verdict"]:
            notes.append(f"{display_name(name)} {lay['verdict']} first, {other['verdict']} last")
    p = _pct(again["latency"].get("p50_s"), first["latency"].get("p50_s"))
    if p is not None and abs(p) > 100 * DRIFT_SHARE:
        notes.append(f"p50 latency {p:+.0f} % from the first baseline to the last")
    if notes:
        return {
            "checked": True,
            "drifted": True,
            "text": "the baseline drifted during the run ("
            + "; ".join(notes)
            + "): compare with care",
        }
    return {
        "checked": True,
        "drifted": False,
        "text": "the baseline run again last agrees with the first",
    }
