"""A GPU out-of-memory error: where it hit, how much was asked and free, the cause, and the fix there.

The finding is built in named steps (`check` -> `_finding` per phase): the figures the message
carries, the causes read around it that change the lever (a request smaller than the free memory:
fragmentation or a per-allocation limit, not the budget; one allocation larger than the device;
a per-process memory fraction; an allocation out of all proportion to the step; the first rank to
fail; the server's own processes in the message), then the fix for the phase in the diagnosed
server's own levers on its platform (levers.py): a server or platform without a lever is never
told about it.
"""

from __future__ import annotations

import re
from typing import Any

from vramdoctor.diagnose.findings import Diagnosis, Evidence, Facts, Finding, LogEvent
from vramdoctor.diagnose.levers import Vocab, platform_tool
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, mib, words

SMALL_PROCESS_MIB = 4096.0  # a process this small next to the server is a context or side work
# One allocation this share of the device in a forward step is out of all proportion to a batch's
# activations: a code path that materialises a whole cache or sequence (a bug), not the budget.
OUTSIZED_SHARE = 0.25

PHASE_NAMES = {
    "weight_load": "while loading the weights",
    "kv_cache_alloc": "while allocating the KV cache",
    "compute_buffer": "while allocating the compute buffers (sized by the context and batch)",
    "cuda_graph": "during CUDA graph capture",
    "profiling": "during the memory-profiling run",
    "mm_profiling": "during the multimodal profiling run",
    "warmup": "during warm-up",
    "prefill": "in a prefill (extend) forward pass",
    "decode": "in a decode forward pass",
    "startup": "while the server was starting (scheduler and model worker initialisation)",
    "distributed_init": (
        "while initialising the GPU worker and torch.distributed / NCCL at start-up (before any weights "
        "or KV cache)"
    ),
    "preprocessing": "during multimodal preprocessing (the image processor, before the model runs)",
    "serving": "while serving a batch of requests (the frames do not say prefill or decode)",
    None: "at a point the traceback does not show",
}
_CENSUS = (
    " Run `vramdoctor census` to see every process's memory on each GPU, and `vramdoctor soak` to "
    "tell steady growth (leak) from a one-off peak."
)


# --- the fix for each phase, in the server's levers -----------------------------------------


def _fix_distributed_init(v: Vocab, d: Diagnosis) -> str:
    holder = {"sglang": "sglang::scheduler", "vllm": "EngineCore / worker"}.get(
        d.server or "", "server process"
    )
    base = (
        " (and --base-gpu-id)"
        if d.server == "sglang"
        else ("" if d.server else " (and the server's base GPU setting)")
    )
    ranks = v("tensor_parallel") or "tensor-parallel"
    share = v("memory_share") or "The memory share"
    return (
        f"Find what already holds the GPUs before the server starts: `{v.say('{smi}')}` or `vramdoctor census` "
        f"(a leftover server from an earlier run, e.g. a zombie {holder}, a notebook or another tenant) and "
        f"stop it; check that CUDA_VISIBLE_DEVICES{base} gives each of the {ranks} ranks its own GPU (two "
        f"ranks mapped to one GPU fill it twice). {share} cannot help: the server had not reserved any of "
        "its share yet."
    )


def _fix_preprocessing(v: Vocab, d: Diagnosis) -> str:
    if d.server == "sglang":
        return (
            "Move image preprocessing off the GPU: --disable-fast-image-processor (from 0.5.18: "
            "--image-processor-backend pil; the version has one of the two), at some CPU cost per image; or "
            "upgrade to SGLang >= 0.5.19 (request-scoped pool for the fast processor's scratch); cap image "
            "size/count per request."
        )
    if d.server == "vllm":
        return (
            v.say(
                "Keep the multimodal processor on the CPU (drop a device='cuda' from --mm-processor-kwargs) and cap "
                "images per request ({mm_limits}) and their size ({mm_pixels})."
            )
            or ""
        )
    if d.server is None:
        return (
            "Move image preprocessing to the CPU (SGLang: --disable-fast-image-processor / "
            "--image-processor-backend pil, or SGLang >= 0.5.19; vLLM: no device='cuda' in "
            "--mm-processor-kwargs) and cap image size/count per request."
        )
    return "Move image preprocessing to the CPU and cap image size/count per request."


def _fix_weight_load(v: Vocab, d: Diagnosis) -> str:
    more = v.join(
        "use more GPUs ({tensor_parallel})", "fewer layers on the GPU ({gpu_layers})", sep=" or "
    )
    quant = "a quantized checkpoint" if v.has("quantize") or d.server is None else ""
    if quant and d.server not in ("sglang", "vllm", None):
        quant = f"quantized weights ({v('quantize')})"  # the other servers' own way to load them
    parts = [p for p in (more, quant, "or free the GPU from other processes") if p]
    share = (
        "; the memory fraction does not help here."
        if v.has("memory_share") or d.server is None
        else "."
    )
    return "The weights do not fit: " + ", ".join(parts) + share


def _fix_kv_cache_alloc(v: Vocab, d: Diagnosis) -> str:
    if d.server in ("llamacpp", "ollama"):
        return (
            v.first(
                "The KV cache for the context does not fit next to the weights: lower {context_length}, put "
                "fewer layers on the GPU ({gpu_layers}), or quantize the KV cache ({kv_dtype})."
            )
            or "Lower the context length or put fewer layers on the GPU."
        )
    fix = (
        v.first(
            "Lower {memory_share} or {kv_size}.",
            "Lower {memory_share} or {context_length}",
            "Lower {kv_share} or {context_length}.",
        )
        or "Lower the KV cache size or the context length."
    )
    if d.server == "vllm":
        fix += (
            v.say("; on vLLM V0 also lower {swap} (the CPU swap blocks are pinned host memory).")
            or "."
        )
    elif not fix.endswith("."):
        fix += "."
    return fix


def _fix_compute_buffer(v: Vocab, d: Diagnosis) -> str:
    f = d.facts
    copies = ""
    if f.pipeline_copies and f.pipeline_copies > 1:
        # llama.cpp's "pipeline parallelism enabled (n_copies=N)": N copies of the compute buffers
        copies = (
            v.say(
                f" Pipeline parallelism keeps {f.pipeline_copies} copies of the compute buffers (the log's "
                "n_copies): a smaller {compute_batch} shrinks each, and a build with GGML_SCHED_MAX_COPIES=1 "
                "turns the copies off."
            )
            or ""
        )
    if f.context_length is not None and f.context_length <= 4096:
        # the context is already short: the weights fill the GPU, the layers are the lever
        return (
            v.first(
                f"The context is already short ({f.context_length} tokens): the weights leave the compute "
                "buffer no room. Put fewer layers on the GPU ({gpu_layers}) first, or use a smaller "
                "quantization; a smaller {compute_batch} helps a little."
            )
            or "Put fewer layers on the GPU."
        ) + copies
    return (
        v.first(
            "The compute buffer grows with the context and the batch: lower {context_length} to what you serve "
            "and {compute_batch}; or put fewer layers on the GPU ({gpu_layers}) to make room."
        )
        or "Lower the context length and the batch size."
    ) + copies


