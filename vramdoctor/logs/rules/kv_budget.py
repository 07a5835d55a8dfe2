"""The KV cache does not fit the budget: a configuration error, not a CUDA OOM."""

from __future__ import annotations

from ..model import Diagnosis, Finding
from . import Rule
from ._common import first_evidence, mib

REASONS = {
    "no_memory_for_cache_blocks": "after weights and activations nothing is left for KV blocks",
    "max_seq_len_exceeds_kv_cache": "one request at the model's max length needs more KV cache than there is",
    "free_memory_below_utilization": "the GPU had less free memory at startup than the utilization asks for (another process holds it)",
    "sglang_not_enough_memory_for_kv_pool": "the static fraction leaves no room for the KV pool after the weights",
}


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("kv_budget_error")
    if not evs:
        return []
    e = evs[0]
    reason = e.data.get("reason", "")
    expl = f"The server refused to start: {REASONS.get(reason, 'the KV cache does not fit')}."
    if reason == "max_seq_len_exceeds_kv_cache" and "kv_cache_tokens" in e.data:
        expl += f" Max model length {e.data['max_seq_len']} tokens, the KV cache holds {e.data['kv_cache_tokens']}."
    elif reason == "max_seq_len_exceeds_kv_cache":
        expl += f" Needed {mib(e.data.get('needed_mib'))}, available {mib(e.data.get('available_mib'))}."
    if d.facts.weights_mib:
        expl += f" Weights take {mib(d.facts.weights_mib)}."
    expl += " This is a budget check, not a CUDA allocation failure."
    if d.server == "sglang":
        fix = "Raise --mem-fraction-static (if nothing else uses the GPU), use more GPUs (--tp-size) or a quantized model."
    elif reason == "free_memory_below_utilization":
        fix = "Free the GPU (see `vramdoctor census`) or lower --gpu-memory-utilization to what is free."
    else:
        fix = ("Raise --gpu-memory-utilization, lower --max-model-len, use --kv-cache-dtype fp8, more GPUs "
               "(--tensor-parallel-size) or a quantized model; --cpu-offload-gb moves weights but costs speed.")
    return [Finding(RULE.id, "critical", "KV cache does not fit the memory budget", fix=fix,
                    explanation=expl, evidence=first_evidence(evs))]


RULE = Rule(
    id="kv-budget-error",
    severity="critical",
    title="KV cache budget error (not a CUDA OOM)",
    fires_when=(
        "vLLM 'No available memory for the cache blocks', V0 'The model's max seq len (N) is larger than the "
        "maximum number of tokens that can be stored in KV cache (M)', V1 '... max seq len (N), (X GiB KV cache is needed, "
        "which is larger than the available KV cache memory', 'Free memory on device ... is less than "
        "desired GPU memory utilization'; SGLang 'Not enough memory. Please try to increase --mem-fraction-static'"
    ),
    fix="raise the memory fraction/utilization, lower max model length, fp8 KV cache, more GPUs",
    check=check,
)
