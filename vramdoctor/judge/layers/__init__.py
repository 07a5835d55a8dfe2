"""The memory layers, one module each behind one signature, found by a registry.

Built in, in the order reports answer them: `vram` (NVML per GPU and process), `kv` (the
server's KV pool in tokens), `host` (RSS of the server's processes by kind). Each module
defines `LAYER`, an object with the `Layer` shape; `register` adds one from outside (a plugin,
a test), and the analysis (`vramdoctor.soak.analysis.analyse_soak`) judges every registered
layer, in registration order:

    from vramdoctor.judge import layers
    from vramdoctor.judge.layers import Layer, LayerContext
    from vramdoctor.judge.results import LayerResult, STABLE
    from vramdoctor.judge.series import Series

    class ToyLayer:
        name, unit = "toy", "MiB"

        def extract(self, records):              # -> {key: Series} of this layer (layer="toy")
            s = Series("toy/pool", "toy", "toy", "MiB")
            s.points = [(r.t, r.values["toy_mib"]) for r in records if ...]
            return {s.key: s}

        def judge(self, ctx: LayerContext) -> LayerResult:
            mine = [s for s in ctx.series if s.layer == self.name]   # judged like every series
            return layers.worst_layer(self.name, self.unit, mine, ctx.life)

    layers.register(ToyLayer())       # layers.unregister("toy") takes it out again

A layer's report block (its sentences) is registered beside it in
`vramdoctor.soak.report.layers` (`register(LayerBlock)`); a layer without one gets the
generic sentences under its own name.

`Layer.extract(records)` returns the series this layer adds (the built-in layers return none:
their series come from `vramdoctor.judge.series.extract_series`, one pass over the records);
every returned series is judged over each server life like the built-in ones (settled levels,
the growth model) before `Layer.judge(ctx)` turns the life's judged series into the layer's
`LayerResult`. Errors: `register` raises ValueError for a second layer of the same name
(unless `replace=True`), `get` KeyError for an unknown name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from vramdoctor.judge import results as _results
from vramdoctor.verdicts import worst as _worst

if TYPE_CHECKING:
    from vramdoctor.judge.inside import InsideEvidence
    from vramdoctor.judge.series import Series

__all__ = [
    "Layer",
    "LayerContext",
    "RunFacts",
    "all",
    "all_layers",
    "get",
    "names",
    "register",
    "unregister",
    "worst_layer",
]


@dataclass(frozen=True)
class RunFacts:
    """What the run says beyond its series: host RAM available at the last sample (MiB), the
    host's cores, MALLOC_ARENA_MAX in the server's environment, the KV pool's size (MiB)."""

    available_mib: float | None = None
    cpu_count: int | None = None
    arena_max: int | None = None
    pool_mib: float | None = None


@dataclass
class LayerContext:
    """What a layer judges one server life from.

    `series`: every judged series of the life (all layers: a layer picks its own by
    `SeriesResult.layer`, and may read the others'); `raw`: the extracted series by key (KV
    pool facts, per-sample process parts); `records`: the run's records in time order;
    `inside`: the agent's evidence inside the server's processes for this life (None when no
    agent ran); `facts`: `RunFacts`; `th`: the thresholds.
    """

    life: int
    series: list[_results.SeriesResult]
    raw: Mapping[str, Series]
    records: Sequence[Any]
    th: _results.Thresholds
    facts: RunFacts = field(default_factory=RunFacts)
    header: Mapping[str, Any] | None = None
    inside: InsideEvidence | None = None


@runtime_checkable
class Layer(Protocol):
    """One memory layer: its name (the key of `SoakAnalysis.layers` and of the report's
    block), its unit, the series it adds, and its verdict over one life's judged series."""

    name: str
    unit: str

    def extract(self, records: Sequence[Any]) -> dict[str, Series]: ...

    def judge(self, ctx: LayerContext) -> _results.LayerResult: ...


_REGISTRY: dict[str, Layer] = {}


def register(layer: Layer, *, replace: bool = False) -> None:
    """Add `layer` (after the ones registered before it). ValueError for a name already
    registered unless `replace`, and for an object without the `Layer` shape."""
    if not isinstance(layer, Layer) or not isinstance(getattr(layer, "name", None), str):
        raise ValueError(f"not a memory layer (needs name, unit, extract, judge): {layer!r}")
    if layer.name in _REGISTRY and not replace:
        raise ValueError(f"a memory layer named {layer.name!r} is already registered")
    _REGISTRY[layer.name] = layer


def unregister(name: str) -> None:
    """Take a layer out again (tests, plugins); a name never registered is ignored."""
    _REGISTRY.pop(name, None)


def get(name: str) -> Layer:
    """The layer of that name; KeyError for one nobody registered."""
    return _REGISTRY[name]


def all_layers() -> tuple[Layer, ...]:
    """Every registered layer, in registration order (the built-in ones first)."""
    return tuple(_REGISTRY.values())


def names() -> tuple[str, ...]:
    """The registered layers' names, in order."""
    return tuple(_REGISTRY)


def worst_layer(
    name: str, unit: str, series: list[_results.SeriesResult], life: int
) -> _results.LayerResult:
    """A plain layer verdict: the most serious verdict of its deciding series, carried by the
    fastest-growing one (NOT_MEASURED without series). For layers with no physics of their
    own to add (a plugin's gauge); the built-in layers do more."""
    if not series:
        return _results.LayerResult(
            name, _results.NOT_MEASURED, _results.R_NO_LEVEL, unit, life=life
        )
    deciding = [s for s in series if s.decides]
    verdict = _worst(s.verdict for s in deciding)
    if verdict is None:
        return _results.LayerResult(
            name, _results.INCONCLUSIVE, _results.R_TRANSIENT, unit, series=series, life=life
        )
    top = max(
        (s for s in deciding if s.verdict == verdict),
        key=lambda s: (
            (s.slope_per_request or 0.0) if verdict == _results.LEAK else abs(s.growth or 0.0)
        ),
    )
    lay = _results.LayerResult(
        name,
        verdict,
        top.reason,
        unit,
        growth=top.growth,
        series=series,
        life=life,
        main_series=top.key,
        decided_by=top.decided_by,
    )
    if verdict == _results.LEAK:
        lay.rate_per_request = top.slope_per_request
        lay.rate_ci = top.slope_ci
        if unit == "MiB":
            lay.rate_mib_per_request = top.slope_per_request
    return lay


def _builtin() -> None:
    from vramdoctor.judge.layers import host, kv, vram

    for module in (vram, kv, host):  # the order the report answers them
        register(module.LAYER, replace=True)


_builtin()

# `all` is the contract's name for `all_layers` (COMMON_CONTRACTS §5): layers.all().
all = all_layers
