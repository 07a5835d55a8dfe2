"""SGLang CUDA graph capture failed: memory only when the cause says so."""

from __future__ import annotations

from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, words


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("cuda_graph_capture_failed")
    if not evs or d.server != "sglang":  # SGLang's own line; it votes for SGLang
        return []
    cause = evs[0].data.get("cause", "")
    if P.CUDA_OOM.search(cause):
        return []  # the cuda-oom rule reports it with the capture phase
    if d.events_of("triton_shared_memory") and ("inductor" in cause or "resource" in cause):
        return []  # a Triton shared-memory limit in the capture: triton-shared-memory names its cause
    if not cause.strip():
        # "Capture cuda graph failed: " with nothing after it: the message does not say why
        return [
            Finding(
                RULE.id,
                "critical",
                "CUDA graph capture failed; the message does not give the cause",
                explanation=(
                    "Capture failed, but the message's cause is empty, so the log line cannot tell memory from "
                    "a kernel or model error. The real error is the one printed above it (the first exception "
                    "of the chain, often on another rank's lines): if that is an out-of-memory error, the "
                    "memory advice in SGLang's message applies; otherwise it does not."
                ),
                fix=words(d).say(
                    "Find the first exception above this one. If it is an OOM, lower {graph_batch} or "
                    "{memory_share}; if not, run with {graph_off} to confirm and report it upstream."
                )
                or "Find the first exception above this one.",
                evidence=first_evidence(evs),
            )
        ]
    return [
        Finding(
            RULE.id,
            "critical",
            "CUDA graph capture failed for a reason other than memory",
            explanation=(
                f"Capture failed with: {cause.strip()[:200]}. SGLang's message then suggests lowering "
                "--mem-fraction-static, but the cause is not an allocation failure, so that advice does "
                "not apply; it is a model/kernel error raised while capturing."
            ),
            fix=words(d).say(
                "Start with {graph_off} to confirm, then fix the cause (e.g. a draft model that "
                "does not match the target for EAGLE, an unsupported kernel); report it upstream."
            )
            or "Fix the cause; report it upstream.",
            evidence=first_evidence(evs),
        )
    ]


RULE = Rule(
    id="sglang-graph-capture-failed",
    severity="critical",
    title="CUDA graph capture failed (not memory)",
    fires_when=(
        "SGLang 'Capture cuda graph failed: <cause>' where the cause is not a CUDA OOM (an empty cause: "
        "'cause unknown', never 'not memory')"
    ),
    fix="--disable-cuda-graph to confirm, then fix the cause; the mem-fraction advice does not apply",
    check=check,
)
