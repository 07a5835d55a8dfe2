"""SGLang ran out of request slots (req_to_token pool), not of GPU memory."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("req_slots_exhausted")
    if not evs or d.server != "sglang":  # SGLang's own line (it votes for SGLang)
        return []
    return [
        Finding(
            RULE.id,
            "warning",
            "Request slots exhausted (alloc_req_slots), not a CUDA OOM",
            explanation=(
                "The scheduler could not allocate a slot in the req_to_token pool: more requests were "
                "admitted than --max-running-requests sized it for (or slots leaked, see the KV self-check). "
                "GPU memory is not what ran out."
            ),
            fix="Set --max-running-requests explicitly (and check for a KV self-check leak finding); upgrade if it recurs.",
            evidence=first_evidence(evs),
        )
    ]


RULE = Rule(
    id="sglang-req-slots-exhausted",
    severity="warning",
    title="SGLang request slots exhausted (not a CUDA OOM)",
    fires_when="SGLang 'alloc_req_slots runs out of memory'",
    fix="--max-running-requests; check for slot leaks",
    check=check,
)
