"""One block of sentences per memory layer (`vram`, `kv`, `host`), found by a registry.

`block(layer)` gives a layer's `LayerBlock` (a generic one, named after the layer, for a layer
nobody registered); `register(block)` adds one from outside (a plugin, a test). The report's
shared sentences live in `vramdoctor.soak.report.sentences`; what a layer says its own way
lives in its module here.
"""

from __future__ import annotations

from vramdoctor.soak.report.layers import host, kv, vram
from vramdoctor.soak.report.layers.base import (
    LayerBlock,
    block,
    blocks,
    caveat_text,
    display_name,
    main_series,
    register,
    who,
)

for _module in (vram, kv, host):  # the built-in layers, in the order the report answers them
    register(_module.BLOCK)

__all__ = [
    "LayerBlock",
    "block",
    "blocks",
    "caveat_text",
    "display_name",
    "main_series",
    "register",
    "who",
]
