"""The bridge from a recorded run to the pure analysis (`vramdoctor.judge`).

`analyse_run` analyses a `record.Run` with `analyse_soak` (schema vramdoctor.soak/2), taking
the thresholds and the production rate the run recorded unless given; the runner's adaptive
rounds ask `undecided_layers` which memory layers are not decided yet. No I/O here: the run
was read by the caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramdoctor.record import Run

if TYPE_CHECKING:  # scipy is imported with the analysis: only when a run is analysed
    from vramdoctor.judge import SoakAnalysis


def analyse_run(
    run: Run, *, production_rate_rps: float | None = None, min_growth_mib: float | None = None
) -> SoakAnalysis:
    """The per-layer soak analysis of a recorded run."""
    from vramdoctor.judge import Thresholds
    from vramdoctor.soak.analysis import analyse_soak

    cfg = run.header.get("config") if isinstance(run.header.get("config"), dict) else {}
    assert isinstance(cfg, dict)
    if production_rate_rps is None:
        rate = cfg.get("production_rate_rps")
        production_rate_rps = float(rate) if isinstance(rate, (int, float)) and rate > 0 else None
    growth = min_growth_mib if min_growth_mib is not None else cfg.get("min_growth_mib")
    th = (
        Thresholds(min_growth_mib=float(growth))
        if isinstance(growth, (int, float))
        else Thresholds()
    )
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


def is_leak(analysis: Any) -> bool:
    """Whether any layer (or the run's verdict) is LEAK."""
    layers = getattr(analysis, "layers", None)
    if isinstance(layers, dict) and any(
        getattr(v, "verdict", None) == "LEAK" for v in layers.values()
    ):
        return True
    return getattr(analysis, "verdict", None) == "LEAK"
