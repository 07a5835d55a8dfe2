"""A memory fraction that leaves too little room for a multimodal model's encoder and images.

Fires on a model the log shows to be multimodal (a line: an architecture class, a multimodal line or
frame) as a warning; on one only its name suggests is multimodal (facts.hints: a name is
not proof) as an info note that says so and what would confirm it.
"""

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


def _named(d: Diagnosis) -> tuple[str, float, float, str] | None:
    """(flag, value, limit, what the name suggests) when only the model's name says multimodal."""
    hint = d.facts.hints.get("multimodal")
    if d.facts.multimodal is not None or not hint or hint.get("value") is not True:
        return None
    f = d.facts
    if (
        d.server == "sglang"
        and f.mem_fraction_static is not None
        and f.mem_fraction_static > SGLANG_MAX
    ):
        return "--mem-fraction-static", f.mem_fraction_static, SGLANG_MAX, str(hint["rests_on"])
    if (
        d.server == "vllm"
        and f.gpu_memory_utilization is not None
        and f.gpu_memory_utilization > VLLM_MAX
    ):
        return "--gpu-memory-utilization", f.gpu_memory_utilization, VLLM_MAX, str(hint["rests_on"])
    return None


def check(d: Diagnosis) -> list[Finding]:
    high = high_fraction_multimodal(d)
    named = _named(d) if high is None else None
    if high is None and named is None:
        return []
    flag, value, limit = high if high is not None else named[:3]  # type: ignore[index]
    name = "mem_fraction_static" if flag == "--mem-fraction-static" else "gpu_memory_utilization"
    ev = [
        e
        for e in (
            d.facts.evidence.get(name),
            d.facts.evidence.get("model" if named else "multimodal"),
        )
        if e
    ]
    fix = f"Lower {flag} to {limit - 0.1:.2f}-{limit:.2f} and measure the headroom under image load with `vramdoctor soak`."
    if d.events_of("kv_budget_error") or d.events_of("kv_budget_negative"):
        # the KV-budget finding says the trade-off once: one direction for the share
        fix += " (The KV-budget finding says how to fit the KV cache without a higher share.)"
    expl = (
        f"{flag}={value:g} gives the static pool (weights + KV cache) almost the whole GPU. A "
        "multimodal model also needs memory outside it: the vision encoder's activations for "
        "large or many images, the image processor's GPU scratch (SGLang fast processor) and "
        "CUDA graphs. Image-heavy traffic then OOMs in prefill although text traffic is fine."
    )
    if named is not None:
        expl = (
            f"If this model is multimodal, as {named[3]} suggests (no line of the log shows it: an architecture "
            "class, an encoder line or frame would): " + expl
        )
        fix = "If it serves images: " + fix[0].lower() + fix[1:]
    return [
        Finding(
            RULE.id,
            "info" if named is not None else "warning",
            f"{flag} {value:g} is high for a multimodal model"
            + (" (multimodal by its name only)" if named else ""),
            explanation=expl,
            fix=fix,
            evidence=ev,
            basis="unknown" if named is not None else None,
        )
    ]


RULE = Rule(
    id="mem-fraction-high-multimodal",
    severity="warning",
    title="Memory fraction too high for a multimodal model",
    fires_when=(
        f"multimodal model with SGLang mem_fraction_static > {SGLANG_MAX} or vLLM gpu_memory_utilization > "
        f"{VLLM_MAX} (warning; info, worded as a condition, when only the model's name suggests multimodal)"
    ),
    fix="lower the fraction to leave encoder/image headroom; measure with `vramdoctor soak`",
    check=check,
)
