"""The KV cache does not fit the budget: a configuration error, not a CUDA OOM."""

from __future__ import annotations

from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.findings import Diagnosis, Finding, LogEvent
from vramdoctor.diagnose.levers import platform_tool
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import (
    first_evidence,
    high_fraction_multimodal,
    mib,
    server_name,
    words,
)

REASONS = {
    "no_memory_for_cache_blocks": "after weights and activations nothing is left for KV blocks",
    "max_seq_len_exceeds_kv_cache": "one request at the model's max length needs more KV cache than there is",
    "free_memory_below_utilization": "the GPU had less free memory at startup than the utilization asks for (another process holds it)",
    "sglang_not_enough_memory_for_kv_pool": "the static fraction leaves no room for the KV pool after the weights",
}


# What one process's own CUDA context (driver state, module images, cuBLAS / NCCL workspaces) takes on a
# GPU before any model memory: 518 MiB before any kernel ran and 612 MiB after a warm-up request, measured
# on an H200 (docs/gpu-results.md); 0.5-1 GiB normally (shared/facts.md). Used memory at vLLM's start-up
# check up to this much per context is the server's own, not another process.
OWN_CONTEXT_MIB = 1024.0


_MORE_GPUS = "Use more GPUs or quantized weights, or a shorter maximum context."


def _fitting_len(e: LogEvent) -> int | None:
    """The longest max-model-len the available KV cache holds, in tokens, as vLLM prints it: V1's
    "the estimated maximum model length is N", V0's "maximum number of tokens that can be stored in KV
    cache (N)"; None when the message has neither."""
    if (m := P.VLLM_EST_MAX_LEN.search(e.text)) is not None:
        return int(m.group(1))
    tokens = e.data.get("kv_cache_tokens")
    return int(tokens) if tokens is not None else None


def _len_at(d: Diagnosis, e: LogEvent, share: float, lower: float) -> str:
    """ " (about N tokens at LOWER)": the max length the KV cache holds once the share drops from `share`
    to `lower`, from the message's figures (KV MiB per token = needed / max seq len) and the GPU's total
    memory when the log shows it; "" when a figure is missing or nothing would be left."""
    need, avail, n = (
        e.data.get("needed_mib"),
        e.data.get("available_mib"),
        e.data.get("max_seq_len"),
    )
    total = d.facts.total_gpu_mib
    if not (need and avail and n and total):
        return ""
    left = float(avail) - (share - lower) * float(total)
    if left <= 0:
        return f" (at {lower:g} nothing is left for the KV cache on this {mib(total)} GPU)"
    return f" (about {int(left / (float(need) / int(n)))} tokens at {lower:g} on this {mib(total)} GPU)"


def _suggest(ratio: float) -> str:
    """A utilization safely below free/total: rounded down to two decimals, minus 0.01."""
    below = int(ratio * 100) / 100
    return f"{max(below - 0.01, 0.01):.2f}"


def _ranks(d: Diagnosis, n_failed: int) -> int:
    """How many of the server's processes may hold a CUDA context on one GPU at start-up (each rank
    creates its own; a rank that touches another GPU leaves one there too)."""
    f = d.facts
    n = (f.tp_size or f.tp_size_at_least or 1) * (f.pp_size or 1) * (f.dp_size or 1)
    return max(1, n, n_failed)


