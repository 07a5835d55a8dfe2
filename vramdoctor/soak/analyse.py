"""The bridge from a recorded run to the pure analysis (`vramdoctor.judge`).

`analyse_run` analyses a `record.Run` with `analyse_soak` (schema vramdoctor.soak/2), taking
the thresholds and the production rate the run recorded unless given; the runner's adaptive
rounds ask `undecided_layers` which memory layers are not decided yet. No I/O here: the run
was read by the caller.
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
    analysis = analyse_soak(
        run.records,
        run.header,
        production_rate_rps=production_rate_rps,
        raw_host=run.raw("host_memory"),
        status=run.status,
        th=th,
    )
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
