"""SGLang's CUDA IPC multimodal feature transport failing on ROCm: the transport is CUDA-only.

The scheduler rebuilds each feature tensor from the tokenizer's IPC handle
(utils/cuda_ipc_transport_utils.py `reconstruct_on_target_device`); on HIP that fails with "Failed to
deserialize from CUDA IPC handle (HIP error: invalid device pointer)" and the scheduler dies. SGLang
0.5.18+ rejects `--mm-feature-transport=cuda_ipc` off NVIDIA CUDA ("requires NVIDIA CUDA"); older
versions take `SGLANG_USE_CUDA_IPC_TRANSPORT=1` there and fail like this (sglang#29227, #29687).
"""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, words


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("ipc_transport_failed")
    if not evs or d.server != "sglang":
        return []
    hip = d.facts.platform == "rocm" or any(e.data.get("runtime") == "HIP" for e in evs)
    if not hip:
        return []
    v = words(d)
    full = d.events_of("mm_feature_pool_full")
    expl = (
        f"`{evs[0].text[:200]}`: SGLang's multimodal feature transport over CUDA IPC could not open a "
        "feature tensor's IPC handle on this ROCm/HIP GPU, and the scheduler died (the launcher's SIGQUIT "
        "follows). The transport is built for NVIDIA CUDA: SGLang 0.5.18+ refuses --mm-feature-transport "
        "cuda_ipc off CUDA, and older versions fail like this when SGLANG_USE_CUDA_IPC_TRANSPORT=1 is set. "
        "Not a memory shortage."
    )
    if full:
        expl += (
            " The feature pool had filled first ('has no free chunk', falling back to non-IPC transport): the "
            "fallback path failed on HIP; a larger pool only delays it."
        )
    return [
        Finding(
            RULE.id,
            "critical",
            "CUDA IPC feature transport failed on ROCm (not supported there; not memory)",
            explanation=expl,
            fix=(
                (
                    v.say("Turn the CUDA IPC transport off: {mm_transport_cpu}")
                    or "Turn the CUDA IPC transport off"
                )
                + " and unset SGLANG_USE_CUDA_IPC_TRANSPORT; features then travel through CPU shared memory."
            ),
            evidence=first_evidence(full[:1] + evs, 2),
        )
    ]


RULE = Rule(
    id="sglang-cuda-ipc-rocm",
    severity="critical",
    title="CUDA IPC multimodal feature transport failed on ROCm",
    fires_when=(
        "SGLang 'Failed to deserialize from CUDA IPC handle (HIP error: ...)' (or on a ROCm platform): the "
        "transport is CUDA-only"
    ),
    fix="--mm-feature-transport cpu / unset SGLANG_USE_CUDA_IPC_TRANSPORT",
    check=check,
)
