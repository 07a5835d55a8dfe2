"""vram-leaking: every request keeps `--leak-kib` KiB (times `--leak-scale`) on the device.

The device is real CUDA with --device cuda, else the virtual GPU (`--vgpu-dir`: its bytes are
published per process, and tests serve them as an exporter page). Host and KV as in stable.
Used for two servers on one GPU (one of them this mode) and MIG slices (`--vgpu-instance`).

TRUTH: vram LEAK at `leak_bytes_per_request` for THIS process (its GPU, and its GPU instance
with MIG); host and KV STABLE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from refserver.modes.base import Mode, layer

if TYPE_CHECKING:
    from refserver.request import Request
    from refserver.state import State


class VramLeakingMode(Mode):
    name = "vram-leaking"

    def after_request_locked(self, state: State, req: Request | None) -> None:
        nbytes = state.leak_bytes(self.args.leak_kib)
        if nbytes:
            state.keep(state.gpu_mem.alloc(nbytes), nbytes)

    def leak_bytes_per_request(self, state: State) -> float | None:
        return float(state.leak_bytes(self.args.leak_kib))

    def truth(self, state: State) -> dict[str, Any]:
        where = (
            f"GPU {self.args.vgpu_index}"
            + (
                f" instance {self.args.vgpu_instance}"
                if self.args.vgpu_instance is not None
                else ""
            )
            if not state.gpu_mem.cuda
            else str(state.device)
        )
        return {
            "summary": f"a device leak of every request on {where}",
            "layers": {
                "vram": layer(
                    "LEAK",
                    f"--leak-kib kept on the device ({where}) per request",
                    bytes_per_request=self.leak_bytes_per_request(state),
                    gpu=self.args.vgpu_index,
                    gpu_instance=self.args.vgpu_instance,
                ),
                "kv": layer("STABLE", "every request's KV tokens return to the pool"),
                "host": layer("STABLE", "nothing kept on the host"),
            },
        }


MODES = [VramLeakingMode]