def _free_below(d: Diagnosis, evs: list[LogEvent]) -> tuple[str, str, str]:
    """vLLM's start-up check on every rank that failed it: (title, explanation, fix).

    The used memory (total - free) of each GPU is compared with what the server's own CUDA contexts
    explain (OWN_CONTEXT_MIB each): within one context it is this process's own and the cause is a
    utilization above free/total; within one per rank it may be sibling ranks' contexts; above that
    another process holds the rest. The fix is sized on the WORST GPU (lowest free/total): every rank
    must pass the check on its own GPU.
    """
    flag = words(d)("memory_share") or "the memory share"
    gpus = _failed_gpus(evs)
    first = evs[0]
    util = first.data.get("gpu_memory_utilization") or d.facts.gpu_memory_utilization
    if not gpus:
        return (
            "GPU memory at start-up is below the server's share",
            "The server refused to start: the GPU had less free memory at start-up than the utilization asks for.",
            f"Find what holds the GPU (`vramdoctor census`, {platform_tool(d.facts.platform, 'smi')}) and stop it, "
            f"or lower {flag}.",
        )
    ranks = _ranks(d, len(gpus))
    worst = min(gpus, key=_free_ratio)
    parts, foreign = _gpu_parts(gpus, ranks)
    asks = (
        f"gpu_memory_utilization={util:g} asks for {mib(float(worst.data['total_mib']) * util)} of each GPU"
        if util
        else "the configured gpu_memory_utilization asks for a share of each GPU's total"
    )
    expl = (
        f"The server refused to start: {asks}, and vLLM requires that much to be free at start-up. "
        + ("; ".join(parts))
        + f". An own CUDA context takes up to about {mib(OWN_CONTEXT_MIB)} (518-612 MiB measured on an H200)."
    )
    r = _free_ratio(worst)
    share = (
        f"set {flag} below free/total = {r:.3f} (e.g. {_suggest(r)})"
        if len(gpus) == 1
        else f"set {flag} below the lowest free/total = {r:.3f} ({_gpu_name(worst)}; e.g. {_suggest(r)}): every rank "
        "must pass the check on its own GPU"
    )
    if not foreign:
        return _own_contexts_only(expl, share, util)
    return _another_process(d, expl, share, foreign, len(gpus))


def _failed_gpus(evs: list[LogEvent]) -> list[LogEvent]:
    """The failed start-up checks that have figures, one per GPU (a line in two logs: once)."""
    seen: dict[tuple[object, ...], LogEvent] = {}
    for e in evs:
        if e.data.get("reason") != "free_memory_below_utilization":
            continue
        # the same line in a launcher log and a worker log is one GPU's figures, read once
        key = (e.data.get("device"), e.data.get("free_mib"), e.data.get("total_mib"))
        seen.setdefault(key, e)
    return [
        e for e in seen.values() if e.data.get("free_mib") is not None and e.data.get("total_mib")
    ]


def _gpu_name(e: LogEvent) -> str:
    """The GPU a start-up check line is about, as the line names it (or by its line)."""
    return str(e.data.get("device") or f"GPU (line {e.line})")


def _free_ratio(e: LogEvent) -> float:
    """The GPU's free memory at start-up over its total."""
    return float(e.data["free_mib"]) / float(e.data["total_mib"])


def _gpu_parts(gpus: list[LogEvent], ranks: int) -> tuple[list[str], list[tuple[LogEvent, float]]]:
    """(a sentence part per GPU, worst first; (GPU, MiB another process holds there) pairs)."""
    parts, foreign = [], []
    for e in sorted(gpus, key=_free_ratio):
        free, total = float(e.data["free_mib"]), float(e.data["total_mib"])
        held = total - free
        part = f"{_gpu_name(e)}: {mib(free)} of {mib(total)} free, {mib(held)} in use"
        if held <= OWN_CONTEXT_MIB:
            part += " (within this process's own CUDA context)"
        elif held <= ranks * OWN_CONTEXT_MIB:
            part += (
                f" (more than one CUDA context: the server's other ranks' contexts, up to {ranks} in all, "
                "or another process)"
            )
        else:
            extra = held - OWN_CONTEXT_MIB
            part += f" (about {mib(extra)} beyond this process's own CUDA context: another process)"
            foreign.append((e, extra))
        parts.append(part)
    return parts, foreign