def _fix_startup(v: Vocab, d: Diagnosis) -> str:
    if d.server == "sglang":
        return (
            v.say(
                "The scheduler ran out while starting (weights, KV pool, graphs): lower {memory_share}, "
                "{graph_batch} or {max_running}; if the weights alone do not fit, use more GPUs "
                "({tensor_parallel}) or a quantized checkpoint."
            )
            or ""
        )
    if d.server == "trtllm":
        return (
            v.join(
                "The engine's runtime buffers and the KV cache did not fit next to the engine: lower {kv_share} "
                "(the KV cache takes that share of the memory free after the engine)",
                "or rebuild the engine with a smaller {max_running} and {input_length} (the runtime buffers are "
                "sized for them)",
                sep=", ",
            )
            + "."
        )
    return (
        v.first(
            "The engine ran out while starting: lower {memory_share}, {context_length} or {max_running}; if the "
            "weights alone do not fit, use more GPUs ({tensor_parallel}) or a quantized checkpoint.",
            "The server ran out while starting: lower {kv_share} or {context_length}; if the weights alone do not "
            "fit, use more GPUs ({tensor_parallel}) or a quantized checkpoint.",
        )
        or "The server ran out while starting: lower its KV cache share or context length."
    )


def _fix_cuda_graph(v: Vocab, d: Diagnosis) -> str:
    if d.server == "sglang":
        return (
            v.say(
                "Graph capture runs outside the static pool: lower {memory_share} or {graph_batch} (or {graph_off})."
            )
            or ""
        )
    return (
        v.first(
            "Graph capture runs outside the KV budget: lower {memory_share}, {max_running} or the capture sizes "
            "(or {graph_off}).",
            "Capture fewer CUDA graphs ({graph_off}).",
        )
        or "Capture fewer CUDA graphs."
    )


def _fix_sampler(v: Vocab, d: Diagnosis) -> str:
    if d.server == "sglang":
        return v.say("Warm-up sampling ran out: lower {max_running} or {memory_share}.") or ""
    max_seqs = d.facts.max_running_requests
    if d.server == "vllm" and max_seqs is not None and max_seqs <= 8:
        # vLLM's own message names max_num_seqs, but it is already small: the share is the lever
        return (
            f"The sampler warm-up (logits for {max_seqs} dummy request(s), --max-num-seqs {max_seqs} already) "
            "ran out after the budget was spent: lower --gpu-memory-utilization to leave headroom outside "
            "the KV cache."
        )
    return (
        v.first(
            "The sampler warm-up (logits for {max_running} dummy requests) ran out: lower {max_running}, as "
            "vLLM's own message says, or lower {memory_share}."
        )
        or "The sampler warm-up ran out: lower the batch size or the memory share."
    )


def _fix_profiling(v: Vocab, d: Diagnosis) -> str:
    if d.server == "sglang":
        return (
            v.say(
                "The profiling pass's activations do not fit: lower {memory_share}, {prefill_chunk} or {batch_tokens}."
            )
            or ""
        )
    return (
        v.first(
            "The profiling run's activations do not fit: lower {prefill_chunk} / {context_length}, limit images "
            "per prompt ({mm_limits}) and the encoder cache, or lower {memory_share} if other processes share "
            "the GPU.",
            "The profiling run's activations do not fit: lower {prefill_chunk} or {context_length}.",
        )
        or "The profiling run's activations do not fit: lower the batch or context length."
    )


def _fix_warmup(v: Vocab, d: Diagnosis) -> str:
    if d.server == "sglang":
        return (
            v.say("Warm-up runs outside the static pool: lower {memory_share} or {graph_batch}.")
            or ""
        )
    if d.server == "tgi":
        return (
            v.say(
                "Warm-up runs a batch of {prefill_chunk} tokens and sizes the KV cache from what is left: lower "
                "{prefill_chunk} and {context_length} (or {input_length}), or set {kv_size} explicitly."
            )
            or ""
        )
    return (
        v.first(
            "Warm-up runs outside the KV budget: lower {memory_share}, {max_running} or {prefill_chunk}.",
            "Warm-up ran out: lower {prefill_chunk} or {context_length}.",
        )
        or "Warm-up ran out: lower the batch or context length."
    )


def _fix_mm_prefill(v: Vocab, d: Diagnosis) -> str:
    if d.server == "sglang":
        return (
            v.say(
                "The vision encoder's activations for this request did not fit next to the static pool: lower "
                "{memory_share} to leave encoder headroom and {prefill_chunk}; cap image size/count per request."
            )
            or ""
        )
    return (
        v.first(
            "The vision encoder's activations for this request did not fit next to the KV cache: lower "
            "{memory_share} to leave encoder headroom, cap images per request ({mm_limits}) and their size "
            "({mm_pixels}), and lower {prefill_chunk}."
        )
        or "The vision encoder's activations did not fit: cap image size and count per request."
    )


def _fix_prefill(v: Vocab, d: Diagnosis) -> str:
    if d.server == "tgi":
        return (
            v.say(
                "A prefill batch ran out after warm-up sized the KV cache from the memory left: set "
                "{prefill_chunk} and {kv_size} lower explicitly, or {memory_share} below 1.0 to leave headroom."
            )
            or ""
        )
    head = v.say(
        "Activations outside the KV pool ran out: lower {memory_share} to leave headroom, lower "
    )
    if head is None:
        return (
            v.first(
                "Activations outside the KV cache ran out: lower {prefill_chunk} or {context_length}."
            )
            or "Activations ran out: lower the prefill batch or the context length."
        )
    if d.server == "sglang":
        tail = v.say("{prefill_chunk} and {batch_tokens}, or cap {context_length}") or ""
    elif d.server == "vllm":
        tail = v.say("{prefill_chunk}, or cap {context_length}") or ""
    else:
        tail = v.say("{prefill_chunk} and {batch_tokens}, or cap {context_length}") or ""
        tail = tail.replace(" (SGLang) / ", " (SGLang) / ")  # both servers' flags, labelled
    return head + tail + " / input length; multimodal inputs also need encoder headroom."


def _fix_serving(v: Vocab, d: Diagnosis) -> str:
    if d.server == "sglang":
        return (
            v.say(
                "A forward pass of a request batch ran out next to the static pool: lower {memory_share} to leave "
                "headroom, and {prefill_chunk} (prefill chunks) or {max_running} / {graph_batch} (decode batches)."
            )
            or ""
        )
    return (
        v.first(
            "A forward pass of a request batch ran out next to the KV cache: lower {memory_share} to leave "
            "headroom, and {prefill_chunk} (prefill chunks) or {max_running} (decode batches).",
            "A forward pass ran out: lower {prefill_chunk} or {max_running}.",
        )
        or "A forward pass ran out: lower the batch size."
    )


def _fix_decode(v: Vocab, d: Diagnosis) -> str:
    batch = v.say("{max_running} or {graph_batch}") if d.server == "sglang" else v("max_running")
    return (
        v.first(
            "Decode activations (logits for large batches) ran out: lower {memory_share}, "
            + (batch or "")
            + ".",
            "Decode activations ran out: lower {max_running} or {kv_size}.",
        )
        or "Decode activations ran out: lower the batch size."
    )


