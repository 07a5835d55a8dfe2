"""The bridge from a recorded run to the pure analysis (`vramdoctor.judge`).

`analyse_run` analyses a `record.Run` with `analyse_soak` (schema vramdoctor.soak/2), taking
the thresholds and the production rate the run recorded unless given; the runner's adaptive
rounds ask `undecided_layers` which memory layers are not decided yet.

Allocator snapshots of `soak --attribute` (the run's `.attribution/` folder, read through
`vramdoctor.attribution`) are inside evidence too: for a process the agent wrote no CUDA
counters for, each snapshot's live and reserved bytes become an `InsideSample` of its round,
and the stacks and Python lines attribution found growing become the culprit's `held_by`.
The snapshots are the only files read here (the run itself was read by the caller).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from vramdoctor.record import Run

if TYPE_CHECKING:  # scipy is imported with the analysis: only when a run is analysed
    from vramdoctor.judge import SoakAnalysis


def _finite(v: Any) -> float | None:
    """`v` as a finite float, None for anything else (NaN, inf, a string, a bool, None)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _round_ends(run: Run) -> dict[int, tuple[float, float]]:
    """round -> (t, wall) of the end of its idle window (round 0: the baseline's end)."""
    from vramdoctor.samples import Event

    out: dict[int, tuple[float, float]] = {}
    for e in run.records:
        if isinstance(e, Event) and e.name in ("idle_end", "baseline_end"):
            rnd = e.data.get("round", 0)
            if isinstance(rnd, int):
                out[rnd] = (e.t, e.wall)
    return out


def _attribution_evidence(run: Run) -> tuple[list[Any], dict[int, list[Any]], str | None]:
    """The run's records with the allocator snapshots' counters added as InsideSamples (for
    processes without the agent's own CUDA counters), the code attribution found holding
    growing memory (pid -> HeldBy), and a note when the snapshots could not be read."""
    from vramdoctor.judge.inside import HeldBy
    from vramdoctor.samples import InsideSample

    records = list(run.records)
    if getattr(run, "path", None) is None:
        return records, {}, None
    try:
        from vramdoctor.attribution.report import run_attribution

        report = run_attribution(run)
    except Exception as exc:  # a damaged folder must not cost the verdict
        return records, {}, f"allocator snapshots not used as evidence: {exc}"
    if report is None:
        return records, {}, None
    held: dict[int, list[Any]] = {}
    for proc in report.processes:
        if proc.pid is None:
            continue
        for st in proc.growing:
            held.setdefault(proc.pid, []).append(
                HeldBy(proc.pid, proc.memory, st.stack.describe(), st.bytes_per_request)
            )
    for lines in report.python:
        for ln in lines.growing:
            held.setdefault(lines.pid, []).append(
                HeldBy(lines.pid, "python", ln.describe(), ln.bytes_per_request)
            )
    with_cuda = {r.pid for r in records if isinstance(r, InsideSample) and r.cuda}
    ends = _round_ends(run)
    n_rounds = max((k for k in ends if k > 0), default=0)
    for proc in report.processes:
        if proc.pid is None or proc.pid in with_cuda or proc.memory != "cuda":
            continue
        rounds = getattr(proc, "rounds", None)
        if not rounds:
            if len(proc.summaries) != n_rounds + 1:
                continue  # which round each snapshot belongs to is not known
            rounds = list(range(n_rounds + 1))
        for rnd, summ in zip(rounds, proc.summaries, strict=False):
            if rnd not in ends:
                continue
            t, wall = ends[rnd]
            records.append(
                InsideSample(
                    t=t,
                    wall=wall,
                    pid=proc.pid,
                    round=int(rnd),
                    window="idle_end",
                    cuda=[
                        {
                            "device": d,
                            "allocated_bytes": summ.live_bytes if i == 0 else 0,
                            "reserved_bytes": summ.reserved_bytes if i == 0 else 0,
                        }
                        for i, d in enumerate(summ.devices or [0])
                    ],
                    error="from the allocator snapshot (soak --attribute)",
                )
            )
    return records, held, None


def analyse_run(
    run: Run, *, production_rate_rps: float | None = None, min_growth_mib: float | None = None
) -> SoakAnalysis:
    """The per-layer soak analysis of a recorded run."""
    from vramdoctor.judge import Thresholds
    from vramdoctor.soak.analysis import analyse_soak

    cfg = run.header.get("config") if isinstance(run.header.get("config"), dict) else {}
    assert isinstance(cfg, dict)
    if production_rate_rps is None:
        rate = _finite(cfg.get("production_rate_rps"))
        production_rate_rps = rate if rate is not None and rate > 0 else None
    growth = _finite(min_growth_mib if min_growth_mib is not None else cfg.get("min_growth_mib"))
    # A damaged header (NaN, inf, a string) falls back to the default floor, never a crash.
    th = Thresholds(min_growth_mib=growth) if growth is not None and growth >= 0 else Thresholds()
    records, held_by, attribution_note = _attribution_evidence(run)
    analysis = analyse_soak(
        records,
        run.header,
        production_rate_rps=production_rate_rps,
        raw_host=run.raw("host_memory"),
        status=run.status,
        th=th,
        held_by=held_by,
    )
    if attribution_note:
        analysis.notes.append(attribution_note)
    # The run file's own damage (bad lines, disorder, a file the disk could not hold, a torn
    # last line) and what the sampler left out: notes, so every report says what was not analysed.
    extra = [*run.problems, *run.dropped()]
    if run.torn_tail:
        extra.append("the run file's last line was torn (the writer was killed); it was skipped")
    analysis.notes.extend(n for n in extra if n not in analysis.notes)
    return analysis


def undecided_layers(analysis: Any) -> list[tuple[str, str]]:
    """(layer, reason) for every memory layer the analysis could not decide yet."""
    out: list[tuple[str, str]] = []
    for item in getattr(analysis, "undecided", None) or []:
        out.append((str(getattr(item, "layer", item)), str(getattr(item, "reason", ""))))
    return out
