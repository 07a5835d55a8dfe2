"""A GPU page fault (ROCm's "Memory access fault by GPU node-N"): a kernel bug, not out-of-memory."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, server_name, words


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("gpu_memory_fault")
    if not evs:
        return []
    v = words(d)
    e = evs[0]
    switch = (
        v.say(
            " Switch the attention kernels ({attention_backend}) to see whether one of them faults."
        )
        or ""
    )
    return [
        Finding(
            RULE.id,
            "critical",
            "GPU memory access fault: a kernel read or wrote an invalid address (not out of memory)",
            explanation=(
                f"`{e.text[:200]}`: the GPU's runtime (ROCm's HSA) killed the process after a page fault on "
                f"GPU node {e.data.get('node')}: a kernel accessed memory outside its buffers. It is a bug in a "
                f"kernel, the kernel library or the driver that {server_name(d)} runs, not a memory shortage: "
                "the memory settings neither cause nor fix it."
            ),
            fix=(
                "Report it with the model, the server version and the kernel library (on ROCm: AITER, Triton, "
                "the ROCm version); try another ROCm/driver or server version to bisect it."
                + switch
            ),
            evidence=first_evidence(evs, 1),
        )
    ]


RULE = Rule(
    id="gpu-memory-fault",
    severity="critical",
    title="GPU memory access fault (not out of memory)",
    fires_when="ROCm 'Memory access fault by GPU node-N (Agent handle: ...) on address ...'",
    fix="report/bisect the kernel (library, driver, server version); not a memory setting",
    check=check,
)
