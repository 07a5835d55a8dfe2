"""The image workload every variant replays: seeded, so every variant sees the same images.

Sizes are drawn per round from a seeded generator (uniform or log-uniform sides, or one
fixed size); with `new_sizes_each_round` each round draws fresh sizes, which is what makes a
caching allocator grow (new shapes need new segment sizes). `--images DIR` replays the
user's own images instead. Pixels are random uint8 (content does not change the memory a
resize/normalise pipeline needs; sizes do).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from vramdoctor.errors import InputError

DISTRIBUTIONS = ("uniform", "loguniform", "fixed")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


@dataclass(frozen=True)
class WorkloadSpec:
    """What to replay: `count` requests a round, `rounds` rounds, one image per request."""

    count: int = 40
    rounds: int = 4
    min_side: int = 256
    max_side: int = 2048
    distribution: str = "uniform"
    seed: int = 0
    new_sizes_each_round: bool = True
    images_dir: str | None = None

    def validate(self) -> WorkloadSpec:
        if self.count < 1 or self.rounds < 1:
            raise InputError("--count and --rounds must be at least 1")
        if self.distribution not in DISTRIBUTIONS:
            raise InputError(
                f"unknown --distribution {self.distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}"
            )
        if not (16 <= self.min_side <= self.max_side <= 16384):
            raise InputError("image sides must satisfy 16 <= --min-side <= --max-side <= 16384")
        if self.images_dir is not None:
            image_files(self.images_dir)  # raises when unusable
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadSpec:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def _sides(rng: np.random.Generator, spec: WorkloadSpec, n: int) -> np.ndarray:
    if spec.distribution == "fixed":
        return np.full(n, spec.max_side, dtype=np.int64)
    if spec.distribution == "loguniform":
        lo, hi = np.log(spec.min_side), np.log(spec.max_side)
        sides: np.ndarray = np.exp(rng.uniform(lo, hi, n)).round().astype(np.int64)
    else:
        sides = rng.integers(spec.min_side, spec.max_side + 1, n)
    return sides


def image_sizes(spec: WorkloadSpec) -> list[list[tuple[int, int]]]:
    """(height, width) of every request, per round. Pure and deterministic in the seed."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    rounds: list[list[tuple[int, int]]] = []
    for r in range(spec.rounds):
        if r > 0 and not spec.new_sizes_each_round:
            rounds.append(list(rounds[0]))
            continue
        h = _sides(rng, spec, spec.count)
        w = _sides(rng, spec, spec.count)
        rounds.append([(int(a), int(b)) for a, b in zip(h, w, strict=True)])
    return rounds


def image_files(images_dir: str | Path) -> list[Path]:
    """The images in DIR (sorted, non-recursive); InputError when there are none."""
    root = Path(images_dir)
    if not root.is_dir():
        raise InputError(f"--images {root}: not a directory")
    files = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise InputError(f"--images {root}: no image files ({', '.join(IMAGE_SUFFIXES)})")
    return files


def make_image(height: int, width: int, seed: int) -> np.ndarray:
    """A random RGB uint8 image (H, W, 3), identical for the same (size, seed)."""
    rng = np.random.default_rng([seed, height, width])
    return rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)


class _NoiseSource:
    """Crops of one seeded noise canvas: as good as fresh noise for memory, much cheaper."""

    def __init__(self, seed: int, side: int) -> None:
        self.canvas = make_image(side, side, seed)

    def crop(self, height: int, width: int, k: int) -> np.ndarray:
        dy = (k * 7919) % (self.canvas.shape[0] - height + 1)
        dx = (k * 104729) % (self.canvas.shape[1] - width + 1)
        return np.ascontiguousarray(self.canvas[dy : dy + height, dx : dx + width])


@lru_cache(maxsize=2)
def _noise_source(seed: int, side: int) -> _NoiseSource:
    """One canvas per run, not one per round (12 MiB of random bytes at 2048 px)."""
    return _NoiseSource(seed, side)


def load_image(path: Path) -> np.ndarray:
    """An image file as RGB uint8 (H, W, 3); InputError naming the file when unreadable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError) as exc:
        raise InputError(f"cannot read image {path}: {exc}") from None


def round_images(spec: WorkloadSpec, round_index: int) -> list[np.ndarray]:
    """The images of one round (generated, or read from --images), made just before it runs."""
    if spec.images_dir is not None:
        files = image_files(spec.images_dir)
        start = round_index * spec.count
        return [load_image(files[(start + i) % len(files)]) for i in range(spec.count)]
    sizes = image_sizes(spec)[round_index]
    noise = _noise_source(spec.seed, spec.max_side)
    return [noise.crop(h, w, round_index * spec.count + i) for i, (h, w) in enumerate(sizes)]


def describe(spec: WorkloadSpec) -> str:
    if spec.images_dir:
        return f"{spec.count} images a round from {spec.images_dir}, {spec.rounds} rounds"
    fresh = "new sizes each round" if spec.new_sizes_each_round else "same images every round"
    return (
        f"{spec.count} random images a round, sides {spec.min_side}..{spec.max_side} px "
        f"({spec.distribution}, seed {spec.seed}), {spec.rounds} rounds, {fresh}"
    )
