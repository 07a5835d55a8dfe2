"""LMDeploy's KV cache set to take (nearly) all the memory left after the weights."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule

SHARE_HIGH = 0.95  # above this the engine's other buffers (and a VLM's vision model) get ~nothing
LMDEPLOY_DEFAULT = 0.8  # TurbomindEngineConfig / PytorchEngineConfig cache_max_entry_count


def check(d: Diagnosis) -> list[Finding]:
    share = d.facts.kv_share
    if d.server != "lmdeploy" or share is None or share < SHARE_HIGH:
        return []
    ev = d.facts.evidence.get("kv_share")
    return [
        Finding(
            RULE.id,
            "warning",
            f"LMDeploy's KV cache takes {share:.0%} of the free GPU memory (--cache-max-entry-count {share})",
            explanation=(
                f"--cache-max-entry-count {share}: after the weights, LMDeploy gives the KV cache this share "
                f"of the free GPU memory (its default is {LMDEPLOY_DEFAULT}). What is left "
                f"({1 - share:.0%}) must hold the engine's runtime buffers, the activations of a batch and, "
                "for a vision-language model, the vision model's work: a failed request or an OOM under load "
                "is the usual result. A risk the setting shows, not a failure the log shows."
            ),
            fix=(
                f"Lower --cache-max-entry-count to {LMDEPLOY_DEFAULT}-0.9 (the default {LMDEPLOY_DEFAULT}); "
                "to serve longer sessions, quantize the KV cache (--quant-policy 8) instead."
            ),
            evidence=[ev] if ev is not None else [],
            basis="read",
        )
    ]


RULE = Rule(
    id="lmdeploy-cache-share-high",
    severity="warning",
    title="LMDeploy's KV cache share of free memory set at 0.95 or more",
    fires_when=(
        "an LMDeploy log whose command (--cache-max-entry-count) or engine config (cache_max_entry_count) "
        "sets the KV cache's share of the free memory at 0.95 or more"
    ),
    fix="--cache-max-entry-count 0.8-0.9 (LMDeploy's default 0.8); --quant-policy 8 for longer sessions",
    check=check,
)
