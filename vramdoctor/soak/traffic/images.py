"""Images for image prompts: generated at chosen sizes from a fixed seed, or read from a folder.

Generated images are random noise (PNG does not compress it), so their decoded size is what the
server's image processor sees. The same seed gives the same bytes every run, so every round
sends identical requests: the precondition for telling caching (plateau) from a leak (growth).
"""

from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from vramdoctor.errors import InputError

_SIZE = re.compile(r"^\s*(\d{1,5})\s*[xX×]\s*(\d{1,5})\s*$")
IMAGE_SUFFIXES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".webp": "image/webp",
    ".gif": "image/gif",
    ".bmp": "image/bmp",
}


@dataclass(frozen=True)
class ImageSize:
    width: int
    height: int

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass(frozen=True)
class PromptImage:
    """One image ready to send: encoded bytes, MIME type and where it came from."""

    data: bytes
    mime: str
    label: str


def parse_image_size(text: str) -> ImageSize:
    """'640x480' -> ImageSize; anything else is an InputError naming the expected form."""
    m = _SIZE.match(text)
    if not m:
        raise InputError(f"--image-size {text!r}: expected WIDTHxHEIGHT, e.g. 640x480")
    w, h = int(m.group(1)), int(m.group(2))
    if not (8 <= w <= 8192 and 8 <= h <= 8192):
        raise InputError(f"--image-size {text!r}: each side must be between 8 and 8192 pixels")
    return ImageSize(w, h)


def generate_images(sizes: list[ImageSize], seed: int = 0) -> list[PromptImage]:
    """One seeded noise PNG per size (deterministic: same seed, same bytes)."""
    rng = np.random.default_rng(seed)
    out: list[PromptImage] = []
    for size in sizes:
        pixels = rng.integers(0, 256, size=(size.height, size.width, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buf, format="PNG", compress_level=1)
        out.append(PromptImage(buf.getvalue(), "image/png", f"generated {size}"))
    return out


def load_image_dir(path: Path, limit: int = 64) -> list[PromptImage]:
    """The user's images, sorted by name (so the order is the same every round)."""
    if not path.is_dir():
        raise InputError(f"--image-dir {path}: not a directory")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise InputError(
            f"--image-dir {path}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in it"
        )
    out: list[PromptImage] = []
    for p in files[:limit]:
        try:
            data = p.read_bytes()
            with Image.open(io.BytesIO(data)) as img:
                img.verify()
        except Exception:
            raise InputError(f"--image-dir: {p} is not a readable image") from None
        out.append(PromptImage(data, IMAGE_SUFFIXES[p.suffix.lower()], p.name))
    return out


def data_url(image: PromptImage) -> str:
    """The image as a `data:` URL (base64), the form OpenAI-compatible chat requests carry."""
    return f"data:{image.mime};base64," + base64.b64encode(image.data).decode("ascii")
