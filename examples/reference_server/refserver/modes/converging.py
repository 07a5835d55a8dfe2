"""converging: a multimodal cache that fills towards its bound, each round adding less.

Each image is cut into tiles of `--tile-px` px (of the preprocessed image); a tile's features
(`--converge-entry-kib`) are cached by the tile's content hash. The cache admits a missing tile
on a sighting with probability `--admit-probability` (a frequency-gated admission filter, as
caches that only keep what recurs have): identical rounds that show each tile m times fill a
share 1 - (1 - p)^m of what is still missing, so round k adds N_tiles x entry x s x (1 - s)^(k-1)
(geometric: e.g. +254, +140, +77, +44, +25 MiB with s = 0.45) towards the bound N_tiles x
entry; `--converge-cap-mib` caps it too (least recently used out). `--converge-on host` (default):
numpy blocks in host RAM (glibc in use grows, converging); `vram`: tensors on the device (real
CUDA, or the virtual GPU on the CPU).

TRUTH: CACHING on that layer with the bound in GET /reference/info (`cache_bound_bytes`, and
`cache_bytes` now); the increments shrink geometrically; never a LEAK (a rate whose interval
contains zero is none).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from refserver.modes.base import Mode, layer

if TYPE_CHECKING:
    from PIL import Image

    from refserver.request import Request
    from refserver.state import State


class ConvergingMode(Mode):
    name = "converging"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--converge-on", choices=["host", "vram"], default="host", help="converging: where"
        )
        parser.add_argument(
            "--admit-probability",
            type=float,
            default=0.03,
            help="converging: chance a missing tile is admitted on a sighting",
        )
        parser.add_argument("--tile-px", type=int, default=56, help="converging: tile side in px")
        parser.add_argument(
            "--converge-entry-kib",
            type=float,
            default=1024.0,
            help="converging: KiB of features cached per tile",
        )
        parser.add_argument(
            "--converge-cap-mib",
            type=float,
            default=0.0,
            help="converging: cap of the cache in MiB (least recently used out); 0: the tiles' bound",
        )
        parser.add_argument(
            "--converge-seed", type=int, default=0, help="converging: the admission draws' seed"
        )

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.entries: OrderedDict[str, Any] = OrderedDict()
        self.tiles_seen: set[str] = set()
        self.entry_bytes = int(args.converge_entry_kib * 1024)
        self.rng = random.Random(args.converge_seed)
        self._lock = threading.Lock()
        self.cache_bytes = 0

    def _tiles(self, state: State, img: Image.Image) -> list[str]:
        pixels = state.cpu(img)  # (3, H, W) float32
        t = max(8, self.args.tile_px)
        _, h, w = pixels.shape
        keys = []
        for y in range(0, h - t + 1, t):
            for x in range(0, w - t + 1, t):
                keys.append(hashlib.sha1(pixels[:, y : y + t, x : x + t].tobytes()).hexdigest())
        return keys

    def _entry(self, state: State) -> Any:
        if self.args.converge_on == "vram":
            return state.gpu_mem.alloc(self.entry_bytes)
        return np.ones(self.entry_bytes, dtype=np.uint8)  # every page written

    def _drop(self, state: State, entry: Any) -> None:
        if self.args.converge_on == "vram":
            state.gpu_mem.free(entry)

    def _image(self, state: State, img: Image.Image) -> None:
        limit = (
            int(self.args.converge_cap_mib * 1024 * 1024) if self.args.converge_cap_mib else None
        )
        for key in self._tiles(state, img):
            with self._lock:
                self.tiles_seen.add(key)
                if key in self.entries:
                    self.entries.move_to_end(key)
                    continue
                admit = self.rng.random() < self.args.admit_probability
            if not admit:
                continue
            entry = self._entry(state)
            with self._lock:
                if key in self.entries:
                    self._drop(state, entry)
                    continue
                self.entries[key] = entry
                self.cache_bytes += self.entry_bytes
                while limit is not None and self.cache_bytes > limit and self.entries:
                    _, old = self.entries.popitem(last=False)
                    self.cache_bytes -= self.entry_bytes
                    self._drop(state, old)

    def cpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        self._image(state, img)

    def gpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        self._image(state, img)

    def bound_bytes(self) -> int:
        """The cache's bound for the tiles seen so far (every tile cached), capped by --cache-mib."""
        bound = len(self.tiles_seen) * self.entry_bytes
        if self.args.converge_cap_mib:
            bound = min(bound, int(self.args.converge_cap_mib * 1024 * 1024))
        return bound

    def info(self, state: State) -> dict[str, Any]:
        with self._lock:
            return {
                "cache_bytes": self.cache_bytes,
                "cache_entries": len(self.entries),
                "tiles_seen": len(self.tiles_seen),
                "cache_bound_bytes": self.bound_bytes(),
            }

    def truth(self, state: State) -> dict[str, Any]:
        where = "vram" if self.args.converge_on == "vram" else "host"
        layers = {
            "vram": layer("STABLE", "no GPU memory held"),
            "kv": layer("STABLE", "every request's KV tokens return to the pool"),
            "host": layer("STABLE", "nothing kept on the host"),
        }
        layers[where] = layer(
            "CACHING",
            "a tile cache with sampled admission fills towards its bound: each round adds a "
            "fixed share of what is still missing (geometric convergence)",
            bound_bytes=self.bound_bytes(),
            cause="converging cache",
        )
        return {"summary": f"a cache on {where} converging to its bound", "layers": layers}


MODES = [ConvergingMode]
