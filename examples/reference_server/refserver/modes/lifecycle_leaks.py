"""sleep-leak, release-leak, lora-leak: ONE lifecycle operation leaves memory behind per cycle.

Requests are as in stable. The operation runs through the server's real endpoints
(`refserver.lifecycle`: vLLM's /sleep + /wake_up, SGLang's /release_memory_occupation +
/resume_memory_occupation, either server's LoRA load/unload), with real memory behind it:
- sleep-leak (needs `--enable-sleep-mode`): every wake-up keeps a `--cycle-leak-mib` staging copy
  of the weights' offload (pinned host memory on CUDA: RssShmem, as vLLM #21336's 13.2 -> 16.6
  -> 24.1 GiB over three cycles; host RAM on the CPU: RssAnon).
- release-leak (needs `--enable-memory-saver`): every resume captures the CUDA graphs again
  without freeing the old ones: `--cycle-leak-mib` more device memory per cycle (VRAM; the
  virtual GPU on the CPU).
- lora-leak (needs `--enable-lora` or `--lora-modules`): every unload keeps the adapter's host
  copy and the next load makes a new one: the adapter's size per load/unload cycle (host RAM).
Without the operation (soak without --cycle) all three are stable; a healthy server with the
same flags (e.g. `--mode stable --enable-sleep-mode`) cycles without residue (vLLM's LoRA LRU
keeps up to --max-cpu-loras unloaded adapters: one rise, then flat).

TRUTH: a LEAK of that operation, per cycle (GET /reference/info "lifecycle": cycles,
leaked_host_bytes / leaked_device_bytes), on that layer; no leak per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from refserver.lifecycle import MIB, adapter_bytes
from refserver.modes.base import Mode, layer

if TYPE_CHECKING:
    from refserver.state import State


class _CycleLeak(Mode):
    lifecycle_leak: ClassVar[str] = ""
    layer_name: ClassVar[str] = "host"
    needs: ClassVar[str] = ""
    operation: ClassVar[str] = ""

    def check(self, state: State) -> None:
        a = self.args
        ok = {
            "sleep": a.enable_sleep_mode,
            "release": a.enable_memory_saver,
            "lora": a.enable_lora or a.lora_modules,
        }[self.lifecycle_leak]
        if not ok:
            raise SystemExit(f"--mode {self.name} needs {self.needs}")

    def bytes_per_cycle(self, state: State) -> float:
        return float(self.args.cycle_leak_mib * MIB)

    def truth(self, state: State) -> dict[str, Any]:
        layers = {
            "vram": layer("STABLE", "requests keep nothing on the device"),
            "kv": layer("STABLE", "every request's KV tokens return to the pool"),
            "host": layer("STABLE", "requests keep nothing on the host"),
        }
        layers[self.layer_name] = layer(
            "LEAK",
            f"each {self.operation} cycle leaves memory behind (none without the cycles)",
            operation=self.lifecycle_leak,
            bytes_per_cycle=self.bytes_per_cycle(state),
            where="RssShmem (pinned)"
            if self.layer_name == "host" and state.gpu_mem.cuda and self.lifecycle_leak == "sleep"
            else None,
        )
        return {
            "summary": f"a leak of the {self.operation} operation only, per cycle",
            "layers": layers,
        }


class SleepLeakMode(_CycleLeak):
    name = "sleep-leak"
    lifecycle_leak = "sleep"
    layer_name = "host"
    needs = "--enable-sleep-mode"
    operation = "sleep/wake"


class ReleaseLeakMode(_CycleLeak):
    name = "release-leak"
    lifecycle_leak = "release"
    layer_name = "vram"
    needs = "--enable-memory-saver"
    operation = "release/resume memory occupation"


class LoraLeakMode(_CycleLeak):
    name = "lora-leak"
    lifecycle_leak = "lora"
    layer_name = "host"
    needs = "--enable-lora (or --lora-modules NAME=PATH)"
    operation = "LoRA load/unload"

    def bytes_per_cycle(self, state: State) -> float:
        sizes = [a.nbytes for a in state.lifecycle.adapters.values()]
        if sizes:
            return float(sizes[0])
        for spec in self.args.lora_modules:
            path = spec.partition("=")[2] or spec
            try:
                return float(
                    adapter_bytes(path, self.args.model_hidden_size, self.args.model_layers)[0]
                )
            except (OSError, ValueError, KeyError):
                break
        return float(2 * 16 * self.args.model_hidden_size * 4 * self.args.model_layers * 2)


MODES = [SleepLeakMode, ReleaseLeakMode, LoraLeakMode]
