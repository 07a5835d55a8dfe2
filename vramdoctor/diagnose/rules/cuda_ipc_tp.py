"""SGLang CUDA IPC feature transport: extra contexts with TP > 1, budget per tokenizer worker."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import mib, version_tuple

CONTEXT_MIB = 500.0  # one extra CUDA context per consumer rank on the producer GPU (PR #22662)
SPLIT_IN = (0, 5, 15)  # from 0.5.15 the budget is split across tokenizer workers
DEFAULT_BUDGET = (
    1024.0  # SGLANG_MM_FEATURE_CACHE_MB default from 0.5.15 (2048 in 0.5.5, 4096 in 0.5.9)
)


def check(d: Diagnosis) -> list[Finding]:
    f = d.facts
    if d.server != "sglang" or f.cuda_ipc_transport is not True:
        return []
    tp = f.tp_size or 1
    workers = f.tokenizer_worker_num or 1
    if tp <= 1 and workers <= 1:
        return []
    # the version printed, else the oldest one whose wording the pool line has (never older than that)
    v = version_tuple(d.version) or version_tuple(f.ipc_min_version)
    budget = f.mm_feature_cache_mb or DEFAULT_BUDGET
    ctx = (tp - 1) * CONTEXT_MIB
    before_split = v is None or v < SPLIT_IN
    pool = f.ipc_pool_total_mib or (budget * workers if before_split else budget)
    total = ctx + pool
    evidence = [
        e
        for e in (
            f.evidence.get("cuda_ipc_transport"),
            f.evidence.get("tp_size"),
            f.evidence.get("tokenizer_worker_num"),
        )
        if e
    ]
    pool_note = (
        f"the feature pool: {mib(budget)} budget x {workers} tokenizer worker(s) = {mib(budget * workers)} "
        "(each worker reserves the whole budget before 0.5.15)"
        if before_split and f.ipc_pool_total_mib is None
        else f"the feature pool: {mib(pool)} in total"
    )
    return [
        Finding(
            id=RULE.id,
            severity="warning",
            title=f"CUDA IPC feature transport costs about {mib(total)} on the producer GPU",
            evidence=evidence,
            explanation=(
                f"Multimodal features travel by CUDA IPC with tp={tp}"
                + (
                    f" (the pool line's wording is SGLang {f.ipc_min_version} or later)"
                    if f.ipc_min_version and d.version is None
                    else ""
                )
                + ". Before the handle redirect "
                f"(PR #22662) each of the {tp - 1} consumer rank(s) opens the producer's handle under "
                f"a guard on the producer's device and creates a full CUDA context there: "
                f"~{CONTEXT_MIB:.0f} MiB each = {mib(ctx)}; plus {pool_note}. The pool is a fixed "
                "block for the process's life (constant, not a leak); the contexts look like stray "
                "processes on the producer GPU in nvidia-smi."
            ),
            fix=(
                "--mm-feature-transport cpu"
                + (
                    "; "
                    if v is not None and v >= (0, 5, 17)
                    else " (or unset SGLANG_USE_CUDA_IPC_TRANSPORT on 0.5.5-0.5.16); "
                )
                + "or upgrade to a version with the IPC device redirect; lower SGLANG_MM_FEATURE_CACHE_MB "
                "and --tokenizer-worker-num; confirm with `vramdoctor census` (a ~500 MiB footprint of "
                "each TP rank on the producer GPU) and measure with `vramdoctor ab-test`."
            ),
        )
    ]


RULE = Rule(
    id="sglang-cuda-ipc-tp",
    severity="warning",
    title="CUDA IPC multimodal feature transport with TP > 1 or several tokenizer workers",
    fires_when=(
        "SGLang log shows CUDA IPC transport on (its pool/auto-resolve lines or "
        "mm_feature_transport='cuda_ipc') and tp_size > 1 or tokenizer_worker_num > 1"
    ),
    fix="--mm-feature-transport cpu, upgrade past the handle redirect, smaller SGLANG_MM_FEATURE_CACHE_MB; the MiB it costs is in the finding",
    check=check,
)
