"""Which server wrote a log, and on which platform: the marks each leaves in its text.

A server kind's `log_marks` (its ServerKind section; `BUILTIN` here until every kind carries its
own) are byte patterns that only that server prints: its loggers' targets and prefixes, its
package paths, its banners. They are counted in the first MiB of each input (the reader keeps it
as `ReadStats.head`), each pattern up to `cap` times, times its `weight`. A kind whose runner
prints another kind's lines (Ollama runs llama.cpp) lists it in `embeds`: that kind's votes count
for it once it has marks of its own.

The platform (CUDA, ROCm/HIP, Ascend NPU) is read the same way from lines that name it: vLLM's
"Automatically detected platform rocm.", HIP's error strings, llama.cpp's device list, ROCm's
runtime messages, Ollama's GPU library; `PLATFORM_MARKS` says which, with a priority (a line that
states the platform outranks a path that suggests it). Each mark is documented with the server
version or source that prints it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from vramdoctor.diagnose.patterns import fast_bytes


@dataclass(frozen=True)
class LogMark:
    """A byte pattern (a regex; literals scan fastest) only this server prints, and its weight."""

    pattern: bytes
    weight: int = 1
    cap: int = 20
    variant: str | None = None  # a fork or wrapper the mark names ("LoRAX", "vLLM-Ascend")


@dataclass(frozen=True)
class LogMarks:
    """A server kind's log marks (the ServerKind section `log_marks`)."""

    marks: tuple[LogMark, ...] = ()
    embeds: tuple[str, ...] = ()  # kinds whose lines this server's log carries (Ollama: llama.cpp)


