"""The fix vocabulary: each server's own flags for each lever, per platform, and how rules use them.

A rule never writes a flag. It asks for a *lever* by name ("memory_share", "prefill_chunk", ...)
and gets the diagnosed server's own spelling on the detected platform, or None when that server
(or platform) has no such setting; a sentence that needs a missing lever is left out. So a
TensorRT-LLM log is never told about `--mem-fraction-static`, and a ROCm host never about
flashinfer.

The levers of each server kind live with the kind (`vramdoctor.servers.<kind>.KIND.levers`, the
ServerKind section this module reads through `levers_of`; each kind module says where its flag
names were read); `LEVER_NAMES` is the shared vocabulary with what each lever means.

    v = vocab("vllm", "rocm", version="0.8.5")
    v("memory_share")                          -> "--gpu-memory-utilization"
    v.say("lower {memory_share} or {prefill_chunk}")  -> "lower --gpu-memory-utilization or ..."
    v.say("use {attention_backend}")           -> None on a server without that lever
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from vramdoctor import servers
from vramdoctor.servers.diagnose_sections import Lever, Levers

Platform = str  # "cuda", "rocm", "npu" (what diagnose detects; None = not shown)
PLATFORMS = ("cuda", "rocm", "npu")

# The shared vocabulary: lever name -> what it changes (docs/diagnose.md lists it).
LEVER_NAMES: dict[str, str] = {
    "memory_share": "the share of GPU memory the server takes for weights, KV cache and its buffers",
    "kv_share": "the share of the memory left after the weights that the KV cache takes",
    "kv_size": "the KV cache size, set directly",
    "context_length": "the longest sequence (prompt + output) a request may have",
    "input_length": "the longest prompt a request may have",
    "prefill_chunk": "the tokens one prefill step takes at once",
    "batch_tokens": "the tokens of all requests in one batch",
    "max_running": "the requests (sequences) in one batch",
    "graph_batch": "the largest batch CUDA graphs are captured for",
    "graph_sizes": "the batch sizes CUDA graphs are captured for",
    "graph_off": "run without CUDA graphs",
    "graph_estimate_off": "leave the CUDA-graph estimate out of the memory profile",
    "compile_off": "run without torch.compile",
    "compile_batch": "the largest batch torch.compile compiles",
    "kv_dtype": "a smaller KV cache dtype",
    "tensor_parallel": "the GPUs the model is split over",
    "gpu_layers": "the layers placed on the GPU (the rest run on the CPU)",
    "tensor_split": "how the layers are split between GPUs",
    "compute_batch": "the physical batch the compute buffers are sized for",
    "quantize": "quantized weights",
    "attention_backend": "the attention kernels",
    "image_processor_cpu": "run the image processor on the CPU",
    "mm_limits": "images or videos per request",
    "mm_pixels": "the image size the processor produces",
    "mm_transport_cpu": "send multimodal features through CPU shared memory, not CUDA IPC",
    "mm_feature_pool": "the GPU pool for CUDA-IPC multimodal features",
    "cpu_offload": "weights kept in CPU RAM",
    "swap": "CPU swap space for KV blocks",
    "schedule_conservativeness": "how cautiously the scheduler admits requests",
    "host_cache": "KV cache kept in host RAM",
    "kv_offload_cpu": "the KV cache kept in CPU RAM",
    "parallel": "requests served at once",
    "rdma_device": "the RDMA devices of the KV transfer (prefill/decode disaggregation)",
}


def _kind_levers(name: str) -> Levers:
    try:
        return servers.get(name).levers
    except KeyError:
        return {}


# The platform's own tools and options (not the server's).
PLATFORM_TOOLS: dict[str, dict[str, str]] = {
    "cuda": {"smi": "nvidia-smi", "alloc_conf": "PYTORCH_CUDA_ALLOC_CONF"},
    "rocm": {"smi": "rocm-smi (or amd-smi)", "alloc_conf": "PYTORCH_HIP_ALLOC_CONF"},
    "npu": {"smi": "npu-smi info", "alloc_conf": "PYTORCH_NPU_ALLOC_CONF"},
}
# Options that exist on one platform only: a fix for another platform must never name them.
PLATFORM_ONLY: dict[str, tuple[str, ...]] = {
    "cuda": ("flashinfer", "fa3", "FLASH_ATTN", "FLASHINFER", "nvidia-smi", "NCCL_NVLS_ENABLE"),
    "rocm": ("rocm-smi", "amd-smi", "aiter", "ROCM_AITER_FA", "PYTORCH_HIP_ALLOC_CONF"),
    "npu": ("npu-smi", "ascend", "PYTORCH_NPU_ALLOC_CONF"),
}


def levers_of(server: str | None) -> Levers:
    """The levers of a server kind (its ServerKind section, vramdoctor/servers/<kind>.py), {} for an
    unknown or generic server."""
    return {} if server is None else _kind_levers(server)


def kinds_with_levers() -> tuple[str, ...]:
    """The registered kinds that have levers (the fallback kind has none)."""
    return tuple(k.name for k in servers.kinds() if k.levers)


def _vt(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", v)
    return tuple(int(x) for x in m.groups(default="0")) if m else None


def pick(options: Iterable[Lever], platform: str | None, version: str | None) -> str | None:
    """The first option that exists on `platform` (unknown platform: the options for every
    platform, else CUDA's) and, when the version is known, in that version; when it is not, the
    first option without a version bound (the text naming both spellings)."""
    opts = list(options)
    if platform in PLATFORMS:
        opts = [o for o in opts if o.platforms is None or platform in o.platforms]
    elif any(o.platforms for o in opts):
        # the platform is not shown: each platform's own option, labelled when they differ (never
        # CUDA's alone)
        per = [(p, pick(opts, p, version)) for p in ("cuda", "rocm")]
        texts = {t for _, t in per if t}
        if len(texts) <= 1:
            return next(iter(texts), None)
        return " / ".join(f"{t} ({'CUDA' if p == 'cuda' else 'ROCm'})" for p, t in per if t)
    v = _vt(version)
    for o in opts:
        lo, hi = _vt(o.since), _vt(o.until)
        if v is None:
            if lo is None and hi is None:
                return o.text
            continue
        if (lo is None or v >= lo) and (hi is None or v < hi):
            return o.text
    return None


_FIELDS = string.Formatter()


@dataclass(frozen=True)
class Vocab:
    """The levers of one diagnosed server on one platform. `server` None: the server is unknown,
    and each lever reads as SGLang's and vLLM's own flags, labelled ("--mem-fraction-static
    (SGLang) / --gpu-memory-utilization (vLLM)"); other servers are never guessed."""

    server: str | None
    platform: str | None = None
    version: str | None = None

    def __call__(self, lever: str) -> str | None:
        if lever not in LEVER_NAMES:
            raise KeyError(f"unknown lever {lever!r}")
        return _text(self.server, self.platform, self.version, lever)

    def has(self, *levers: str) -> bool:
        return all(self(name) is not None for name in levers)

    def say(self, template: str) -> str | None:
        """`template` with each {lever} replaced by its text; None when one of them is missing.
        Other fields: {smi} (the platform's process list tool), {alloc_conf}."""
        values: dict[str, str] = {}
        for _, name, _, _ in _FIELDS.parse(template):
            if not name or name in values:
                continue
            if name in ("smi", "alloc_conf"):
                values[name] = platform_tool(self.platform, name)
                continue
            text = self(name)
            if text is None:
                return None
            values[name] = text
        return template.format(**values)

    def join(self, *templates: str, sep: str = "; ") -> str:
        """Every template whose levers exist, joined (empty string when none)."""
        return sep.join(s for t in templates if (s := self.say(t)) is not None)

    def first(self, *templates: str) -> str | None:
        """The first template whose levers exist."""
        return next((s for t in templates if (s := self.say(t)) is not None), None)


@lru_cache(maxsize=512)
def _text(server: str | None, platform: str | None, version: str | None, lever: str) -> str | None:
    if server is None:
        sgl = pick(_kind_levers("sglang").get(lever, ()), platform, None)
        vll = pick(_kind_levers("vllm").get(lever, ()), platform, None)
        if sgl and vll:
            return f"{sgl} (SGLang) / {vll} (vLLM)"
        return None
    return pick(levers_of(server).get(lever, ()), platform, version)


def vocab(server: str | None, platform: str | None = None, version: str | None = None) -> Vocab:
    return Vocab(server, platform, version)


def platform_tool(platform: str | None, what: str) -> str:
    """The platform's tool for `what` ("smi": list the processes on a GPU; "alloc_conf": the
    PyTorch allocator's environment variable); CUDA's when the platform is not shown."""
    tools = PLATFORM_TOOLS.get(platform or "", PLATFORM_TOOLS["cuda"])
    if platform not in PLATFORM_TOOLS and what == "smi":
        return "nvidia-smi / rocm-smi"
    return tools[what]


# Flags only one server has, beyond its levers' texts (rules once wrote them by hand; the tests check
# every fix against them). Flags both share (--kv-cache-dtype, --attention-backend) are left out.
SGLANG_ONLY_FLAGS = (
    "--mem-fraction-static",
    "--context-length",
    "--chunked-prefill-size",
    "--max-prefill-tokens",
    "--max-running-requests",
    "--max-total-tokens",
    "--cuda-graph-max-bs",
    "--disable-cuda-graph",
    "--tp-size",
    "--schedule-conservativeness",
    "--disable-radix-cache",
    "--disable-overlap-schedule",
    "--disable-fast-image-processor",
    "--image-processor-backend",
    "--mm-feature-transport",
    "--tokenizer-worker-num",
    "--base-gpu-id",
    "SGLANG_",
)
VLLM_ONLY_FLAGS = (
    "--gpu-memory-utilization",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--enforce-eager",
    "--tensor-parallel-size",
    "--swap-space",
    "--limit-mm-per-prompt",
    "--cpu-offload-gb",
    "--kv-cache-memory",
    "--mm-processor-kwargs",
    "VLLM_",
)


# --- checks the tests use (a fix must speak only its own server's and platform's words) ---------

_TOKEN = re.compile(
    r"--[a-z][\w-]*|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|\b[a-z]+(?:_[a-z0-9]+){2,}\b|\bnum_(?:gpu|ctx|batch)\b"
)
# tokens several servers share, so they prove nothing about which server a fix is for
_SHARED = {
    "--kv-cache-dtype",
    "--quantization",
    "--attention-backend",
    "--cpu-offload-gb",
    "--max-total-tokens",
    "--max-batch-size",
    "--tp",
    "--max-num-batched-tokens",
}


def _tokens(text: str) -> set[str]:
    return set(_TOKEN.findall(text))


@lru_cache(maxsize=16)
def _owned(server: str) -> frozenset[str]:
    out: set[str] = set()
    for options in levers_of(server).values():
        for o in options:
            out |= _tokens(o.text)
    return frozenset(out)


def foreign_flags(server: str | None, text: str) -> list[str]:
    """Flags in `text` that belong to another server's levers and not to `server`'s. For an unknown
    server, SGLang's and vLLM's (named, labelled) are allowed; the other servers' are not."""
    mine: set[str] = set()
    for name in ("sglang", "vllm") if server is None else (server,):
        mine |= _owned(name)
    found = _tokens(text)
    bad: set[str] = set()
    for owner, words in (("sglang", SGLANG_ONLY_FLAGS), ("vllm", VLLM_ONLY_FLAGS)):
        if server not in (owner, None):
            bad |= {
                w
                for w in words
                if w not in mine
                and re.search(re.escape(w) + (r"(?![\w-])" if w.startswith("--") else ""), text)
            }
    for other in kinds_with_levers():
        if server is None and other in ("sglang", "vllm"):
            continue
        if other == server:
            continue
        bad |= (found & _owned(other)) - mine - _SHARED
    return sorted(bad)


def platform_forbidden(platform: str | None, text: str) -> list[str]:
    """Options in `text` that exist only on a platform other than `platform` (nothing for an unknown
    platform)."""
    if platform not in PLATFORM_ONLY:
        return []
    out = []
    for other, words in PLATFORM_ONLY.items():
        if other == platform:
            continue
        for w in words:
            if re.search(r"(?<![\w-])" + re.escape(w) + r"(?![\w-])", text):
                out.append(w)
    return out
