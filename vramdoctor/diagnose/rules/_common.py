"""Small helpers shared by rules: version comparison, MiB formatting, evidence picking."""

from __future__ import annotations

import re

from vramdoctor.diagnose.findings import Diagnosis, Evidence, LogEvent
from vramdoctor.diagnose.levers import Vocab, vocab


def version_tuple(v: str | None) -> tuple[int, ...] | None:
    """'0.5.9.post2' -> (0, 5, 9); None when absent or unparsable."""
    if not v:
        return None
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", v)
    if not m:
        return None
    return tuple(int(x) for x in m.groups(default="0"))


def mib(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v / 1024:.2f} GiB" if abs(v) >= 1024 else f"{v:.0f} MiB"


def first_evidence(events: list[LogEvent], n: int = 3) -> list[Evidence]:
    return [e.evidence for e in events[:n]]


# Flags only one server has (a fix for the other server must never name them). Flags both share
# (--kv-cache-dtype, --attention-backend, --max-num-batched-tokens is vLLM-only) are left out.
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


def words(d: Diagnosis) -> Vocab:
    """The diagnosed server's levers on its platform (the vocabulary every fix is written in)."""
    return vocab(d.server, d.facts.platform, d.version or d.facts.version_at_least)


def server_name(d: Diagnosis) -> str:
    """The server's name as its users say it ("SGLang", "TGI (LoRAX, a TGI fork)", "the server")."""
    from vramdoctor.diagnose.report import display_name

    return display_name(d.server, d.facts.variant) if d.server else "the server"


def by_server(server: str | None, sglang: str, vllm: str, unknown: str | None = None) -> str:
    """The server's own wording of a fix; for an unknown server `unknown` (a wording that names
    neither server's own flags) or else both, each labelled."""
    if server == "sglang":
        return sglang
    if server == "vllm":
        return vllm
    return unknown if unknown is not None else f"{sglang} (SGLang); {vllm} (vLLM)"


def fraction_flag(server: str | None) -> str:
    """The memory-share flag of the server (both, labelled, when the server is unknown)."""
    if server in ("sglang", "vllm"):
        return by_server(server, "--mem-fraction-static", "--gpu-memory-utilization")
    return "--mem-fraction-static (SGLang) / --gpu-memory-utilization (vLLM)"


# The memory share above which a multimodal model's encoder and images lack headroom: SGLang itself lowers
# its default fraction for multimodal models; vLLM's encoder activations need a few GiB outside the KV pool.
SGLANG_MM_FRACTION_MAX = 0.85
VLLM_MM_UTILIZATION_MAX = 0.92


def high_fraction_multimodal(d: Diagnosis) -> tuple[str, float, float] | None:
    """(flag, value, limit) when a multimodal model runs with a memory share above the limit (the
    mem-fraction-high-multimodal finding advises LOWERING it: another finding must then not advise
    raising it), else None."""
    f = d.facts
    if f.multimodal is not True:
        return None
    if (
        d.server == "sglang"
        and f.mem_fraction_static is not None
        and f.mem_fraction_static > SGLANG_MM_FRACTION_MAX
    ):
        return "--mem-fraction-static", f.mem_fraction_static, SGLANG_MM_FRACTION_MAX
    if (
        d.server == "vllm"
        and f.gpu_memory_utilization is not None
        and f.gpu_memory_utilization > VLLM_MM_UTILIZATION_MAX
    ):
        return "--gpu-memory-utilization", f.gpu_memory_utilization, VLLM_MM_UTILIZATION_MAX
    return None
