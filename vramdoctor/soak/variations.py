"""soak --vary and --cycle as one plug-in of the soak session and its report.

`variation_hooks(session)`: the hooks (`VaryHook`, `CycleHook`) for the session's config, and
the config with the rounds they need (`adjust`); `analyse_variations(run)` -> (vary result or
None, cycle result or None); `variations_json(run)` the `vary` / `cycle` keys of `soak --json`;
`render_variations(run, out)` their text blocks; `variations_exit_code(run)` 0, 1 (a feature
or an operation leaks) or 2 (a lifecycle call failed: the server needs a switch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramdoctor.errors import InputError

if TYPE_CHECKING:
    from vramdoctor.record import Run
    from vramdoctor.soak.config import SoakConfig
    from vramdoctor.soak.cycle import CycleResult
    from vramdoctor.soak.session import SoakHook, SoakSession
    from vramdoctor.soak.vary import VaryResult


def check_options(vary: str | None, cycle: str | None) -> None:
    """--vary / --cycle values checked before anything runs (InputError: exit 2)."""
    if vary is not None and cycle is not None:
        raise InputError(
            "--vary and --cycle: one at a time (their rounds differ in different ways)"
        )
    if vary is not None:
        from vramdoctor.soak.traffic.features import parse_features

        parse_features(vary)
    if cycle is not None:
        from vramdoctor.soak.cycle import parse_cycle

        parse_cycle(cycle)


def adjust(cfg: SoakConfig) -> SoakConfig:
    """The config with the rounds --vary / --cycle plan (unchanged without them)."""
    if cfg.vary:
        from vramdoctor.soak.vary import adjust_config

        return adjust_config(cfg)
    if cfg.cycle:
        from vramdoctor.soak.cycle import adjust_config as adjust_cycle

        return adjust_cycle(cfg)
    return cfg


def variation_hooks(session: SoakSession) -> list[SoakHook]:
    """The session's --vary / --cycle hooks; sets `session.config` to the adjusted config."""
    cfg = session.config
    if not cfg.vary and not cfg.cycle:
        return []
    session.config = adjust(cfg)
    if cfg.vary:
        from vramdoctor.soak.vary import VaryHook, VaryPlan

        return [VaryHook(VaryPlan.create(cfg.vary, cfg.seed))]
    from vramdoctor.soak.cycle import CycleHook, CyclePlan, parse_cycle

    assert cfg.cycle is not None
    return [CycleHook(CyclePlan(parse_cycle(cfg.cycle), cfg.seed))]


def analyse_variations(run: Run) -> tuple[VaryResult | None, CycleResult | None]:
    from vramdoctor.soak.cycle import analyse_cycle
    from vramdoctor.soak.vary import analyse_vary

    return analyse_vary(run), analyse_cycle(run)


def variations_json(run: Run) -> dict[str, Any]:
    """{"vary": ...} / {"cycle": ...} for a run that has them; {} otherwise (other runs'
    JSON stays as it was)."""
    vary, cycle = analyse_variations(run)
    out: dict[str, Any] = {}
    if vary is not None:
        out["vary"] = vary.to_dict()
    if cycle is not None:
        out["cycle"] = cycle.to_dict()
    return out


def render_variations(run: Run, out: Any) -> None:
    from vramdoctor.soak import cycle as _cycle
    from vramdoctor.soak import vary as _vary

    vary, cycle = analyse_variations(run)
    if vary is not None:
        _vary.render(vary, out)
    if cycle is not None:
        _cycle.render(cycle, out)


def variations_exit_code(run: Run) -> int:
    vary, cycle = analyse_variations(run)
    codes = [r.exit_code for r in (vary, cycle) if r is not None]
    return max(codes) if codes else 0
