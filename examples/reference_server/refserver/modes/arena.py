"""arena: host-allocator caching through new glibc arenas, for real.

Every image is decoded on `--arena-threads` fresh threads at once (thread per request, as
servers that hand each request to a new thread do); glibc gives concurrent threads their own
malloc arenas and keeps the memory freed in them. RSS rises while new arenas appear and is
bounded by MALLOC_ARENA_MAX (default 8 x cores on 64-bit); under MALLOC_ARENA_MAX=2 it stays
flat. The server leaves glibc at its defaults (no tuning at start).

TRUTH: host CACHING (allocator retention): glibc's bytes in use (`mallinfo2()`, GET
/reference/info `malloc.in_use_bytes`) stay flat while the bytes it keeps grow; never LEAK.
"""

from __future__ import annotations

import argparse
import io
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from refserver.modes.base import Mode, layer

if TYPE_CHECKING:
    from refserver.request import Request
    from refserver.state import State


def decode_on_threads(state: State, data: bytes, threads: int) -> None:
    """Decode `data` on `threads` fresh threads at once: each thread's mallocs (Pillow's
    decode buffers, numpy's float arrays) come from the arena glibc gives it; the memory is
    freed when the thread ends but stays in that arena."""

    def decode() -> None:
        img = Image.open(io.BytesIO(data))
        img.load()
        pixels = state.cpu(img)
        # A second, differently sized working buffer, as resize/normalise pipelines have.
        np.resize(pixels.ravel(), pixels.size // 3 + 4096).astype(np.float64).sum()

    workers = [threading.Thread(target=decode) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()


class ArenaMode(Mode):
    name = "arena"
    tune_malloc = False  # glibc's defaults are the point

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--arena-threads",
            type=int,
            default=4,
            help="arena mode: decode threads started per image (each may get its own malloc arena)",
        )

    def cpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        decode_on_threads(state, data, self.args.arena_threads)

    def gpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        decode_on_threads(state, data, self.args.arena_threads)

    def truth(self, state: State) -> dict[str, Any]:
        return {
            "summary": "threads decoding PNGs get their own glibc arenas, which keep freed "
            "memory: allocator retention bounded by MALLOC_ARENA_MAX",
            "layers": {
                "vram": layer("STABLE", "no GPU work is kept"),
                "kv": layer("STABLE", "every request's KV tokens return to the pool"),
                "host": layer(
                    "CACHING",
                    "glibc arena retention: in use flat (mallinfo2), kept free bytes and RSS grow "
                    "while new arenas appear; flat under MALLOC_ARENA_MAX=2",
                    cause="arena retention",
                ),
            },
        }


MODES = [ArenaMode]
