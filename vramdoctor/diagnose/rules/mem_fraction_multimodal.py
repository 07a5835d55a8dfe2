"""A memory fraction that leaves too little room for a multimodal model's encoder and images."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import (
    SGLANG_MM_FRACTION_MAX,
    VLLM_MM_UTILIZATION_MAX,
    high_fraction_multimodal,
)

SGLANG_MAX = (
    SGLANG_MM_FRACTION_MAX  # SGLang itself lowers the default fraction for multimodal models
)
VLLM_MAX = VLLM_MM_UTILIZATION_MAX


def check(d: Diagnosis) -> list[Finding]:
    high = high_fraction_multimodal(d)
    if high is None:
        return []
    flag, value, limit = high
    name = "mem_fraction_static" if flag == "--mem-fraction-static" else "gpu_memory_utilization"
    ev = d.facts.evidence.get(name)
    fix = f"Lower {flag} to {limit - 0.1:.2f}-{limit:.2f} and measure the headroom under image load with `vramdoctor soak`."
    if d.events_of("kv_budget_error") or d.events_of("kv_budget_negative"):
        # the KV-budget finding says the trade-off once (review 12b): one direction for the share
        fix += " (The KV-budget finding says how to fit the KV cache without a higher share.)"
    return [
        Finding(
            RULE.id,
            "warning",
            f"{flag} {value:g} is high for a multimodal model",
            explanation=(
                f"{flag}={value:g} gives the static pool (weights + KV cache) almost the whole GPU. A "
                "multimodal model also needs memory outside it: the vision encoder's activations for "
                "large or many images, the image processor's GPU scratch (SGLang fast processor) and "
                "CUDA graphs. Image-heavy traffic then OOMs in prefill although text traffic is fine."
            ),
            fix=fix,
            evidence=[ev] if ev else [],
        )
    ]


RULE = Rule(
    id="mem-fraction-high-multimodal",
    severity="warning",
    title="Memory fraction too high for a multimodal model",
    fires_when=f"multimodal model with SGLang mem_fraction_static > {SGLANG_MAX} or vLLM gpu_memory_utilization > {VLLM_MAX}",
    fix="lower the fraction to leave encoder/image headroom; measure with `vramdoctor soak`",
    check=check,
)
