"""`soak --vary FEATURE[,FEATURE...]`: which request feature leaks.

Rounds differ in ONE request feature at a time (`vramdoctor.soak.traffic.features`: each
feature's variant shape and the shape it is compared with). The plan (`VaryPlan`) is one
warm-up round that sends every shape (request i has shape i mod S: each shape's first
sighting, with what caches fill then, comes before any judged round), then blocks: every shape once per block, in an order drawn
from the seed for that block (`random.Random(f"{seed}:vary:{block}")`), so warm-up and drift
are spread over the shapes instead of passing for a feature's effect. The plan is recorded in
the run header (`config.vary_plan`) and each round's shape in a `vary_round` event; `report`
re-analyses from them.

The analysis (`analyse_vary`): for each layer (VRAM, KV, host RSS, and its anonymous and
pinned parts) each round's change of the settled level per request that reached the server;
a least-squares block fit (`vramdoctor.soak.contrast`); for each feature the contrast of its
variant against its reference shape, with its 90 % interval; and the control shape's own rate.
A feature is named when its contrast leaks (interval above zero, above the floor, not fading);
with no feature named and the control's own rate leaking, every request leaks alike. Two blocks
are planned; while a layer is undecided another block runs, up to `--max-rounds`.

`VaryResult.to_dict()` is the `vary` object of `soak --json` (schema below); `render` prints
the block of the text report. JSON: {"features": [...], "shapes": {name: {...}}, "seed",
"blocks", "rounds_judged", "layers": {layer: {"unit", "per": "request", "control": Estimate,
"features": {feature: Estimate + {"says"}}, "overall": Estimate (the growth model over every
judged round: steady = every request leaks alike), "verdict": "LEAK"|"CACHING"|"STABLE"|
"INCONCLUSIVE",
"culprits": [...], "headline"}}, "verdict", "headline"}. Estimates are in the layer's unit per
request (MiB or tokens).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, overload

from vramdoctor.errors import InputError
from vramdoctor.soak.contrast import (
    BlockFit,
    Estimate,
    LayerRounds,
    Observation,
    decide,
    fit_blocks,
    growth_estimate,
    layer_rounds,
)
from vramdoctor.soak.session import SoakHook
from vramdoctor.soak.traffic.features import (
    FEATURES,
    ShapePlan,
    check_supported,
    lora_model_name,
    parse_features,
    shapes_for,
)
from vramdoctor.soak.traffic.workload import PlannedRequest

if TYPE_CHECKING:
    from vramdoctor.record import Run
    from vramdoctor.soak.config import SoakConfig
    from vramdoctor.soak.session import SoakSession

VARY_ROUND = "vary_round"
MIN_BLOCKS = 2
DEFAULT_MAX_BLOCKS = 4
KV_FLOOR_TOKENS = 0.5  # per request: less than a token a request is no page leak
LAYER_NAMES = {
    "vram": "VRAM",
    "kv": "KV pool",
    "host": "host RAM",
    "host_anon": "host RAM (anonymous)",
    "host_pinned": "host RAM (pinned/shared)",
}


@dataclass(frozen=True)
class VaryPlan:
    """Which shape each round sends (see the module doc). Round 1 is the warm-up (control);
    round r >= 2 is position (r - 2) % S of block (r - 2) // S + 1."""

    features: tuple[str, ...]
    shapes: tuple[str, ...]
    seed: int
    lora_name: str | None = None

    @classmethod
    def create(cls, text: str, seed: int) -> VaryPlan:
        req = parse_features(text)
        return cls(
            req.features, tuple(s.name for s in shapes_for(req.features)), seed, req.lora_name
        )

    def order(self, block: int) -> list[str]:
        names = list(self.shapes)
        random.Random(f"{self.seed}:vary:{block}").shuffle(names)
        return names

    def shape_of(self, rnd: int) -> tuple[str, int]:
        """(shape, block) of round `rnd` (block 0: the warm-up round)."""
        if rnd <= 1:
            return "control", 0
        k = rnd - 2
        block = k // len(self.shapes) + 1
        return self.order(block)[k % len(self.shapes)], block

    def rounds_for(self, blocks: int) -> int:
        return 1 + blocks * len(self.shapes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "shapes": {
                s: FEATURES[s].shape.to_dict() if s in FEATURES else {"control": True}
                for s in self.shapes
            },
            "seed": self.seed,
            "lora_name": self.lora_name,
            "warmup_rounds": 1,
            "block_orders": {str(b): self.order(b) for b in range(1, DEFAULT_MAX_BLOCKS + 1)},
        }


