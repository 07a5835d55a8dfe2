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
    X_FRAGMENTATION,
    X_LIVE_CACHE,
    X_STRAY_CONTEXT,
    LayerResult,
    SoakAnalysis,
)
from vramdoctor.soak.report.layers.base import LayerBlock, held_text, inside, main_series, who
from vramdoctor.soak.report.series import label
from vramdoctor.soak.report.text import rate, size

__all__ = ["VramBlock"]


class VramBlock(LayerBlock):
    """GPU memory: a leak per request names the process and whether KV pages are ruled out."""

    layer = VRAM
    display = "VRAM"
    not_measured = "no GPU source: NVML on the server's host, or --gpu-metrics"

    def leak(self, lay: LayerResult, a: SoakAnalysis, *, ci: str, proj: str) -> str:
        s = main_series(lay)
        if s is not None and s.reason == "live_grew":
            return (
                f"{self.display}: LEAK: live tensors of {who(lay)} (the CUDA caching allocator's "
                f"allocated bytes, read inside the process by vramdoctor's agent) grow "
                f"{rate(lay.rate_per_request, 'MiB')} per request{ci} in every round of identical "
                f"traffic: memory held, not cached{held_text(lay)}{proj}."
            )
        if lay.culprit and lay.culprit.cause == "outside_allocator":
            return (
                f"{self.display}: LEAK: GPU memory of {who(lay)} outside PyTorch's caching "
                f"allocator (NVML's count minus the allocator's reserve, read inside the process: "
                f"NCCL buffers, CUDA graphs, an extension's own allocations) grows "
                f"{rate(lay.rate_per_request, 'MiB')} per request{ci} in every round of identical "
                f"traffic, while the allocator's live tensors stay flat{proj}."
            )
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

    def explained(self, lay: LayerResult, a: SoakAnalysis) -> str | None:
        s = main_series(lay)
        if s is not None and s.reason == "live_flat":
            live = inside(lay, "cuda_allocated")
            reserved = inside(lay, "cuda_reserved")
            split = inside(lay, "cuda_split")
            words: dict[str, str] = {
                X_FRAGMENTATION: "fragmentation settling: free pieces of split segments",
                X_LIVE_CACHE: "a cache of live tensors converging towards its bound",
            }
            what = words.get(
                lay.explanation or "", "PyTorch's caching allocator keeping freed blocks"
            )
            extra = (
                f", {size(split.growth, signed=True)} of it in free pieces of split segments"
                if split is not None and lay.explanation == X_FRAGMENTATION
                else ""
            )
            return (
                f"{self.display}: CACHING: GPU memory of {label(s)} grew "
                f"{size(s.growth, signed=True)} while live tensors stayed flat"
                f"{f' ({size(live.growth, signed=True)})' if live is not None else ''}, read "
                f"inside the process by vramdoctor's agent: the allocator's reserve grew"
                f"{f' {size(reserved.growth, signed=True)}' if reserved is not None else ''}"
                f"{extra} ({what}), not a leak."
            )
        return super().explained(lay, a)

    def notes(self, lay: LayerResult) -> list[str]:
        """A stray CUDA context: a context-sized footprint on a GPU that is not the process's;
        other tenants' processes on the server's GPUs, with their growth."""
        out = []
        for key in lay.tenants:
            t = next((x for x in lay.series if x.key == key), None)
            if t is not None:
                owner = f", user {t.username}" if t.username else ""
                out.append(
                    f"pid {t.pid} ({t.name or '?'}{owner}) on {t.device or f'GPU {t.gpu}'} is "
                    f"another tenant (not the server's process tree): "
                    f"{size(t.growth, signed=True)} over the run, {t.verdict.lower()}; it never "
                    "decides the server's verdict and is taken out of the GPU's total"
                )
        for key in lay.stray_contexts:
            s = next((x for x in lay.series if x.key == key), None)
            if s is not None:
                out.append(
                    f"pid {s.pid} ({s.name or '?'}) holds a context-sized {size(s.last)} on "
                    f"GPU {s.gpu}, not its main GPU: a stray CUDA context"
                )
        return out


BLOCK = VramBlock()