def _fix_unplaced(v: Vocab, d: Diagnosis) -> str:
    if d.server in ("llamacpp", "ollama"):
        return (
            v.first(
                "Put fewer layers on the GPU ({gpu_layers}) or lower {context_length}; a smaller quantization "
                "needs less memory for the weights."
            )
            or "Put fewer layers on the GPU or lower the context length."
        )
    return (
        v.first(
            "Lower {memory_share} to leave headroom and check the settings listed; the traceback does not show "
            "the phase.",
            "Lower {kv_share} to leave headroom; the log does not show where it ran out.",
            "Lower {context_length} or {max_running}; the log does not show where it ran out.",
        )
        or "The log does not show where it ran out; lower the server's batch or context settings."
    )


_FIXES = {
    "distributed_init": _fix_distributed_init,
    "preprocessing": _fix_preprocessing,
    "weight_load": _fix_weight_load,
    "kv_cache_alloc": _fix_kv_cache_alloc,
    "compute_buffer": _fix_compute_buffer,
    "startup": _fix_startup,
    "cuda_graph": _fix_cuda_graph,
    "profiling": _fix_profiling,
    "mm_profiling": _fix_profiling,
    "warmup": _fix_warmup,
    "prefill": _fix_prefill,
    "serving": _fix_serving,
    "decode": _fix_decode,
}


def _fix(phase: str | None, d: Diagnosis, e: LogEvent) -> str:
    """The fix for an OOM in this phase, in the server's own levers (both servers', labelled, when the
    server is unknown)."""
    v = words(d)
    if phase in ("warmup", "profiling", "mm_profiling") and e.data.get("sampler"):
        return _fix_sampler(v, d)
    if phase == "prefill" and e.data.get("multimodal_frames"):
        return _fix_mm_prefill(v, d)
    return _FIXES.get(phase or "", _fix_unplaced)(v, d)


# --- what the message shows -----------------------------------------------------------------


def _other_process(e: LogEvent) -> str | None:
    """Why this OOM message shows memory of a process other than the failing one, or None.

    torch lists every process NVML reports on the failing GPU: itself as "this process has X" when
    its pid matches, else as "Process P has X" (a container's pid namespace). One "Process P" line per
    GPU is then the failing rank itself, not another program. Another process is implied only when
    one message lists more than one process (at most one of them is the failing one), when it has
    "this process" and a "Process P" besides, or when the one listed holds less than PyTorch alone
    has reserved in the failing process (so it cannot be that process).
    """
    d = e.data
    # a pid the log's own process tags name is the server's own process (another rank's CUDA context)
    procs = [
        p
        for p in d.get("processes", [])
        if p.get("mib") is not None and not p.get("server_process")
    ]
    gpu = d.get("gpu")
    if procs and d.get("this_process_mib") is not None:
        return (
            f"{_gw(e)} {gpu} also holds memory of process(es) {', '.join(str(p['pid']) for p in procs[:6])} "
            f"next to the failing process ({mib(d['this_process_mib'])})"
        )
    if len(procs) > 1:
        return f"{len(procs)} processes hold memory on {_gw(e)} {gpu}; at most one of them is the failing process"
    if len(procs) == 1 and d.get("allocated_mib") is not None:
        own = d["allocated_mib"] + (d.get("reserved_unallocated_mib") or 0.0)
        if procs[0]["mib"] < own * 0.98 - 64:
            return (
                f"process {procs[0]['pid']} holds {mib(procs[0]['mib'])} on {_gw(e)} {gpu}, less than PyTorch "
                f"alone reserved in the failing process ({mib(own)}): it is another process"
            )
    return None


# vLLM's own names for the facts read from its max_num_seqs / tensor_parallel_size arguments
_VLLM_NAMES = {"max_running_requests": "max_num_seqs", "tp_size": "tensor_parallel_size"}


def _budget(f: Facts, server: str | None) -> str:
    """The sentence naming the budget settings the log prints (or that it prints none)."""
    parts = []
    for name in (
        "mem_fraction_static",
        "gpu_memory_utilization",
        "kv_share",
        "max_total_tokens",
        "cuda_graph_max_bs",
        "chunked_prefill_size",
        "max_running_requests",
        "context_length",
        "max_model_len",
        "tp_size",
    ):
        v = getattr(f, name)
        if v is not None:
            label = _VLLM_NAMES.get(name, name) if server == "vllm" else name
            if name == "tp_size" and f.tp_size_is_lower_bound:
                v = f"{v} (at least; from rank tags)"
            parts.append(f"{label}={v}")
    if not parts:
        return (
            "The log prints no budget setting (memory share, token or batch caps, context length)."
        )
    return f"Budget settings in the log: {', '.join(parts)}."


def _gw(e: LogEvent) -> str:
    """What the OOM message calls the device: "NPU" on Ascend (torch_npu), else "GPU"."""
    return "NPU" if e.data.get("device") == "NPU" else "GPU"


def _shown(e: LogEvent, name: str) -> str:
    """A figure as the log printed it ("12.95 GiB", "4480.00 MiB"), else formatted from MiB."""
    text = (e.data.get("shown") or {}).get(name)
    return str(text) if text else mib(e.data.get(f"{name}_mib"))


def _figures(e: LogEvent) -> str:
    d = e.data
    bits = []
    if "requested_mib" in d:
        bits.append(f"asked for {_shown(e, 'requested')}")
    if "free_mib" in d:
        on = f" on {_gw(e)} {d['gpu']}" if d.get("gpu") is not None else ""
        bits.append(f"{_shown(e, 'free')} free of {_shown(e, 'total')}{on}")
    elif "gpu" in d and "requested_mib" in d:
        bits.append(f"on {_gw(e)} {d['gpu']}")
    if d.get("allocator") == "cudaMallocAsync" and "allocated_mib" in d:
        bits.append(f"PyTorch had {mib(d['allocated_mib'])} allocated (cudaMallocAsync backend)")
    if "allowed_mib" in d:
        bits.append(f"PyTorch's per-process limit {mib(d['allowed_mib'])}")
    if "this_process_mib" in d:
        bits.append(f"this process held {mib(d['this_process_mib'])}")
    for p in d.get("processes", []):
        bits.append(f"process {p['pid']} held {mib(p['mib'])}")
    if "private_pools_mib" in d:
        bits.append(f"{mib(d['private_pools_mib'])} in private pools (CUDA graphs)")
    if "reserved_unallocated_mib" in d:
        bits.append(f"{_shown(e, 'reserved_unallocated')} reserved but unallocated")
    if bits:
        return "; ".join(bits)
    if "Tried to allocate" in e.text or "out of memory." in e.text:
        return "figures cut off in the log"  # torch's message, whose figures follow on its lines
    # NCCL's "Cuda failure 'out of memory'", the CUDA runtime's "CUDA error: out of memory": no figures
    return "this error format carries no figures"


