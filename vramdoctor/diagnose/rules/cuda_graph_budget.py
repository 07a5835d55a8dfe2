"""CUDA graphs that capture more than the memory left after the KV pool allows."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import mib, words

MIN_HEADROOM_MIB = (
    1024.0  # free memory left after capture below this leaves no room for activations
)


def check(d: Diagnosis) -> list[Finding]:
    f = d.facts
    ev = [
        e
        for e in (f.evidence.get("avail_after_graph_mib"), f.evidence.get("cuda_graph_max_bs"))
        if e
    ]
    if f.avail_after_graph_mib is not None and f.avail_after_graph_mib < MIN_HEADROOM_MIB:
        left = f.avail_after_graph_mib
        used = f"{mib(f.cuda_graph_mib)} for graphs" if f.cuda_graph_mib is not None else "graphs"
        return [
            Finding(
                RULE.id,
                "warning",
                f"Only {mib(left)} left after CUDA graph capture",
                explanation=(
                    f"After the KV pool and {used}, {mib(left)} of the GPU is free. Prefill activations, "
                    "sampling buffers, the multimodal encoder and NCCL all need room outside the static "
                    "pool, so the first long or image-heavy request can OOM."
                    + (f" cuda_graph_max_bs={f.cuda_graph_max_bs}." if f.cuda_graph_max_bs else "")
                ),
                fix=words(d).first(
                    "Lower {graph_batch} or {memory_share}.",
                    "Lower {max_running} (the largest graph batch) or {memory_share}.",
                )
                or "Capture graphs for smaller batches.",
                evidence=ev,
            )
        ]
    return []


RULE = Rule(
    id="cuda-graph-budget",
    severity="warning",
    title="CUDA graph capture leaves too little free memory",
    fires_when=f"SGLang 'Capture cuda graph end ... avail mem=X GB' with X < {MIN_HEADROOM_MIB / 1024:.0f} GiB",
    fix="lower --cuda-graph-max-bs or the memory fraction",
    check=check,
)