BUILTIN: dict[str, LogMarks] = {
    # TGI (huggingface/text-generation-inference): tracing targets of the launcher, router and client,
    # the Python server's package, the launcher's Args dump and warm-up/shard lines (2023-2025).
    # LoRAX (predibase/lorax) is a TGI fork with its own target names.
    "tgi": LogMarks(
        (
            LogMark(rb"text_generation_(?:launcher|router|client)\b", 5),
            LogMark(rb"text_generation_server/", 3),
            LogMark(rb"text-generation-(?:launcher|server|router)", 3),
            LogMark(rb"Method (?:Warmup|Prefill|Decode) encountered an error", 3),
            LogMark(rb"router/src/(?:main|infer|server)\.rs", 2),
            LogMark(
                rb"Shard ready in |Waiting for shard to be ready|Setting max batch total tokens to",
                3,
            ),
            LogMark(rb"lorax_(?:launcher|client|router)\b|lorax_server/", 5, variant="LoRAX"),
        )
    ),
    # TensorRT-LLM: the C++ runtime's "[TensorRT-LLM][INFO] ", the Python logger's "[TRT-LLM] [I] ",
    # its package paths and the Triton backend library.
    "trtllm": LogMarks(
        (
            LogMark(rb"\[TensorRT-LLM\]", 5),
            LogMark(rb"\[TRT-LLM\]", 5),
            LogMark(rb"tensorrt_llm/|libtriton_tensorrtllm|tensorrtllm_backend", 3),
        )
    ),
    # llama.cpp (ggml-org/llama.cpp server, 2023-2025 builds): the loader and context prefixes,
    # ggml's backend lines, the server's listening lines; older builds' llm_load_* names.
    "llamacpp": LogMarks(
        (
            LogMark(rb"\bllama_model_loader: ", 2),
            LogMark(rb"\bggml_cuda_init: |\bggml_init_cublas: |\bload_backend: loaded ", 3),
            LogMark(rb"\bload_tensors: |\bllm_load_tensors: |\bllm_load_print_meta: ", 2),
            LogMark(rb"\bllama_context: |\bllama_new_context_with_model: |\bllama_kv_cache", 2),
            LogMark(rb"\bggml_backend_\w+: |\bggml_gallocr_\w+: ", 2),
            LogMark(
                rb"main: HTTP server is listening|main: server is listening on|llama server listening at",
                5,
            ),
            LogMark(rb"\bllama_model_load(?:_from_file_impl)?: ", 2),
            LogMark(rb"\bsrv +\w+: |\bslot +\w+: ", 1),
        )
    ),
    # Ollama: Go slog key=value lines ("level=INFO source=server.go:130 msg=..."), the older Go log
    # format ("2024/01/05 10:38:07 llama.go:455: "), its runner, its environment, journald's unit.
    "ollama": LogMarks(
        (
            LogMark(rb"level=(?:INFO|WARN|DEBUG|ERROR) source=\w+\.go:\d+ msg=", 5),
            LogMark(
                rb"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (?:llama|routes|server|gpu|images|sched)\.go:\d+: ",
                5,
            ),
            LogMark(
                rb"llama runner|ollama runner|OLLAMA_[A-Z_]+|github\.com/(?:ollama|jmorganca)/ollama",
                3,
            ),
            LogMark(rb"\bollama\[\d+\]: ", 3),
        ),
        embeds=("llamacpp",),
    ),
    # LMDeploy: Python logging " - lmdeploy - INFO - " (older " - turbomind - "), its package and
    # TurboMind's C++ "[TM][ERROR] ", the engine configs it prints.
    "lmdeploy": LogMarks(
        (
            LogMark(rb" - (?:lmdeploy|turbomind) - (?:INFO|WARNING|ERROR|DEBUG) - ", 5),
            LogMark(rb"lmdeploy/(?:serve|turbomind|pytorch|cli)/", 3),
            LogMark(rb"TurbomindEngineConfig\(|PytorchEngineConfig\(|\[TM\]\[", 5),
        )
    ),
    # SGLang's batch lines (scheduler, every version since 2024) and its launcher's SIGQUIT line: an
    # excerpt with no server_args dump (the rest of SGLang's marks: diagnosis._sniff)
    "sglang": LogMarks(
        (
            LogMark(rb"Prefill batch\. #new-seq: |Decode batch\.? #running-req: ", 2),
            LogMark(rb"SIGQUIT received\. It usually means one child failed", 3),
        )
    ),
    # vLLM's own logger prefix without a process tag ("ERROR 07-03 22:34:37 [core.py:588] ", 0.8+:
    # vllm/logger.py `_FORMAT` with `_DATE_FORMAT` "%m-%d %H:%M:%S"), its argparse error line, and
    # the forks' packages.
    "vllm": LogMarks(
        (
            LogMark(
                rb"(?m)^[^\n]{0,48}(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[\w.]+:\d+\] ",
                1,
            ),
            LogMark(rb"vllm serve: error: ", 5),
            # its process tags on lines without its logger prefix (a traceback relayed by the engine)
            LogMark(
                rb"\((?:EngineCore(?:_DP\d+|_\d+)?|Worker(?:_[A-Z]+\d+)*|VllmWorker(?: rank=\d+| TP\d+)?|APIServer) pid=\d+\) ",
                1,
            ),
            LogMark(rb"vllm_ascend/|Platform plugin ascend is activated", 3, variant="vLLM-Ascend"),
            LogMark(rb"vllm_omni/|vLLM-Omni", 3, variant="vLLM-Omni"),
        )
    ),
}


def marks_of(server: str) -> LogMarks:
    """A kind's log marks: its ServerKind section when the registry has one, else `BUILTIN`."""
    try:
        from vramdoctor import servers

        section = getattr(servers.get(server), "log_marks", None)
    except (ImportError, KeyError):
        section = None
    if section is not None and section.marks:
        return section  # type: ignore[no-any-return]
    return BUILTIN.get(server, LogMarks())


def variant_kind(variant: str) -> str | None:
    """The kind whose marks name this variant ("LoRAX" -> "tgi")."""
    for kind, lm in BUILTIN.items():
        if any(m.variant == variant for m in lm.marks):
            return kind
    return None


_COMPILED: dict[bytes, Any] = {}


def _rx(pattern: bytes) -> Any:
    rx = _COMPILED.get(pattern)
    if rx is None:
        rx = _COMPILED[pattern] = fast_bytes(pattern)
    return rx