def _own_processes(e: LogEvent) -> str:
    """The listed processes the log's own tags name (the server's other ranks), said as such."""
    own = [
        p
        for p in e.data.get("processes", [])
        if p.get("server_process") and p.get("pid") != e.data.get("pid")
    ]  # (the failing one is itself)
    if not own:
        return ""
    listed = ", ".join(f"{p['pid']} ({p['server_process']}, {mib(p['mib'])})" for p in own[:6])
    many = len(own) > 1
    how = "; ".join(
        dict.fromkeys(
            p.get("server_process_evidence") or f"the log's process tags name pid {p['pid']}"
            for p in own[:6]
        )
    )
    return (
        f" Process{'es' if many else ''} {listed} {'are' if many else 'is'} the server's own ({how}): another "
        f"rank's context on {_gw(e)} {e.data.get('gpu')} (NCCL, custom all-reduce, CUDA IPC), not another program."
    )


def _limit(e: LogEvent) -> tuple[str, str, bool]:
    """A per-process memory fraction below the GPU's memory (PyTorch's "X allowed;" or the
    cudaMallocAsync "PyTorch limit (set by user-supplied memory fraction)"): (explanation, fix, the limit
    alone refused it), or ("", "", False) when no such limit shows."""
    d = e.data
    allowed, total = d.get("allowed_mib"), d.get("total_mib")
    if allowed is None or total is None or allowed >= total:
        return "", "", False
    free, requested = d.get("free_mib"), d.get("requested_mib")
    alone = free is not None and requested is not None and free >= requested
    expl = (
        f" PyTorch's per-process limit was {mib(allowed)} of the GPU's {mib(total)}: a memory fraction set in "
        "the process (torch.cuda.set_per_process_memory_fraction), which PyTorch enforces on its own allocations."
    )
    if alone:
        expl += (
            f" The limit, not the GPU, refused the allocation: {mib(free)} was still free on the device, enough "
            f"for the {mib(requested)} asked."
        )
    elif free is not None:
        expl += f" The device itself was nearly full too ({mib(free)} free)."
    fix = (
        "Raise or remove the per-process memory fraction (torch.cuda.set_per_process_memory_fraction, called by "
        "the launcher, a plugin or a framework sharing the process), or make the server's share fit under it. "
    )
    return expl, fix, alone


def _device(e: LogEvent, d: Diagnosis) -> str:
    """The device the OOM message names (HIP on ROCm, NPU on Ascend), else the platform's."""
    if e.data.get("device"):
        return str(e.data["device"])
    return {"rocm": "HIP", "npu": "NPU"}.get(d.facts.platform or "", "CUDA")


def _title(phase: str | None, e: LogEvent, server: str | None = None) -> str:
    if phase == "prefill" and e.data.get("multimodal_frames"):
        return "in the prefill of a multimodal request (vision encoder or merging its embeddings)"
    if phase == "warmup" and e.data.get("sampler"):
        return "during the sampler warm-up"
    if phase in ("profiling", "mm_profiling") and e.data.get("sampler"):
        return PHASE_NAMES[phase] + " (sampler warm-up)"
    if phase == "startup" and server not in ("sglang", None):
        return "while the server was starting (its engine and runtime buffers)"
    return PHASE_NAMES.get(phase, str(phase))


_ALLOC_CONF = re.compile(r"(PYTORCH_\w*ALLOC_CONF)=expandable_segments")


def _alloc_conf(e: LogEvent, d: Diagnosis) -> str:
    """The allocator variable the OOM message itself names (torch prints the one its build reads),
    else the platform's."""
    m = _ALLOC_CONF.search(e.text)
    return m.group(1) if m else platform_tool(d.facts.platform, "alloc_conf")


# --- causes that change the lever (cause before class) --------------------------------------------


def _below_free(e: LogEvent, d: Diagnosis, phase: str | None) -> tuple[str, str, str] | None:
    """The request was smaller than the free memory the message (or the server at load) reports:
    (explanation, fix, the arithmetic), or None. Then the budget did not run out: the free memory was
    not one block big enough (fragmentation; on an APU or with ROCm, a per-allocation limit)."""
    requested = e.data.get("requested_mib")
    free = e.data.get("free_mib")
    source = "the message reports"
    if free is None and phase == "weight_load" and d.facts.free_before_load_mib is not None:
        free, source = d.facts.free_before_load_mib, "the server saw on the device at load"
    if requested is None or free is None or e.data.get("allowed_mib"):
        return None
    if requested >= free - max(64.0, 0.05 * requested):
        return None  # free only by a hair: the device is full, not fragmented
    asked = _shown(e, "requested")
    free_text = _shown(e, "free") if e.data.get("free_mib") is not None else mib(free)
    math = f"{asked} asked < {free_text} free ({source})"
    expl = (
        f" The request ({asked}) is smaller than the {free_text} free ({source}): the memory budget "
        "did not run out. The free memory was not one block large enough, or the device refused one "
        "allocation that large: fragmentation of the free memory, or a per-allocation limit of the "
        "driver/runtime (on an APU the 'free' figure is shared system memory, and a single large "
        "contiguous block can fail)."
    )
    v = words(d)
    conf = _alloc_conf(e, d)
    if d.server in ("llamacpp", "ollama"):
        fix = (
            v.first(
                "Split the allocation: fewer layers on the GPU ({gpu_layers}) makes the weight buffer smaller; if "
                "the same model loaded with an earlier runtime, try another ROCm/driver (or CUDA) build.",
            )
            or "Make the single allocation smaller, or try another runtime/driver build."
        )
    else:
        fix = (
            f"Set {conf}=expandable_segments:True (the allocator then maps memory in pieces, as the message "
            "suggests)"
            + (v.say(", and lower {memory_share} so less of the device is already allocated") or "")
            + "; on an APU, raise the memory the GPU may use (the GTT/TTM limits) rather than the share."
        )
    return expl, fix, math


def _outsized(e: LogEvent, phase: str | None) -> tuple[str, str] | None:
    """One allocation of a large share of the device in a forward step: (explanation, arithmetic)."""
    requested, total = e.data.get("requested_mib"), e.data.get("total_mib")
    if phase not in ("decode", "prefill", "serving") or not requested or not total:
        return None
    share = requested / total
    if share < OUTSIZED_SHARE or requested > total:
        return None
    expl = (
        f" One allocation of {mib(requested)} ({share:.0%} of the {mib(total)} device) in a {phase} step is "
        "far more than a batch's activations: a code path that builds a whole cache or sequence at once "
        "(a bug of that path, not the memory budget), so a lower memory share would not make it fit."
    )
    return expl, f"{mib(requested)} / {mib(total)} = {share:.0%} of the device in one allocation"


