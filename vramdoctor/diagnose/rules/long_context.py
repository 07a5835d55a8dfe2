"""A long max context makes vLLM's profiling run and KV budget the likely OOM points."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule


def check(d: Diagnosis) -> list[Finding]:
    f = d.facts
    if f.long_context_length is None or d.server != "vllm":  # vLLM's own warning; it votes for vLLM
        return []
    profiled_oom = any(e.phase in ("profiling", "mm_profiling") for e in d.events_of("cuda_oom"))
    budget = bool(d.events_of("kv_budget_error"))
    ev = f.evidence.get("long_context_length")
    return [
        Finding(
            RULE.id,
            "warning" if (profiled_oom or budget) else "info",
            f"Max model length {f.long_context_length} is long for this GPU budget",
            explanation=(
                f"vLLM warned that the model's context length ({f.long_context_length}) may cause OOM in the "
                "initial memory-profiling run (it profiles a batch of that many tokens) or leave a small KV "
                "cache." + (" The log shows such a failure." if profiled_oom or budget else "")
            ),
            fix="Set --max-model-len to the longest prompt+output you serve (e.g. 8192-32768).",
            evidence=[ev] if ev else [],
        )
    ]


RULE = Rule(
    id="vllm-long-context",
    severity="warning",
    title="Long max model length (vLLM profiling/KV risk)",
    fires_when="vLLM 'The model has a long context length (N). This may cause OOM errors during the initial memory profiling phase ...' (info; warning with a profiling OOM or KV budget error)",
    fix="--max-model-len to what you serve",
    check=check,
)
