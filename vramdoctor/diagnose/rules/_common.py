"""Small helpers shared by rules: version comparison, MiB formatting, evidence picking."""

from __future__ import annotations

import re

from vramdoctor.diagnose import levers
from vramdoctor.diagnose.findings import Diagnosis, Evidence, LogEvent
from vramdoctor.diagnose.levers import Vocab, vocab
from vramdoctor.diagnose.names import display_name


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


# Flags only one server has: the vocabulary's lists (levers.py), for the tests that check every fix.
SGLANG_ONLY_FLAGS = levers.SGLANG_ONLY_FLAGS
VLLM_ONLY_FLAGS = levers.VLLM_ONLY_FLAGS


def words(d: Diagnosis) -> Vocab:
    """The diagnosed server's levers on its platform (the vocabulary every fix is written in)."""
    return vocab(d.server, d.facts.platform, d.version or d.facts.version_at_least)


def server_name(d: Diagnosis) -> str:
    """The server's name as its users say it ("SGLang", "TGI (LoRAX, a TGI fork)", "the server")."""
    return display_name(d.server, d.facts.variant) if d.server else "the server"


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
