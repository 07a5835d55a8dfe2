"""plain: bounded caching.

On the GPU the fast image processor runs on CUDA and PyTorch's caching allocator keeps the
freed blocks (VRAM rises in the first round, then flat). On the CPU a bounded encoder-output
cache keyed by image content (`--cache-entry-kib` per unique image, at most `--cache-mib`)
fills in the first round, then stays.

TRUTH: CACHING (or STABLE once settled) on the layer that holds the cache; no LEAK anywhere:
soak's identical rounds send the same images, so the cache is full after round 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from refserver.modes.base import Mode, layer

if TYPE_CHECKING:
    from PIL import Image

    from refserver.request import Request
    from refserver.state import State


class PlainMode(Mode):
    name = "plain"

    def cpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        state.cached_features(img, data)

    def gpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        assert state.gpu is not None
        out = state.gpu(img)
        pv = out["pixel_values"]
        cpu_out = {k: (v.cpu() if hasattr(v, "cpu") else v) for k, v in out.items()}
        self.keep_gpu_output(state, pv)
        del out, pv, cpu_out

    def keep_gpu_output(self, state: State, pixel_values: Any) -> None:
        """What happens to the processor's output tensor after the copy to the CPU (plain:
        nothing; it is freed into PyTorch's cache)."""

    def truth(self, state: State) -> dict[str, Any]:
        if state.gpu is not None:
            return {
                "summary": "the fast image processor on CUDA; PyTorch's caching allocator keeps "
                "freed blocks: VRAM rises in round 1, then flat",
                "layers": {
                    "vram": layer("CACHING", "allocator cache: reserved rises once, live flat"),
                    "kv": layer("STABLE", "every request's KV tokens return to the pool"),
                    "host": layer("STABLE", "nothing is kept on the host"),
                },
            }
        return {
            "summary": "a bounded encoder-output cache keyed by image content: full after round 1",
            "layers": {
                "vram": layer("STABLE", "no GPU work"),
                "kv": layer("STABLE", "every request's KV tokens return to the pool"),
                "host": layer(
                    "CACHING",
                    "a cache bounded by --cache-mib, filled by the first round's unique images",
                    bound_bytes=int(state.cache_limit),
                ),
            },
        }


MODES = [PlainMode]
