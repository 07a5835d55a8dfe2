"""The VRAM layer's sentences: GPU memory per process (NVML, or an exporter's per-GPU gauge).

A leak is allocator memory never freed (or a stray CUDA context on a GPU the process does not
use); when the KV pool is back at its idle level the sentence says the growth is not KV pages.
"""

from __future__ import annotations

from vramdoctor.judge.results import (
    CACHING,
    KV,
    STABLE,
    VRAM,
    X_STRAY_CONTEXT,
    LayerResult,
    SoakAnalysis,
)
from vramdoctor.soak.report.layers.base import LayerBlock, who
from vramdoctor.soak.report.text import rate, size

__all__ = ["VramBlock"]


class VramBlock(LayerBlock):
    """GPU memory: a leak per request names the process and whether KV pages are ruled out."""

    layer = VRAM
    display = "VRAM"
    not_measured = "no GPU source: NVML on the server's host, or --gpu-metrics"

    def leak(self, lay: LayerResult, a: SoakAnalysis, *, ci: str, proj: str) -> str:
        cause = (
            "a stray CUDA context"
            if lay.culprit and lay.culprit.cause == X_STRAY_CONTEXT
            else "allocator memory that is never freed"
        )
        kv = a.layers.get(KV)
        if kv is not None and kv.verdict in (STABLE, CACHING):
            cause += " (the KV pool is back to its idle level: not KV pages, but preprocessing or activations)"
        return (
            f"{self.display}: LEAK: GPU memory of {who(lay)} grows "
            f"{rate(lay.rate_per_request, 'MiB')} per request{ci} in every round of identical "
            f"traffic: {cause}{proj}."
        )

    def notes(self, lay: LayerResult) -> list[str]:
        """A stray CUDA context: a context-sized footprint on a GPU that is not the process's."""
        out = []
        for key in lay.stray_contexts:
            s = next((x for x in lay.series if x.key == key), None)
            if s is not None:
                out.append(
                    f"pid {s.pid} ({s.name or '?'}) holds a context-sized {size(s.last)} on "
                    f"GPU {s.gpu}, not its main GPU: a stray CUDA context"
                )
        return out


BLOCK = VramBlock()