def count(head: bytes, server: str) -> tuple[int, dict[str, int]]:
    """(votes, variant -> votes) of `server`'s marks in `head` (the first MiB of a file)."""
    votes = 0
    variants: dict[str, int] = {}
    for mark in marks_of(server).marks:
        n = sum(1 for _ in itertools.islice(_rx(mark.pattern).finditer(head), mark.cap))
        if n:
            votes += n * mark.weight
            if mark.variant:
                variants[mark.variant] = variants.get(mark.variant, 0) + n
    return votes, variants


# --- platforms ------------------------------------------------------------------------------
# (pattern, platform, priority): 3 the line states the platform, 2 a runtime message only that
# platform prints, 1 a path or library name that suggests it.
PLATFORM_MARKS: tuple[tuple[bytes, str, int], ...] = (
    # vLLM vllm/platforms/__init__.py: "Automatically detected platform %s." (0.7+)
    (rb"Automatically detected platform rocm", "rocm", 3),
    (rb"Automatically detected platform cuda", "cuda", 3),
    (rb"Automatically detected platform npu|Platform plugin ascend is activated", "npu", 3),
    # torch on ROCm names HIP in its errors ("HIP out of memory", "HIP error: invalid device pointer",
    # torch.AcceleratorError), the HSA runtime its page faults ("Memory access fault by GPU node-N")
    (rb"HIP out of memory|HIP error|hipError\w+|Memory access fault by GPU node-", "rocm", 3),
    # llama.cpp's device list and backend ("found 1 ROCm devices", "using device ROCm0", "libggml-hip")
    (
        rb"found \d+ ROCm devices|using device ROCm\d|loaded ROCm backend|libggml-hip|\bROCm : ",
        "rocm",
        3,
    ),
    (rb"found \d+ CUDA devices|using device CUDA\d|ggml_init_cublas: found", "cuda", 3),
    # llama.cpp's buffer lines name the device by its backend (b4000+: "CUDA0", "ROCm0")
    (rb"\bCUDA\d+ (?:model|KV|compute) buffer size", "cuda", 2),
    (rb"\bROCm\d+ (?:model|KV|compute) buffer size", "rocm", 2),
    # vLLM V0 ROCm: "# rocm blocks: N", "Using ROCmFlashAttention backend"; rocm.py's own warnings
    (
        rb"# rocm blocks: |ROCmFlashAttention|rocm\.py:\d+\]|not supported on AMD GPUs|not supported by ROCm",
        "rocm",
        2,
    ),
    # Ollama's GPU discovery and offload plan: library=cuda / library=rocm, "CUDA freeMem N mb"
    (rb"library=rocm", "rocm", 2),
    (rb"library=cuda|CUDA (?:freeMem|totalMem) \d+", "cuda", 2),
    # torch_npu / vllm-ascend: "NPU out of memory", the plugin's package
    (rb"NPU out of memory|vllm_ascend/|torch_npu", "npu", 2),
    # a ROCm build of PyTorch's own source paths, RCCL (ROCm's NCCL)
    (rb"/ATen/hip/|librccl\.so", "rocm", 1),
    # the torch message on CUDA ("CUDA out of memory", torch's CUDA error) and ggml-cuda's own error
    (rb"CUDA out of memory|CUDA error: out of memory|CUDA error 2 at ", "cuda", 1),
)
_PLATFORM_RX = [(fast_bytes(p), name, prio) for p, name, prio in PLATFORM_MARKS]


def platform_in(head: bytes) -> tuple[str, int, bytes] | None:
    """(platform, priority, the bytes that show it) of the strongest platform mark in `head`; a
    tie between two platforms at the top priority is no answer (None)."""
    best: dict[str, tuple[int, bytes]] = {}
    for rx, name, prio in _PLATFORM_RX:
        m = rx.search(head)
        if m is not None and prio > best.get(name, (0, b""))[0]:
            best[name] = (prio, m.group(0))
    if not best:
        return None
    top = max(p for p, _ in best.values())
    names = [n for n, (p, _) in best.items() if p == top]
    if len(names) != 1:
        return None
    return names[0], top, best[names[0]][1]