def _own_contexts_only(expl: str, share: str, util: float | None) -> tuple[str, str, str]:
    """(title, explanation, fix) when the server's own CUDA contexts explain the memory in use."""
    title = "gpu_memory_utilization is too high for the free GPU memory at start-up"
    expl += (
        " No other process is needed to explain it: the memory in use fits in what the server's own CUDA "
        "context(s) take, and "
        + (f"{util:g} of the total " if util else "the share ")
        + "leaves no room for it (a small process such as a desktop session may still hold part of it: "
        "`vramdoctor census` lists each one). gpu_memory_utilization is a share of the GPU's total memory, "
        "not of what is free."
    )
    fix = f"Lower the share: {share}."
    return title, expl, fix


def _another_process(
    d: Diagnosis, expl: str, share: str, foreign: list[tuple[LogEvent, float]], n_gpus: int
) -> tuple[str, str, str]:
    """(title, explanation, fix) when another process holds memory beyond the server's contexts."""
    expl += (
        " Another process holds memory there: a leftover or second server (a zombie EngineCore from an earlier "
        "run) or another tenant. gpu_memory_utilization is a share of the GPU's total memory, not of what is free."
    )
    holders = ", ".join(f"~{mib(extra)} on {_gpu_name(e)}" for e, extra in foreign[:8])
    fix = (
        f"Find the process{'es' if len(foreign) > 1 else ''} holding {holders} (`vramdoctor census`, "
        f"{platform_tool(d.facts.platform, 'smi')}) "
        f"and stop {'them' if len(foreign) > 1 else 'it'}; or, to share the "
        f"GPU{'s' if n_gpus > 1 else ''} on purpose, {share}."
    )
    return "Another process holds GPU memory the server's share needs", expl, fix


# A CUDA-graph estimate this large (or this share of the GPU) is what the KV budget lost (vLLM 0.18+ subtracts
# it before sizing the KV cache; by default from 0.21): the lever is the graphs, not the share.
GRAPH_ESTIMATE_LARGE_MIB = 4096.0
GRAPH_ESTIMATE_LARGE_SHARE = 0.10


def _graph_cause(d: Diagnosis) -> tuple[str, str, str] | None:
    """(explanation, fix, arithmetic) when vLLM's CUDA-graph estimate is what left no KV memory."""
    f = d.facts
    est = f.cuda_graph_estimate_mib
    if d.server != "vllm" or est is None or f.cuda_graph_estimate_applied is False:
        return None
    total = f.total_gpu_mib
    large = est >= GRAPH_ESTIMATE_LARGE_MIB or (
        total is not None and est >= GRAPH_ESTIMATE_LARGE_SHARE * total
    )
    if not large:
        return None
    v = words(d)
    share = f" ({est / total:.0%} of the {mib(total)} GPU)" if total else ""
    expl = (
        f" vLLM estimated {mib(est)} for CUDA graphs{share} and, with CUDA-graph memory profiling on (the default "
        "from 0.21), took it out of the budget before sizing the KV cache: the estimate, not the weights or "
        "the activations, is what left nothing for the KV blocks."
    )
    fix = (
        v.join(
            "Capture fewer CUDA graphs: {graph_sizes}",
            "or leave the estimate out of the profile ({graph_estimate_off}) and keep {memory_share} low enough "
            "to hold the graphs the estimate over-counts",
            "or run without graphs ({graph_off})",
            sep="; ",
        )
        + "."
    )
    return (
        expl,
        fix,
        f"estimated CUDA graph memory {mib(est)}"
        + (f" = {est / total:.0%} of {mib(total)}" if total else ""),
    )