def _neighbours(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The largest set of processes whose pids lie within 64 of each other (ranks started together
    by one launcher get neighbouring pids)."""
    ps = sorted(procs, key=lambda p: p["pid"])
    best: list[dict[str, Any]] = []
    for i in range(len(ps)):
        j = i
        while j + 1 < len(ps) and ps[j + 1]["pid"] - ps[i]["pid"] <= 64:
            j += 1
        if j - i + 1 > len(best):
            best = ps[i : j + 1]
    return best


def _crowded(e: LogEvent, d: Diagnosis, group: list[LogEvent]) -> tuple[str, str, str, str] | None:
    """The device was full of OTHER processes' memory: the message lists this process
    and others, and the others hold at least half the device and more than this one. Either several
    ranks of one job on one GPU (three or more others with neighbouring pids) or another program.
    (explanation, fix, title, arithmetic), or None."""
    fd = e.data
    total, this = fd.get("total_mib"), fd.get("this_process_mib")
    procs = [
        p
        for p in fd.get("processes", [])
        if p.get("mib") is not None and not p.get("server_process")
    ]
    if not total or this is None or not procs:
        return None
    others = sum(p["mib"] for p in procs)
    if others < 0.5 * total or this >= others:
        return None
    gw, gpu = _gw(e), fd.get("gpu")
    math = f"{mib(others)} held by {len(procs)} other process(es) >= half of {mib(total)}; this process {mib(this)}"
    smi = platform_tool(d.facts.platform, "smi")
    near = _neighbours(procs)
    if len(near) >= 3:
        pids = f"{near[0]['pid']}-{near[-1]['pid']}"
        same = [
            x
            for x in group
            if x.data.get("gpu") == gpu and x.data.get("free_mib") == fd.get("free_mib")
        ]
        also = (
            f" {len(same)} OOM lines name {gw} {gpu} with the same free figure ({_shown(e, 'free')}): the "
            "failing ranks share one device."
            if len(same) > 1
            else ""
        )
        expl = (
            f" {len(near)} processes with neighbouring pids ({pids}) hold "
            f"{mib(sum(p['mib'] for p in near))} of the {mib(total)} {gw} {gpu}, next to the failing process "
            f"({mib(this)}): ranks of one job landed on the same {gw}, each with its own copy of what a rank "
            f"loads.{also} No memory setting helps while they share it."
        )
        fix = (
            f"Check the rank-to-device mapping: every rank must get its own {gw} (the launcher's device "
            "assignment, CUDA_VISIBLE_DEVICES / the local rank with MPI or Slurm, the container's visible "
            f"devices); `{smi}` or `vramdoctor census` during start-up shows which processes sit on {gw} {gpu}. "
            "If the launcher is right, the server version may map ranks wrongly: try another version."
        )
        return expl, fix, f"several ranks on one {gw} (device mapping)", math
    big = max(procs, key=lambda p: p["mib"])
    expl = (
        f" Another process holds the {gw}: process {big['pid']} has {mib(big['mib'])}"
        + (f" (other processes {mib(others - big['mib'])} more)" if len(procs) > 1 else "")
        + f" of the {mib(total)} device, the failing process {mib(this)} (the message lists them). The "
        f"{gw} was full before this process asked; its own memory settings are not the cause."
    )
    fix = (
        f"Find process {big['pid']} (`{smi}` or `vramdoctor census`): stop it, cap its memory (if it is an "
        f"inference server: its own memory share), or run this one on another {gw} (its visible devices). "
        "Lowering this process's memory share does not free the other's."
    )
    return expl, fix, f"another process holds the {gw}", math


def _unattributed(e: LogEvent) -> tuple[str, str] | None:
    """The device's used memory (total - free) far above what PyTorch holds in the
    failing process, while the message lists no other process: (explanation, arithmetic), or None."""
    fd = e.data
    total, free, alloc = fd.get("total_mib"), fd.get("free_mib"), fd.get("allocated_mib")
    if total is None or free is None or alloc is None or fd.get("processes"):
        return None
    own = alloc + (fd.get("reserved_unallocated_mib") or 0.0) + (fd.get("private_pools_mib") or 0.0)
    gap = total - free - own
    if gap < max(4096.0, 0.2 * total):
        return None
    zero = (
        " (the message's 'this process has 0 bytes' means the driver did not attribute memory to it, "
        "as in a container)"
        if fd.get("this_process_mib") == 0
        else ""
    )
    expl = (
        f" {mib(total - free)} of the device was in use, but PyTorch in the failing process held {mib(own)}: "
        f"{mib(gap)} is outside its allocator{zero}: other processes on the device, or memory the "
        "server allocates outside PyTorch. `vramdoctor census` shows whose it is."
    )
    return (
        expl,
        f"{mib(total)} total - {mib(free)} free - {mib(own)} PyTorch = {mib(gap)} not PyTorch's",
    )


# vLLM applies 0.9 when --gpu-memory-utilization is not given (every version)
_VLLM_DEFAULT_UTILIZATION = 0.9


def _above_share(e: LogEvent, d: Diagnosis, phase: str | None) -> tuple[str, str, str, str] | None:
    """The failing process already held more than the memory share the log sets (e.g. util
    0.6 but 58.92 of 60.97 GiB allocated; a 40 GB GPU full at the default 0.9): lowering the share
    cannot help. Then the weights (no tensor parallelism) or the parallel layout are the suspects."""
    fd, f = e.data, d.facts
    total = fd.get("total_mib")
    held = fd.get("this_process_mib") or fd.get("allocated_mib")
    if not total or not held or phase in ("preprocessing", "distributed_init"):
        return None
    share, source = f.mem_fraction_static or f.gpu_memory_utilization, "set in the log"
    if share is None and d.server == "vllm" and f.evidence.get("model") is not None:
        share, source = (
            _VLLM_DEFAULT_UTILIZATION,
            "vLLM's default; the settings shown do not set it",
        )
    if share is None or held <= share * total + max(1024.0, 0.05 * total):
        return None
    v = words(d)
    math = f"{mib(held)} held > {share} x {mib(total)} = {mib(share * total)} (the share)"
    expl = (
        f" The failing process held {mib(held)} ({held / total:.0%} of the {mib(total)} device), more than "
        f"the {share} share ({mib(share * total)}, {source}): what ran out is not bounded by the share, "
        "so lowering it does not help."
    )
    tp = f.tp_size
    if tp in (None, 1):
        expl += (
            " No tensor parallelism is set"
            + (" (tp=1)" if tp == 1 else "")
            + ": the weights alone may not fit one device."
        )
    layout = ""
    if f.dp_env_size and tp and f.visible_devices and f.dp_env_size * tp > f.visible_devices:
        expl += (
            f" The environment sets VLLM_DP_SIZE={f.dp_env_size} next to tensor parallel {tp}: "
            f"{f.dp_env_size * tp} ranks on the {f.visible_devices} visible devices, so ranks share devices."
        )
        layout = (
            f" Unset VLLM_DP_SIZE (it is meant for offline data parallelism), or give each of the "
            f"{f.dp_env_size * tp} ranks its own device."
        )
        math += f"; {f.dp_env_size} x {tp} ranks > {f.visible_devices} devices"
    fix = (
        v.first(
            "Fit the model to the devices: shard it over more GPUs ({tensor_parallel}) or load quantized "
            "weights ({quantize}); the memory share is not the lever (the process already held more than it).",
            "Fit the model to the devices: shard it over more GPUs ({tensor_parallel}); the memory share "
            "is not the lever (the process already held more than it).",
        )
        or "Fit the model to the devices: more GPUs or quantized weights; the memory share is not the lever."
    ) + layout
    return expl, fix, "the process held more than its memory share", math


def _trt_executor(e: LogEvent, d: Diagnosis) -> tuple[str, str, str] | None:
    """TensorRT-LLM's executor could not create one component (its own memory monitor's message):
    (explanation, fix in the knob its message names for that component, title), or None."""
    fd = e.data
    if not fd.get("trt_executor") or d.server != "trtllm":
        return None
    comp = str(fd.get("component") or "a component")
    created = fd.get("created") or []
    model = next((c for c in created if c["component"] == "Model"), None)
    expl = (
        f" TensorRT-LLM's executor could not create its {comp}: {_shown(e, 'free')} was free of "
        f"{_shown(e, 'total')} before the attempt."
    )
    if model:
        expl += (
            f" The model took {model['free_before_gib'] - model['free_after_gib']:.2f} GiB "
            f"({model['free_before_gib']} -> {model['free_after_gib']} GiB free)."
        )
    # the knob TensorRT-LLM's own message names for each component (py_executor_creator.py tuning_knobs)
    if comp == "KV cache":
        knob = (
            "Lower the KV cache's share of the free memory (kv_cache_config.free_gpu_memory_fraction in the "
            "--extra_llm_api_options YAML; trtllm-serve --kv_cache_free_gpu_memory_fraction), or cap it "
            "(kv_cache_config.max_tokens): the rest of the executor needs the memory it leaves."
        )
    elif comp.startswith(("Additional executor resources", "Initial KV cache", "Model resources")):
        knob = (
            "Lower max_num_tokens (the batch the executor's buffers are sized for), as TensorRT-LLM's message "
            "says; a lower kv_cache_config.free_gpu_memory_fraction leaves these buffers more room."
        )
    elif comp.startswith(("Model", "Draft model")):
        knob = (
            "The weights do not fit: shard them over more GPUs (tensor/pipeline parallelism, trtllm-serve "
            "--tp_size / --pp_size) or lower max_num_tokens, as TensorRT-LLM's message says."
        )
    elif comp in ("Sampler", "Drafter"):
        knob = (
            "Lower max_seq_len"
            + (" and max_draft_len" if comp == "Drafter" else "")
            + ", as TensorRT-LLM's message says."
        )
    else:
        knob = "Follow the options TensorRT-LLM's message lists after the figures."
    return expl, knob, f"TensorRT-LLM could not create its {comp}"


def _ranks(group: list[LogEvent]) -> str:
    """Which ranks/GPUs failed, first one first ("GPU 5 first"; "GPUs 7, 0, 2"), or ""."""
    gpus: list[int] = []
    for e in sorted(group, key=lambda x: (x.file, x.line)):
        g = e.data.get("gpu")
        if isinstance(g, int) and g not in gpus:
            gpus.append(g)
    if len(gpus) > 1:
        return f" It hit GPUs {', '.join(str(g) for g in gpus)} (in the order the log prints them): every rank that printed an error ran out at this step."
    return ""


def _finding(d: Diagnosis, phase: str | None, group: list[LogEvent], total: int) -> Finding:
    first = next((e for e in group if e.data.get("free_mib") is not None), group[0])
    where = _title(phase, first, d.server)
    device = _device(first, d)
    expl = (
        f"{device} out of memory {where} ({len(group)} of {total} OOM line(s)); "
        f"{_figures(first)}. {_budget(d.facts, d.server)}"
    )
    trt = _trt_executor(first, d)
    crowded = None if phase in ("distributed_init", "preprocessing") else _crowded(first, d, group)
    cause = crowded or _above_share(first, d, phase) if trt is None else None
    below = None if cause or trt else _below_free(first, d, phase)
    figures, derived, whole, outsized = _figure_causes(d, phase, first, trt, cause, below)
    expl += figures
    expl += _ranks(group)
    context, limit_fix, limit_alone = _process_context(d, phase, first, cause)
    expl += context
    fix, title = _fix_and_title(
        d, phase, first, where, device, below, outsized, whole, limit_fix, limit_alone
    )
    if trt is not None:
        fix, title = trt[1], f"{device} out of memory: {trt[2]}"
    elif cause is not None and not limit_alone:
        fix, title = cause[1], f"{device} out of memory {where}: {cause[2]}"
    return Finding(
        id=RULE.id,
        severity="critical",
        title=title,
        evidence=first_evidence(group),
        explanation=expl,
        fix=fix + _CENSUS,
        basis="derived" if (below or outsized or whole or cause) else None,
        derived=derived,
    )


def _figure_causes(
    d: Diagnosis,
    phase: str | None,
    first: LogEvent,
    trt: tuple[str, str, str] | None,
    cause: tuple[str, str, str, str] | None,
    below: tuple[str, str, str] | None,
) -> tuple[str, list[str], bool, tuple[str, str] | None]:
    """(explanation, arithmetic, request larger than the device, outsized note) from the figures."""
    expl = ""
    derived: list[str] = []
    fd = first.data
    reserved = fd.get("reserved_unallocated_mib")
    requested = fd.get("requested_mib")
    # fragmentation only when the reserved-but-unallocated blocks plus the free memory would have
    # held the request: then only their split into pieces kept it from fitting
    if (
        below is None
        and reserved
        and reserved > 1024
        and requested is not None
        and reserved + (fd.get("free_mib") or 0.0) >= requested
    ):
        conf = _alloc_conf(first, d)
        expl += f" Much memory is reserved but unallocated: fragmentation; {conf}=expandable_segments:True helps."
        derived.append(
            f"{mib(reserved)} reserved-unallocated + {mib(fd.get('free_mib') or 0.0)} free >= {mib(requested)} asked"
        )
    whole = bool(requested is not None and fd.get("total_mib") and requested > fd["total_mib"])
    if whole:
        expl += (
            f" The single allocation ({mib(requested)}) is larger than the whole device "
            f"({mib(fd['total_mib'])}): no memory share or headroom setting can make it fit."
        )
        derived.append(f"{mib(requested)} asked > {mib(fd['total_mib'])} total")
    if below is not None:
        expl += below[0]
        derived.append(below[2])
    outsized = None if whole or below or cause or trt else _outsized(first, phase)
    if cause is not None:
        expl += cause[0]
        derived.append(cause[3])
    elif (gap := _unattributed(first)) is not None:
        expl += gap[0]
        derived.append(gap[1])
    if trt is not None:
        expl += trt[0]
    if outsized is not None:
        expl += outsized[0]
        derived.append(outsized[1])
    return expl, derived, whole, outsized


def _process_context(
    d: Diagnosis, phase: str | None, first: LogEvent, cause: tuple[str, str, str, str] | None
) -> tuple[str, str, bool]:
    """(explanation, limit fix, the limit alone explains it) from what held memory around the OOM."""
    expl = ""
    skipped = d.events_of("kv_profiling_skipped")
    if skipped and phase not in ("weight_load", "distributed_init", "preprocessing"):
        # vLLM sized the KV cache from --kv-cache-memory-bytes and skipped its memory profile: nothing
        # checked that the rest fits, so the size set by hand is the cause to look at first
        kv = skipped[0].data.get("kv_cache_mib")
        expl += (
            f" vLLM skipped its memory profiling: the KV cache ({mib(kv)}) was sized by --kv-cache-memory-bytes, "
            "not from the memory left after the weights and activations, and gpu_memory_utilization was not "
            "applied."
        )
    other = _other_process(first)  # the same message as the figures and the process notes
    limit_expl, limit_fix, limit_alone = _limit(first)
    expl += limit_expl
    expl += _own_processes(first)
    if cause is None or "share" in cause[2]:  # (a crowded device: its own words say what they are)
        expl += _process_notes(d, phase, first, other)
    if phase == "distributed_init":
        expl += (
            " At this point the server has allocated nothing but its CUDA context and NCCL's "
            "communication buffers (typically a few hundred MiB per GPU): the GPU was already (nearly) full "
            "when the server started. Usual causes: a leftover server from an earlier run, another process "
            "on the GPU, or two ranks mapped to one GPU (CUDA_VISIBLE_DEVICES listing fewer GPUs than "
            "ranks, or the same one twice). If nothing else holds the GPU, NCCL's own buffers are the "
            "suspect (NCCL_NVLS_ENABLE=0, a smaller NCCL_BUFFSIZE)."
        )
    return expl, limit_fix, limit_alone


def _process_notes(d: Diagnosis, phase: str | None, first: LogEvent, other: str | None) -> str:
    """What the processes in the message are: the server's own, a tokenizer, or another program."""
    fd = first.data
    out = ""
    procs = [p for p in fd.get("processes", []) if not p.get("server_process")]
    small = [p for p in procs if p["mib"] is not None and p["mib"] < SMALL_PROCESS_MIB]
    if len(procs) > 1 and small:
        listed = ", ".join(f"{p['pid']} ({mib(p['mib'])})" for p in small[:6])
        out += (
            f" {len(procs)} processes hold memory on {_gw(first)} {fd.get('gpu')}; the small ones "
            f"({listed}) are extra CUDA contexts or side work on this GPU: other TP ranks opening "
            "CUDA IPC handles here, the tokenizer process running a GPU image processor, or another "
            "program. They shrink what the server budgeted for."
        )
    if (
        len(procs) > 1
        and d.server == "sglang"
        and d.facts.multimodal
        and d.facts.fast_image_processor
        and phase != "preprocessing"  # (then the failing process is that tokenizer process)
    ):
        least = min(procs, key=lambda p: p["mib"] or 0)
        out += (
            f" With the fast image processor on, process {least['pid']} ({mib(least['mib'])}) next to the "
            "server is the first suspect: the tokenizer process preprocessing images on this GPU "
            "(see sglang-fast-image-processor)."
        )
    scheduler_own = (
        phase == "preprocessing"
        and d.server == "sglang"
        and fd.get("preprocess_process") == "tokenizer"
        and procs
    )
    if scheduler_own:
        big = max(procs, key=lambda p: p["mib"] or 0)
        out += (
            f" The failing process is SGLang's tokenizer process, which runs the fast image processor on "
            f"the GPU (torchvision) next to the server's own scheduler: process {big['pid']} "
            f"({mib(big['mib'])}) is that scheduler (weights + KV pool + CUDA graphs under "
            "--mem-fraction-static), not another program"
            + (
                "; the other processes listed are other ranks or other programs."
                if len(procs) > 1
                else "."
            )
            + " The scheduler's static pool leaves the preprocessing scratch little room, and the fast "
            "processor's cached scratch grows with image sizes."
        )
        return out
    if phase == "preprocessing" and fd.get("preprocess_process") == "scheduler":
        out += (
            " The failing process is the server's scheduler materialising a request's multimodal inputs "
            "(_process_and_broadcast_mm_inputs)."
        )
    if other and phase in (
        "cuda_graph",
        "profiling",
        "mm_profiling",
        "kv_cache_alloc",
        "distributed_init",
    ):
        out += f" Another process holds memory on this GPU that the startup budget did not leave room for ({other})."
    elif other:
        out += f" Another process holds memory on this GPU ({other})."
    elif procs:
        besides = any(p.get("server_process") for p in fd.get("processes", []))
        out += (
            (" Besides the server's own ranks, each" if besides else " Each")
            + " OOM message lists one process on its GPU: the failing rank itself (pids differ in "
            "containers), not another program."
        )
    return out


