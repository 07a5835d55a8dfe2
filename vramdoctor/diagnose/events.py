"""Events read off a log: CUDA OOMs with their phase and figures, KV self-check leaks, and the
memory errors that are not CUDA OOMs (KV budget, retraction, Triton shared memory, host OOM...).

A mixin of `FileExtractor` (extract.py): it shares the extractor's state (facts, votes, caps)
and is fed the lines whose anchors can start an event. The phase of an OOM comes from the
traceback that ends at it (innermost context marker wins); without one it is unknown (None), never
guessed from the startup lines printed before it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.findings import INFERRED, MAX_EVENTS_PER_KIND, RUNTIME, Evidence, LogEvent
from vramdoctor.diagnose.normalize import clean, is_continuation, short_line_memo, strip_noise
from vramdoctor.diagnose.reader import Hit

GIB = 1024.0
MAX_TRACEBACKS = 64  # tracebacks read for model files and backend per file
# Lowercase fragments of every line _memory handles (a cheap gate before its regexes).
MEMORY_KEYS = (
    "out of memory",
    "outofmemoryerror",
    "cudaerrormemoryallocation",
    "memory pool end",
    "total_gpu_memory",
    "no available memory",
    "max seq len",
    "free memory on device",
    "not enough memory",
    "alloc_req_slots",
    "out of resource",
    "ran out of gpu memory",
    "not enough gpu memory",
    "failed to register memory",
    "out_of_memory",
    "alloc_failed",
    "profiled value",
    "gpu-memory-utilization=",
    # crashes: SGLang's retraction line, host-RAM errors
    "retract requests",
    "defaultcpuallocator",
    "memoryerror",
    # TensorRT-LLM's executor creation, Ray's memory monitor
    "insufficient gpu memory",
    "memory usage threshold",
    "ray killed this worker",
)
WRAP_COLUMNS = 80  # a row this wide may be a terminal's wrap (joined without a space)
FRAME_GAP_LINES = (
    8  # the last frame of an error's own traceback is at most this many lines above it
)


def size_mib(text: str) -> float | None:
    """'3.43 GiB' / '112.00 MiB' / '2.25 GB' -> MiB (the servers' GB means GiB)."""
    try:
        num, unit = text.split()
        v = float(num)
    except ValueError:
        return None
    unit = unit.upper().replace("I", "")
    scale = {
        "B": 1 / 1048576,
        "BYTES": 1 / 1048576,  # torch's format_size: "0 bytes" up to 1 KiB
        "KB": 1 / 1024,
        "MB": 1.0,
        "GB": GIB,
        "TB": GIB * 1024,
    }.get(unit)
    return None if scale is None else round(v * scale, 2)


def gib_text_to_mib(text: str | None) -> float | None:
    """'2.25' GB (GiB in the servers' logs) -> MiB."""
    return None if text is None else round(float(text) * GIB, 1)


# What a memory line says (memory_plan): ("oom", text), ("trt_executor", text), ("host", data, text),
# ("kv_alloc", phase, text), ("facts", ((name, value), ...), votes) or
# ("event", kind, phase, data, votes, text, facts), votes being ((server, n), ...).
Plan = tuple[Any, ...]
Votes = tuple[tuple[str, int], ...]
# A reader's answer for a line of its kind that says nothing: memory_plan returns None without asking
# the readers after it (None from a reader: not its kind, the next one is asked).
NOTHING: Plan = ("nothing",)
_SGLANG: Votes = (("sglang", 3),)
_VLLM: Votes = (("vllm", 3),)


def _event(
    kind: str,
    phase: str | None,
    data: dict[str, Any],
    votes: Votes,
    text: str,
    facts: tuple[tuple[str, Any], ...] = (),
) -> Plan:
    return ("event", kind, phase, data, votes, text, facts)


@short_line_memo()
def memory_plan(t: str) -> Plan | None:
    """What a memory line says, as a pure function of its text (memoised for short lines): None
    (nothing), or a `Plan` the handler (`_memory`) applies to the state. The readers below are asked
    in order; the first that knows the line answers."""
    low = t.lower()
    if not any(k in low for k in MEMORY_KEYS):
        return None  # a line that merely mentions memory: no regex needed
    text = clean(t).text
    for read in _MEMORY_READERS:
        plan = read(text)
        if plan is not None:
            return None if plan is NOTHING else plan
    return None


def _gpu_oom(text: str) -> Plan | None:
    """A CUDA-style OOM (its figures and phase are read by the handler), or TensorRT-LLM's executor
    creation failing for memory (the figures follow on the next lines)."""
    if P.CUDA_OOM.search(text) or P.VLLM_NOT_ENOUGH_LOAD.search(text):
        return ("oom", text)
    if "nsufficient GPU memory" in text and P.TRT_EXECUTOR_OOM.search(text):
        return ("trt_executor", text)  # TensorRT-LLM's PyTorch executor: the figures follow
    return None


def _ray_killed(text: str) -> Plan | None:
    """Ray's memory monitor killed a worker (host RAM): the node's figures, the task it killed."""
    if not ("Ray killed" in text or "usage threshold" in text) or not (
        m := P.RAY_KILLED.search(text)
    ):
        return None
    data: dict[str, Any] = {"killer": "ray memory monitor"}
    if m.group(1):
        data.update(
            node_used_gb=float(m.group(1)),
            node_total_gb=float(m.group(2)),
            node_fraction=float(m.group(3)),
            threshold=float(m.group(4)),
        )
    if task := P.RAY_TASK_NAME.search(text):
        data.update(
            task=task.group(1), task_pid=int(task.group(2)), task_used_gb=float(task.group(3))
        )
    return ("host", data, text)


def _kv_alloc_failed(text: str) -> Plan | None:
    """SGLang's KV pool gave a batch no slots: fatal (the figures follow on the next lines)."""
    if ("ry to lower" in text or "never happen" in text) and (
        m := P.SGL_KV_ALLOC_FAIL.search(text)
    ):
        return ("kv_alloc", m.group(1).lower() if m.group(1) else None, text)
    return None


def _host_allocation(text: str) -> Plan | None:
    """Host RAM refused to torch's CPU allocator or to Python (MemoryError)."""
    if "DefaultCPUAllocator" in text and (m := P.CPU_ALLOC_OOM.search(text)):
        n = int(m.group(1)) * (1 << 30 if m.group(2) == "GB" else 1)
        return ("host", {"killer": "torch DefaultCPUAllocator", "requested_bytes": n}, text)
    if "MemoryError" in text and (m := P.PY_MEMORY_ERROR.search(text)):
        data: dict[str, Any] = {"killer": "python MemoryError"}
        if m.group(1):
            data["requested_mib"] = size_mib(m.group(1))
        return ("host", data, text)
    return None


def _retract_pool_full(text: str) -> Plan | None:
    """SGLang's "Retract requests" line (the pool is full: requests go back to the queue)."""
    if not ("Retract requests" in text and (m := P.SGL_RETRACT_POOL_FULL.search(text))):
        return None
    data: dict[str, Any] = {"retracted_reqs": int(m.group(1))}
    if m.group(2):
        data["new_tokens_gained"] = int(m.group(2))
    if m.group(3):
        data["new_token_ratio_from"] = float(m.group(3))
        data["new_token_ratio_to"] = float(m.group(4))
    return _event("retraction", "decode", data, (("sglang", 3),), text)


def _startup_figures(text: str) -> Plan | None:
    """The memory figures servers print at start-up: SGLang's pool end and profiled token budget,
    vLLM's budget line, its desired-utilization line (0.11+) and utilization hint (0.21+). A line
    with one of their markers but not the figures says nothing (NOTHING)."""
    if "Memory pool end" in text:
        m = P.SGL_POOL_END.search(text)
        if not m:
            return NOTHING
        return ("facts", (("avail_after_pool_mib", gib_text_to_mib(m.group(1))),), _SGLANG)
    if "total_gpu_memory" in text:
        m = P.VLLM_BUDGET.search(text)
        if not m:
            return NOTHING
        return (
            "facts",
            (
                ("total_gpu_mib", gib_text_to_mib(m.group(1))),
                ("gpu_memory_utilization", float(m.group(2))),
            ),
            _VLLM,
        )
    if "Desired GPU memory" in text and (m := P.VLLM_DESIRED.search(text)):
        return _desired_utilization(text, m)
    if "gpu-memory-utilization=" in text:
        m = P.VLLM_UTIL_EQUIV.search(text)
        if not m:
            return NOTHING
        return ("facts", (("gpu_memory_utilization", float(m.group(1))),), _VLLM)
    if "profiled value" in text:
        m = P.SGL_PROFILED.search(text)
        return NOTHING if not m else _profiled_tokens(text, m)
    return None


def _desired_utilization(text: str, m: re.Match[str]) -> Plan:
    """vLLM 0.11+ after start-up: the configured share and, in the same line, the KV cache size
    that would fit it (negative when weights + activations + graphs already exceed it)."""
    facts: list[tuple[str, Any]] = [("gpu_memory_utilization", float(m.group(1)))]
    if fm := P.VLLM_FREE_STARTUP.search(text):
        facts.append(("total_gpu_mib", gib_text_to_mib(fm.group(2))))
    if (k := P.VLLM_KV_SUGGEST.search(text)) and int(k.group(1)) < 0:
        return _event(
            "kv_budget_negative",
            "startup",
            {
                "reason": "vllm_kv_cache_memory_negative",
                "kv_cache_memory_bytes": int(k.group(1)),
                "kv_cache_memory_mib": round(int(k.group(1)) / 1048576, 1),
                "gpu_memory_utilization": float(m.group(1)),
                "requested_mib": gib_text_to_mib(m.group(2)),
            },
            _VLLM,
            text,
            tuple(facts),
        )
    return ("facts", tuple(facts), _VLLM)


def _profiled_tokens(text: str, m: re.Match[str]) -> Plan:
    """SGLang's "max_total_tokens=N is larger than the profiled value M": the budget capped (or
    none left when M <= 0)."""
    profiled = int(m.group(2))
    return _event(
        "kv_budget_negative" if profiled <= 0 else "kv_budget_capped",
        "kv_cache_alloc",
        {
            "reason": "sglang_profiled_tokens_negative"
            if profiled <= 0
            else "sglang_max_total_tokens_capped",
            "max_total_tokens": int(m.group(1)),
            "profiled_tokens": profiled,
        },
        (("sglang", 5),),
        text,
        (("max_total_tokens", int(m.group(1))),),
    )


def _retraction(text: str) -> Plan | None:
    """SGLang's decode/prefill retraction warning (the older wordings)."""
    if not ((m := P.SGL_RETRACT.search(text)) and ("retracted" in text or "happened" in text)):
        return None
    data: dict[str, Any] = {}
    if m.group(2):
        data = {
            "retracted_reqs": int(m.group(2)),
            "new_token_ratio_from": float(m.group(3)),
            "new_token_ratio_to": float(m.group(4)),
        }
    return _event("retraction", m.group(1).lower(), data, _SGLANG, text)


def _kv_budget_error(text: str) -> Plan | None:
    """The KV cache has no room: vLLM's "No available memory for the cache blocks", its max seq len
    checks (V1 and V0), its start-up free-memory check, SGLang's "Not enough memory" for the pool."""
    if P.VLLM_NO_KV.search(text):
        return _event(
            "kv_budget_error",
            "kv_cache_alloc",
            {"reason": "no_memory_for_cache_blocks"},
            _VLLM,
            text,
        )
    if m := P.VLLM_MAX_SEQ.search(text):
        data: dict[str, Any] = {
            "reason": "max_seq_len_exceeds_kv_cache",
            "max_seq_len": int(m.group(1)),
            "needed_mib": gib_text_to_mib(m.group(2)),
            "available_mib": gib_text_to_mib(m.group(3)),
        }
        return _event("kv_budget_error", "kv_cache_alloc", data, _VLLM, text)
    if m := P.VLLM_MAX_SEQ_V0.search(text):
        data = {
            "reason": "max_seq_len_exceeds_kv_cache",
            "max_seq_len": int(m.group(1)),
            "kv_cache_tokens": int(m.group(2)),
        }
        return _event("kv_budget_error", "kv_cache_alloc", data, _VLLM, text)
    if m := P.VLLM_FREE_LT.search(text):
        return _free_below_utilization(text, m)
    if P.SGL_NOT_ENOUGH.search(text):
        data = {"reason": "sglang_not_enough_memory_for_kv_pool"}
        return _event("kv_budget_error", "kv_cache_alloc", data, _SGLANG, text)
    return None


def _free_below_utilization(text: str, m: re.Match[str]) -> Plan:
    """vLLM's start-up check: less free memory on the device than the share asks for."""
    free, total = gib_text_to_mib(m.group(2)), gib_text_to_mib(m.group(3))
    data: dict[str, Any] = {
        "reason": "free_memory_below_utilization",
        "free_mib": free,
        "total_mib": total,
        "device": m.group(1),
    }
    if m.group(4):
        data.update(
            gpu_memory_utilization=float(m.group(4)), requested_mib=gib_text_to_mib(m.group(5))
        )
    facts: list[tuple[str, Any]] = [("total_gpu_mib", total)]
    if m.group(4):
        facts.append(("gpu_memory_utilization", float(m.group(4))))
    return _event("kv_budget_error", "startup", data, (("vllm", 5),), text, tuple(facts))


def _other_memory_event(text: str) -> Plan | None:
    """SGLang's request slots exhausted, Triton's shared-memory limit (not the autotuner skipping a
    candidate: NOTHING), Ray's OOM, an RDMA registration failure, SGLang's multimodal preprocessing
    retried on the CPU."""
    if P.SGL_REQ_SLOTS.search(text):
        return _event("req_slots_exhausted", None, {}, _SGLANG, text)
    if m := P.TRITON_SMEM.search(text):
        if any(k in text for k in AUTOTUNE_SKIP):
            return NOTHING  # inductor's autotuner skipped one candidate config: harmless
        data: dict[str, Any] = {}
        if m.group(1):
            data = {"required_bytes": int(m.group(1)), "limit_bytes": int(m.group(2))}
        return _event("triton_shared_memory", None, data, (), text)
    if P.RAY_OOM.search(text):
        return _event("host_oom", None, {"killer": "ray memory monitor"}, (), text)
    if m := P.RDMA_REGISTER.search(text):
        data = {"address": m.group(1), "error": (m.group(2) or "").strip()}
        return _event("rdma_registration_failed", None, data, (), text)
    if P.MM_CPU_RETRY.search(text):
        return _event("mm_preprocess_gpu_oom", "preprocessing", {}, _SGLANG, text)
    return None


# memory_plan's readers, in the order they are asked (the first that knows a line answers)
_MEMORY_READERS: tuple[Callable[[str], Plan | None], ...] = (
    _gpu_oom,
    _ray_killed,
    _kv_alloc_failed,
    _host_allocation,
    _retract_pool_full,
    _startup_figures,
    _retraction,
    _kv_budget_error,
    _other_memory_event,
)


# Above this, torch's "PyTorch limit" is its UINT64_MAX sentinel (no fraction set): 16 EiB in MiB.
NO_LIMIT_MIB = float(1 << 40)
_ASYNC_KEYS = {
    "Currently allocated": "allocated_mib",
    "Requested": "requested_mib",
    "Device limit": "total_mib",
    "PyTorch limit": "allowed_mib",
}


def _oom_wrapped(hit: Hit, text: str) -> tuple[str, str]:
    """torch's caching-allocator OOM message wrapped over several rows (a terminal, a pasted issue):
    the rows after it are joined, past sentence ends, while they continue the message and its last
    figure (patterns.OOM_END) has not come. Three joins: `_message`'s rule (a row as wide as a terminal
    wrapped mid-word, a shorter one at a space), every row with a space (a soft wrap as wide as a
    terminal) and every row glued (a hard wrap narrower than a terminal): returns the first and the
    other two separated by a newline (a figure the first misses is read from them)."""
    out, spaced, glued, prev = text, text, text, hit.text
    for nxt in hit.following(16):  # a 40-column wrap of the longest message
        if P.OOM_END.search(spaced) or not is_continuation(nxt):
            break
        piece = strip_noise(nxt).rstrip()
        row = strip_noise(prev).rstrip("\r\n")
        hard_wrap = len(row) >= WRAP_COLUMNS and not row.endswith(" ")
        out += ("" if hard_wrap or out[-1:].isspace() or piece[:1].isspace() else " ") + piece
        spaced += " " + piece.lstrip()
        glued += piece
        prev = nxt
    return out, spaced + "\n" + glued


def _async_figures(hit: Hit, msg: str, data: dict[str, Any]) -> str:
    """torch's cudaMallocAsync OOM ("Allocation on device N would exceed allowed memory. (out of
    memory)"): its figures are on the following lines, one per line, the limit's value on the line
    after its name (patterns.OOM_ASYNC_FIELD). Fills `data` (MiB; `allowed_mib` only for a real
    limit, not torch's no-limit sentinel) and returns the message with the figure lines joined."""
    if m := P.OOM_ASYNC_DEVICE.search(msg):
        data["gpu"] = int(m.group(1))
    data["allocator"] = "cudaMallocAsync"
    pending: str | None = None
    parts = [msg]
    for raw in hit.following(8):
        line = clean(raw).text.strip()
        m = P.OOM_ASYNC_FIELD.match(line) if line else None
        if m is None or not (m.group(1) or (pending and m.group(2))):
            break
        name = m.group(1) or pending or ""
        parts.append(" ".join(line.split()))
        if m.group(2) is None:
            pending = (
                name  # "PyTorch limit (set by user-supplied memory fraction)": value next line
            )
            continue
        pending = None
        value = size_mib(m.group(2))
        key = "free_mib" if name.startswith("Free") else _ASYNC_KEYS.get(name.split(" (")[0])
        if key == "allowed_mib" and (value is None or value >= NO_LIMIT_MIB):
            continue  # the limit line is printed always; this value means "no fraction set"
        if key is not None and value is not None:
            data[key] = value
    return " ".join(parts)


def _async_fields(lines: list[str], data: dict[str, Any]) -> None:
    """The cudaMallocAsync figure lines ("Currently allocated     : 16.08 GiB", ...) into `data`."""
    pending: str | None = None
    for raw in lines:
        line = raw.strip().strip('")')
        m = P.OOM_ASYNC_FIELD.match(line)
        if m is None:
            continue
        name = m.group(1) or pending or ""
        if m.group(2) is None:
            pending = name
            continue
        pending = None
        value = size_mib(m.group(2))
        key = "free_mib" if name.startswith("Free") else _ASYNC_KEYS.get(name.split(" (")[0])
        if key == "allowed_mib" and (value is None or value >= NO_LIMIT_MIB):
            continue
        if key is not None and value is not None:
            data[key] = value


# llama.cpp names what it was allocating on the lines after cudaMalloc's failure; TGI's shard names the
# method that failed ("Method Prefill encountered an error.") on the line after the router's error, its
# router the warm-up ("Unable to warmup model: ..."); TensorRT-LLM's Triton backend fails creating the
# model instance (its runtime buffers and KV cache) at start-up.
def _phase_from_lines(hit: Hit, msg: str) -> str | None:
    if "warmup" in msg.lower():
        return "warmup"
    if "Failed to create instance" in msg or "modelInstanceState" in msg:
        return "startup"
    after = [clean(x).text for x in hit.after(4)]
    if "cudaMalloc failed" in msg:
        for line in after:
            for phase, rx in P.LCPP_WHAT:
                if rx.search(line):
                    return phase
        return None
    for line in after[:2]:
        if m := P.TGI_METHOD.search(line):
            return {"Warmup": "warmup", "Prefill": "prefill", "Decode": "decode"}.get(m.group(1))
    if any(P.TGI_SHARD_START.search(line) for line in after):
        return "weight_load"  # TGI's shard died before it was ready: while loading the model
    return None


def _lcpp_retry(hit: Hit) -> dict[str, Any] | None:
    """llama.cpp's retry after a compute buffer failed with pipeline parallelism: {"retried": the
    retry line, "recovered": the line showing the context was then created, or None}; None when the
    lines after the OOM show no retry."""
    after = hit.after(12)
    for i, raw in enumerate(after):
        if P.LCPP_RETRY_NO_PP.search(raw):
            out: dict[str, Any] = {
                "retried": clean(raw).text.strip()[:200],
                "retried_line": hit.lineno + i + 1,
            }
            for j, nxt in enumerate(hit.after(i + 40)[i + 1 :]):
                x = clean(nxt).text
                if "failed to" in x or "error" in x.lower() or "cudaMalloc failed" in x:
                    break  # the retry failed too
                if P.LCPP_CONTEXT_READY.search(x):
                    out["recovered"] = x.strip()[:200]
                    out["recovered_line"] = hit.lineno + i + j + 2
                    break
            return out
    return None


def _frames_above(before: str) -> str:
    """The traceback frames directly above an error line, without a header (an excerpt that starts
    mid-traceback), or "" when the line above is not a frame.

    A frame is its 'File "..."' line, the code line right after it and Python 3.11+'s caret line."""
    lines = before.rstrip("\n").split("\n")[-200:]
    # a request echo quoting a traceback is user text: it ends the run of frames
    texts = ["" if P.request_echo(t) >= 0 else t for t in (clean(x).text for x in lines)]
    k = len(lines)
    while k > 0:
        s = texts[k - 1]
        older = texts[k - 2] if k >= 2 else ""
        if 'File "' in s or (s and not s.strip("^~ ")) or ('File "' in older and s):
            k -= 1
            continue
        break
    region = lines[k:]
    return "\n".join(region) if any('File "' in t for t in texts[k:]) else ""


def _chained_below(after: list[str]) -> str:
    """The frames of the traceback Python chains right after an error ("During handling of the above
    exception, another exception occurred:"), up to its own error line; "" when none follows."""
    for i, raw in enumerate(after[:FRAME_GAP_LINES]):
        if (
            "During handling of the above exception" in raw
            or "The above exception was the direct cause" in raw
        ):
            out: list[str] = []
            for nxt in after[i + 1 :]:
                s = clean(nxt).text
                if (
                    s
                    and not nxt[:1].isspace()
                    and 'File "' not in s
                    and not s.startswith("Traceback")
                    and out
                ):
                    break
                out.append(nxt)
            return "\n".join(out)
    return ""


def _nccl_traceback_below(after: list[str]) -> str:
    """The traceback that follows an NCCL "Cuda failure 'out of memory'" WARN line (NCCL's C code prints
    its WARN when the failure happens, before Python raises): its frames, up to an exception line that is
    NCCL's own ("NCCL error", "unhandled cuda error", ncclUnhandledCudaError); "" when none follows
    within 60 lines."""
    out: list[str] = []
    started = False
    for raw in after[:60]:
        s = clean(raw).text
        if not started:
            started = s.startswith("Traceback (most recent call last)")
            continue
        if 'File "' in s or raw[:1].isspace() or not s or s.startswith("  "):
            out.append(raw)
            continue
        if out and P.EXCEPTION_LINE.match(s):
            low = s.lower()
            return "\n".join(out) if ("nccl" in low or "unhandled cuda error" in low) else ""
        out.append(raw)  # a code line of a frame that lost its indentation
    return ""


# A graceful stop that an operator or a supervisor began (Ctrl-C, docker stop / SIGTERM):
# uvicorn's shutdown lines (every SGLang and vLLM HTTP server), vLLM's launcher "Shutting down FastAPI
# HTTP server.", Python's KeyboardInterrupt (Ctrl-C; vLLM turns SIGTERM into one), a terminal's "^C".
# A SIGKILL after one of them, with no start-up line in between, is the stop timeout (docker stop's
# 10 s, Kubernetes' grace period), not the OOM killer.
STOP_MARKS = (
    b"Waiting for application shutdown",
    b"Application shutdown complete",
    b"INFO:     Shutting down",
    b"Shutting down FastAPI HTTP server",
    b"KeyboardInterrupt",
    b"Received SIGTERM",
    b"Received SIGINT",
    b"Received sigint",
    b"\n^C",
)
# a server (re)started after the stop: the kill is not that stop's
START_MARKS = (
    "Application startup complete",
    "Started server process",
    "Uvicorn running",
    "fired up",
)
STOP_LOOKBACK = 64 << 10


# torch inductor's max-autotune (torch/_inductor/select_algorithm.py) benchmarks candidate kernels and
# skips one that fails: log.error("Runtime error during autotuning: \n%s. \nIgnoring this choice.", msg),
# and log.warning(e) for a triton OutOfResources; both from its own logger (torch's log format names
# the file). "out of resource: shared memory" there is one rejected config, not a failure.
AUTOTUNE_SKIP = ("select_algorithm", "during autotuning", "Ignoring this choice")


def _failed_procs(text: str, after: list[str]) -> dict[str, int]:
    """The failed processes a death line names: name -> exit code ({} when it names none)."""
    procs: dict[str, int] = {}
    if m := P.VLLM_FAILED_PROCS.search(text):
        procs = {k: int(v) for k, v in P.VLLM_FAILED_PROC.findall(m.group(1))}
    elif "scheduler is dead" in text:  # SGLang: "Exit code: C" on one of the next lines
        rank = text.split(" scheduler is dead")[0].split()[-1]
        for raw in after[:3]:
            if code := P.SGL_EXIT_CODE.match(clean(raw).text):
                procs = {f"Scheduler rank {rank}": int(code.group(1))}
                break
    return procs


def _crash_error(
    hit: Hit, after: list[str], see_above: bool, data: dict[str, Any]
) -> dict[str, Any]:
    """The crash's exception line as event fields ("error", "error_above"), or {} when none."""
    for raw in () if see_above else after:
        # the exception's own last line ("ValueError: ..."), when the text has it
        s = clean(raw).text
        if P.EXCEPTION_LINE.match(s):
            return {"error": s[:300]}
    if see_above and -9 not in data.get("failed_procs", {}).values():
        # "See root cause above": the last exception line in the 200 lines above it (a
        # process killed by SIGKILL printed none: an older one would not be its cause)
        for raw in reversed(hit.before(32 << 10).split("\n")[-200:]):
            s = clean(raw).text
            if P.EXCEPTION_LINE.match(s) and not P.VLLM_CRASH.search(s):
                return {"error": s[:300], "error_above": True}
    return {}


def _oom_line(hit: Hit, text: str) -> str:
    """The OOM line's own text: a wrapped start joined back on, squashed-on records cut off."""
    if text.startswith("ream->") or (text[:1].islower() and "): out of memory (" in text):
        # a terminal wrapped TensorRT-LLM's "CUDA runtime error in ::cudaMallocAsync(...): out of
        # memory" before its tail: the row above carries the start of the message
        above = hit.before(4096).rstrip("\n").rsplit("\n", 1)[-1]
        if "CUDA runtime error" in above:
            text = clean(above).text + text
    if "        " in text and (sq := P.SQUASHED_RECORD.search(text)):
        text = text[: sq.start()]  # the next records squashed onto the error's line
    return text


def _leak_body(hit: Hit, text: str, wording: str) -> str:
    """The leak self-check's text: its line, its field lines, and (KV pool) the row above."""
    body = text
    for nxt in hit.following(6):
        s = strip_noise(nxt).strip()
        if P.LEAK_FIELD.search(s) and not P.LEAK.search(s) and not s.startswith("self."):
            body += " " + s
        else:
            break
    if wording.startswith("KV cache pool leak"):
        prev = hit.before(4096).rstrip("\n").rsplit("\n", 1)[-1]
        if P.request_echo(prev) >= 0:
            prev = ""  # a request echo above is user text
        body = prev + " " + body
    return body


def _leak_tagged_pools(body: str) -> dict[str, dict[str, int]]:
    """Pool name -> its counts from 0.5.12+'s "[pool] total=..." parts ({} when there are none)."""
    # 0.5.12+: one "[pool] total=..., available=..., ..." part per pool; each pool's deficit is
    # total minus every count the checker adds (available, evictable, protected, session_held,
    # uncached and any other held count a fork prints).
    tagged: dict[str, dict[str, int]] = {}
    if "] total=" in body:
        tagged = {
            name: {k: int(v) for k, v in P.LEAK_POOL_FIELD.findall(part)}
            for name, part in P.LEAK_POOL.findall(body)
        }
        tagged = {name: f for name, f in tagged.items() if "total" in f and "available" in f}
    return tagged


def _leak_pool(wording: str, body: str) -> str:
    """Which pool the self-check's wording is about: "req", "busy", "swa" or "token"."""
    pool = "token"
    if wording.startswith("req_to_token"):
        pool = "req"
    elif "Mem Leak Detected" in wording:
        pool = "busy"
    elif "[swa]" in body and "[full]" not in body:
        pool = "swa"
    return pool


def _leak_counts(fields: dict[str, int]) -> tuple[int | None, int | None, int, int, int]:
    """(total, available, evictable, protected, held) from the fields, any version's names."""
    total = (
        fields.get("total")
        or fields.get("max_total_num_tokens")
        or fields.get("max_total_num_token")
        or fields.get("total_size")
    )
    avail = fields.get("available", fields.get("available_size", fields.get("full_available_size")))
    evict = fields.get("evictable", fields.get("evictable_size", 0))
    prot = fields.get("protected", fields.get("protected_size", 0))
    held = fields.get("session_held", 0) + fields.get("uncached", 0)
    return total, avail, evict, prot, held


def _leak_hybrid_pools(hybrid: dict[str, list[int]]) -> dict[str, dict[str, int]]:
    """Pool name -> its counts and deficit ("leaked"), from a hybrid model's per-pool figures."""
    pools = {}
    for name, (av, ev_, tot, pr) in hybrid.items():
        pools[name] = {
            "total": tot,
            "available": av,
            "evictable": ev_,
            "protected": pr,
            "leaked": tot - av - ev_ - pr,
        }
    return pools


def _leak_worst_pool(pools: dict[str, dict[str, Any]], body: str) -> str:
    """The name of the pool with the largest deficit (after adding each pool's leaked pages)."""
    for name, pages in P.LEAK_PAGES.findall(body):
        if name in pools:
            pools[name]["leaked_pages"] = pages
    return max(pools, key=lambda k: abs(pools[k]["leaked"]))


def autotune_choice(hit: Hit) -> bool:
    """Whether a Triton out-of-resource line is inside the autotuner's 'Runtime error during
    autotuning: ... Ignoring this choice.' message (it spans lines: the error text is multi-line)."""
    above = hit.before(2048).rstrip("\n").rsplit("\n", 2)[-2:]
    return any(k in x for x in above + hit.after(3) for k in AUTOTUNE_SKIP)


def _operator_stop(hit: Hit) -> str | None:
    """The graceful-stop line (from its mark) that came before this SIGKILL line with no (re)start in
    between, or None. Marks inside a request echo are user text and skipped."""
    region = ""
    for mark in STOP_MARKS:
        r = hit.since_last_own(mark, STOP_LOOKBACK, P.request_echo)
        if r and (not region or len(r) < len(region)):
            region = r  # the latest stop mark
    if not region or any(m in region for m in START_MARKS):
        return None
    return region.lstrip("\n").split("\n", 1)[0].strip()[:200]


class EventsMixin:
    """Failure handlers of FileExtractor; see the module docstring."""

    name: str
    event_counts: dict[str, int]
    votes: dict[str, int]
    model_files: set[str]
    tracebacks_read: int
    mm_evidence: Evidence | None
    events: list[LogEvent]
    _stores: int

    def ev(self, hit: Hit, text: str | None = None) -> Evidence:
        raise NotImplementedError  # provided by FileExtractor

    def put(self, name: str, value: Any, prio: float, evidence: Evidence | Hit) -> None:
        raise NotImplementedError  # provided by FileExtractor

    def add_event(self, event: LogEvent) -> None:
        raise NotImplementedError  # provided by FileExtractor

    def cut(self, t: str) -> str:
        raise NotImplementedError  # provided by FileExtractor: redact, then cut to EVIDENCE_CHARS

    def _exception(self, hit: Hit, t: str) -> None:
        vllm = None  # vLLM's own death lines ("EngineCore failed to start." ...), not "hit an exception"
        if "hit an exception" not in t and "run_tp_server" not in t:
            vllm = P.VLLM_CRASH.search(t)
            if vllm is None or t[vllm.start() - 1 : vllm.start()] in ("'", '"', "{"):
                return  # a mention, or the server's source quoted in a traceback (a string literal)
            self.votes["sglang" if "scheduler is dead" in t else "vllm"] += 3
        if "Scheduler hit" in t or "TpModelWorkerClient hit" in t:
            self.votes["sglang"] += 3
        elif "EngineCore hit" in t:
            self.votes["vllm"] += 3
        if "run_tp_server" in t:
            if "Exception in run_tp_server" not in t:
                return  # a frame or a mention, not the crash line
            self.votes["sglang"] += 3  # SGLang 2024 "Exception in run_tp_server:"
        # the server's crash line: the process died of an exception (its cause is further down)
        crash_kept = self.event_counts.get("server_crash", 0) < MAX_EVENTS_PER_KIND
        if not crash_kept and self.tracebacks_read >= MAX_TRACEBACKS:
            self.event_counts["server_crash"] += 1  # counted; the first ones carry the detail
            return
        after = hit.after(150)
        if crash_kept:
            text = clean(t).text
            data: dict[str, Any] = {
                "process": text.split(" hit an exception")[0].split()[-1]
                if " hit an exception" in text
                else "run_tp_server"
            }
            see_above = False
            if vllm is not None:
                see_above = self._vllm_death(hit, vllm, text, after, data)
            data.update(_crash_error(hit, after, see_above, data))
            self.add_event(
                LogEvent("server_crash", self.name, hit.lineno, self.cut(text), None, data)
            )
        else:
            self.event_counts["server_crash"] += 1
        if self.tracebacks_read < MAX_TRACEBACKS:
            self.tracebacks_read += 1
            self._frames("\n".join(after))

    def _vllm_death(
        self, hit: Hit, vllm: re.Match[str], text: str, after: list[str], data: dict[str, Any]
    ) -> bool:
        """Whether a death line's cause is above it (fills data, adds any sigkill event)."""
        proc = next(g for g in vllm.groups() if g)
        data["process"] = {
            "Engine core": "EngineCore",
            "scheduler": "Scheduler",
            "Error executing method": "worker",
        }.get(proc, proc)
        # "initialization failed. See root cause above" / "died unexpectedly" / "scheduler is
        # dead": the cause is above (or nowhere: a process killed by a signal prints nothing)
        see_above = (
            "initialization failed" in text
            or "died unexpectedly" in text
            or "Engine process" in text
            or "scheduler is dead" in text
        )
        if see_above:
            data["report"] = True  # another process's death reported, not an exception here
        procs = _failed_procs(text, after)
        if procs:
            data["failed_procs"] = procs  # name -> exit code (-9: killed by SIGKILL)
            killed = sorted(k for k, v in procs.items() if v == -9)
            if killed and self.event_counts.get("sigkill", 0) < MAX_EVENTS_PER_KIND:
                self.add_event(
                    LogEvent(
                        "sigkill",
                        self.name,
                        hit.lineno,
                        self.cut(text),
                        None,
                        {"killer": "sigkill", "process": ", ".join(killed)},
                    )
                )
        return see_above

    def _frames(self, text: str) -> None:
        """Model files and attention backend read off traceback paths (lowest priority)."""
        for f in P.MODEL_FILE.findall(text):
            self.model_files.add(f)
        if not text:
            return
        m = P.TRACE_BACKEND.search(text)
        if m:
            name = m.group(1) or "flashinfer"
            self.put(
                "attention_backend",
                name,
                INFERRED,
                Evidence(self.name, 0, "traceback: " + m.group(0)),
            )

    def _region(self, hit: Hit) -> str:
        """The traceback that ends at this error line, or "" when the error has none of its own.

        A traceback printed earlier (a warning a minute before, another rank's error) is not this
        error's: its last frame must be within FRAME_GAP_LINES lines of the error. An excerpt that
        starts mid-traceback (no header) still has its frames: the run of frame lines right above.
        When the error has no frames above but Python chains another traceback right after it
        ("During handling of the above exception, another exception occurred:"), that traceback's
        frames show where the server was (the chained one is raised while handling this one).
        """
        # (a traceback header inside a request echo is user text: skipped)
        region = hit.since_last_own(P.TRACEBACK_BYTES, 48 << 10, P.request_echo)
        if not region:
            region = _frames_above(hit.before(32 << 10))
            if not region:
                return _chained_below(hit.after(FRAME_GAP_LINES + 160))
        last_frame = region.rfind('File "')
        tail = region[last_frame:] if last_frame >= 0 else region
        if tail.count("\n") > FRAME_GAP_LINES:
            return ""
        return region

    @staticmethod
    def _markers(text: str) -> dict[str, int]:
        """Last position of each phase marker in the frames. Each marker has its own regex (one
        alternation of all of them is slower in Python's engine); the weak and multimodal ones run
        only when a cheap substring says they can match."""
        last: dict[str, int] = {}
        for name, rx in P.PHASE_MARKERS:
            for m in rx.finditer(text):
                last[name] = m.start()
        if "sampler" in text and (m := P.SAMPLER_WARMUP.search(text)):
            last["sampler"] = m.start()
        if "_dummy" in text and (m := P.WARMUP_LEAF.search(text)):
            last["warmup_leaf"] = m.start()
        if any(k in text for k in P.MM_HINTS):
            if m := P.MM_FRAMES.search(text):
                last["mm"] = m.start()
            elif "general_mm_embed_routine" in text:
                last["mm_model"] = text.index("general_mm_embed_routine")
        if not any(name in last for name in P.CONTEXT_PHASES):
            for name, rx in P.FORWARD_MARKERS:
                for m in rx.finditer(text):
                    last[name] = m.start()
            if "replay" in text:
                # a CUDA graph replay while serving: the runner's file says decode or prefill
                for m in P.REPLAY_FRAME.finditer(text):
                    runner = m.group(1)
                    kind = (
                        "prefill" if any(k in runner for k in P.REPLAY_PREFILL_FILES) else "decode"
                    )
                    last[kind] = max(last.get(kind, -1), m.start())
            for m in P.SERVING_FRAMES.finditer(text):
                last["serving"] = m.start()
        return last

    @staticmethod
    def _phase(marks: dict[str, int]) -> str | None:
        """The phase the traceback's frames show (None when they do not tell)."""
        context = [(pos, name) for name, pos in marks.items() if name in P.CONTEXT_PHASES]
        if context:
            return max(context)[1]  # the innermost context frame
        if ("warmup_leaf" in marks or "sampler" in marks) and "serving" not in marks:
            return "warmup"  # (vLLM's dummy passes never run under execute_model)
        if "mm" in marks:
            return "prefill"  # the vision encoder or the merge of its output: a multimodal prefill
        forward = [(pos, name) for name, pos in marks.items() if name in ("decode", "prefill")]
        if forward:
            return max(forward)[1]
        # serving a batch, the frames do not say prefill or decode (vLLM V1 mixes them in one batch)
        return "serving" if "serving" in marks else None

    def _message(self, hit: Hit, text: str) -> str:
        """The error message plus its terminal-wrapped tail (up to 3 lines).

        A line is joined only while the message stops mid-sentence (not after '.', ')' ...)
        and the next line does not start a new record. A terminal wraps at its width (80 columns or
        more), anywhere in a word: such a row is joined as is; a shorter row ended at a word
        boundary (a newline in the message itself), so a space goes between them.
        """
        out = text
        prev = hit.text
        for nxt in hit.following(3):
            if not out or out[-1] in ".)]:!?" or not is_continuation(nxt):
                break
            piece = strip_noise(nxt).rstrip()
            row = strip_noise(prev).rstrip("\r\n")
            # a terminal's wrap splits anywhere: the row's own trailing space is the only separator
            hard_wrap = len(row) >= WRAP_COLUMNS and not row.endswith(" ")
            sep = "" if hard_wrap or out[-1].isspace() or piece[:1].isspace() else " "
            out += sep + piece
            prev = nxt
        return out

    def _kv_alloc(self, hit: Hit, phase: str | None, text: str) -> None:
        """SGLang's KV pool could not give a batch its token slots (fatal in every version): the
        requested and available tokens from the lines after the message, the phase from the message
        (or the frames), one event per failure (logger.error's line and the RuntimeError it raises
        next are the same failure)."""
        self.votes["sglang"] += 5
        at = m.start() if (m := P.SGL_KV_ALLOC_FAIL.search(text)) else 0
        # "RuntimeError: ..." (or a fork's own exception class): the raise, not logger.error's line
        raised = text[:at].rstrip().endswith(":")
        n = self.event_counts.get("kv_pool_exhausted", 0)
        if n >= MAX_EVENTS_PER_KIND:  # counted (logger.error's line; its raise is the same failure)
            self.event_counts["kv_pool_exhausted"] = n + (0 if raised else 1)
            return
        data: dict[str, Any] = {"fatal": True}
        pools: dict[str, dict[str, int]] = {}
        if m := P.SGL_KV_ALLOC_TRY.search(text):  # a paste that lost the message's newlines
            data["requested_tokens"] = int(m.group(1))
        for raw in hit.following(8):
            s = clean(raw).text
            if not s:
                break
            if m := P.SGL_KV_ALLOC_TRY.match(s):
                data["requested_tokens"] = int(m.group(1))
            elif m := P.SGL_KV_ALLOC_EVICTABLE.match(s):
                pools.setdefault("token", {})["evictable_tokens"] = int(m.group(1))
            elif "_size()=" in s and (m := P.SGL_KV_ALLOC_SIZE_CALL.search(s)):
                key = "free_tokens" if m.group(1) == "available" else "evictable_tokens"
                pools.setdefault("token", {})[key] = int(m.group(2))
            elif "ble" in s and (m := P.SGL_KV_ALLOC_AVAIL.search(s)):
                pool = pools.setdefault(m.group(1) or "token", {})
                pool["available_tokens"] = int(m.group(2))
                for key, val in P.SGL_KV_ALLOC_FIELD.findall(m.group(3) or ""):
                    if "evictable" in key:
                        pool["evictable_tokens"] = int(val)
                    elif "available" in key:
                        pool["free_tokens"] = int(val)
            else:
                break
        for pool in pools.values():
            if "free_tokens" in pool and "available_tokens" not in pool:
                pool["available_tokens"] = pool["free_tokens"] + pool.get("evictable_tokens", 0)
        if pools:
            data["pools"] = pools
            want = data.get("requested_tokens")
            short = [
                n
                for n, p in pools.items()
                if want is not None and p.get("available_tokens", want) < want
            ]
            if short:
                data["short_pool"] = short[0]
        region = self._region(hit)
        self._frames(region)
        if phase is None and region:
            if "alloc_for_extend" in region or "prepare_for_extend" in region:
                phase = "prefill"
            elif "alloc_for_decode" in region or "prepare_for_decode" in region:
                phase = "decode"
        data["raised"] = raised
        if raised:  # the RuntimeError after logger.error's own line: the same failure
            for e in reversed(self.events[-MAX_EVENTS_PER_KIND:]):
                if (
                    e.kind == "kv_pool_exhausted"
                    and not e.data.get("raised")
                    and e.phase == phase
                    and e.data.get("requested_tokens") == data.get("requested_tokens")
                ):
                    e.data["raised"] = True
                    self._stores += 1  # (a change: never an inert line)
                    return
        self.add_event(
            LogEvent("kv_pool_exhausted", self.name, hit.lineno, self.cut(text), phase, data)
        )

    def _host_oom(self, hit: Hit, data: dict[str, Any], text: str) -> None:
        """Host RAM ran out (PyTorch's CPU allocator, Python's MemoryError): the phase from the
        traceback above it (loading weights, most often)."""
        n = self.event_counts.get("host_oom", 0)
        if n >= MAX_EVENTS_PER_KIND:
            self.event_counts["host_oom"] = n + 1
            return
        region = self._region(hit)
        self._frames(region)
        phase = self._phase(self._markers(region)) if region else None
        if phase in (None, "startup") and (
            "model_loader" in region or "weights_iterator" in region
        ):
            phase = "weight_load"  # vLLM model_loader/weight_utils.py *_weights_iterator
        self.add_event(
            LogEvent(
                "host_oom",
                self.name,
                hit.lineno,
                self.cut(self._message(hit, text)),
                phase,
                dict(data),
            )
        )

    def _killed(self, hit: Hit, t: str) -> None:
        """A process killed by the Linux OOM killer (kernel line, k8s OOMKilled) or by SIGKILL with no
        text of its own (the shell's "Killed", exit code -9 / 137): host RAM, most often."""
        text = clean(t).text
        if m := P.KERNEL_OOM_KILL.search(text):
            data: dict[str, Any] = {"killer": "linux oom killer"}
            if m.group(2):
                data.update(pid=int(m.group(2)), process=m.group(3), cgroup=bool(m.group(1)))
            elif m.group(6):
                data.update(pid=int(m.group(6)), process=m.group(5), constraint=m.group(4))
        elif m := P.SIGKILL_LINE.search(text):
            # a "sigkill" event, not host_oom: the OOM killer's usual mark, but SGLang's launcher also
            # SIGKILLs its own process tree after a child failed (its "Received sigquit" line first)
            n = self.event_counts.get("sigkill", 0)
            if n >= MAX_EVENTS_PER_KIND:
                self.event_counts["sigkill"] = n + 1
                return
            data = {"killer": "sigkill"}
            pid = m.group(1) or m.group(2)
            if pid:
                data["pid"] = int(pid)
            if hit.since_last_own(
                b"It usually means", 16 << 10, P.request_echo
            ):  # rfind, decoded if found
                data["cleanup"] = True
            if stop := _operator_stop(hit):
                # a graceful stop began before the kill (uvicorn's shutdown, Ctrl-C, SIGTERM)
                # and the server did not start again: the supervisor's stop timeout, not the OOM killer
                data["after_shutdown"] = stop
            self.add_event(LogEvent("sigkill", self.name, hit.lineno, self.cut(text), None, data))
            return
        else:
            return
        n = self.event_counts.get("host_oom", 0)
        if n >= MAX_EVENTS_PER_KIND:
            self.event_counts["host_oom"] = n + 1
            return
        self.add_event(LogEvent("host_oom", self.name, hit.lineno, self.cut(text), None, data))

    def _memory(self, hit: Hit, t: str) -> None:
        plan = memory_plan(t)
        if plan is None:
            return  # a line that merely mentions memory
        what = plan[0]
        if what == "oom":
            self._oom(hit, plan[1])
        elif what == "kv_alloc":
            self._kv_alloc(hit, plan[1], plan[2])
        elif what == "host":
            if str(plan[1].get("task", "")).startswith("RayWorkerVllm"):
                self.votes["vllm"] += 3  # vLLM's Ray worker, by its actor's name
            self._host_oom(hit, plan[1], plan[2])
        elif what == "trt_executor":
            self._trt_executor(hit, plan[1])
        elif what == "facts":
            for name, value in plan[1]:
                self.put(name, value, RUNTIME, hit)
            for server, n in plan[2]:
                self.votes[server] += n
        else:  # "event"
            _, kind, phase, data, votes, text, facts = plan
            for server, n in votes:
                self.votes[server] += n
            for name, value in facts:
                self.put(name, value, RUNTIME, hit)
            if kind == "triton_shared_memory" and autotune_choice(hit):
                return  # torch inductor's autotuner rejected one candidate and went on
            data = dict(data)
            if kind == "triton_shared_memory":
                # which code launched the kernel: torch.compile's generated kernels (inductor) or a
                # Triton kernel of the server (its attention backend): the lever differs
                region = self._region(hit)
                data["inductor"] = bool(P.INDUCTOR_FRAME.search(region))
                if m := P.TRACE_BACKEND.search(region):
                    data["attention_frame"] = m.group(0)[:120]
            n = self.event_counts.get(kind, 0)
            if n >= MAX_EVENTS_PER_KIND:
                self.event_counts[kind] = n + 1  # counted; the first ones carry the detail
                return
            self.add_event(
                LogEvent(
                    kind, self.name, hit.lineno, self.cut(self._message(hit, text)), phase, data
                )
            )

    def _trt_executor(self, hit: Hit, text: str) -> None:
        """TensorRT-LLM's "Executor creation failed due to insufficient GPU memory." and the lines
        its memory monitor prints after it: the component that could not be created, the device's
        total, the free memory before the attempt, and each component created before (free before /
        after, GiB). A cuda_oom event whose phase is the component's."""
        self.votes["trtllm"] += 5  # its own message (py_executor_creator.py)
        if self.event_counts.get("cuda_oom", 0) >= MAX_EVENTS_PER_KIND:
            self.event_counts["cuda_oom"] += 1
            return
        data: dict[str, Any] = {"trt_executor": True}
        created: list[dict[str, Any]] = []
        lines = [text]
        for raw in hit.following(16):
            line = clean(raw).text.strip()
            if not line:
                continue
            if m := P.TRT_COMPONENT.search(line):
                data["component"] = m.group(1)
            elif m := P.TRT_TOTAL.match(line):
                data["total_mib"] = round(float(m.group(1)) * GIB, 1)
                data.setdefault("shown", {})["total"] = f"{m.group(1)} GiB"
            elif m := P.TRT_FREE_BEFORE.match(line):
                data["free_mib"] = round(float(m.group(1)) * GIB, 1)
                data.setdefault("shown", {})["free"] = f"{m.group(1)} GiB"
            elif m := P.TRT_CREATED.match(line):
                created.append(
                    {
                        "component": m.group(1),
                        "free_before_gib": float(m.group(2)),
                        "free_after_gib": float(m.group(3)),
                    }
                )
            elif not line.startswith("Previously created"):
                break
            lines.append(line)
        if created:
            data["created"] = created
        component = str(data.get("component", ""))
        phase = (
            "kv_cache_alloc"
            if component.startswith(("KV cache", "Initial KV cache"))
            else "weight_load"
            if component.startswith(("Model", "Draft model"))
            else "startup"
        )
        if data.get("total_mib") is not None:
            self.put("total_gpu_mib", data["total_mib"], INFERRED, self.ev(hit))
        self.add_event(
            LogEvent("cuda_oom", self.name, hit.lineno, self.cut(" ".join(lines)), phase, data)
        )

    def _oom(self, hit: Hit, text: str) -> None:
        if self.event_counts.get("cuda_oom", 0) >= MAX_EVENTS_PER_KIND:
            self.event_counts["cuda_oom"] += 1  # counted; the first ones carry the detail
            return
        text = _oom_line(hit, text)
        msg = self._message(hit, text)
        alt = ""  # the same rows joined with spaces: a soft wrap as wide as a terminal looks hard
        if ("Tried to allocate" in msg or "out of memory." in msg) and (
            msg != text or not P.OOM_END.search(msg)
        ):
            msg, alt = _oom_wrapped(hit, text)  # rows past a sentence's "." carry the figures too
        region = self._region(hit)
        if (
            not region and "NCCL" in text
        ):  # NCCL's WARN line comes before the traceback Python raises
            region = _nccl_traceback_below(hit.after(60))
        self._frames(region)
        data: dict[str, Any] = {}
        msg = self._oom_async(hit, msg, data)
        self._oom_figures(hit, msg, alt, data)
        marks = self._markers(region + "\n" + msg)
        phase = self._phase(marks)
        if phase is None:
            phase = _phase_from_lines(
                hit, msg
            )  # llama.cpp, TGI, TensorRT-LLM say it in their lines
        if "cudaMalloc failed" in msg and phase == "compute_buffer" and (r := _lcpp_retry(hit)):
            data.update(r)  # llama.cpp retried without pipeline parallelism (and went on, or not)
        if "torchair" in region:
            data["torchair"] = True  # vllm-ascend's torchair graph mode ran the failing step
        if P.VLLM_NOT_ENOUGH_LOAD.search(text):
            phase = "weight_load"
        self._oom_step(hit, msg, region, marks, phase, data)
        self.add_event(LogEvent("cuda_oom", self.name, hit.lineno, self.cut(msg), phase, data))

    def _oom_async(self, hit: Hit, msg: str, data: dict[str, Any]) -> str:
        """The OOM message, with cudaMallocAsync's figures read into data (and its rows joined)."""
        if "would exceed allowed memory" in msg and "\\n" in msg:
            # TGI's router quotes the shard's message with its newlines escaped, on one line
            _async_fields(msg.split("\\n")[1:], data)
            if m := P.OOM_ASYNC_DEVICE.search(msg):
                data["gpu"] = int(m.group(1))
            data["allocator"] = "cudaMallocAsync"
        elif "would exceed allowed memory" in msg:
            msg = _async_figures(hit, msg, data)
            if data.get("total_mib") is not None:
                self.put("total_gpu_mib", data["total_mib"], INFERRED, self.ev(hit))
        return msg

    def _oom_figures(self, hit: Hit, msg: str, alt: str, data: dict[str, Any]) -> None:
        """None; the OOM message's figures (and the failing pid) are read into data."""

        def find(rx: Any) -> Any:
            return rx.search(msg) or (rx.search(alt) if alt else None)

        if "allowed;" in msg + alt and (m := find(P.OOM_ALLOWED)):
            data["allowed_mib"] = size_mib(m.group(1))  # a per-process memory fraction was set
        shown: dict[
            str, str
        ] = {}  # the figures as the message prints them (quoted, never re-rounded)
        if m := find(P.OOM_TRIED):
            data["requested_mib"] = size_mib(m.group(1))
            shown["requested"] = m.group(1)
        elif m := P.GGML_ALLOC.search(msg):
            # llama.cpp: "allocating 4480.00 MiB on device 0: cudaMalloc failed"
            data["requested_mib"] = float(m.group(1))
            data["gpu"] = int(m.group(2))
            shown["requested"] = f"{m.group(1)} MiB"
        if "pid=" in hit.text[:120] and (m := P.PROC_PID.search(hit.text, 0, 160)):
            while hit.text.startswith(" (", m.end()) and (
                n := P.PROC_PID.match(hit.text, m.end() + 1)
            ):
                m = n  # nested tags: the innermost one is the process that printed the line
            data["pid"] = int(m.group(2))  # the failing process, by its own tag
        if m := P.OOM_DEVICE.search(msg):
            data["device"] = m.group(1).upper() if m.group(1) else "HIP"  # ROCm / Ascend: not CUDA
        if m := (find(P.OOM_GPU) or find(P.OOM_GPU_OLD)):
            old = m.re is P.OOM_GPU_OLD
            data["gpu"] = int(m.group(1))
            data["total_mib"] = size_mib(m.group(2))
            data["free_mib"] = size_mib(m.group(4 if old else 3))
            shown["total"], shown["free"] = m.group(2), m.group(4 if old else 3)
            if old:
                data["allocated_mib"] = size_mib(m.group(3))
            self.put("total_gpu_mib", data["total_mib"], INFERRED, self.ev(hit))
        found = P.OOM_PROCESS.findall(msg) or (P.OOM_PROCESS.findall(alt) if alt else [])
        procs = [{"pid": int(p), "mib": size_mib(s)} for p, s in found]
        if procs:
            data["processes"] = procs
        if m := find(P.OOM_THIS):
            data["this_process_mib"] = size_mib(m.group(1))
        if m := find(P.OOM_PRIVATE):
            data["private_pools_mib"] = size_mib(m.group(1))
        if m := find(P.OOM_RESERVED):
            data["reserved_unallocated_mib"] = size_mib(m.group(1))
            shown["reserved_unallocated"] = m.group(1)
        if "allocated_mib" not in data and (m := find(P.OOM_ALLOCATED)):
            data["allocated_mib"] = size_mib(m.group(1))
        if shown:
            data["shown"] = shown

    def _oom_step(
        self,
        hit: Hit,
        msg: str,
        region: str,
        marks: dict[str, int],
        phase: str | None,
        data: dict[str, Any],
    ) -> None:
        """None; what the frames say ran (sampler, preprocessing process, vision model) goes in data."""
        if "warming up sampler" in msg:
            self.votes["vllm"] += 3  # vLLM's own message (gpu_model_runner _dummy_sampler_run)
        if "sampler" in marks:
            data["sampler"] = True  # vLLM's sampler warm-up: its own message names --max-num-seqs
        if phase == "preprocessing":
            # which process preprocessed: SGLang's scheduler materialising a request's inputs, else the
            # front end (SGLang's tokenizer process / vLLM's API server) running the image processor
            data["preprocess_process"] = (
                "scheduler"
                if "_process_and_broadcast_mm_inputs" in region and "process_mm_data" not in region
                else "tokenizer"
            )
        if phase == "prefill" and "mm" in marks:
            data["multimodal_frames"] = (
                True  # the vision encoder / embedding merge of a request with images
            )
        if ("mm" in marks or "mm_model" in marks) and (
            m := P.MM_MODEL_FRAMES.search(region)
        ) is not None:
            self.mm_evidence = self.mm_evidence or Evidence(
                self.name, hit.lineno, "traceback frame: " + m.group(0).strip()[:120]
            )

    def _leak(self, hit: Hit, t: str) -> None:
        text = clean(t).text
        m = P.LEAK.search(text)
        if not m or P.SOURCE_LINE.search(text):
            # no wording, or the checker's own source line quoted in a traceback (never counted: the
            # count past the cap once took such lines too)
            return
        if self.event_counts.get("kv_leak_selfcheck", 0) >= MAX_EVENTS_PER_KIND:
            self.event_counts["kv_leak_selfcheck"] += 1
            return
        self.votes["sglang"] += 5
        wording = m.group(1)
        body = _leak_body(hit, text, wording)
        fields: dict[str, int] = {}
        for key, val in P.LEAK_FIELD.findall(body):
            fields.setdefault(key, int(val))
        tagged = _leak_tagged_pools(body)
        pool = _leak_pool(wording, body)
        total, avail, evict, prot, held = _leak_counts(fields)
        data: dict[str, Any] = {"pool": pool, "wording": wording, "fields": fields}
        hybrid = {m[0]: [int(x) for x in m[1:]] for m in P.LEAK_HYBRID.findall(body)}
        if hybrid:
            pools = _leak_hybrid_pools(hybrid)
            worst = _leak_worst_pool(pools, body)
            data.update(pools=pools, pool=worst)
            total, avail = pools[worst]["total"], pools[worst]["available"]
            evict, prot, held = pools[worst]["evictable"], pools[worst]["protected"], 0
        if tagged:
            pools = {}
            for name, f in tagged.items():
                counted = sum(
                    v for k, v in f.items() if k != "total" and not k.startswith("leaked")
                )
                pools[name] = {**f, "leaked": f["total"] - counted}
            worst = _leak_worst_pool(pools, body)
            w = pools[worst]
            data.update(pools=pools, pool=worst)
            total, avail = w["total"], w["available"]
            evict, prot = w.get("evictable", 0), w.get("protected", 0)
            held = w["total"] - w["leaked"] - avail - evict - prot
        if total is not None and avail is not None:
            data.update(
                total=total,
                available=avail,
                evictable=evict,
                protected=prot,
                leaked=total - avail - evict - prot - held,
                double_free=avail > total,
            )
        self.add_event(
            LogEvent("kv_leak_selfcheck", self.name, hit.lineno, self.cut(body), None, data)
        )
