"""`vramdoctor ab-test`: every memory mitigation for a model's GPU image processor, measured.

workload (seeded images) -> runner (one worker process per variant, records streamed to the
run file) -> analysis (pure, over the records) -> report. The IPC arm measures the CUDA IPC
device redirect across GPUs. torch is only imported inside worker processes.

The public names are imported on first use (numpy, scipy and transformers load only then):

    from vramdoctor.abtest import resolve_model, load_processor, make_image
    processor, name = load_processor(resolve_model("Qwen/Qwen2.5-VL-7B-Instruct"))  # offline
    image = make_image(448, 672, seed=0)              # HxWx3 uint8 noise, reproducible
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramdoctor import _lazy

if TYPE_CHECKING:
    from vramdoctor.abtest.analysis import analyse
    from vramdoctor.abtest.models import ModelChoice, resolve_model, supported
    from vramdoctor.abtest.processor import load_processor
    from vramdoctor.abtest.workload import WorkloadSpec, make_image

# Public name -> its module in this package (imported on first access).
_LAZY = {
    "ModelChoice": "models",
    "WorkloadSpec": "workload",
    "analyse": "analysis",
    "load_processor": "processor",
    "make_image": "workload",
    "resolve_model": "models",
    "supported": "models",
}

__all__ = [
    "ModelChoice",
    "WorkloadSpec",
    "analyse",
    "load_processor",
    "make_image",
    "resolve_model",
    "supported",
]


def __getattr__(name: str) -> Any:
    return _lazy.load(__name__, name, _LAZY)


def __dir__() -> list[str]:
    return _lazy.listing(globals(), _LAZY)