def _fix_and_title(
    d: Diagnosis,
    phase: str | None,
    first: LogEvent,
    where: str,
    device: str,
    below: tuple[str, str, str] | None,
    outsized: tuple[str, str] | None,
    whole: bool,
    limit_fix: str,
    limit_alone: bool,
) -> tuple[str, str]:
    """The fix (cause before class: the cause read around the error picks the lever) and the title."""
    title = f"{device} out of memory {where}"
    if limit_alone:  # the limit alone refused it: the phase's memory-share advice does not apply
        title = f"{device} out of memory: PyTorch's per-process memory limit reached" + (
            f" {where}" if phase is not None else ""
        )
        return limit_fix.rstrip(), title
    if whole:
        title = f"{device} out of memory: one allocation larger than the whole GPU"
        return _fix_whole(d), title
    if below is not None:
        return limit_fix + below[
            1
        ], f"{device} out of memory {where}: the request was smaller than the free memory"
    if outsized is not None:
        fix = (
            "A memory setting will not fit one allocation of this size: report it to the server's developers "
            "with the traceback, and avoid the code path it runs (upgrade, or turn off the graph or "
            "compilation mode its frames show)."
        )
        if first.data.get("torchair"):
            fix += (
                " On vLLM-Ascend with torchair graph mode: run without it (--additional-config "
                '\'{"torchair_graph_config": {"enabled": false}}\').'
            )
        return (
            fix,
            f"{device} out of memory {where}: one allocation out of all proportion to the step",
        )
    if d.events_of("kv_profiling_skipped") and phase not in (
        "weight_load",
        "distributed_init",
        "preprocessing",
    ):
        # (the line names vLLM's kv_cache_memory_bytes config: its flag, whatever the version)
        lower = (
            "Lower --kv-cache-memory-bytes (it was set by hand and not checked against what is free); "
            if d.server == "vllm"
            else words(d).say(
                "Lower {kv_size} (it was set by hand and not checked against what is free); "
            )
        )
        return limit_fix + (lower or "") + _fix(phase, d, first), title
    return limit_fix + _fix(phase, d, first), title


