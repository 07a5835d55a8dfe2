"""The KV cache gets less memory than configured, or none: weights + activations + graphs take it.

Two servers' lines (format strings in vramdoctor/diagnose/patterns.py):
- SGLang model_runner.py (0.1-0.5.x; `_apply_token_constraints` from 0.5.18): "max_total_tokens=N is
  larger than the profiled value M. Use the profiled value instead." M <= 0: the weights (and the
  activation reserve) leave nothing for the KV cache under --mem-fraction-static; the server then
  fails with "Not enough memory" (or a draft model's pool is sized otherwise).
- vLLM gpu_worker.py (0.11+): "... Desired GPU memory utilization is (U, R GiB). Actual usage is ...
  Replace gpu_memory_utilization config with --kv-cache-memory=N (X GiB) to fit into requested
  memory ..." with N < 0: what the engine actually uses besides the KV cache already exceeds the
  share U asks for; "Available KV cache memory: -X GiB" says the same before the cache is sized.
"""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding, LogEvent
from vramdoctor.diagnose.levers import Vocab
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import (
    first_evidence,
    high_fraction_multimodal,
    mib,
    words,
)


def _share_fix(d: Diagnosis, raising: str, without: str) -> str:
    """`raising` (a fix that starts by raising the memory share), or `without` plus why not when the
    mem-fraction-high-multimodal finding advises lowering that share (one direction per diagnosis)."""
    high = high_fraction_multimodal(d)
    if high is None:
        return raising
    return (
        f"{without} Do not raise {high[0]} ({high[1]:g}): it is already high for a multimodal model (see "
        "mem-fraction-high-multimodal)."
    )


# TensorRT-LLM: the KV cache gets a share of what is free after the engine and its runtime buffers
# ("Memory usage when calculating max tokens in paged kv cache: total: T GiB, available: A GiB"); under this
# much, or this share of the GPU, the pool holds only a few requests.
TRT_SMALL_KV_MIB = 1024.0
TRT_SMALL_KV_SHARE = 0.05


def _trtllm_small_kv(d: Diagnosis) -> Finding | None:
    f = d.facts
    avail, total = f.kv_available_mib, f.total_gpu_mib
    if d.server != "trtllm" or avail is None or total is None:
        return None
    if avail >= TRT_SMALL_KV_MIB and avail >= TRT_SMALL_KV_SHARE * total:
        return None
    v = words(d)
    blocks = f" ({f.gpu_blocks} KV blocks)" if f.gpu_blocks is not None else ""
    ev = [e for e in (f.evidence.get("kv_available_mib"), f.evidence.get("gpu_blocks")) if e]
    return Finding(
        RULE.id,
        "warning",
        f"TensorRT-LLM left {mib(avail)} of {mib(total)} for the KV cache after loading the engine",
        explanation=(
            f"After the engine and its runtime buffers, {mib(avail)} of the GPU's {mib(total)} was free for "
            f"the KV cache{blocks}: it holds only a few short requests. kv_cache_free_gpu_mem_fraction is a "
            "share of what is free, so raising it cannot make room: the engine's own buffers (sized at build "
            "time for its batch and sequence limits) take the memory."
        ),
        fix=v.join(
            "Rebuild the engine with a smaller {max_running}, {prefill_chunk} or {context_length} (the runtime "
            "buffers are sized for them)",
            "or spread it over more GPUs ({tensor_parallel})",
            sep=", ",
        )
        + ".",
        evidence=ev,
        derived=[f"{mib(avail)} free for KV / {mib(total)} total = {avail / total:.1%}"],
    )


_MORE_GPUS = "Spread the weights over more GPUs or serve a quantized checkpoint."


def check(d: Diagnosis) -> list[Finding]:
    v = words(d)
    out: list[Finding] = []
    neg = d.events_of("kv_budget_negative")
    sgl = [e for e in neg if e.data.get("reason") == "sglang_profiled_tokens_negative"]
    vll = [
        e
        for e in neg
        if e.data.get("reason") in ("vllm_kv_cache_memory_negative", "vllm_available_kv_negative")
    ]
    if sgl:
        out.append(_sglang_negative(d, v, sgl))
    if vll:
        out.append(_vllm_negative(d, v, vll))
    trt = _trtllm_small_kv(d)
    if trt is not None:
        out.append(trt)
    capped = d.events_of("kv_budget_capped")
    if capped and not sgl:
        out.append(_capped(d, v, capped))
    return out


