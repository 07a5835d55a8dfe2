"""The KV cache does not fit the budget: a configuration error, not a CUDA OOM."""

from __future__ import annotations

from ..model import Diagnosis, Finding, LogEvent
from . import Rule
from ._common import by_server, first_evidence, fraction_flag, mib

REASONS = {
    "no_memory_for_cache_blocks": "after weights and activations nothing is left for KV blocks",
    "max_seq_len_exceeds_kv_cache": "one request at the model's max length needs more KV cache than there is",
    "free_memory_below_utilization": "the GPU had less free memory at startup than the utilization asks for (another process holds it)",
    "sglang_not_enough_memory_for_kv_pool": "the static fraction leaves no room for the KV pool after the weights",
}


def _free_below(d: Diagnosis, e: LogEvent) -> tuple[str, str]:
    """vLLM's start-up check: free/total memory and the share asked for -> what holds the rest."""
    free, total = e.data.get("free_mib"), e.data.get("total_mib")
    util = e.data.get("gpu_memory_utilization") or d.facts.gpu_memory_utilization
    device = e.data.get("device") or "the GPU"
    expl = "The server refused to start: the GPU had less free memory at start-up than the utilization asks for."
    flag = fraction_flag(d.server)
    fix = f"Find what holds the GPU (`vramdoctor census`, nvidia-smi) and stop it, or lower {flag}."
    if free is not None and total:
        held = total - free
        expl = (
            f"The server refused to start: only {mib(free)} of {mib(total)} were free on {device} at start-up"
            + (
                f", and gpu_memory_utilization={util:g} asks for {mib(total * util)}"
                if util
                else ""
            )
            + f". Besides this process's own CUDA context (a few hundred MiB), something else holds about "
            f"{mib(held)} of that GPU: a leftover or second server "
            "(a zombie EngineCore from an earlier run), another tenant, or another rank's CUDA context. "
            "gpu_memory_utilization is a share of the GPU's total memory, not of what is free."
        )
        below = int(free / total * 100) / 100  # rounded down to two decimals
        fix = (
            f"Find the process holding ~{mib(held)} on {device} (`vramdoctor census`, nvidia-smi) and stop it; "
            f"or, to share the GPU on purpose, set {flag} below free/total = "
            f"{free / total:.3f} (e.g. {max(below - 0.01, 0.01):.2f})."
        )
    return expl, fix


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("kv_budget_error")
    if not evs:
        return []
    e = evs[0]
    reason = e.data.get("reason", "")
    if reason == "free_memory_below_utilization":
        expl, fix = _free_below(d, e)
        expl += " This is a budget check, not a CUDA allocation failure."
        return [
            Finding(
                RULE.id,
                "critical",
                "Another process holds GPU memory the server's share needs",
                fix=fix,
                explanation=expl,
                evidence=first_evidence(evs),
            )
        ]
    expl = f"The server refused to start: {REASONS.get(reason, 'the KV cache does not fit')}."
    if reason == "max_seq_len_exceeds_kv_cache" and "kv_cache_tokens" in e.data:
        expl += f" Max model length {e.data['max_seq_len']} tokens, the KV cache holds {e.data['kv_cache_tokens']}."
    elif reason == "max_seq_len_exceeds_kv_cache":
        expl += f" Needed {mib(e.data.get('needed_mib'))}, available {mib(e.data.get('available_mib'))}."
    if d.facts.weights_mib:
        expl += f" Weights take {mib(d.facts.weights_mib)}."
    expl += " This is a budget check, not a CUDA allocation failure."
    fix = by_server(
        d.server,
        "Raise --mem-fraction-static (if nothing else uses the GPU), use more GPUs (--tp-size) or a quantized model.",
        "Raise --gpu-memory-utilization, lower --max-model-len, use --kv-cache-dtype fp8, more GPUs "
        "(--tensor-parallel-size) or a quantized model; --cpu-offload-gb moves weights but costs speed.",
    )
    return [
        Finding(
            RULE.id,
            "critical",
            "KV cache does not fit the memory budget",
            fix=fix,
            explanation=expl,
            evidence=first_evidence(evs),
        )
    ]


RULE = Rule(
    id="kv-budget-error",
    severity="critical",
    title="KV cache budget error (not a CUDA OOM)",
    fires_when=(
        "vLLM 'No available memory for the cache blocks', V0 'The model's max seq len (N) is larger than the "
        "maximum number of tokens that can be stored in KV cache (M)', V1 '... max seq len (N), (X GiB KV cache is needed, "
        "which is larger than the available KV cache memory', 'Free memory on device [cuda:N ](F/T GiB) on startup "
        "is less than desired GPU memory utilization (U, R GiB)' (says how much another process holds); SGLang "
        "'Not enough memory. Please try to increase --mem-fraction-static'"
    ),
    fix=(
        "raise the memory fraction/utilization, lower max model length, fp8 KV cache, more GPUs; for the free-memory "
        "check: find and stop the process holding the GPU, or a utilization below free/total"
    ),
    check=check,
)
