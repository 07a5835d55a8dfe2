"""SGLang multimodal model with the fast (GPU) image processor and no request-scoped pool."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import version_tuple

FIXED_IN = (0, 5, 19)  # _temporary_fast_processor_cuda_pool (PR #36295)
SEVERE = (0, 4, 9)  # v0.4.9.post6: known severe VLM leak with the fast processor (sglang #9365)


def check(d: Diagnosis) -> list[Finding]:
    f = d.facts
    if d.server != "sglang" or f.multimodal is not True or f.fast_image_processor is not True:
        return []
    v = version_tuple(d.version)
    if v is not None and v >= FIXED_IN:
        return []
    # No version line (SGLang never prints one), but a line's format may date the server: the dict
    # form server_args={...} is 0.5.19+ (version_at_least), which has the request-scoped pool.
    at_least = version_tuple(f.version_at_least) if v is None else None
    if at_least is not None and at_least >= FIXED_IN:
        return []
    model = f.model or "<model>"
    evidence = [
        e for e in (f.evidence.get("fast_image_processor"), f.evidence.get("multimodal")) if e
    ]
    if v is not None:
        known = f"SGLang {d.version}"
    elif f.version_at_least:
        known = (
            f"SGLang version not shown in the log (SGLang never prints it); its format says "
            f"{f.version_at_least} or later"
        )
    else:
        known = "SGLang version not shown in the log (SGLang never prints it)"
    severe = (
        " v0.4.9.post6 has a known severe VLM leak on this path (sglang #9365)."
        if (v is None and (at_least is None or at_least[:3] <= SEVERE)) or (v and v[:3] == SEVERE)
        else ""
    )
    return [
        Finding(
            id=RULE.id,
            severity="warning",
            title="Fast image processor runs on the GPU in the tokenizer process",
            evidence=evidence,
            explanation=(
                f"{model} is multimodal and the fast image processor is on "
                "(image_processor_backend='torchvision', SGLang's 'Automatically use fast version' line, "
                "or disable_fast_image_processor=False before image_processor_backend existed; and no "
                "transformers 'Using a slow image processor' warning). Preprocessing then runs on "
                "the GPU inside the tokenizer process (GPU 0 or --base-gpu-id): an extra CUDA "
                "context plus scratch that stays in PyTorch's caching allocator, growing with image "
                f"sizes until OOM on versions without the request-scoped pool (< 0.5.19). {known}.{severe} "
                "Public reports: sglang #8179, #8429, #6082, #15871 (~20 GB on GPU 0)."
            ),
            fix=(
                "Add --disable-fast-image-processor (0.5.18+: --image-processor-backend pil): "
                "preprocessing moves to the CPU (~14 ms vs ~4 ms per 256-2048 px image on an H100; "
                "public reports of >2x slower serving). Or upgrade to SGLang >= 0.5.19 (request-scoped "
                "pool; not applied with CUDA IPC/VMM feature transport), or wrap preprocessing in "
                "vramdoctor's scoped pool (vramdoctor.fixes). Measure it on your GPU: "
                f"vramdoctor ab-test --model {model}"
            ),
        )
    ]


RULE = Rule(
    id="sglang-fast-image-processor",
    severity="warning",
    title="Fast image processor on a multimodal SGLang model",
    fires_when=(
        "SGLang log, multimodal model with images (architecture, model name or multimodal lines), fast "
        "processor shown on (image_processor_backend='torchvision', SGLang's 'does not have a slow "
        "version. Automatically use fast version' line, or disable_fast_image_processor=False on "
        "versions before image_processor_backend; 'auto' lets transformers choose and proves nothing) "
        "and no 'Using a slow image processor' warning, version < 0.5.19 or unknown (a "
        "server_args={...} dict dump dates the server 0.5.19+)"
    ),
    fix=(
        "--disable-fast-image-processor / --image-processor-backend pil (CPU cost), upgrade to "
        ">= 0.5.19, or the vramdoctor scoped pool; measure with `vramdoctor ab-test --model <model>`"
    ),
    check=check,
)
