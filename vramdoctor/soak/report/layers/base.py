"""A memory layer's block of sentences in the soak report, and the registry of blocks.

A `LayerBlock` words one layer's `LayerResult` (`vramdoctor.judge.results`): its name, why it
can be unmeasured, its leak sentence, what explains growth that is not a leak, its caveats.
The report (`vramdoctor.soak.report.sentences`) asks `block(layer)` and words what every layer
shares (INCONCLUSIVE, the common STABLE and CACHING sentences, leaks driven by time) itself.
A layer with no registered block (one added from outside) gets `LayerBlock`'s generic
sentences under its own name: the report never raises for a layer it does not know.

    from vramdoctor.soak.report import layers
    class ToyBlock(layers.LayerBlock):
        layer = "toy"; display = "toy pool"; not_measured = "no toy gauge"
    layers.register(ToyBlock())
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from vramdoctor.judge.results import LayerResult, SeriesResult, SoakAnalysis
from vramdoctor.soak.report.series import label
from vramdoctor.soak.report.text import known, rate, value
from vramdoctor.units import format_percent

__all__ = [
    "LayerBlock",
    "block",
    "blocks",
    "caveat_text",
    "display_name",
    "held_text",
    "inside",
    "main_series",
    "register",
    "who",
]


class LayerBlock:
    """The sentences of one memory layer. Override what the layer words its own way; every
    method returning `str | None` returns None for "nothing special: use the shared sentence".

    Attributes: `layer` (the `LayerResult.layer` it words), `display` (its name in the report:
    "VRAM"), `not_measured` (why no source measured it, in words), `runs_out` (what happens at
    the capacity, for the projection: "out of memory"), `caveats` (caveat code -> sentence).
    """

    layer: str = ""
    display: str = ""
    not_measured: str = "no source measured it"
    runs_out: str = "out of memory"
    caveats: Mapping[str, str] = MappingProxyType({})

    def leak(self, lay: LayerResult, a: SoakAnalysis, *, ci: str, proj: str) -> str:
        """The LEAK sentence of a leak per request. `ci` is the rate's interval (" (90 %
        interval ...)" or ""), `proj` the projection ("; out of memory after ..." or "")."""
        return (
            f"{self.display}: LEAK: {who(lay)} grows {rate(lay.rate_per_request, lay.unit)} per "
            f"request{ci} in every round of identical traffic{proj}."
        )

    def explained(self, lay: LayerResult, a: SoakAnalysis) -> str | None:
        """A STABLE or CACHING layer whose growth has a named explanation (malloc arenas,
        pinned memory, KV held at idle): its sentence, or None. The base block words growth
        the growth model found converging (each round adding a shrinking share, with the
        projected bound); a layer's block calls it when it has nothing more special."""
        s = main_series(lay)
        if lay.verdict != "CACHING" or s is None or s.reason != "converging":
            return None
        share = f", {format_percent(s.ratio, 0)} of the round before" if known(s.ratio) else ""
        bound = f" towards about {value(s.bound, s.unit)}" if known(s.bound) else ""
        # A creep under the floor rides on any converging fill unseen: say how large it could be.
        tail = (
            f"; a leak under {rate(s.creep_floor_per_request, s.unit)} per request cannot be "
            "ruled out at this load (more requests per round tell)"
            if known(s.creep_floor_per_request)
            else ", not a leak"
        )
        return (
            f"{self.display}: CACHING: {label(s)} rose {value(s.growth, s.unit, signed=True)}, "
            f"each round adding a shrinking share (increments "
            f"{', '.join(value(d, s.unit, signed=True) for d in s.increments)}{share}): "
            f"converging{bound}, a cache or an allocator filling up{tail}."
        )

    def stable(self, lay: LayerResult, a: SoakAnalysis) -> str | None:
        """The layer's own STABLE sentence, or None for the shared one."""
        return None

    def caching_why(self, lay: LayerResult) -> str | None:
        """Why the layer's CACHING growth is not a leak, when the layer knows better than
        "memory kept for reuse, not a leak"; else None."""
        return None

    def short_leak(self, lay: LayerResult) -> str | None:
        """The headline's few words for a leak per request, or None for the shared ones."""
        return None

    def short_caching(self, lay: LayerResult, growth: str) -> str | None:
        """The headline's few words for CACHING (`growth` is the signed rise), or None."""
        return None

    def notes(self, lay: LayerResult) -> list[str]:
        """Notes this layer adds to the report's notes (before its caveats)."""
        return []


class _Generic(LayerBlock):
    """The block of a layer nobody registered one for: generic sentences, its own name."""

    def __init__(self, layer: str) -> None:
        self.layer = layer
        self.display = layer


_BLOCKS: dict[str, LayerBlock] = {}


def register(b: LayerBlock) -> None:
    """Add (or replace) the block of `b.layer`. Raises ValueError when it has no layer name."""
    if not b.layer:
        raise ValueError("a LayerBlock needs its layer's name (LayerBlock.layer)")
    if not b.display:
        b.display = b.layer
    _BLOCKS[b.layer] = b


def block(layer: str) -> LayerBlock:
    """The block of `layer`; a generic one named after the layer when none is registered."""
    found = _BLOCKS.get(layer)
    return found if found is not None else _Generic(layer)


def blocks() -> tuple[LayerBlock, ...]:
    """Every registered block, in registration order."""
    return tuple(_BLOCKS.values())


def display_name(layer: str) -> str:
    """The layer's name in the report ("VRAM", "KV pool", "host RAM")."""
    return block(layer).display


def main_series(lay: LayerResult) -> SeriesResult | None:
    """The series that decided the layer (`LayerResult.main_series`), or None."""
    return next((s for s in lay.series if s.key == lay.main_series), None)


def who(lay: LayerResult) -> str:
    """Whose memory it is: the culprit process (pid, name, GPU or MIG slice), else the
    deciding series."""
    c = lay.culprit
    s = main_series(lay)
    if c is not None and c.pid is not None:
        where = f" on {c.device or f'GPU {c.gpu}'}" if c.gpu is not None else ""
        return f"pid {c.pid} ({c.name or '?'}){where}"
    if c is not None and c.device and c.gpu_instance is not None:
        return c.device
    if s is not None:
        return label(s)
    return display_name(lay.layer)


def inside(lay: LayerResult, kind: str) -> SeriesResult | None:
    """The layer's inside series of `kind` ("glibc_kept", "cuda_reserved", ...) for the process
    that carries its verdict, or None."""
    s = main_series(lay)
    if s is None or s.pid is None:
        return None
    return next((x for x in lay.series if x.key == f"{kind}/pid{s.pid}"), None)


def held_text(lay: LayerResult) -> str:
    """ "; held by FILE:LINE (N per request)" for the code attribution found, else ""."""
    c = lay.culprit
    if c is None or not c.held_by:
        return ""
    parts = []
    for h in c.held_by[:3]:
        bpr = h.get("bytes_per_request")
        per = f" ({rate(bpr / 2**20, 'MiB')} per request)" if isinstance(bpr, (int, float)) else ""
        parts.append(f"{h.get('describe', '?')}{per}")
    return "; held by " + "; ".join(parts)


def caveat_text(layer: str, code: str) -> str:
    """A caveat code in words: the layer's own table first, then every block's, else the code."""
    own = block(layer).caveats.get(code)
    if own is not None:
        return own
    for b in _BLOCKS.values():
        if code in b.caveats:
            return b.caveats[code]
    return code