def _tgi_prefill(d: Diagnosis, evs: list[LogEvent]) -> Finding:
    """TGI's warm-up: not enough memory for a batch of --max-batch-prefill-tokens tokens."""
    e = evs[0]
    n = e.data.get("prefill_tokens")
    v = words(d)
    fix = v.join(
        f"Lower {{prefill_chunk}} (the warm-up runs one batch of that many tokens; {n} now)",
        "{input_length} and {context_length} with it",
        "or make room for it: quantized weights ({quantize}) or more GPUs ({tensor_parallel})",
        sep=", ",
    )
    return Finding(
        RULE.id,
        "critical",
        f"Warm-up: not enough memory for {n} prefill tokens (a budget check, not a CUDA OOM)",
        explanation=(
            f"{server_name(d)}'s warm-up runs one prefill batch of --max-batch-prefill-tokens ({n}) tokens to "
            "size the KV cache, and found the memory left after the weights too small for it: a budget check, "
            "not a CUDA allocation failure. The server stops (the router's warm-up fails, the launcher shuts "
            "the shards down)."
        ),
        fix=fix + ".",
        evidence=first_evidence(evs),
    )


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("kv_budget_error")
    if not evs:
        return []
    e = evs[0]
    reason = e.data.get("reason", "")
    if reason == "tgi_prefill_tokens":
        return [_tgi_prefill(d, evs)]
    if reason == "free_memory_below_utilization":
        return [_free_below_finding(d, evs)]
    expl = _budget_explanation(d, e, reason)
    fits = _fitting_len(e)
    high = high_fraction_multimodal(d)
    graph = _graph_cause(d) if reason == "no_memory_for_cache_blocks" else None
    if graph is not None:
        return [_graph_finding(d, evs, expl, reason, graph)]
    if reason == "max_seq_len_exceeds_kv_cache" and d.server != "sglang" and fits is not None:
        fix = _fitting_len_fix(d, e, fits, high)
    elif high:
        fix = _high_share_fix(d, reason, high)
    else:
        fix = _budget_fix(d)
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


def _free_below_finding(d: Diagnosis, evs: list[LogEvent]) -> Finding:
    """The finding for vLLM's start-up check (free memory below its share), worst GPU first."""
    title, expl, fix = _free_below(d, evs)
    expl += " This is a budget check, not a CUDA allocation failure."
    # the worst GPU's line first (lowest free/total), whatever rank printed it first
    worst_first = sorted(
        evs,
        key=lambda x: (
            (x.data.get("free_mib") or 0.0) / (x.data.get("total_mib") or 1.0)
            if x.data.get("total_mib")
            else 2.0
        ),
    )
    return Finding(
        RULE.id,
        "critical",
        title,
        fix=fix,
        explanation=expl,
        evidence=first_evidence(worst_first),
    )


def _budget_explanation(d: Diagnosis, e: LogEvent, reason: str) -> str:
    """The explanation of a budget error: why the server refused to start, with the figures."""
    expl = f"The server refused to start: {REASONS.get(reason, 'the KV cache does not fit')}."
    if reason == "max_seq_len_exceeds_kv_cache" and "kv_cache_tokens" in e.data:
        expl += f" Max model length {e.data['max_seq_len']} tokens, the KV cache holds {e.data['kv_cache_tokens']}."
    elif reason == "max_seq_len_exceeds_kv_cache":
        expl += f" Needed {mib(e.data.get('needed_mib'))}, available {mib(e.data.get('available_mib'))}."
    if d.facts.weights_mib:
        expl += f" Weights take {mib(d.facts.weights_mib)}."
    expl += " This is a budget check, not a CUDA allocation failure."
    return expl


def _graph_finding(
    d: Diagnosis, evs: list[LogEvent], expl: str, reason: str, graph: tuple[str, str, str]
) -> Finding:
    """The finding when vLLM's CUDA-graph estimate is what left no memory for the KV cache."""
    return Finding(
        RULE.id,
        "critical",
        "KV cache does not fit the memory budget: the CUDA-graph estimate took it",
        fix=graph[1],
        explanation=expl.replace(REASONS[reason], "nothing is left for KV blocks") + graph[0],
        evidence=[
            *first_evidence(evs),
            *(
                [d.facts.evidence["cuda_graph_estimate_mib"]]
                if "cuda_graph_estimate_mib" in d.facts.evidence
                else []
            ),
        ],
        derived=[graph[2]],
    )


