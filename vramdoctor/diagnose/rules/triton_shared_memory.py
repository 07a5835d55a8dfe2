"""Triton 'out of resource: shared memory': a kernel's on-chip limit, not GPU memory."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import by_server, first_evidence


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("triton_shared_memory")
    if not evs:
        return []
    e = evs[0]
    need = e.data.get("required_bytes")
    lim = e.data.get("limit_bytes")
    figures = f" (the kernel needs {need} bytes, the GPU allows {lim} per block)" if need else ""
    backend = d.facts.attention_backend
    return [
        Finding(
            RULE.id,
            "critical",
            "Triton kernel exceeds the GPU's shared memory (not an OOM)",
            explanation=(
                f"A Triton kernel was launched with more on-chip shared memory than this GPU model "
                f"has{figures}. It is a kernel configuration limit of this GPU, not VRAM exhaustion: "
                "lowering the memory fraction does not help."
                + (f" The attention backend in use is {backend}." if backend else "")
            ),
            fix=by_server(
                d.server,
                "Use another attention backend (--attention-backend flashinfer or fa3), or a version whose "
                "Triton configs cover this GPU.",
                "Use another attention backend (VLLM_ATTENTION_BACKEND, or --attention-backend on 0.11+), or a "
                "version whose Triton configs cover this GPU.",
            ),
            evidence=first_evidence(evs),
        )
    ]


RULE = Rule(
    id="triton-shared-memory",
    severity="critical",
    title="Triton shared-memory limit (not a CUDA OOM)",
    fires_when=(
        "'OutOfResources: out of resource: shared memory, Required: N, Hardware limit: M' (not inside torch "
        "inductor's 'Runtime error during autotuning: ... Ignoring this choice.': one skipped candidate)"
    ),
    fix="another attention backend, or a version with Triton configs for this GPU",
    check=check,
)
