"""pinned: CUDA pinned host memory caching (needs torch and a CUDA GPU; refuses to start
otherwise).

Each image goes through a pinned host buffer to the GPU; PyTorch's host allocator keeps the
freed pinned block for the next request. Pinned host memory shows as RssShmem.

TRUTH: host CACHING in RssShmem (rises in round 1, then flat): the host-side twin of VRAM
caching; VRAM STABLE/CACHING (the staged copy is freed into the allocator's cache).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from refserver.modes.base import Mode, layer

if TYPE_CHECKING:
    from PIL import Image

    from refserver.request import Request
    from refserver.state import State


class PinnedMode(Mode):
    name = "pinned"

    def check(self, state: State) -> None:
        try:
            import torch
        except ImportError:
            raise SystemExit("--mode pinned needs torch (pip install torch)") from None
        if not torch.cuda.is_available():
            raise SystemExit("--mode pinned needs a CUDA GPU (pinned host memory is CUDA's)")
        self.torch = torch

    def _stage(self, state: State, img: Image.Image) -> None:
        """Stage the pixels through pinned host memory to the GPU, as data loaders and servers
        do; PyTorch's host allocator caches the freed pinned block for the next request."""
        torch = self.torch
        pixels = torch.from_numpy(state.cpu(img))
        staging = torch.empty(pixels.shape, dtype=pixels.dtype, pin_memory=True)
        staging.copy_(pixels)
        on_gpu = staging.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        del staging, on_gpu

    def cpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        self._stage(state, img)

    def gpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        self._stage(state, img)

    def truth(self, state: State) -> dict[str, Any]:
        return {
            "summary": "images staged through pinned host memory: PyTorch's host allocator "
            "keeps the pinned blocks (RssShmem rises, then flat)",
            "layers": {
                "vram": layer("CACHING", "the staged copies are freed into the allocator cache"),
                "kv": layer("STABLE", "every request's KV tokens return to the pool"),
                "host": layer("CACHING", "pinned host cache in RssShmem", cause="pinned cache"),
            },
        }


MODES = [PinnedMode]