def _fix_whole(d: Diagnosis) -> str:
    v = words(d)
    pixels = v("mm_pixels")
    return (
        "No memory setting helps: a single tensor larger than the device comes from the input size. "
        "Cap the input: "
        + (
            "the image size (max_pixels in the processor settings, "
            + (pixels if pixels and d.server == "vllm" else "resize images before sending")
            + "), the number of images or video frames per request, and the prompt length."
            if d.facts.multimodal is not False
            else "the prompt length and batch size."
        )
        + " If the server's attention path materialises a full attention matrix (a vision encoder "
        "without flash attention, e.g. on ROCm), a memory-efficient attention backend avoids it."
    )


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("cuda_oom")
    if not evs:
        return []
    by_phase: dict[str | None, list[LogEvent]] = {}
    for e in evs:
        by_phase.setdefault(e.phase, []).append(e)
    if len(by_phase) > 1:
        # an unplaced copy of a placed error adds nothing but, when the placed one has no figures,
        # its figures (e.g. vLLM's "CUDA out of memory occurred when warming up sampler" then
        # the torch message it wraps, a few lines below)
        for e in by_phase.get(None, []):
            for group in by_phase.values():
                g0 = group[0]
                if (
                    g0.phase is not None
                    and g0.file == e.file
                    and 0 < e.line - g0.line <= 12
                    and g0.data.get("free_mib") is None
                    and e.data.get("free_mib") is not None
                ):
                    if g0.data.get("sampler"):
                        # the message the sampler warm-up wrapped: the same failure (rules read
                        # the flag from the event whose figures they quote)
                        e = LogEvent(
                            e.kind, e.file, e.line, e.text, e.phase, {**e.data, "sampler": True}
                        )
                    group.append(e)
        by_phase.pop(None, None)
    if "serving" in by_phase and ("prefill" in by_phase or "decode" in by_phase):
        # vLLM's EngineCore re-raises a worker's OOM from execute_model: the worker's frames say more
        by_phase.pop("serving")
    total = d.event_counts.get("cuda_oom", len(evs))
    out = []
    for phase, group in by_phase.items():
        failed = [e for e in group if not e.data.get("recovered")]
        if failed:
            out.append(_finding(d, phase, failed, total))
        elif group:
            out.append(_recovered(d, group))
    return out


