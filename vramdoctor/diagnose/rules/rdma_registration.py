"""RDMA memory registration failed in the KV transfer engine: not a GPU memory shortage."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, words


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("rdma_registration_failed")
    if not evs:
        return []
    n = d.event_counts.get("rdma_registration_failed", len(evs))
    err = evs[0].data.get("error") or "no reason printed"
    return [
        Finding(
            RULE.id,
            "warning",
            f"RDMA could not register {n} GPU buffer(s) for KV transfer (not an OOM)",
            explanation=(
                f"The KV transfer engine (Mooncake, PD disaggregation) failed to register memory with the "
                f"RDMA NIC ({err}). 'Bad address' on GPU memory usually means GPUDirect RDMA is not "
                "available (nvidia_peermem not loaded, or a NIC/GPU pair without P2P). Nothing ran out of "
                "memory; KV transfers between prefill and decode then fail."
            ),
            fix=(
                "Load nvidia_peermem (modprobe nvidia_peermem) or use dmabuf-capable drivers, check "
                + (words(d)("rdma_device") or "the RDMA device settings of the KV transfer")
                + ", and confirm with Mooncake's TCP protocol."
            ),
            evidence=first_evidence(evs, 2),
        )
    ]


RULE = Rule(
    id="rdma-registration-failed",
    severity="warning",
    title="RDMA memory registration failed (not a GPU OOM)",
    fires_when="Mooncake 'Failed to register memory 0x...: Bad address [14]' (SGLang PD disaggregation)",
    fix="load nvidia_peermem / check the IB device; not a memory-fraction problem",
    check=check,
)
