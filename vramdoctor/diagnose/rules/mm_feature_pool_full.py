"""SGLang's CUDA IPC feature pool ran out of chunks and fell back to CPU transport."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("mm_feature_pool_full")
    if not evs or d.server != "sglang":  # SGLang's own line (it votes for SGLang)
        return []
    e = evs[0]
    return [
        Finding(
            RULE.id,
            "info",
            "CUDA IPC feature pool full: features fell back to CPU transport",
            explanation=(
                f"A {e.data.get('tensor_mib')} MiB feature tensor did not fit the {e.data.get('pool_mib')} MiB "
                "pool, so it travelled the slow path. The pool is fixed-size memory held for the process's "
                "life; this message is about speed, not a leak."
            ),
            fix=(
                "The transport is CUDA IPC, which ROCm does not support (see sglang-cuda-ipc-rocm): turn it off "
                "(--mm-feature-transport cpu, or unset SGLANG_USE_CUDA_IPC_TRANSPORT); a larger "
                "SGLANG_MM_FEATURE_CACHE_MB only avoids this fallback."
                if d.facts.platform == "rocm"
                else "Raise SGLANG_MM_FEATURE_CACHE_MB (costs that much GPU memory), or use --mm-feature-transport cpu."
            ),
            evidence=first_evidence(evs, 1),
        )
    ]


RULE = Rule(
    id="sglang-mm-feature-pool-full",
    severity="info",
    title="CUDA IPC feature pool full",
    fires_when="'MmItemMemoryPool has no free chunk large enough for a X MiB tensor'",
    fix="raise SGLANG_MM_FEATURE_CACHE_MB or use CPU transport",
    check=check,
)