def _fitting_len_fix(
    d: Diagnosis, e: LogEvent, fits: int, high: tuple[str, float, float] | None
) -> str:
    """The fix that sets vLLM's own figure for the max-model-len the KV cache holds."""
    # vLLM names the length that fits: the lever that needs no other change
    fix = (
        f"Set --max-model-len {fits} or lower (vLLM's own figure for what the available KV cache holds; "
        f"the log asks for {e.data.get('max_seq_len', '?')}); "
    )
    if high:
        fix += (
            f"do not raise {high[0]} ({high[1]:g}): it already leaves a multimodal model little room for "
            f"its encoder (see mem-fraction-high-multimodal), so lowering it to {high[2]:g} or less trades "
            "KV cache for encoder headroom and needs a still shorter --max-model-len"
            + _len_at(d, e, high[1], high[2])
            + ". For longer contexts: --kv-cache-dtype fp8, more GPUs (--tensor-parallel-size) or a "
            "quantized model."
        )
    else:
        fix += (
            "for longer contexts raise --gpu-memory-utilization if nothing else uses the GPU, or use "
            "--kv-cache-dtype fp8, more GPUs (--tensor-parallel-size) or a quantized model; "
            "--cpu-offload-gb moves weights but costs speed."
        )
    return fix


def _high_share_fix(d: Diagnosis, reason: str, high: tuple[str, float, float]) -> str:
    """The fix when the memory share is already high for a multimodal model (never raise it)."""
    # another finding advises lowering the share: never advise raising it here
    lever = (
        "Lower --max-model-len"
        if reason == "max_seq_len_exceeds_kv_cache"
        else "Lower what the profiling run takes outside the KV cache (--max-num-batched-tokens, "
        "--max-num-seqs)"
    )
    v = words(d)
    return (
        v.say(
            f"Use more GPUs ({{tensor_parallel}}) or a quantized model; do not raise {{memory_share}} "
            f"({high[1]:g}, already high for a multimodal model: see mem-fraction-high-multimodal)."
        )
        if d.server == "sglang"
        else v.say(
            f"{lever}; do not raise {{memory_share}} ({high[1]:g}, already high for a multimodal model: "
            "see mem-fraction-high-multimodal); use {kv_dtype}, more GPUs ({tensor_parallel}) or a "
            "quantized model."
        )
    ) or _MORE_GPUS


def _budget_fix(d: Diagnosis) -> str:
    """The usual fix for a KV cache that does not fit (a larger share, fewer tokens, more GPUs)."""
    v = words(d)
    return (
        v.first(
            "Raise {memory_share}, lower {context_length}, use {kv_dtype}, more GPUs ({tensor_parallel}) or a "
            "quantized model; {cpu_offload} moves weights but costs speed.",
        )
        if d.server == "vllm"
        else v.first(
            "Raise {memory_share} (if nothing else uses the GPU), use more GPUs ({tensor_parallel}) or a "
            "quantized model.",
            "Raise {kv_share} if nothing else uses the GPU, lower {context_length}, or use more GPUs "
            "({tensor_parallel}) or quantized weights.",
        )
    ) or _MORE_GPUS


RULE = Rule(
    id="kv-budget-error",
    severity="critical",
    title="KV cache budget error (not a CUDA OOM)",
    fires_when=(
        "vLLM 'No available memory for the cache blocks', V0 'The model's max seq len (N) is larger than the "
        "maximum number of tokens that can be stored in KV cache (M)', V1 '... max seq len (N), (X GiB KV cache is needed, "
        "which is larger than the available KV cache memory', 'Free memory on device [cuda:N ](F/T GiB) on startup "
        "is less than desired GPU memory utilization (U, R GiB)' on every rank that printed it (used memory up to "
        "1 GiB per CUDA context is the server's own: then the utilization is too high for free/total; beyond "
        "what the server's contexts explain another process holds it); SGLang "
        "'Not enough memory. Please try to increase --mem-fraction-static'"
    ),
    fix=(
        "raise the memory fraction/utilization, lower max model length, fp8 KV cache, more GPUs; for the free-memory "
        "check: find and stop the process holding the GPU, or a utilization below the lowest free/total of all "
        "failing GPUs"
    ),
    check=check,
)
