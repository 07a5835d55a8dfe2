"""retention and host-leak: a thread-per-connection server decoding PNGs of varying size.

retention: every answer closes its connection, so each request is served on a new thread (a
thread per connection, no keep-alive). The thread decodes the image with PIL, resizes it to
the size the processor picks for this request (a seeded per-request scale, 0.5x to 2x with a
heavy tail: allocation sizes vary from request to request and rare large ones keep arriving
round after round, as with mixed real traffic), normalises it to float32 and keeps a 1 MiB
feature block in a bounded cache (`--retention-cache-entries`, keyed by request number modulo
the bound: full after that many requests). glibc is left at its defaults: each thread's arena
keeps what it freed, and fragmentation inside existing arenas and the main heap retains more
as new peak sizes arrive. Measured on a 2-core host (4 concurrent, 30 requests a round): glibc's
bytes in use flat at ~50 MiB from round 1, the free bytes it keeps 59 -> 336 MiB and RssAnon
111 -> 397 MiB over 10 rounds, arena heaps 4 -> 5: retention, not new arenas. Under
MALLOC_ARENA_MAX=2 RssAnon stays within ~110-220 MiB with no trend.

host-leak: the same server, plus a real leak through real `malloc`: `--leak-kib` KiB per request
(times `--leak-scale`) allocated with libc's malloc via ctypes, every page written, never freed.

TRUTH: retention: host CACHING (allocator retention): `malloc.in_use_bytes` (mallinfo2, GET
/reference/info) flat after the cache filled while `free_kept_bytes` and RssAnon grow; never a
LEAK; from outside a leak and this look alike (decide with the agent's mallinfo2, or restart
with MALLOC_ARENA_MAX=2). host-leak: host LEAK at `leak_bytes_per_request`; in-use bytes grow
by that per request. On a GPU (--device cuda) the same, with the fast image processor also run
on CUDA after the host work (VRAM: allocator CACHING).
"""

from __future__ import annotations

import argparse
import ctypes
import random
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from refserver import malloc
from refserver.modes.base import Mode, layer
from refserver.processors import MEAN, STD

if TYPE_CHECKING:
    from PIL import Image

    from refserver.request import Request
    from refserver.state import State

FEATURE_BYTES = 1024 * 1024


def request_scale(seed: int, number: int) -> float:
    """The processor's scale for request `number`: 0.5 + an exponential tail, capped at 2."""
    r = random.Random(seed * 1_000_003 + number)
    return min(2.0, 0.5 + r.expovariate(2.5))


class RetentionMode(Mode):
    name = "retention"
    tune_malloc = False  # glibc's defaults are the point
    close_connections = True

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--retention-cache-entries",
            type=int,
            default=40,
            help="retention/host-leak: 1 MiB feature blocks kept (a bounded cache)",
        )
        parser.add_argument(
            "--retention-threads",
            type=int,
            default=2,
            help="retention/host-leak: fresh threads per image (bands normalised in parallel)",
        )
        parser.add_argument(
            "--retention-seed", type=int, default=0, help="retention/host-leak: the scales' seed"
        )

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.features: OrderedDict[int, np.ndarray] = OrderedDict()
        self.number = 0
        self._lock = threading.Lock()

    def _host_work(self, state: State, img: Image.Image) -> None:
        with self._lock:
            self.number += 1
            number = self.number
        s = request_scale(self.args.retention_seed, number)
        w, h = img.size
        w2, h2 = max(28, int(w * s) // 28 * 28), max(28, int(h * s) // 28 * 28)
        resized = img.convert("RGB").resize((w2, h2))
        # The processor normalises the image in horizontal bands, each on a fresh thread (as
        # multi-threaded image processors do): each band's buffers come from its thread's arena.
        bands = max(1, self.args.retention_threads)
        rows = [(k * h2 // bands, (k + 1) * h2 // bands) for k in range(bands)]
        parts: list[np.ndarray | None] = [None] * bands

        def band(k: int) -> None:
            top, bottom = rows[k]
            arr = np.asarray(resized.crop((0, top, w2, bottom)), dtype=np.float32) / 255.0
            parts[k] = ((arr - MEAN) / STD).transpose(2, 0, 1).copy()

        workers = [threading.Thread(target=band, args=(k,)) for k in range(bands)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        pixels = np.concatenate([p for p in parts if p is not None], axis=1)
        feature = np.resize(pixels.ravel(), FEATURE_BYTES // 4).astype(np.float32)
        with self._lock:
            self.features[number % max(1, self.args.retention_cache_entries)] = feature
        del pixels

    def cpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        self._host_work(state, img)

    def gpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        assert state.gpu is not None
        self._host_work(state, img)
        out = state.gpu(img)
        cpu_out = {k: (v.cpu() if hasattr(v, "cpu") else v) for k, v in out.items()}
        del out, cpu_out

    def info(self, state: State) -> dict[str, Any]:
        with self._lock:
            return {
                "feature_cache_bytes": len(self.features) * FEATURE_BYTES,
                "arena_heaps": malloc.arena_heaps(),
            }

    def truth(self, state: State) -> dict[str, Any]:
        return {
            "summary": "thread per connection decoding PNGs of varying size with glibc's "
            "defaults: allocator retention (in use flat, kept free bytes and RssAnon grow)",
            "layers": {
                "vram": layer(
                    "CACHING" if state.gpu is not None else "STABLE",
                    "the fast image processor's blocks in PyTorch's cache"
                    if state.gpu is not None
                    else "no GPU work",
                ),
                "kv": layer("STABLE", "every request's KV tokens return to the pool"),
                "host": layer(
                    "CACHING",
                    "glibc retention: mallinfo2 in-use flat once the bounded feature cache is "
                    "full; free bytes kept in the arenas and RssAnon grow; flat-ish under "
                    "MALLOC_ARENA_MAX=2",
                    cause="allocator retention",
                    bound_in_use_bytes=self.args.retention_cache_entries * FEATURE_BYTES,
                ),
            },
        }


class HostLeakMode(RetentionMode):
    name = "host-leak"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        if malloc.LIBC is None:
            raise SystemExit("--mode host-leak needs glibc (Linux): it leaks through libc malloc")
        self.libc = malloc.LIBC
        self.libc.malloc.restype = ctypes.c_void_p
        self.libc.malloc.argtypes = [ctypes.c_size_t]

    def after_request_locked(self, state: State, req: Request | None) -> None:
        nbytes = state.leak_bytes(self.args.leak_kib)
        if not nbytes:
            return
        ptr = self.libc.malloc(nbytes)
        if ptr:
            ctypes.memset(ptr, 1, nbytes)  # every page written: resident
            state.keep(ptr, nbytes)

    def leak_bytes_per_request(self, state: State) -> float | None:
        return float(state.leak_bytes(self.args.leak_kib))

    def truth(self, state: State) -> dict[str, Any]:
        out = super().truth(state)
        rate = self.leak_bytes_per_request(state)
        out["summary"] = (
            "the retention server plus a real malloc leak of every request: in use grows"
        )
        out["layers"]["host"] = layer(
            "LEAK" if rate else "CACHING",
            "libc malloc'd buffers (every page written) never freed, on top of arena retention: "
            "mallinfo2 in-use grows by the leak per request",
            bytes_per_request=rate,
        )
        return out


MODES = [RetentionMode, HostLeakMode]