def _recovered(d: Diagnosis, group: list[LogEvent]) -> Finding:
    """llama.cpp retried a compute buffer without pipeline parallelism and the start-up went on:
    a warning that says so, not a failure."""
    e = group[0]
    v = words(d)
    return Finding(
        id=RULE.id,
        severity="warning",
        title=(
            f"{_device(e, d)} out of memory allocating compute buffers: llama.cpp retried without pipeline "
            "parallelism and went on"
        ),
        evidence=[
            e.evidence,
            Evidence(e.file, int(e.data["retried_line"]), str(e.data["retried"])),
            Evidence(e.file, int(e.data["recovered_line"]), str(e.data["recovered"])),
        ],
        explanation=(
            f"{_device(e, d)} out of memory allocating compute buffers; {_figures(e)}. llama.cpp then retried "
            f"without pipeline parallelism (line {e.data['retried_line']}) and the start-up continued (line "
            f"{e.data['recovered_line']}): the server runs, with one copy of the compute buffers instead of "
            "several, so prompt processing over several GPUs overlaps less."
        ),
        fix=(
            v.first(
                "Nothing is down. To keep pipeline parallelism, make the compute buffers smaller: a smaller "
                "{compute_batch}, a shorter {context_length}, or fewer layers on the tight GPU ({tensor_split})."
            )
            or "Nothing is down; a smaller batch or context keeps pipeline parallelism."
        ),
        basis="read",
    )


RULE = Rule(
    id="cuda-oom",
    severity="critical",
    title="CUDA out of memory",
    fires_when=(
        "torch.OutOfMemoryError / 'CUDA out of memory' / 'CUDA error: out of memory' (any case, incl. "
        "ROCm 'HIP out of memory' and Ascend 'NPU out of memory', named by their device; "
        "flashinfer's 'CUDA Error: out of memory (2)'), Triton 'Triton Error [CUDA]: out of memory', "
        "CUDA_ERROR_OUT_OF_MEMORY, CUBLAS/CUDNN_STATUS_ALLOC_FAILED, a quoted 'out of memory' (NCCL \"Cuda failure "
        "'out of memory'\", CUDACHECK); the other servers' words: llama.cpp/Ollama 'cudaMalloc failed: out of "
        "memory' (phase from the lines after it: KV cache, compute buffers, weights) and ggml's 'CUDA error 2 "
        "at ggml-cuda.cu:N: out of memory', TensorRT-LLM 'CUDA runtime error in ::cudaMallocAsync(...): out of "
        "memory', LMDeploy '[TM][ERROR] CUDA runtime error: out of memory', TGI's router quoting the shard's "
        "error (phase from 'Method Prefill/Warmup encountered an error'); "
        "phase from the error's own traceback frames only (weight load, KV allocation, CUDA graph capture, "
        "profiling, warm-up incl. the sampler warm-up, prefill incl. a multimodal request's vision encoder, "
        "decode, SGLang scheduler start-up, torch.distributed / NCCL start-up (SGLang init_torch_distributed, vLLM "
        "init_device -> init_worker_distributed_environment -> PyNcclCommunicator: the GPU was already full, so "
        "the fix is finding the process holding it, never a lower share), multimodal preprocessing (SGLang's "
        "tokenizer process process_mm_data -> a transformers image_processing_*_fast frame, or the scheduler's "
        "_process_and_broadcast_mm_inputs: the other process listed is the server's own scheduler)), else "
        "unknown; an NCCL 'Cuda failure' WARN line takes the traceback right below it when its exception is "
        "NCCL's; frames without a traceback header and a traceback "
        "chained right after the error count too; a CUDA graph REPLAY frame (SGLang runners' replay / "
        "replay_prepare) is decode, or prefill in the piecewise/breakable/prefill runners, never capture (the "
        "phase comes from the frames' function names, not the file cuda_graph_runner.py); vLLM execute_model / "
        "SGLang's event loop without a finer frame is 'serving'; a pid listed in the message that the log's own "
        "process tags name, or that another GPU's OOM message of the log shows as its failing process, is the "
        "server's own rank, not another process; a per-process memory fraction below the GPU's memory "
        "(torch's 'X allowed;' or the cudaMallocAsync 'PyTorch limit (set by user-supplied memory fraction)', "
        "its figures read from the lines after the message) is named as the cause when the device still had "
        "the memory asked; a request smaller than the free memory is fragmentation or a per-allocation "
        "limit, not the budget (derived); an allocation larger than the whole GPU gets 'cap the input' instead "
        "of a memory setting; one allocation of 25 % or more of the device in a forward step is a code path's "
        "bug, not the budget; fragmentation only when reserved-unallocated + free >= the request"
    ),
    fix=(
        "phase-specific, in the diagnosed server's own levers on its platform (levers.py): more GPUs or "
        "quantization at load; lower mem fraction / graph batch size / chunked prefill / running requests later; "
        "--max-num-seqs for vLLM's sampler warm-up; encoder headroom for a multimodal prefill; llama.cpp/Ollama: "
        "fewer GPU layers, a shorter context, a quantized KV cache; TGI: --max-batch-prefill-tokens / "
        "--max-batch-total-tokens / --cuda-memory-fraction; TensorRT-LLM: kv_cache_free_gpu_mem_fraction, a "
        "smaller max_batch_size at build; find and stop what holds the GPU / check the device mapping "
        "for an NCCL start-up OOM; --disable-fast-image-processor / --image-processor-backend pil / SGLang >= "
        "0.5.19 for a preprocessing OOM; raise or remove a per-process memory fraction that refused it; "
        "expandable_segments (the variable the message names) when the request was below the free memory"
    ),
    check=check,
)
