"""A CUDA out-of-memory error: where it hit, how much was asked and free, and the fix there."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Facts, Finding, LogEvent
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import by_server, first_evidence, fraction_flag, mib

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
    "startup": "while the server was starting (scheduler and model worker initialisation)",
    "distributed_init": (
        "while initialising the GPU worker and torch.distributed / NCCL at start-up (before any weights "
        "or KV cache)"
    ),
    "preprocessing": "during multimodal preprocessing (the image processor, before the model runs)",
    "serving": "while serving a batch of requests (the frames do not say prefill or decode)",
    None: "at a point the traceback does not show",
}


def _fix(phase: str | None, server: str | None, e: LogEvent) -> str:
    """The fix for an OOM in this phase, in the server's own flags (both, labelled, when unknown)."""
    frac = fraction_flag(server)
    if phase == "distributed_init":
        return (
            "Find what already holds the GPUs before the server starts: `nvidia-smi` or `vramdoctor census` "
            "(a leftover server from an earlier run, e.g. a zombie "
            + by_server(server, "sglang::scheduler", "EngineCore / worker", "server process")
            + ", a notebook or another tenant) and stop it; check that CUDA_VISIBLE_DEVICES"
            + by_server(server, " (and --base-gpu-id)", "", " (and the server's base GPU setting)")
            + " gives each of the "
            + by_server(server, "--tp-size", "--tensor-parallel-size", "tensor-parallel")
            + " ranks its own GPU (two ranks mapped to one GPU fill it twice). "
            f"{frac} cannot help: the server had not reserved any of its share yet."
        )
    if phase == "preprocessing":
        return by_server(
            server,
            "Move image preprocessing off the GPU: --disable-fast-image-processor (from 0.5.18: "
            "--image-processor-backend pil; the version has one of the two), at some CPU cost per image; or "
            "upgrade to SGLang >= 0.5.19 (request-scoped pool for the fast processor's scratch); cap image "
            "size/count per request.",
            "Keep the multimodal processor on the CPU (drop a device='cuda' from --mm-processor-kwargs) and cap "
            "images per request (--limit-mm-per-prompt) and their size (--mm-processor-kwargs max_pixels).",
            "Move image preprocessing to the CPU (SGLang: --disable-fast-image-processor / "
            "--image-processor-backend pil, or SGLang >= 0.5.19; vLLM: no device='cuda' in "
            "--mm-processor-kwargs) and cap image size/count per request.",
        )
    if phase == "weight_load":
        return (
            "The weights do not fit: use more GPUs ("
            + by_server(server, "--tp-size", "--tensor-parallel-size")
            + "), a quantized checkpoint, or free the GPU from other processes; the memory fraction does not help here."
        )
    if phase == "kv_cache_alloc":
        return by_server(
            server,
            "Lower --mem-fraction-static or --max-total-tokens.",
            "Lower --gpu-memory-utilization or --max-model-len; on vLLM V0 also lower --swap-space (the CPU swap "
            "blocks are pinned host memory).",
        )
    if phase == "startup":
        return by_server(
            server,
            "The scheduler ran out while starting (weights, KV pool, graphs): lower --mem-fraction-static, "
            "--cuda-graph-max-bs or --max-running-requests; if the weights alone do not fit, use more GPUs "
            "(--tp-size) or a quantized checkpoint.",
            "The engine ran out while starting: lower --gpu-memory-utilization, --max-model-len or --max-num-seqs; "
            "if the weights alone do not fit, use more GPUs (--tensor-parallel-size) or a quantized checkpoint.",
        )
    if phase == "cuda_graph":
        return by_server(
            server,
            "Graph capture runs outside the static pool: lower --mem-fraction-static or --cuda-graph-max-bs "
            "(or --disable-cuda-graph).",
            "Graph capture runs outside the KV budget: lower --gpu-memory-utilization, --max-num-seqs or the "
            "capture sizes (or --enforce-eager).",
        )
    if phase in ("warmup", "profiling", "mm_profiling") and e.data.get("sampler"):
        return by_server(
            server,
            "Warm-up sampling ran out: lower --max-running-requests or --mem-fraction-static.",
            "The sampler warm-up (logits for --max-num-seqs dummy requests) ran out: lower --max-num-seqs, as "
            "vLLM's own message says, or --gpu-memory-utilization.",
        )
    if phase in ("profiling", "mm_profiling"):
        return by_server(
            server,
            "The profiling pass's activations do not fit: lower --mem-fraction-static, --chunked-prefill-size or "
            "--max-prefill-tokens.",
            "The profiling run's activations do not fit: lower --max-num-batched-tokens / --max-model-len, limit "
            "images per prompt (--limit-mm-per-prompt) and the encoder cache, or lower --gpu-memory-utilization if "
            "other processes share the GPU.",
        )
    if phase == "warmup":
        return by_server(
            server,
            "Warm-up runs outside the static pool: lower --mem-fraction-static or --cuda-graph-max-bs.",
            "Warm-up runs outside the KV budget: lower --gpu-memory-utilization, --max-num-seqs or "
            "--max-num-batched-tokens.",
        )
    if phase == "prefill" and e.data.get("multimodal_frames"):
        return by_server(
            server,
            "The vision encoder's activations for this request did not fit next to the static pool: lower "
            "--mem-fraction-static to leave encoder headroom and --chunked-prefill-size; cap image size/count per "
            "request.",
            "The vision encoder's activations for this request did not fit next to the KV cache: lower "
            "--gpu-memory-utilization to leave encoder headroom, cap images per request (--limit-mm-per-prompt) "
            "and their size (--mm-processor-kwargs), and lower --max-num-batched-tokens.",
        )
    if phase == "prefill":
        return (
            f"Activations outside the KV pool ran out: lower {frac} to leave headroom, lower "
            + by_server(
                server,
                "--chunked-prefill-size and --max-prefill-tokens, or cap --context-length",
                "--max-num-batched-tokens, or cap --max-model-len",
            )
            + " / input length; multimodal inputs also need encoder headroom."
        )
    if phase == "serving":
        return by_server(
            server,
            "A forward pass of a request batch ran out next to the static pool: lower --mem-fraction-static to "
            "leave headroom, and --chunked-prefill-size (prefill chunks) or --max-running-requests / "
            "--cuda-graph-max-bs (decode batches).",
            "A forward pass of a request batch ran out next to the KV cache: lower --gpu-memory-utilization to "
            "leave headroom, and --max-num-batched-tokens (prefill chunks) or --max-num-seqs (decode batches).",
        )
    if phase == "decode":
        return (
            f"Decode activations (logits for large batches) ran out: lower {frac}, "
            + by_server(server, "--max-running-requests or --cuda-graph-max-bs", "--max-num-seqs")
            + "."
        )
    return f"Lower {frac} to leave headroom and check the settings listed; the traceback does not show the phase."


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
            f"GPU {gpu} also holds memory of process(es) {', '.join(str(p['pid']) for p in procs[:6])} "
            f"next to the failing process ({mib(d['this_process_mib'])})"
        )
    if len(procs) > 1:
        return f"{len(procs)} processes hold memory on GPU {gpu}; at most one of them is the failing process"
    if len(procs) == 1 and d.get("allocated_mib") is not None:
        own = d["allocated_mib"] + (d.get("reserved_unallocated_mib") or 0.0)
        if procs[0]["mib"] < own * 0.98 - 64:
            return (
                f"process {procs[0]['pid']} holds {mib(procs[0]['mib'])} on GPU {gpu}, less than PyTorch "
                f"alone reserved in the failing process ({mib(own)}): it is another process"
            )
    return None


