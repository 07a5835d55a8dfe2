"""SGLang 0.5.23 caught a GPU OOM in multimodal preprocessing and retried on the CPU."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("mm_preprocess_gpu_oom")
    if not evs or d.server != "sglang":  # SGLang's own line (it votes for SGLang)
        return []
    n = d.event_counts.get("mm_preprocess_gpu_oom", len(evs))
    return [
        Finding(
            RULE.id,
            "warning",
            f"Image preprocessing ran out of GPU memory {n} time(s) (retried on CPU)",
            explanation=(
                "The fast image processor runs on the GPU in the tokenizer process; it hit a CUDA OOM and "
                "SGLang retried those images on the CPU. The GPU it runs on (GPU 0 / --base-gpu-id) is "
                "full: the server's own budget leaves too little room for preprocessing, or its cached "
                "scratch has grown."
            ),
            fix=(
                "Lower --mem-fraction-static on that GPU, or move preprocessing to the CPU for good with "
                "--image-processor-backend pil; measure with `vramdoctor ab-test`."
            ),
            evidence=first_evidence(evs),
        )
    ]


RULE = Rule(
    id="sglang-mm-preprocess-gpu-oom",
    severity="warning",
    title="Multimodal preprocessing out of GPU memory (CPU retry)",
    fires_when="SGLang 0.5.23 'Multimodal preprocessing ran out of GPU memory on X; retrying on CPU'",
    fix="lower the memory fraction on that GPU or --image-processor-backend pil",
    check=check,
)