def _sglang_negative(d: Diagnosis, v: Vocab, sgl: list[LogEvent]) -> Finding:
    """The finding for SGLang's negative profiled KV budget (the weights leave no KV cache)."""
    e = sgl[0]
    frac = d.facts.mem_fraction_static
    weights = f" The weights take {mib(d.facts.weights_mib)}." if d.facts.weights_mib else ""
    return Finding(
        RULE.id,
        "critical",
        "The weights leave no memory for the KV cache (negative profiled budget)",
        explanation=(
            f"SGLang profiled room for {e.data['profiled_tokens']} KV tokens (asked for "
            f"max_total_tokens={e.data['max_total_tokens']}): a negative budget means the weights and the "
            f"activation reserve already exceed the static share"
            + (f" mem_fraction_static={frac:g}" if frac is not None else "")
            + " of this GPU, so there is no KV cache at all; the server fails with 'Not enough memory' "
            "(a speculative draft model's pool may be sized separately)." + weights
        ),
        fix=_share_fix(
            d,
            v.say(
                "Raise {memory_share} if nothing else uses the GPU, spread the weights over more GPUs "
                "(a larger {tensor_parallel}), or serve a quantized checkpoint (e.g. {quantize} fp8)."
            )
            or _MORE_GPUS,
            v.say(
                "Spread the weights over more GPUs (a larger {tensor_parallel}) or serve a quantized "
                "checkpoint (e.g. {quantize} fp8)."
            )
            or _MORE_GPUS,
        ),
        evidence=first_evidence(sgl),
    )


def _vllm_negative(d: Diagnosis, v: Vocab, vll: list[LogEvent]) -> Finding:
    """The finding for vLLM's negative KV cache memory (the engine exceeds its configured share)."""
    e = vll[0]
    kv = e.data.get("kv_cache_memory_mib")
    util = e.data.get("gpu_memory_utilization") or d.facts.gpu_memory_utilization
    share = f"gpu_memory_utilization={util:g}" if util else "the configured gpu_memory_utilization"
    if e.data.get("reason") == "vllm_available_kv_negative":
        expl = (
            f"vLLM profiled the memory left for the KV cache at {share}: {mib(kv)} (negative). Weights + peak "
            "activation + CUDA graphs already take more than the share asked for, so no KV cache fits."
        )
    else:
        expl = (
            f"vLLM measured its real use after start-up: at {share} ({mib(e.data.get('requested_mib'))}) "
            f"the KV cache that would fit is {mib(kv)} (negative), so weights + peak activation + CUDA "
            "graphs already take more than the share asked for; the engine runs beyond its budget and "
            "the headroom the share was meant to leave is gone."
        )
    return Finding(
        RULE.id,
        "warning",
        "Weights, activations and CUDA graphs exceed the configured GPU share",
        explanation=expl,
        fix=_share_fix(
            d,
            v.first(
                "Raise {memory_share} if the GPU is not shared, or lower what sits outside the KV cache: "
                "{prefill_chunk} (activations), {graph_batch} (CUDA graphs), a quantized checkpoint or a "
                "larger {tensor_parallel} (weights).",
                "Raise {memory_share} if the GPU is not shared, or lower what sits outside the KV cache: "
                "{prefill_chunk} (activations), {max_running} or the capture sizes (CUDA graphs), a "
                "quantized checkpoint or a larger {tensor_parallel} (weights)"
                + (
                    "; or size the cache directly with --kv-cache-memory."
                    if d.server == "vllm"
                    else "."
                ),
            )
            or _MORE_GPUS,
            v.first(
                "Lower what sits outside the KV cache: {prefill_chunk} (activations), {graph_batch} (CUDA "
                "graphs), a quantized checkpoint or a larger {tensor_parallel} (weights).",
                "Lower what sits outside the KV cache: {prefill_chunk} (activations), {max_running} or the "
                "capture sizes (CUDA graphs), a quantized checkpoint or a larger {tensor_parallel} (weights).",
            )
            or _MORE_GPUS,
        ),
        evidence=first_evidence(vll),
    )


def _capped(d: Diagnosis, v: Vocab, capped: list[LogEvent]) -> Finding:
    """The finding for SGLang capping --max-total-tokens to the profiled value (info)."""
    e = capped[0]
    return Finding(
        RULE.id,
        "info",
        f"max_total_tokens capped to the profiled {e.data['profiled_tokens']} tokens",
        explanation=(
            f"--max-total-tokens={e.data['max_total_tokens']} asked for more KV tokens than the memory "
            f"share holds; SGLang uses the profiled {e.data['profiled_tokens']} instead."
        ),
        fix=_share_fix(
            d,
            v.first(
                "Lower {kv_size} to the profiled value, or raise {memory_share} if there is headroom.",
                "Raise {memory_share} if there is headroom, or lower {context_length}.",
            )
            or _MORE_GPUS,
            v.first("Lower {kv_size} to the profiled value.", "Lower {context_length}.")
            or _MORE_GPUS,
        ),
        evidence=first_evidence(capped, 1),
    )


RULE = Rule(
    id="kv-budget-shortfall",
    severity="critical",
    title="KV cache budget below what was configured (negative or capped)",
    fires_when=(
        "SGLang 'max_total_tokens=N is larger than the profiled value M' (critical when M <= 0: the weights leave "
        "no memory for the KV cache; info otherwise); vLLM 'Desired GPU memory utilization is (U, R GiB) ... "
        "--kv-cache-memory=N' with N < 0, or 'Available KV cache memory: -X GiB' (warning)"
    ),
    fix=(
        "SGLang: --mem-fraction-static, a larger --tp-size, quantisation; vLLM: --gpu-memory-utilization, fewer "
        "activations/graphs, quantisation or a larger --tensor-parallel-size, or --kv-cache-memory"
    ),
    check=check,
)
