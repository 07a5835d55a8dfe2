"""SGLang retracted requests because the KV pool filled up (scheduling, not a crash).

The retraction lines: "Decode out of memory happened. #retracted_reqs: N, #new_token_ratio: A -> B"
(older versions) and "KV cache pool is full. Retract requests. #retracted_reqs: N, ..." (newer). The
allocation failure "Prefill/Decode out of memory. Try to lower your batch size." is NOT one: it kills
the scheduler (rule sglang-kv-pool-exhausted).
"""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence

MANY = 20  # retraction lines before it is worth a warning


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("retraction")
    if not evs or d.server != "sglang":  # SGLang's own line (it votes for SGLang)
        return []
    n = d.event_counts.get("retraction", len(evs))
    reqs = sum(e.data.get("retracted_reqs", 0) for e in evs)
    return [
        Finding(
            RULE.id,
            "warning" if n >= MANY else "info",
            f"KV pool full: {n} retraction line(s)",
            explanation=(
                "SGLang's retraction line ('Decode out of memory happened' in older versions, 'KV cache "
                "pool is full. Retract requests.' in newer ones) means the KV pool ran out of free slots "
                f"during decode and SGLang retracted running requests ({reqs} in the lines kept) and "
                "re-queued them; the server kept running. It "
                "is not a CUDA OOM and not a leak; requests are recomputed, which costs latency. "
                "Frequent retraction means the KV pool is too small for the load."
            ),
            fix=(
                "Lower --max-running-requests, raise --mem-fraction-static if there is headroom, or "
                "raise --schedule-conservativeness; more GPUs give a bigger pool."
            ),
            evidence=first_evidence(evs),
        )
    ]


RULE = Rule(
    id="sglang-retraction",
    severity="warning",
    title="SGLang KV pool retraction",
    fires_when=(
        "SGLang 'Decode out of memory happened. #retracted_reqs: N' or 'KV cache pool is full. Retract "
        "requests. #retracted_reqs: N' (info; warning from 20 lines)"
    ),
    fix="lower --max-running-requests, raise --schedule-conservativeness or the memory fraction",
    check=check,
)