# vLLM's own names for the facts read from its max_num_seqs / tensor_parallel_size arguments
_VLLM_NAMES = {"max_running_requests": "max_num_seqs", "tp_size": "tensor_parallel_size"}


def _budget(f: Facts, server: str | None) -> str:
    parts = []
    for name in (
        "mem_fraction_static",
        "gpu_memory_utilization",
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
    return ", ".join(parts) if parts else "not shown in the log"


def _figures(e: LogEvent) -> str:
    d = e.data
    bits = []
    if "requested_mib" in d:
        bits.append(f"asked for {mib(d['requested_mib'])}")
    if "free_mib" in d:
        bits.append(f"{mib(d['free_mib'])} free of {mib(d.get('total_mib'))} on GPU {d.get('gpu')}")
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
        bits.append(f"{mib(d['reserved_unallocated_mib'])} reserved but unallocated")
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
        f"rank's CUDA context on GPU {e.data.get('gpu')} (NCCL, custom all-reduce, CUDA IPC), not another program."
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


def _device(e: LogEvent) -> str:
    """The device the OOM message names: CUDA, HIP (ROCm) or NPU (Ascend)."""
    return str(e.data.get("device") or "CUDA")


def _title(phase: str | None, e: LogEvent) -> str:
    if phase == "prefill" and e.data.get("multimodal_frames"):
        return "in the prefill of a multimodal request (vision encoder or merging its embeddings)"
    if phase == "warmup" and e.data.get("sampler"):
        return "during the sampler warm-up"
    if phase in ("profiling", "mm_profiling") and e.data.get("sampler"):
        return PHASE_NAMES[phase] + " (sampler warm-up)"
    return PHASE_NAMES.get(phase, str(phase))


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("cuda_oom")
    if not evs:
        return []
    by_phase: dict[str | None, list[LogEvent]] = {}
    for e in evs:
        by_phase.setdefault(e.phase, []).append(e)
    if len(by_phase) > 1:
        by_phase.pop(None, None)  # an unplaced copy of a placed error adds nothing
    if "serving" in by_phase and ("prefill" in by_phase or "decode" in by_phase):
        # vLLM's EngineCore re-raises a worker's OOM from execute_model: the worker's frames say more
        by_phase.pop("serving")
    total = d.event_counts.get("cuda_oom", len(evs))
    out = []
    for phase, group in by_phase.items():
        first = next((e for e in group if e.data.get("free_mib") is not None), group[0])
        where = _title(phase, first)
        device = _device(first)
        expl = (
            f"{device} out of memory {where} ({len(group)} of {total} OOM line(s)); "
            f"{_figures(first)}. Budget settings in the log: {_budget(d.facts, d.server)}."
        )
        fd = first.data
        reserved = fd.get("reserved_unallocated_mib")
        requested = fd.get("requested_mib")
        # fragmentation only when the reserved-but-unallocated blocks plus the free memory would have
        # held the request: then only their split into pieces kept it from fitting
        if (
            reserved
            and reserved > 1024
            and requested is not None
            and reserved + (fd.get("free_mib") or 0.0) >= requested
        ):
            expl += " Much memory is reserved but unallocated: fragmentation; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps."
        whole = requested is not None and fd.get("total_mib") and requested > fd["total_mib"]
        if whole:
            expl += (
                f" The single allocation ({mib(requested)}) is larger than the whole device "
                f"({mib(fd['total_mib'])}): no memory share or headroom setting can make it fit."
            )
        other = next((why for e in group if (why := _other_process(e))), None)
        limit_expl, limit_fix, limit_alone = _limit(first)
        expl += limit_expl
        expl += _own_processes(first)
        procs = [p for p in fd.get("processes", []) if not p.get("server_process")]
        small = [p for p in procs if p["mib"] is not None and p["mib"] < SMALL_PROCESS_MIB]
        if len(procs) > 1 and small:
            listed = ", ".join(f"{p['pid']} ({mib(p['mib'])})" for p in small[:6])
            expl += (
                f" {len(procs)} processes hold memory on GPU {first.data.get('gpu')}; the small ones "
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
            expl += (
                f" With the fast image processor on, process {least['pid']} ({mib(least['mib'])}) next to the "
                "server is the first suspect: the tokenizer process preprocessing images on this GPU "
                "(see sglang-fast-image-processor)."
            )
        if phase == "distributed_init":
            expl += (
                " At this point the server has allocated nothing but its CUDA context and NCCL's "
                "communication buffers (typically a few hundred MiB per GPU): the GPU was already (nearly) full "
                "when the server started. Usual causes: a leftover server from an earlier run, another process "
                "on the GPU, or two ranks mapped to one GPU (CUDA_VISIBLE_DEVICES listing fewer GPUs than "
                "ranks, or the same one twice). If nothing else holds the GPU, NCCL's own buffers are the "
                "suspect (NCCL_NVLS_ENABLE=0, a smaller NCCL_BUFFSIZE)."
            )
        scheduler_own = (
            phase == "preprocessing"
            and d.server == "sglang"
            and fd.get("preprocess_process") == "tokenizer"
            and procs
        )
        if scheduler_own:
            big = max(procs, key=lambda p: p["mib"] or 0)
            expl += (
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
        elif phase == "preprocessing" and fd.get("preprocess_process") == "scheduler":
            expl += (
                " The failing process is the server's scheduler materialising a request's multimodal inputs "
                "(_process_and_broadcast_mm_inputs)."
            )
        if scheduler_own:
            pass
        elif other and phase in (
            "cuda_graph",
            "profiling",
            "mm_profiling",
            "kv_cache_alloc",
            "distributed_init",
        ):
            expl += f" Another process holds memory on this GPU that the startup budget did not leave room for ({other})."
        elif other:
            expl += f" Another process holds memory on this GPU ({other})."
        elif any(
            p for e in group for p in e.data.get("processes", []) if not p.get("server_process")
        ):
            besides = any(
                p.get("server_process") for e in group for p in e.data.get("processes", [])
            )
            expl += (
                (" Besides the server's own ranks, each" if besides else " Each")
                + " OOM message lists one process on its GPU: the failing rank itself (pids differ in "
                "containers), not another program."
            )
        # when the limit alone refused it, the phase's memory-share advice does not apply
        fix = limit_fix.rstrip() if limit_alone else limit_fix + _fix(phase, d.server, first)
        title = f"{device} out of memory {where}"
        if limit_alone:
            title = f"{device} out of memory: PyTorch's per-process memory limit reached" + (
                f" {where}" if phase is not None else ""
            )
        if whole:
            title = f"{device} out of memory: one allocation larger than the whole GPU"
            fix = (
                "No memory setting helps: a single tensor larger than the device comes from the input size. "
                "Cap the input: "
                + (
                    "the image size (max_pixels in the processor settings, "
                    + by_server(
                        d.server,
                        "resize images before sending",
                        "--mm-processor-kwargs '{\"max_pixels\": ...}'",
                    )
                    + "), the number of images or video frames per request, and the prompt length."
                    if d.facts.multimodal is not False
                    else "the prompt length and batch size."
                )
                + " If the server's attention path materialises a full attention matrix (a vision encoder "
                "without flash attention, e.g. on ROCm), a memory-efficient attention backend avoids it."
            )
        out.append(
            Finding(
                id=RULE.id,
                severity="critical",
                title=title,
                evidence=first_evidence(group),
                explanation=expl,
                fix=fix + " Run `vramdoctor census` to see every process's memory on each GPU, and"
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
        "ROCm 'HIP out of memory' and Ascend 'NPU out of memory', named by their device; "
        "flashinfer's 'CUDA Error: out of memory (2)'), Triton 'Triton Error [CUDA]: out of memory', "
        "CUDA_ERROR_OUT_OF_MEMORY, CUBLAS/CUDNN_STATUS_ALLOC_FAILED, a quoted 'out of memory' (NCCL \"Cuda failure "
        "'out of memory'\", CUDACHECK); "
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
        "the memory asked; an allocation larger than the whole GPU gets "
        "'cap the input' instead of a memory setting; fragmentation only when reserved-unallocated + free "
        ">= the request"
    ),
    fix=(
        "phase-specific, in the server's own flags: more GPUs or quantization at load; lower mem fraction / "
        "graph batch size / chunked prefill / running requests later; --max-num-seqs for vLLM's sampler warm-up; "
        "encoder headroom for a multimodal prefill; find and stop what holds the GPU / check the device mapping "
        "for an NCCL start-up OOM; --disable-fast-image-processor / --image-processor-backend pil / SGLang >= "
        "0.5.19 for a preprocessing OOM; raise or remove a per-process memory fraction that refused it"
    ),
    check=check,
)
