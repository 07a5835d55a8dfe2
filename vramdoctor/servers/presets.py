"""The `presets` section of `ServerKind`: named `ab-test --server` variants with the server's
real flags and environment variables (COMMON_CONTRACTS §1, owner: ab-test).

A `Preset` is one change to the launch command: arguments added (a flag already in the command
gets the preset's value instead), arguments removed (with their value), environment variables
set or removed. `trades` says what the change costs, for the recommendation. `since`/`until`
bound the server versions whose parser accepts that spelling, `platforms` where it exists.

Every flag, default and version below was read from the servers' released wheels and checked
against their real argument parsers (research notes of 2026-12-01: sglang 0.5.9-0.5.23, vllm
0.11-0.33, transformers 5.0/5.24; `source` names the file). Pure data: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "ENV_PRESETS",
    "SGLANG_PRESETS",
    "TRANSFORMERS_PRESETS",
    "VLLM_PRESETS",
    "Preset",
]


@dataclass(frozen=True)
class Preset:
    """A named variant. `add_args` shell words appended (a `--flag` already in the command has
    its value replaced), `remove_args` flags removed with their value, `env` set, `unset_env`
    removed. `description` says what it changes, `trades` what it costs; `since`/`until`
    ([since, until)) the versions that accept it, `platforms` ("cuda", "rocm") where it exists
    (None: everywhere), `source` where the spelling was read."""

    name: str
    description: str
    trades: str
    add_args: tuple[str, ...] = ()
    remove_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    unset_env: tuple[str, ...] = ()
    since: str | None = None
    until: str | None = None
    platforms: tuple[str, ...] | None = None
    source: str = ""

    def describe(self) -> str:
        """The change in one line, as a user would type it ("--x 1; MALLOC_ARENA_MAX=2")."""
        parts = [" ".join(self.add_args)] if self.add_args else []
        parts += [f"without {a}" for a in self.remove_args]
        parts += [f"{k}={v}" for k, v in self.env.items()]
        parts += [f"unset {k}" for k in self.unset_env]
        return "; ".join(parts)


def _env(**env: str) -> Mapping[str, str]:
    return MappingProxyType(dict(env))


# Any Python server on glibc and PyTorch: the host allocator's and CUDA allocator's own knobs.
ENV_PRESETS: tuple[Preset, ...] = (
    Preset(
        "malloc-arena-max-2",
        "glibc keeps at most 2 malloc arenas (MALLOC_ARENA_MAX=2): freed heap returns to 2 "
        "arenas instead of one per thread (8 x cores); host RAM growth from arena retention "
        "should stop",
        "lock contention in malloc when many threads allocate at once (image preprocessing "
        "threads): watch p99 latency",
        env=_env(MALLOC_ARENA_MAX="2"),
        source="glibc mallopt(M_ARENA_MAX) / the MALLOC_ARENA_MAX tunable",
    ),
    Preset(
        "expandable-segments",
        "PyTorch's CUDA caching allocator maps memory in growable segments "
        "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): less fragmentation, reserved "
        "memory closer to what is allocated",
        "first allocations are slower (mapping), and it does not combine with CUDA IPC "
        "sharing of allocations on older PyTorch releases",
        env=_env(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"),
        platforms=("cuda",),
        source="torch/csrc/cuda/CUDAAllocatorConfig (PYTORCH_CUDA_ALLOC_CONF)",
    ),
)

SGLANG_PRESETS: tuple[Preset, ...] = (
    Preset(
        "fast-image-processor-off",
        "image preprocessing on the CPU (PIL) instead of the fast torchvision processor on GPU "
        "0 in the tokenizer process, which caches its own VRAM",
        "preprocessing CPU time per image: higher latency for image requests",
        add_args=("--disable-fast-image-processor",),
        source="sglang==0.5.23: sglang/srt/arg_groups/fields (accepted 0.5.9-0.5.23; from 0.5.18 "
        "deprecated for --image-processor-backend=pil)",
    ),
    Preset(
        "image-processor-pil",
        "the same as fast-image-processor-off, in the 0.5.18+ spelling "
        "(--image-processor-backend pil)",
        "preprocessing CPU time per image: higher latency for image requests",
        add_args=("--image-processor-backend", "pil"),
        since="0.5.18",
        source="sglang==0.5.23: --image-processor-backend {auto,torchvision,pil} (rejected in 0.5.15)",
    ),
    Preset(
        "cuda-ipc-off",
        "multimodal features travel to the scheduler by CPU, not through a CUDA IPC pool on the "
        "base GPU (--mm-feature-transport cpu)",
        "a host copy per image feature: more host memory traffic, slightly higher latency",
        add_args=("--mm-feature-transport", "cpu"),
        since="0.5.18",
        platforms=("cuda",),
        source="sglang==0.5.23: --mm-feature-transport {cpu,cuda_ipc,cuda_vmm}",
    ),
    Preset(
        "vlm-cache-off",
        "the multimodal embedding cache off (SGLANG_VLM_CACHE_SIZE_MB=0; default 100 MB): "
        "growth that is this cache filling should disappear",
        "repeated images are encoded again: more GPU time for repeated images",
        env=_env(SGLANG_VLM_CACHE_SIZE_MB="0"),
        source="sglang==0.5.23: sglang/srt/environ.py SGLANG_VLM_CACHE_SIZE_MB (default 100)",
    ),
    Preset(
        "mem-fraction-0.80",
        "a smaller static memory share for weights and KV cache (--mem-fraction-static 0.80): "
        "more headroom for the encoder and activations",
        "a smaller KV pool: fewer concurrent requests and tokens before queueing",
        add_args=("--mem-fraction-static", "0.80"),
        source="sglang==0.5.23: --mem-fraction-static (default None: automatic)",
    ),
    Preset(
        "radix-cache-off",
        "the prefix (radix) cache off (--disable-radix-cache): KV tokens held for reuse at "
        "idle go away",
        "no prefix reuse: repeated prompts prefill again (higher time to first token)",
        add_args=("--disable-radix-cache",),
        source="sglang==0.5.23: --disable-radix-cache (default False)",
    ),
    Preset(
        "cuda-graph-off",
        "CUDA graphs off (--disable-cuda-graph): the graph memory pool is not captured",
        "decode runs without graphs: markedly lower throughput at small batches",
        add_args=("--disable-cuda-graph",),
        source="sglang==0.5.23: --disable-cuda-graph (deprecated from 0.5.14 for "
        "--cuda-graph-backend-{decode,prefill}=disabled, still accepted)",
    ),
    *ENV_PRESETS,
)

VLLM_PRESETS: tuple[Preset, ...] = (
    Preset(
        "fast-image-processor-off",
        "the slow (PIL) Hugging Face image processor (--mm-processor-kwargs "
        '\'{"use_fast": false}\'); transformers 5 maps it to backend="pil"',
        "preprocessing CPU time per image: higher latency for image requests",
        add_args=("--mm-processor-kwargs", '{"use_fast": false}'),
        source="vllm==0.33.0: --mm-processor-kwargs forwarded to from_pretrained (parses; not "
        "verified end to end on a live server)",
    ),
    Preset(
        "mm-processor-cache-off",
        "the multimodal processor cache off (--mm-processor-cache-gb 0; default 4 GiB per API "
        "and engine process): host RAM growth that is this cache filling should disappear",
        "repeated images are processed again: more CPU time for repeated images",
        add_args=("--mm-processor-cache-gb", "0"),
        source="vllm==0.33.0: --mm-processor-cache-gb (default 4; 0 disables; 0.11-0.33)",
    ),
    Preset(
        "gpu-memory-utilization-0.85",
        "a smaller GPU memory share (--gpu-memory-utilization 0.85; default 0.92 from 0.21, "
        "0.9 before): more headroom for the encoder and activations",
        "a smaller KV cache: fewer concurrent requests before preemption",
        add_args=("--gpu-memory-utilization", "0.85"),
        source="vllm==0.33.0: --gpu-memory-utilization",
    ),
    Preset(
        "enforce-eager",
        "CUDA graphs off (--enforce-eager): no graph memory pool",
        "lower decode throughput at small batches",
        add_args=("--enforce-eager",),
        source="vllm==0.33.0: --enforce-eager / --no-enforce-eager (default False)",
    ),
    Preset(
        "prefix-caching-off",
        "automatic prefix caching off (--no-enable-prefix-caching): blocks kept for reuse at "
        "idle go away",
        "no prefix reuse: repeated prompts prefill again (higher time to first token)",
        add_args=("--no-enable-prefix-caching",),
        source="vllm==0.33.0: --enable-prefix-caching / --no-enable-prefix-caching",
    ),
    *ENV_PRESETS,
)

# transformers serve (the OpenAI-compatible fallback kind): no memory flags of its own
# (5.24: --continuous-batching, --attn-implementation, --compile, ...), only the allocators' knobs.
TRANSFORMERS_PRESETS: tuple[Preset, ...] = ENV_PRESETS
