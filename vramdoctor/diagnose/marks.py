"""Which server wrote a log, and on which platform: the marks each leaves in its text.

A server kind's `log_marks` (its ServerKind section, vramdoctor/servers/<kind>.py) are byte patterns that only that server prints: its loggers' targets and prefixes, its
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
from typing import Any

from vramdoctor import servers
from vramdoctor.diagnose.patterns import fast_bytes
from vramdoctor.servers.diagnose_sections import LogMarks


def marks_of(server: str) -> LogMarks:
    """A kind's log marks (its ServerKind section; an unknown name has none)."""
    try:
        return servers.get(server).log_marks
    except KeyError:
        return LogMarks()


def variant_kind(variant: str) -> str | None:
    """The kind whose marks name this variant ("LoRAX" -> "tgi")."""
    for kind in servers.kinds():
        if any(m.variant == variant for m in kind.log_marks.marks):
            return kind.name
    return None


_COMPILED: dict[bytes, Any] = {}


def _rx(pattern: bytes) -> Any:
    rx = _COMPILED.get(pattern)
    if rx is None:
        rx = _COMPILED[pattern] = fast_bytes(pattern)
    return rx


# The start of a file the marks are counted in: a server's start-up lines (its banner, argument dump,
# loader) come first; 256 KiB holds them in every excerpt of the corpus and keeps the sniff of a large
# file at a few milliseconds.
SNIFF_BYTES = 256 << 10
_ANY: dict[str, Any] = {}


def _any(server: str, lm: LogMarks) -> Any:
    """One RE2 alternation of a kind's marks: one pass over the head tells whether any is there."""
    rx = _ANY.get(server)
    if rx is None:
        rx = _ANY[server] = fast_bytes(b"|".join(b"(?:" + m.pattern + b")" for m in lm.marks))
    return rx


def count(head: bytes, server: str) -> tuple[int, dict[str, int]]:
    """(votes, variant -> votes) of `server`'s marks in `head` (the start of a file, SNIFF_BYTES)."""
    votes = 0
    variants: dict[str, int] = {}
    lm = marks_of(server)
    head = head[:SNIFF_BYTES]
    if not lm.marks or _any(server, lm).search(head) is None:
        return 0, variants  # (the usual case for all kinds but one: one DFA pass)
    for mark in lm.marks:
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
_PLATFORM_ANY = fast_bytes(b"|".join(b"(?:" + p + b")" for p, _, _ in PLATFORM_MARKS))


def platform_in(head: bytes) -> tuple[str, int, bytes] | None:
    """(platform, priority, the bytes that show it) of the strongest platform mark in `head` (its
    first SNIFF_BYTES); a tie between two platforms at the top priority is no answer (None)."""
    head = head[:SNIFF_BYTES]
    if _PLATFORM_ANY.search(head) is None:
        return None
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
