"""The bridge from a recorded run to the pure analysis (`vramdoctor.analysis.soak`).

`analyse_run` analyses a `record.Run` with the per-layer entry point `analyse_soak` where it
exists (schema vramdoctor.soak/2), and with the earlier series analysis otherwise; the
runner's adaptive rounds ask `undecided_layers` which memory layers are not decided yet.
No I/O here: the run was read by the caller.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..record import Run

# Series kinds of the earlier analysis -> memory layer.
_LAYER_OF_KIND = {"gpu": "vram", "gpu_process": "vram", "rss": "host", "kv": "kv"}


def _entry() -> tuple[Any, bool]:
    from ..analysis import soak as mod

    fn = getattr(mod, "analyse_soak", None)
    return (fn, True) if fn is not None else (mod.analyse, False)


def analyse_run(run: Run, *, production_rate_rps: float | None = None,
                min_growth_mib: float | None = None, legacy: bool = False) -> Any:
    """The soak analysis of a recorded run (SoakAnalysis, or the earlier SoakResult)."""
    fn, per_layer = _entry()
    if legacy and per_layer:
        from ..analysis import soak as mod

        fn, per_layer = mod.analyse, False
    cfg = run.header.get("config", {}) if isinstance(run.header.get("config"), dict) else {}
    if production_rate_rps is None:
        rate = cfg.get("production_rate_rps")
        production_rate_rps = float(rate) if isinstance(rate, (int, float)) else None
    growth = min_growth_mib if min_growth_mib is not None else cfg.get("min_growth_mib")
    if per_layer:
        offered: dict[str, Any] = {
            "production_rate_rps": production_rate_rps, "status": run.status,
            "raw_host": run.raw("host_memory"), "min_growth_mib": growth,
        }
        accepted = inspect.signature(fn).parameters
        takes_all = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
        kwargs = {k: v for k, v in offered.items()
                  if v is not None and (takes_all or k in accepted)}
        if "th" in accepted and isinstance(growth, (int, float)) and "min_growth_mib" not in kwargs:
            from ..analysis.soak import Thresholds

            kwargs["th"] = Thresholds(min_growth_mib=float(growth))
        return _with_run_problems(fn(run.records, run.header, **kwargs), run)
    from ..analysis.soak import Thresholds

    th = Thresholds(min_growth_mib=float(growth if isinstance(growth, (int, float)) else 2.0))
    return _with_run_problems(
        fn(run.records, header=run.header, raw_host=run.raw("host_memory"), status=run.status, th=th), run)


def _with_run_problems(analysis: Any, run: Run) -> Any:
    """The run file's own damage (bad lines, disorder, a file the disk could not hold, a torn
    last line) as notes of the analysis, so every report says what was not analysed."""
    notes = getattr(analysis, "notes", None)
    if isinstance(notes, list):
        extra = list(run.problems)
        if run.torn_tail:
            extra.append("the run file's last line was torn (the writer was killed); it was skipped")
        notes.extend(n for n in extra if n not in notes)
    return analysis


def undecided_layers(analysis: Any) -> list[tuple[str, str]]:
    """(layer, reason) for every memory layer the analysis could not decide yet."""
    items = getattr(analysis, "undecided", None)
    if items is not None:
        out: list[tuple[str, str]] = []
        for item in items:
            if isinstance(item, (tuple, list)) and len(item) >= 2:
                out.append((str(item[0]), str(item[1])))
            else:
                out.append((str(getattr(item, "layer", item)), str(getattr(item, "reason", ""))))
        return out
    seen: dict[str, str] = {}
    for s in getattr(analysis, "series", []):
        if getattr(s, "verdict", None) == "INCONCLUSIVE":
            layer = _LAYER_OF_KIND.get(getattr(s, "kind", ""), str(getattr(s, "kind", "?")))
            seen.setdefault(layer, f"{s.key}: {s.reason}")
    return sorted(seen.items())


def is_leak(analysis: Any) -> bool:
    """Whether any layer (or the run's verdict) is LEAK."""
    layers = getattr(analysis, "layers", None)
    if isinstance(layers, dict):
        return any(getattr(v, "verdict", None) == "LEAK" for v in layers.values())
    return getattr(analysis, "verdict", None) == "LEAK"
