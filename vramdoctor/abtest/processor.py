"""Load the real GPU-capable ("fast", torchvision-based) image processor with transformers.

Runs inside a variant's worker process only. transformers 5.x gives the torchvision classes
the plain names (`Qwen2VLImageProcessor`) and 4.x suffixes them `...Fast`; going through
`AutoImageProcessor` (use_fast=True) or the mapping table covers both.
"""

from __future__ import annotations

from typing import Any

from vramdoctor.abtest.models import ModelChoice
from vramdoctor.errors import InputError, MissingExtra


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise MissingExtra("vramdoctor ab-test", "transformers") from None
    return transformers


def fast_class_name(model_type: str) -> str | None:
    """The torchvision-backed processor class for a model_type in this transformers."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    entry = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    if entry is None:
        return None
    if isinstance(entry, dict):  # transformers 5.x: {"torchvision": ..., "pil": ...}
        name = entry.get("torchvision")
    elif isinstance(entry, (tuple, list)) and len(entry) > 1:  # 4.x: (slow, fast)
        name = entry[1]
    else:
        name = None
    return name if isinstance(name, str) else None


def load_processor(choice: ModelChoice) -> tuple[Any, str]:
    """(processor instance, its class name) for `choice`, offline."""
    transformers = _transformers()
    if choice.path is not None:
        # 5.x names the GPU path backend="torchvision" (use_fast is deprecated there).
        major = int(transformers.__version__.split(".")[0])
        kwargs = {"backend": "torchvision"} if major >= 5 else {"use_fast": True}
        proc = transformers.AutoImageProcessor.from_pretrained(
            choice.path, local_files_only=True, **kwargs
        )
        return proc, type(proc).__name__
    name = fast_class_name(choice.model_type)
    if name is None or not hasattr(transformers, name):
        raise InputError(
            f"transformers {transformers.__version__} has no GPU (torchvision) image processor "
            f"for {choice.model_type}"
        )
    proc = getattr(transformers, name)()
    return proc, name
