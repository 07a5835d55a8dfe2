"""vLLM's CPU swap space takes a large share of host RAM (pinned per GPU)."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import mib


def check(d: Diagnosis) -> list[Finding]:
    f = d.facts
    if f.swap_space_mib is None or f.host_memory_mib is None or d.server != "vllm":
        return []
    share = f.swap_space_mib / f.host_memory_mib if f.host_memory_mib else 0.0
    ev = f.evidence.get("swap_space_mib")
    return [
        Finding(
            RULE.id,
            "warning",
            f"CPU swap space takes {share:.0%} of host RAM",
            explanation=(
                f"vLLM allocates {mib(f.swap_space_mib)} of pinned host memory for swapped-out KV blocks "
                f"out of {mib(f.host_memory_mib)} (vLLM warns above 40%, refuses above 70%). Pinned memory "
                "cannot be paged out; with weights being loaded, Ray workers or other containers on the "
                "node, the host runs out of RAM (a host OOM, not a GPU one)."
            ),
            fix="Lower --swap-space (GiB per GPU; 0-4 is enough unless you rely on preemption by swapping), or give the node more RAM.",
            evidence=[ev] if ev else [],
        )
    ]


RULE = Rule(
    id="vllm-swap-space",
    severity="warning",
    title="vLLM CPU swap space too large for host RAM",
    fires_when="vLLM 'Possibly too large swap space. X GiB out of the Y GiB total CPU memory is allocated for the swap space.'",
    fix="lower --swap-space",
    check=check,
)