def adjust_config(cfg: SoakConfig) -> SoakConfig:
    """`cfg` with the rounds --vary needs: a warm-up round and two blocks (exactly that with
    --no-adapt), more blocks while undecided up to --max-rounds (default four blocks)."""
    if not cfg.vary:
        return cfg
    plan = VaryPlan.create(cfg.vary, cfg.seed)
    rounds = plan.rounds_for(MIN_BLOCKS)
    if cfg.max_rounds is not None:
        blocks = max(MIN_BLOCKS, (cfg.max_rounds - 1) // len(plan.shapes))
    else:
        blocks = DEFAULT_MAX_BLOCKS
    cap = plan.rounds_for(blocks)
    if cfg.rounds == rounds and cfg.max_rounds == (cap if cfg.adapt else None):
        return cfg
    return replace(cfg, rounds=rounds, max_rounds=cap if cfg.adapt else None)


# --- the hook -----------------------------------------------------------------------------


class VaryHook(SoakHook):
    """Sets each round's shape (before_round), records it, and decides whether another block
    is needed (more_rounds). Built by `vramdoctor.soak.variations.variation_hooks`."""

    name = "vary"

    def __init__(self, plan: VaryPlan) -> None:
        self.plan = plan
        self.plans: dict[str, ShapePlan] = {}
        self.lora_name = plan.lora_name

    def header(self, session: SoakSession) -> Mapping[str, Any]:
        from vramdoctor import servers

        cfg = session.config
        assert session.info is not None
        kind = servers.get(session.info.kind)
        if "lora" in self.plan.features and not self.lora_name:
            self.lora_name = find_adapter(session)
        check_supported(
            self.plan.features,
            kind.request_features,
            server=kind.display_name,
            text_only=cfg.text_only,
            api=cfg.api,
            lora_name=self.lora_name,
        )
        model = session.send_model
        lora_model = (
            lora_model_name(kind.request_features, model, self.lora_name)
            if self.lora_name
            else None
        )
        for name in self.plan.shapes:
            shape = FEATURES[name].shape if name in FEATURES else shapes_for(())[0]
            self.plans[name] = ShapePlan(
                shape,
                cfg.requests,
                model=model,
                max_tokens=cfg.max_tokens,
                request_features=kind.request_features,
                lora_model=lora_model,
                seed=cfg.seed,
            )
        plan = replace(self.plan, lora_name=self.lora_name)
        session.say(
            f"--vary: {len(plan.shapes)} shapes ({', '.join(plan.shapes)}), a warm-up round, then "
            f"blocks of {len(plan.shapes)} rounds in seeded order (seed {plan.seed})"
        )
        return {"vary_plan": plan.to_dict()}

    def before_round(self, session: SoakSession, round_index: int) -> None:
        shape, block = self.plan.shape_of(round_index)
        if block == 0:  # the warm-up: every shape's first sighting, before any judged round
            session.plan = MixedPlan([self.plans[n] for n in self.plan.shapes])
            session.event(VARY_ROUND, {"round": round_index, "shape": "warm-up", "block": 0})
            return
        session.plan = self.plans[shape]
        session.event(VARY_ROUND, {"round": round_index, "shape": shape, "block": block})

    def more_rounds(
        self, session: SoakSession, undecided: list[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """Another round while the current block is incomplete, or (at a block's end) while a
        layer is undecided; the identical-rounds rule does not apply to varied rounds."""
        assert session.protocol is not None and session.writer is not None
        done = session.protocol.state.round
        s = len(self.plan.shapes)
        if done >= 1 and (done - 1) % s != 0:
            left = s - (done - 1) % s
            return [("vary", f"the block is {left} round(s) short")]
        result = analyse_vary(session.writer.read_back())
        if result is None:
            return []
        return [(layer, why) for layer, why in result.undecided()]


class MixedPlan(Sequence[PlannedRequest]):
    """The warm-up round: request i is request i of shape i mod S (every shape seen)."""

    def __init__(self, plans: list[ShapePlan]) -> None:
        self.plans = plans
        self.n = len(plans[0]) if plans else 0

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> PlannedRequest: ...
    @overload
    def __getitem__(self, i: slice) -> list[PlannedRequest]: ...

    def __getitem__(self, i: int | slice) -> PlannedRequest | list[PlannedRequest]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.plans[i % len(self.plans)][i]


def find_adapter(session: SoakSession) -> str | None:
    """The first LoRA adapter the server lists in /v1/models (vLLM lists each with `parent`
    set to the base model), or None."""
    import requests

    try:
        r = requests.get(session.base + "/v1/models", headers=session.headers, timeout=10)
        data = r.json().get("data") or []
    except (requests.RequestException, ValueError, AttributeError):
        return None
    base = session.send_model
    for card in data:
        if (
            isinstance(card, dict)
            and card.get("id")
            and card.get("id") != base
            and card.get("parent")
        ):
            return str(card["id"])
    return None


# --- the analysis -------------------------------------------------------------------------


@dataclass
class VaryLayer:
    layer: str
    unit: str
    control: Estimate
    features: dict[str, Estimate]
    verdict: str
    culprits: list[str]
    headline: str
    floor: float
    overall: Estimate | None = None
    overall_fit: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "per": "request",
            "floor": self.floor,
            "control": self.control.to_dict(),
            "overall": self.overall.to_dict() if self.overall is not None else None,
            "overall_fit": self.overall_fit,
            "features": {
                f: {**e.to_dict(), "says": FEATURES[f].says} for f, e in self.features.items()
            },
            "verdict": self.verdict,
            "culprits": self.culprits,
            "headline": self.headline,
        }


@dataclass
class VaryResult:
    plan: VaryPlan
    blocks: int
    rounds_judged: int
    layers: dict[str, VaryLayer] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        verdicts = [v.verdict for v in self.layers.values()]
        if "LEAK" in verdicts:
            return "LEAK"
        if "INCONCLUSIVE" in verdicts or not verdicts:
            return "INCONCLUSIVE"
        return "CACHING" if "CACHING" in verdicts else "STABLE"

    @property
    def headline(self) -> str:
        leaks = [
            f"{LAYER_NAMES[k]}: {v.headline}" for k, v in self.layers.items() if v.verdict == "LEAK"
        ]
        if leaks:
            return "; ".join(leaks)
        if self.verdict == "INCONCLUSIVE":
            return "no feature decided yet: " + "; ".join(
                f"{LAYER_NAMES[k]}: {v.headline}"
                for k, v in self.layers.items()
                if v.verdict == "INCONCLUSIVE"
            )
        if self.verdict == "CACHING":
            return "no varied feature leaks; the growth there is caching (it converges), not a leak"
        return "no varied feature leaks, and requests as a whole do not"

    def undecided(self) -> list[tuple[str, str]]:
        return [(k, v.headline) for k, v in self.layers.items() if v.verdict == "INCONCLUSIVE"]

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "LEAK" else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "features": list(self.plan.features),
            "shapes": self.plan.to_dict()["shapes"],
            "seed": self.plan.seed,
            "lora_name": self.plan.lora_name,
            "blocks": self.blocks,
            "rounds_judged": self.rounds_judged,
            "layers": {k: v.to_dict() for k, v in self.layers.items()},
            "verdict": self.verdict,
            "headline": self.headline,
            "notes": self.notes,
        }


def _plan_from_header(header: Mapping[str, Any]) -> VaryPlan | None:
    cfg = header.get("config") or {}
    data = cfg.get("vary_plan")
    if not isinstance(data, dict):
        return None
    try:
        feats = tuple(str(f) for f in data.get("features") or ())
        if not feats or any(f not in FEATURES for f in feats):
            return None
        return VaryPlan(
            feats,
            tuple(s.name for s in shapes_for(feats)),
            int(data.get("seed", 0)),
            data.get("lora_name"),
        )
    except (TypeError, ValueError):
        return None


def analyse_vary(run: Run, *, min_growth_mib: float | None = None) -> VaryResult | None:
    """The --vary analysis of a run (None when the run did not vary). Shapes come from the
    run's `vary_round` events (the plan in the header where an event is missing)."""
    plan = _plan_from_header(run.header)
    if plan is None:
        return None
    cfg = run.header.get("config") or {}
    floor_mib = float(
        min_growth_mib if min_growth_mib is not None else cfg.get("min_growth_mib", 2.0)
    )
    marks = _vary_marks(run.records)
    levels, rounds = layer_rounds(run.records)
    reached = {ri.round: ri.reached for ri in rounds}
    complete = {ri.round: ri.complete for ri in rounds}
    per_round = int(cfg.get("requests") or 1)
    s = len(plan.shapes)
    judged = [
        r
        for r in sorted(reached)
        if r >= 2 and reached.get(r) and complete.get(r, True) and r in {ri.round for ri in rounds}
    ]
    blocks = sorted({marks.get(r, plan.shape_of(r))[1] for r in judged})
    full_blocks = [
        b for b in blocks if sum(1 for r in judged if marks.get(r, plan.shape_of(r))[1] == b) == s
    ]
    use_blocks = full_blocks[1:] if len(full_blocks) >= 3 else full_blocks
    result = VaryResult(plan, len(full_blocks), 0)
    if len(full_blocks) >= 3:
        result.notes.append(
            f"{len(full_blocks)} blocks: the first is left out as every shape's warm-up"
        )
    for layer, lr in levels.items():
        obs = _vary_observations(lr, judged, marks, plan, use_blocks, reached)
        result.rounds_judged = max(result.rounds_judged, len(obs))
        fit = fit_blocks(obs)
        if fit is None or set(fit.shapes) != set(plan.shapes):
            continue
        result.layers[layer] = _vary_layer(
            layer, lr, fit, plan, judged, marks, reached, floor_mib, per_round
        )
    return result


def _vary_marks(records: Sequence[Any]) -> dict[int, tuple[str, int]]:
    """Each round's (shape, block) as its `vary_round` event recorded it (round -> mark)."""
    from vramdoctor.samples import Event

    marks: dict[int, tuple[str, int]] = {}
    for r in records:
        if isinstance(r, Event) and r.name == VARY_ROUND:
            try:
                marks[int(r.data["round"])] = (str(r.data["shape"]), int(r.data["block"]))
            except (KeyError, TypeError, ValueError):
                continue
    return marks


def _vary_observations(
    lr: LayerRounds,
    judged: list[int],
    marks: Mapping[int, tuple[str, int]],
    plan: VaryPlan,
    use_blocks: list[int],
    reached: Mapping[int, int],
) -> list[Observation]:
    """What each judged round of the blocks in `use_blocks` left behind on the layer, per
    request that reached the server (one Observation a round with a measured change)."""
    obs: list[Observation] = []
    for r in judged:
        shape, block = marks.get(r, plan.shape_of(r))
        if block not in use_blocks:
            continue
        d = lr.delta(r)
        if d is None:
            continue
        obs.append(Observation(r, block, shape, d / max(1, reached[r])))
    return obs


def _vary_layer(
    layer: str,
    lr: LayerRounds,
    fit: BlockFit,
    plan: VaryPlan,
    judged: list[int],
    marks: Mapping[int, tuple[str, int]],
    reached: Mapping[int, int],
    floor_mib: float,
    per_round: int,
) -> VaryLayer:
    """The layer's result: the control's rate, each feature's excess over its reference,
    what requests without the culprits leave, and the growth model over every round."""
    floor = KV_FLOOR_TOKENS if lr.unit == "tokens" else floor_mib / max(1, per_round)
    control = fit.contrast({"control": 1.0}, absolute=True)
    block_sd = math.sqrt(2.0) * fit.sigma if fit.sigma is not None else None
    feats = _feature_estimates(fit, plan, floor, block_sd, per_round)
    # What requests WITHOUT the named culprits leave: the control, unless the control has a
    # culprit itself (images: then the variant without it)
    off = [f for f, e in feats.items() if e.decision == "leak" and FEATURES[f].sign < 0]
    besides = decide(fit.contrast({off[0] if off else "control": 1.0}, absolute=True), floor)
    overall, gfit = _overall_growth(lr, judged, marks, plan, reached, floor, per_round)
    layer_result = _layer_verdict(layer, lr.unit, control, feats, floor, besides, overall)
    layer_result.overall_fit = gfit.to_dict() if hasattr(gfit, "to_dict") else None
    return layer_result


def _feature_estimates(
    fit: BlockFit, plan: VaryPlan, floor: float, block_sd: float | None, per_round: int
) -> dict[str, Estimate]:
    """Each planned feature's excess per request over its reference shape, decided (feature
    name -> Estimate)."""
    feats: dict[str, Estimate] = {}
    for f in plan.features:
        feat = FEATURES[f]
        weights = (
            {f: 1.0, feat.reference: -1.0} if feat.sign > 0 else {feat.reference: 1.0, f: -1.0}
        )
        est = fit.contrast(weights)
        trend = _excess_trend(est, floor, block_sd, per_round)
        feats[f] = decide(est, floor, sigma=block_sd, trend=trend)
    return feats


def _excess_trend(est: Estimate, floor: float, block_sd: float | None, per_round: int) -> Any:
    """The excess's own trend, block by block (the growth model's fit over its running sum,
    MiB/tokens per round); None with fewer than three blocks."""
    trend = None
    if len(est.per_block) >= 3:  # the excess's own trend, block by block (MiB/tokens)
        cum = [0.0]
        for d in est.per_block:
            cum.append(cum[-1] + d * per_round)
        trend = growth_estimate(
            [k * per_round for k in range(len(cum))],
            cum,
            floor=floor * per_round,
            step=per_round,
            noise=(block_sd or 0.0) * per_round,
        )[1]
    return trend


def _overall_growth(
    lr: LayerRounds,
    judged: list[int],
    marks: Mapping[int, tuple[str, int]],
    plan: VaryPlan,
    reached: Mapping[int, int],
    floor: float,
    per_round: int,
) -> tuple[Estimate, Any]:
    """Every request alike: the growth model's Estimate over every judged round's level after
    the warm-up (by requests reached), and the fit itself."""
    # Every request alike: the growth model over every judged round's level (a cache that
    # converges over these rounds is caching, however steady two blocks look)
    xs, ys = [0.0], [0.0]
    for r in judged:
        d = lr.delta(r)
        if d is None or marks.get(r, plan.shape_of(r))[1] == 0:
            continue
        xs.append(xs[-1] + reached[r])
        ys.append(ys[-1] + d)
    return growth_estimate(xs, ys, floor=floor * per_round, step=per_round)


def _fmt(value: float, unit: str) -> str:
    """A figure with its unit: MiB below 1 MiB in KiB; never "-0"."""
    if unit == "MiB":
        if abs(value) < 1:
            kib = round(value * 1024)
            return f"{kib if kib else 0} KiB"
        return f"{value:.2f} MiB"
    v = round(value, 1)
    return f"{v if v else 0.0:.1f} {unit}"


def _interval(e: Estimate, unit: str) -> str:
    if e.lo is None or e.hi is None:
        return "no interval yet"
    return f"90 % interval {_fmt(e.lo, unit)} to {_fmt(e.hi, unit)}"


def _layer_verdict(
    layer: str,
    unit: str,
    control: Estimate,
    feats: dict[str, Estimate],
    floor: float,
    besides: Estimate,
    overall: Estimate,
) -> VaryLayer:
    """The layer's verdict: the features named (and what every request leaks besides), or
    every request alike (the growth model over all rounds says steady), or nothing."""

    def out(verdict: str, culprits: list[str], headline: str) -> VaryLayer:
        return VaryLayer(layer, unit, control, feats, verdict, culprits, headline, floor, overall)

    culprits = [f for f, e in feats.items() if e.decision == "leak"]
    undecided = [f for f, e in feats.items() if e.decision == "undecided"]
    if culprits:
        parts = [
            f"{FEATURES[f].says}: +{_fmt(feats[f].value, unit)} per request ({_interval(feats[f], unit)})"
            for f in culprits
        ]
        if besides.decision == "leak":
            parts.append(
                f"and every request leaks {_fmt(besides.value, unit)} besides ({_interval(besides, unit)})"
            )
        return out("LEAK", culprits, "; ".join(parts))
    if undecided:
        return out("INCONCLUSIVE", [], "; ".join(f"{f}: {feats[f].why}" for f in undecided))
    if overall.decision == "leak":
        return out(
            "LEAK",
            [],
            f"every request leaks alike, {_fmt(overall.value, unit)} per request "
            f"({_interval(overall, unit)}): no varied feature causes it",
        )
    if overall.decision == "undecided":
        return out(
            "INCONCLUSIVE",
            [],
            f"no varied feature leaks; whether every request does is undecided ({overall.why})",
        )
    if overall.why in ("converging", "rose_then_flat", "fell_back", "bounded"):
        return out(
            "CACHING",
            [],
            f"no varied feature leaks; the rounds' growth is caching ({overall.why}), not a leak",
        )
    return out("STABLE", [], "no varied feature leaks, and requests as a whole do not")


# --- the report block ---------------------------------------------------------------------


def render(result: VaryResult, out: Any) -> None:
    """The --vary block of the text report (`out`: a rich Console)."""
    out.print()
    out.print(f"[bold]--vary[/bold] {', '.join(result.plan.features)}: {result.verdict}")
    out.print(f"  {result.headline}")
    out.print(
        f"  {result.blocks} block(s) of {len(result.plan.shapes)} shapes after a warm-up round, "
        f"seed {result.plan.seed}; rates per request that reached the server"
    )
    for layer, v in result.layers.items():
        out.print(
            f"  {LAYER_NAMES[layer]} ({v.verdict}): control {_fmt(v.control.value, v.unit)}/request ({_interval(v.control, v.unit)})"
        )
        for f, e in v.features.items():
            mark = "LEAKS" if e.decision == "leak" else ("?" if e.decision == "undecided" else "no")
            out.print(
                f"    {f:<12} {mark:<5} {'+' if e.value >= 0 else ''}{_fmt(e.value, v.unit)}/request "
                f"({_interval(e, v.unit)}); {e.why}"
            )
    for note in result.notes:
        out.print(f"  note: {note}")
    out.print(
        "  (this block decides: the per-layer verdicts below treat all rounds as one traffic, "
        "and --vary's rounds differ by design)"
    )


def check_vary_option(text: str | None) -> None:
    """--vary's value, checked before anything runs (InputError: exit 2)."""
    if text is None:
        return
    if not text.strip():
        raise InputError("--vary: give at least one feature, e.g. --vary images,stream")
    parse_features(text)


__all__ = [
    "VARY_ROUND",
    "VaryHook",
    "VaryPlan",
    "VaryResult",
    "adjust_config",
    "analyse_vary",
    "check_vary_option",
    "render",
]
