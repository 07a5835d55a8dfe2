"""A memory fraction that leaves too little room for a multimodal model's encoder and images."""

from __future__ import annotations

from ..model import Diagnosis, Finding
from . import Rule

SGLANG_MAX = 0.85  # SGLang itself lowers the default fraction for multimodal models
VLLM_MAX = 0.92


def check(d: Diagnosis) -> list[Finding]:
    f = d.facts
    if f.multimodal is not True:
        return []
    if (
        d.server == "sglang"
        and f.mem_fraction_static is not None
        and f.mem_fraction_static > SGLANG_MAX
    ):
        value, flag, limit = f.mem_fraction_static, "--mem-fraction-static", SGLANG_MAX
        ev = f.evidence.get("mem_fraction_static")
    elif (
        d.server == "vllm"
        and f.gpu_memory_utilization is not None
        and f.gpu_memory_utilization > VLLM_MAX
    ):
        value, flag, limit = f.gpu_memory_utilization, "--gpu-memory-utilization", VLLM_MAX
        ev = f.evidence.get("gpu_memory_utilization")
    else:
        return []
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
            fix=f"Lower {flag} to {limit - 0.1:.2f}-{limit:.2f} and measure the headroom under image load with `vramdoctor soak`.",
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
