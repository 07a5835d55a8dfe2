"""TensorRT-LLM's KV cache takes its default share of the free GPU memory (0.9): little headroom.

The Triton backend prints "kv_cache_free_gpu_mem_fraction is not specified, will use default value
of 0.9" and then "Max tokens in paged KV cache: N. Allocating B bytes.": after the engine, 90 % of
what is free becomes KV cache, and activations and other processes share the rest.
"""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, mib, words


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("trtllm_kv_default_fraction")
    if not evs or d.server != "trtllm":
        return []
    share = evs[0].data.get("kv_share", 0.9)
    kv = d.facts.kv_cache_mib
    oom = bool(d.events_of("cuda_oom"))
    v = words(d)
    ev = first_evidence(evs, 1)
    if (k := d.facts.evidence.get("kv_cache_mib")) is not None:
        ev.append(k)
    return [
        Finding(
            RULE.id,
            "warning" if oom else "info",
            f"TensorRT-LLM's KV cache takes {share:.0%} of the free GPU memory (the default)",
            explanation=(
                f"kv_cache_free_gpu_mem_fraction is not set, so the KV cache gets {share:g} of the memory free "
                "after the engine loads"
                + (f" ({mib(kv)} here)" if kv else "")
                + ": activations, the decoder's runtime buffers and anything else on the GPU share the rest."
                + (
                    " The log shows an out-of-memory error after it."
                    if oom
                    else " If requests later run out of memory, this is the headroom to look at."
                )
            ),
            fix=(
                v.say("Set {kv_share} to 0.5-0.8 (or {kv_size}) to leave headroom for activations.")
                or "Set the KV cache share lower to leave headroom."
            ),
            evidence=ev,
        )
    ]


RULE = Rule(
    id="trtllm-kv-default-fraction",
    severity="warning",
    title="TensorRT-LLM KV cache at its default share of free memory",
    fires_when=(
        "TensorRT-LLM 'kv_cache_free_gpu_mem_fraction is not specified, will use default value of 0.9' (info; "
        "warning with an OOM in the log)"
    ),
    fix="kv_cache_free_gpu_mem_fraction 0.5-0.8 or max_tokens_in_paged_kv_cache",
    check=check,
)
