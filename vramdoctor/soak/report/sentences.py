"""The soak report in sentences: each layer's verdict, the headline, why a layer is undecided,
what to run to decide, the notes and the key figures.

Shared sentences live here (INCONCLUSIVE, STABLE and CACHING in general, leaks driven by
time, the projection to capacity); what one layer says its own way lives in its block
(`vramdoctor.soak.report.layers`). The headline is built from the same layer results as the
table, so the two cannot disagree. Pure: analysis in, text out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from vramdoctor.judge.results import (
    CACHING,
    INCONCLUSIVE,
    LAYERS,
    LEAK,
    NOT_MEASURED,
    STABLE,
    VRAM,
    LayerResult,
    SeriesResult,
    SoakAnalysis,
    Undecided,
)
from vramdoctor.soak.report.layers import block, caveat_text, display_name, main_series, who
from vramdoctor.soak.report.reasons import inconclusive_extra, suggestion_for, undecided_words
from vramdoctor.soak.report.series import label, series_reason
from vramdoctor.soak.report.text import count, known, rate, size, value
from vramdoctor.units import format_count, format_duration, format_percent

__all__ = [
    "figures",
    "headline",
    "layer_order",
    "layer_sentence",
    "notes",
    "projection_text",
    "suggestion",
    "undecided_text",
]


def layer_order(a: SoakAnalysis) -> list[str]:
    """The layers of the analysis in the order the report answers them: the built-in ones
    (VRAM, KV pool, host RAM), then any other layer the analysis judged, by name."""
    return [n for n in LAYERS if n in a.layers] + sorted(n for n in a.layers if n not in LAYERS)


def _rounds_text(a: SoakAnalysis) -> str:
    n = len([r for r in a.rounds if r.reached and r.life >= 0])
    return format_count(n, "round" if n == 1 else "rounds")


def projection_text(lay: LayerResult) -> str:
    """When the layer runs out at its leak rate: in requests, and in hours at the production
    rate (given, or the server's own counter before the soak); "" without a projection."""
    p = lay.projection
    if p is None or not known(p.requests):
        return ""
    assert p.requests is not None
    what = block(lay.layer).runs_out
    left = {
        "gpu_free": f"{size(p.capacity_left)} free on the GPU",
        "host_available": f"{size(p.capacity_left)} of host RAM available",
        "kv_free_tokens": f"{value(p.capacity_left, 'tokens')} free",
        "kv_free_ratio": f"{value(p.capacity_left, 'ratio')} free",
    }.get(p.capacity_of, "")
    text = f"{what} after ~{format_count(round(p.requests), 'more requests')} at this rate ({left})"
    if known(p.hours) and known(p.production_rate_rps):
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


def layer_sentence(lay: LayerResult, a: SoakAnalysis) -> str:
    """One layer's verdict as a sentence with its numbers and units ("VRAM: LEAK: ...")."""
    blk = block(lay.layer)
    name = blk.display
    s = main_series(lay)
    if lay.verdict == NOT_MEASURED:
        return f"{name}: not measured ({blk.not_measured})."
    if lay.verdict == LEAK:
        return _leak_sentence(lay, a)
    if lay.verdict == INCONCLUSIVE:
        reason = series_reason(s) if s is not None else "no series decided"
        where = f"{label(s)}: " if s is not None else ""
        return f"{name}: INCONCLUSIVE: {where}{reason}{inconclusive_extra(lay, a)}."
    explained = blk.explained(lay, a)
    if explained is not None:
        return explained
    if lay.verdict == STABLE:
        own = blk.stable(lay, a)
        if own is not None:
            return own
        thr = value(s.threshold, s.unit) if s is not None else "the noise"
        return f"{name}: STABLE: no series moved beyond {thr} across {_rounds_text(a)} of identical traffic."
    where = label(s) if s is not None else name
    why = blk.caching_why(lay) or "memory kept for reuse, not a leak"
    creep = ""
    if s is not None and known(s.creep_floor_per_request):
        if blk.caching_why(lay) is None:
            why = "its last rounds grew by less than the floor"
        creep = (
            f"; a leak under {rate(s.creep_floor_per_request, s.unit)} per request cannot be "
            "ruled out at this load (more requests per round tell)"
        )
    return f"{name}: CACHING: {where} {_caching_shape(s, a)}: {why}{creep}."


def _caching_shape(s: SeriesResult | None, a: SoakAnalysis) -> str:
    """How a CACHING series moved, in its own terms: a rise that then stayed (for how many of
    the last rounds), a rise that fell back, or levels that swung within a band; never "flat"
    for levels that swung."""
    rounds = _rounds_text(a)
    if s is None:
        return f"stopped growing across {rounds} of identical traffic"
    u = s.unit
    growth = value(s.growth, u, signed=True)
    levels = [v for v in s.settled if v is not None]
    if s.reason in ("fell_back", "bounded") and levels:
        return (
            f"moved between {value(min(levels), u)} and {value(max(levels), u)} across {rounds} "
            f"of identical traffic, with no trend (last level {value(levels[-1], u)})"
        )
    incs = s.increments
    if s.reason == "rose_then_flat" and incs:
        grew = [i for i, d in enumerate(incs) if d > s.threshold]
        flat_for = len(incs) - (grew[-1] + 1) if grew else len(incs)
        if grew and flat_for < len(incs):
            return (
                f"rose {growth} and then stayed within {value(s.threshold, u)} for the last "
                f"{count(flat_for, 'round')} of {rounds} of identical traffic"
            )
    return f"rose {growth} and then stayed flat across {rounds} of identical traffic"


def _time_leak_sentence(lay: LayerResult) -> str:
    """A leak driven by time: per hour, idle included; hours to the capacity at that rate."""
    name = display_name(lay.layer)
    per_hour = rate(lay.rate_per_hour, lay.unit)
    p = lay.projection
    proj = ""
    if p is not None and known(p.hours):
        assert p.hours is not None
        left = {
            "gpu_free": "the GPU's free memory",
            "host_available": "the available host RAM",
            "kv_free_tokens": "the KV pool's free tokens",
        }.get(p.capacity_of, "the capacity")
        proj = f"; {left} is used up in about {format_duration(p.hours * 3600.0)} at this rate"
    return (
        f"{name}: LEAK: {who(lay)} grows {per_hour} per hour with time, also inside the idle "
        f"windows with no request in flight: a leak driven by time (a timer, a log or "
        f"buffer that fills), not by requests; the rate per request "
        f"({rate(lay.rate_per_request, lay.unit)}) is only an average at the soak's load{proj}."
    )


def _leak_sentence(lay: LayerResult, a: SoakAnalysis) -> str:
    """A LEAK layer: the time-driven sentence, or the layer's own sentence per request with the
    rate's interval and the projection (and the aborted-request share) the layers share."""
    if lay.rate_per_hour is not None:
        return _time_leak_sentence(lay)
    proj = projection_text(lay)
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
        lo, hi = rate(lay.rate_ci[0], lay.unit), rate(lay.rate_ci[1], lay.unit)
        # An interval too narrow to print as two figures is said as its half-width (or as
        # exact, when even that prints as zero).
        half = rate((lay.rate_ci[1] - lay.rate_ci[0]) / 2, lay.unit)
        if lo != hi:
            ci = f" (90 % interval {lo} to {hi})"
        elif any(c in "123456789" for c in half):
            ci = f" (90 % interval: within {half})"
        else:
            ci = " (the same in every round)"
    return block(lay.layer).leak(lay, a, ci=ci, proj=proj)


def _short(lay: LayerResult) -> str:
    """The layer in a few words, for the headline."""
    blk = block(lay.layer)
    name = blk.display
    s = main_series(lay)
    if lay.verdict == LEAK:
        own = blk.short_leak(lay)
        if own is not None:
            return own
        if lay.rate_per_hour is not None:
            return f"{name} leaks {rate(lay.rate_per_hour, lay.unit)} per hour with time, idle included, in {who(lay)}"
        return f"{name} leaks {rate(lay.rate_per_request, lay.unit)} per request, in {who(lay)}"
    if lay.verdict == CACHING:
        growth = value(s.growth, s.unit, signed=True) if s is not None else ""
        own = blk.short_caching(lay, growth)
        if own is not None:
            return own
        if s is not None and s.reason == "fell_back":
            return f"{name} is caching, not leaking (rose, then fell back: {growth} from the start)"
        if s is not None and s.reason == "bounded":
            return f"{name} is caching, not leaking (up and down within a band: {growth} from the start)"
        if s is not None and (s.growth or 0.0) <= 0:
            return f"{name} is caching, not leaking (no rise: {growth} from the start)"
        if s is not None and known(s.creep_floor_per_request):
            # the rounds bound a leak, they do not rule it out: the headline says no more
            # than the layer's sentence ("a leak under X per request cannot be ruled out")
            return (
                f"{name} is caching (rose {growth}, then flat; a leak under "
                f"{rate(s.creep_floor_per_request, s.unit)} per request is not ruled out)"
            )
        return f"{name} is caching, not leaking (rose {growth}, then flat)"
    if lay.verdict == STABLE:
        return f"{name} is stable"
    if lay.verdict == INCONCLUSIVE:
        return f"{name} is undecided ({series_reason(s) if s is not None else lay.reason})"
    return f"{name} not measured"


def headline(a: SoakAnalysis) -> str:
    """The run in one sentence: VRAM first, then every other layer not STABLE or CACHING."""
    first = f" (first error: {a.first_error})" if a.first_error else ""
    measured_growth = any(
        lay.verdict == INCONCLUSIVE and lay.reason == "retention_or_leak"
        for lay in a.layers.values()
    )
    if a.no_request_succeeded and a.verdict != LEAK and not measured_growth:
        return f"INCONCLUSIVE: no request succeeded, so memory was never exercised{first}."
    parts = [_short(a.layers[VRAM])]
    vram_measured = a.layers[VRAM].verdict != NOT_MEASURED
    for name in layer_order(a):
        lay = a.layers[name]
        if name != VRAM and (
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
    name = display_name(u.layer)
    return (
        name
        + ": "
        + (
            {
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
            }.get(u.reason)
            or undecided_words(u.reason)
            or u.reason
        )
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
    decide = suggestion_for(reasons)  # evidence more rounds cannot give
    if decide is not None:
        return decide
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
    out += _traffic_notes(a)
    out += _life_notes(a)
    out += _process_change_notes(a)
    for name in layer_order(a):
        lay = a.layers[name]
        out += block(name).notes(lay)
        out += [f"{display_name(name)}: {caveat_text(name, code)}" for code in lay.caveats]
    out += _run_notes(a)
    out += a.notes
    return out


def _traffic_notes(a: SoakAnalysis) -> list[str]:
    """The notes on the rounds' requests: failures (by kind), rounds no request reached,
    requests the client abandoned."""
    out: list[str] = []
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
    return out


def _life_notes(a: SoakAnalysis) -> list[str]:
    """The notes on the server's lives: each replacement, and the rounds cut without a
    verdict (by a death or replacement, or by damaged lines)."""
    out: list[str] = []
    for life in a.lives:
        if life.ended_by == "server_replaced":
            out.append(
                f"the server was replaced (a new pid owns the port) after life {life.index + 1}: "
                "each life was analysed on its own rounds"
            )
    cut = [r.round for r in a.rounds if r.life < 0]
    if cut:
        ended = any(life.ended_by is not None for life in a.lives)  # a death or replacement seen
        why = (
            "cut by the server's death or replacement"
            if ended
            else "the run file does not say where they start or end: damaged or missing lines"
        )
        out.append(f"rounds without a verdict ({why}): " + ", ".join(str(c) for c in cut))
    return out


def _process_change_notes(a: SoakAnalysis) -> list[str]:
    """One note per process that appeared or exited during the run (by pid, in the order
    first seen), with its rounds and GPU."""
    out: list[str] = []
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
    return out


def _run_notes(a: SoakAnalysis) -> list[str]:
    """The notes on the run as a whole: no production rate for a projection, source errors,
    a sampling stop, a run that did not complete."""
    out: list[str] = []
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
    return out


# --- JSON ------------------------------------------------------------------------------------


def figures(a: SoakAnalysis) -> list[tuple[str, str]]:
    """The run's key figures as (name, value with unit) rows."""
    rows = [("verdict", a.verdict)]
    for name in layer_order(a):
        lay = a.layers[name]
        shown = display_name(name)
        if lay.verdict == LEAK and lay.rate_per_hour is not None:
            rows.append(
                (
                    f"{shown} leak per hour (with time, idle included)",
                    rate(lay.rate_per_hour, lay.unit),
                )
            )
            if lay.projection is not None and known(lay.projection.hours):
                assert lay.projection.hours is not None
                rows.append(
                    (
                        f"{shown} runs out",
                        f"in about {format_duration(lay.projection.hours * 3600.0)} at this rate",
                    )
                )
            rows.append((f"{shown} culprit", who(lay)))
        elif lay.verdict == LEAK:
            rows.append(
                (
                    f"{shown} leak per request",
                    rate(lay.rate_per_request, lay.unit)
                    + (
                        f" ({size(lay.rate_mib_per_request)})"
                        if lay.unit != "MiB" and known(lay.rate_mib_per_request)
                        else ""
                    ),
                )
            )
            proj = projection_text(lay)
            if proj:
                rows.append((f"{shown} runs out", proj))
            rows.append((f"{shown} culprit", who(lay)))
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
