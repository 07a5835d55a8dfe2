"""A CUDA out-of-memory error: where it hit, how much was asked and free, and the fix there."""

from __future__ import annotations

from ..model import Diagnosis, Event, Facts, Finding
from . import Rule
from ._common import first_evidence, mib

SMALL_PROCESS_MIB = 4096.0  # a process this small next to the server is a context or side work

PHASE_NAMES = {
    "weight_load": "while loading the weights",
    "kv_cache_alloc": "while allocating the KV cache",
    "cuda_graph": "during CUDA graph capture",
    "profiling": "during the memory-profiling run",
    "mm_profiling": "during the multimodal profiling run",
    "warmup": "during warm-up",
    "prefill": "in a prefill (extend) forward pass",
    "decode": "in a decode forward pass",
    None: "at a point the traceback does not show",
}


def _fix(phase: str | None, server: str | None) -> str:
    sg = server != "vllm"
    frac = "--mem-fraction-static" if sg else "--gpu-memory-utilization"
    if phase == "weight_load":
        return (
            "The weights do not fit: use more GPUs (--tp-size / --tensor-parallel-size), a quantized "
            "checkpoint, or free the GPU from other processes; the memory fraction does not help here."
        )
    if phase == "kv_cache_alloc":
        return (
            f"Lower {frac} or --max-total-tokens / --max-model-len; on vLLM V0 also lower --swap-space "
            "(the CPU swap blocks are pinned host memory)."
        )
    if phase == "cuda_graph":
        return (
            "Graph capture runs outside the static pool: lower " + frac
            + (" or --cuda-graph-max-bs" if sg else ", --max-num-seqs or the capture sizes")
            + (" (or --disable-cuda-graph)" if sg else " (or --enforce-eager)") + "."
        )
    if phase in ("profiling", "mm_profiling"):
        return (
            "The profiling run's activations do not fit: lower --max-num-batched-tokens / --max-model-len, "
            "limit images per prompt (--limit-mm-per-prompt) and the encoder cache, or lower "
            "--gpu-memory-utilization if other processes share the GPU."
        )
    if phase in ("prefill", "warmup"):
        return (
            f"Activations outside the KV pool ran out: lower {frac} to leave headroom, lower "
            + ("--chunked-prefill-size and --max-prefill-tokens" if sg else "--max-num-batched-tokens")
            + ", or cap --context-length / input length; multimodal inputs also need encoder headroom."
        )
    if phase == "decode":
        return (
            f"Decode activations (logits for large batches) ran out: lower {frac}, "
            + ("--max-running-requests or --cuda-graph-max-bs" if sg else "--max-num-seqs")
            + "."
        )
    return f"Lower {frac} to leave headroom and check the settings listed; see the traceback for the phase."


def _budget(f: Facts) -> str:
    parts = []
    for name in (
        "mem_fraction_static", "gpu_memory_utilization", "max_total_tokens", "cuda_graph_max_bs",
        "chunked_prefill_size", "max_running_requests", "context_length", "max_model_len", "tp_size",
    ):
        v = getattr(f, name)
        if v is not None:
            parts.append(f"{name}={v}")
    return ", ".join(parts) if parts else "not shown in the log"


def _figures(e: Event) -> str:
    d = e.data
    bits = []
    if "requested_mib" in d:
        bits.append(f"asked for {mib(d['requested_mib'])}")
    if "free_mib" in d:
        bits.append(f"{mib(d['free_mib'])} free of {mib(d.get('total_mib'))} on GPU {d.get('gpu')}")
    if "this_process_mib" in d:
        bits.append(f"this process held {mib(d['this_process_mib'])}")
    for p in d.get("processes", []):
        bits.append(f"process {p['pid']} held {mib(p['mib'])}")
    if "private_pools_mib" in d:
        bits.append(f"{mib(d['private_pools_mib'])} in private pools (CUDA graphs)")
    if "reserved_unallocated_mib" in d:
        bits.append(f"{mib(d['reserved_unallocated_mib'])} reserved but unallocated (fragmentation)")
    return "; ".join(bits) if bits else "figures cut off in the log"


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("cuda_oom")
    if not evs:
        return []
    by_phase: dict[str | None, list[Event]] = {}
    for e in evs:
        by_phase.setdefault(e.phase, []).append(e)
    if len(by_phase) > 1:
        by_phase.pop(None, None)  # an unplaced copy of a placed error adds nothing
    total = d.event_counts.get("cuda_oom", len(evs))
    out = []
    for phase, group in by_phase.items():
        first = next((e for e in group if e.data.get("free_mib") is not None), group[0])
        others = [p for e in group for p in e.data.get("processes", [])]
        expl = (
            f"CUDA out of memory {PHASE_NAMES.get(phase, phase)} ({len(group)} of {total} OOM line(s)); "
            f"{_figures(first)}. Budget settings in the log: {_budget(d.facts)}."
        )
        reserved = first.data.get("reserved_unallocated_mib")
        if reserved and reserved > 1024:
            expl += " Much memory is reserved but unallocated: fragmentation; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps."
        named_other = others and (first.data.get("this_process_mib") is not None or len(others) > 1)
        procs = first.data.get("processes", [])
        small = [p for p in procs if p["mib"] is not None and p["mib"] < SMALL_PROCESS_MIB]
        if len(procs) > 1 and small:
            listed = ", ".join(f"{p['pid']} ({mib(p['mib'])})" for p in small[:6])
            expl += (
                f" {len(procs)} processes hold memory on GPU {first.data.get('gpu')}; the small ones "
                f"({listed}) are extra CUDA contexts or side work on this GPU: other TP ranks opening "
                "CUDA IPC handles here, the tokenizer process running a GPU image processor, or another "
                "program. They shrink what the server budgeted for."
            )
        if len(procs) > 1 and d.server == "sglang" and d.facts.multimodal and d.facts.fast_image_processor:
            least = min(procs, key=lambda p: p["mib"] or 0)
            expl += (
                f" With the fast image processor on, process {least['pid']} ({mib(least['mib'])}) next to the "
                "server is the first suspect: the tokenizer process preprocessing images on this GPU "
                "(see sglang-fast-image-processor)."
            )
        if named_other and phase in ("cuda_graph", "profiling", "mm_profiling", "kv_cache_alloc"):
            expl += " Another process holds memory on this GPU that the startup budget did not leave room for."
        out.append(
            Finding(
                id=RULE.id,
                severity="critical",
                title=f"CUDA out of memory {PHASE_NAMES.get(phase, phase)}",
                evidence=first_evidence(group),
                explanation=expl,
                fix=_fix(phase, d.server)
                + " Run `vramdoctor census` to see every process's memory on each GPU, and"
                " `vramdoctor soak` to tell steady growth (leak) from a one-off peak.",
            )
        )
    return out


RULE = Rule(
    id="cuda-oom",
    severity="critical",
    title="CUDA out of memory",
    fires_when=(
        "torch.OutOfMemoryError / 'CUDA out of memory' / 'CUDA error: out of memory' (any case, incl. "
        "flashinfer's 'CUDA Error: out of memory (2)'); phase from the traceback (weight load, KV "
        "allocation, CUDA graph capture, profiling, warm-up, prefill, decode)"
    ),
    fix="phase-specific: more GPUs or quantization at load; lower mem fraction / graph batch size / chunked prefill / running requests later",
    check=check,
)
