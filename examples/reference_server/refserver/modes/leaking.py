"""leaking: plain + a real leak.

CPU: a buffer of `--leak-kib` KiB (numpy, every page touched) kept per request (times
`--leak-scale`: the flag that makes it worse; $REFERENCE_FREE_REQUEST_BUFFERS=1 releases it at
the request's end: the env knob that fixes it; $REFERENCE_FIX_LEAK=1 is the same knob). GPU:
`--leak-kind kept` keeps each request's pixel tensor on the GPU; `--leak-kind escape` lets it
escape a request-scoped `torch.cuda.MemPool`, so the pool's segments are orphaned (~19 MiB a
request on an H100); `--leak-kind bytes` keeps exactly `--leak-kib` KiB on the GPU per request.

TRUTH: LEAK on the layer the buffer lives on (host on the CPU, VRAM on the GPU), at
`leak_bytes_per_request` (GET /reference/info), steady per request and zero in idle windows.
With the env fix on: as plain (CPU: the bounded cache, CACHING then flat; GPU: allocator
CACHING), leak_bytes_per_request 0.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import numpy as np

from refserver.modes.base import layer
from refserver.modes.plain import PlainMode

if TYPE_CHECKING:
    from PIL import Image

    from refserver.request import Request
    from refserver.state import State


class LeakingMode(PlainMode):
    name = "leaking"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--leak-kind",
            choices=["kept", "escape", "bytes"],
            default="escape",
            help="GPU leak: keep each request's pixel tensor (kept), let it escape a "
            "request-scoped MemPool (escape), or keep --leak-kib KiB on the GPU (bytes)",
        )

    def gpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        kind = self.args.leak_kind
        if kind == "escape":
            self._escape(state, img)
            return
        if kind == "bytes":
            assert state.gpu is not None
            state.gpu(img)  # preprocessing as in plain (cached by the allocator), plus a sized leak
            return
        super().gpu_image(state, img, data, req)

    def keep_gpu_output(self, state: State, pixel_values: Any) -> None:
        with state.lock:
            state.keep(pixel_values, pixel_values.numel() * pixel_values.element_size())

    def _escape(self, state: State, img: Image.Image) -> None:
        torch = state.torch_mod()
        assert state.gpu is not None
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            out = state.gpu(img)
            pv = out["pixel_values"]
            out = {k: (v.cpu() if hasattr(v, "cpu") else v) for k, v in out.items()}
        torch.cuda.synchronize()
        # The pool's segments that hold the escaped tensor stay reserved: that is the leak.
        snap = pool.snapshot()
        segments = snap.get("segments", []) if isinstance(snap, dict) else list(snap or [])
        reserved = sum(
            seg.get("total_size", 0)
            for seg in segments
            if any(b.get("state") == "active_allocated" for b in seg.get("blocks", []))
        )
        with state.lock:
            state.keep(pv, reserved or pv.numel() * pv.element_size())
        del out, pool

    def after_request_locked(self, state: State, req: Request | None) -> None:
        nbytes = state.leak_bytes(self.args.leak_kib)  # --leak-scale; 0 with the env fix
        if nbytes and state.gpu is not None and self.args.leak_kind == "bytes":
            torch = state.gpu.torch
            t = torch.ones(nbytes, dtype=torch.uint8, device=state.device)
            state.keep(t, t.numel())
        if nbytes and state.gpu is None:
            buf = np.ones(nbytes, dtype=np.uint8)  # touched pages
            state.keep(buf, buf.nbytes)

    def leak_bytes_per_request(self, state: State) -> float | None:
        if state.gpu is None or self.args.leak_kind == "bytes":
            return float(state.leak_bytes(self.args.leak_kib))
        return state.kept_bytes / state.requests if state.requests else None

    def truth(self, state: State) -> dict[str, Any]:
        rate = self.leak_bytes_per_request(state)
        if state.release_buffers:
            layers = super().truth(state)["layers"]
            return {
                "summary": "$REFERENCE_FREE_REQUEST_BUFFERS=1: the leaking buffers are released "
                "(the fix); as plain",
                "layers": layers,
            }
        where = "vram" if state.gpu is not None else "host"
        layers = super().truth(state)["layers"]
        why = (
            f"a GPU tensor kept per request (--leak-kind {self.args.leak_kind})"
            if where == "vram"
            else "a touched --leak-kib host buffer kept per request"
        )
        layers[where] = layer("LEAK", why, bytes_per_request=rate)
        return {"summary": f"a real leak of every request on {where}", "layers": layers}


MODES = [LeakingMode]
