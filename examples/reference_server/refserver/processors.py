"""Image preprocessing the modes share: Pillow/numpy on the CPU, a real transformers fast image
processor on CUDA.

Shapes: `CpuPreprocessor()(img)` -> float32 array (3, H, W), H and W multiples of 28 px, at most
`max_side` px on the long side. `GpuPreprocessor(dir, device)(img)` -> the processor's
`BatchFeature` with `pixel_values` on `device`.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import numpy as np
from PIL import Image

MEAN = np.array([0.481, 0.458, 0.408], dtype=np.float32)
STD = np.array([0.269, 0.261, 0.276], dtype=np.float32)


class CpuPreprocessor:
    """Pillow/numpy preprocessing: decode, resize to a multiple of 28 px, normalise to float32."""

    def __init__(self, max_side: int = 448) -> None:
        self.max_side = max_side

    def __call__(self, img: Image.Image) -> np.ndarray:
        w, h = img.size
        scale = min(1.0, self.max_side / max(w, h))
        w2 = max(28, int(w * scale) // 28 * 28)
        h2 = max(28, int(h * scale) // 28 * 28)
        arr = np.asarray(img.convert("RGB").resize((w2, h2)), dtype=np.float32) / 255.0
        return ((arr - MEAN) / STD).transpose(2, 0, 1).copy()


class GpuPreprocessor:
    """A real transformers fast image processor running on CUDA (via AutoImageProcessor)."""

    def __init__(self, processor_dir: str | None, device: str) -> None:
        import tempfile

        import torch
        from transformers import AutoImageProcessor

        self.torch = torch
        self.device = device
        if processor_dir is None:
            # Offline: a preprocessor config naming the Qwen2-VL processor. transformers 5 gives the
            # torchvision ("fast") class under the plain name; 4.x needs use_fast=True.
            processor_dir = tempfile.mkdtemp(prefix="vramdoctor-ref-")
            with open(os.path.join(processor_dir, "preprocessor_config.json"), "w") as fh:
                json.dump({"image_processor_type": "Qwen2VLImageProcessor"}, fh)
        import transformers

        major = int(transformers.__version__.split(".")[0])
        # 5.x: backend="torchvision" (use_fast is deprecated there); 4.x: use_fast=True.
        kwargs = {"backend": "torchvision"} if major >= 5 else {"use_fast": True}
        self.processor = AutoImageProcessor.from_pretrained(processor_dir, **kwargs)
        self.name = type(self.processor).__name__

    def __call__(self, img: Image.Image) -> Any:
        return self.processor(images=[img.convert("RGB")], return_tensors="pt", device=self.device)


def decode(data: bytes) -> Image.Image:
    """The image in `data` decoded now (PIL's lazy open made eager); raises what PIL raises."""
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def tiny_png() -> bytes:
    """A 64x64 black PNG (the warm-up input)."""
    buf = io.BytesIO()
    Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()
