"""Lifecycle endpoints with real memory behind them: sleep/wake (vLLM), release/resume memory
occupation (SGLang), LoRA load/unload (both shapes).

Routes and bodies as the servers have them (vLLM 0.33, SGLang 0.5.23; read off their released
wheels, /work/research/servers/NOTES.md):

- vLLM (`--metrics-flavour vllm`; registered only with $VLLM_SERVER_DEV_MODE=1, else 404):
  `POST /sleep?level=0|1|2[&mode=abort|wait|keep]` -> {"status": "sleeping", "level": N};
  `POST /wake_up[?tags=weights&tags=kv_cache]` -> {"status": "awake"|"sleeping", "tags": [...]|null};
  `GET /is_sleeping` -> {"is_sleeping": bool}. Needs `--enable-sleep-mode` to free anything
  (without it the call goes through and frees nothing: inferred from vLLM's source).
  LoRA (registered only with $VLLM_ALLOW_RUNTIME_LORA_UPDATING=1|true): `POST
  /v1/load_lora_adapter` {"lora_name", "lora_path"} -> 200 text "Success: LoRA adapter 'N' added
  successfully."; `POST /v1/unload_lora_adapter` {"lora_name"} -> 200 text "Success: LoRA
  adapter 'N' removed successfully."; errors as JSON {"error": {"message", "type", "code"}}.
  A request selects an adapter with `model` = its name; /v1/models lists it (root = path).
- SGLang (`--metrics-flavour sglang`): `GET|POST /release_memory_occupation` and
  `/resume_memory_occupation` {"tags": [...]|null} (kv_cache, weights, cuda_graph; null: all)
  -> 200 `null`; only at idle (else 400 "release_memory_occupation should be called only when
  server is idle."); frees only with `--enable-memory-saver`. `POST /load_lora_adapter`
  {"lora_name", "lora_path"} and `/unload_lora_adapter` {"lora_name"} -> {"success",
  "error_message", "loaded_adapters"} (400 when not success); a request selects an adapter with
  `model` "base:adapter" or `lora_path`.
- reference flavour: all of the above, ungated.

Memory: the model's weights (`--weights-mib`), the KV pool (`--kv-pool-mib`) and CUDA graphs
(`--graph-mib`) are device memory (real CUDA with --device cuda, else the virtual GPU). Sleep
level 1 copies the weights to a host backup (pinned on CUDA, RssShmem; host RAM on the CPU) and
frees the device weights and KV pool; level 2 discards both; wake restores (level 1: from the
backup, which is then freed; level 2: the weights are "reloaded" from disk) and reallocates the
KV pool. Release frees the tagged device memory; resume allocates it again. A LoRA adapter's
weights are sized from its adapter_config.json against the model shape (or read from its
weights file): a host copy, and a GPU slot preallocated `--max-loras` at start. vLLM's unload
only drops the name (its weights stay in an LRU of `--max-cpu-loras` adapters: caching,
bounded); SGLang's unload frees them.

A mode makes ONE operation leak (`Mode.lifecycle_leak` = "sleep" | "release" | "lora"), by
`--cycle-leak-mib` per cycle (lora: the adapter's own size): sleep: each wake keeps a staging
copy of the offload (host: pinned on CUDA, RssShmem; RAM on the CPU); release: each resume
captures CUDA graphs again without freeing the old ones (device); lora: each unload keeps the
adapter's host copy and each load makes a new one (host).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from refserver.request import Request
    from refserver.state import State

MIB = 1024 * 1024
SLEEP_TAGS = ("weights", "kv_cache")
MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true")


def _error(code: int, message: str, kind: str = "BadRequestError") -> tuple[int, Any]:
    return code, {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Adapter:
    """A loaded LoRA adapter: its name, path, and the bytes of its weights (host copy)."""

    def __init__(self, name: str, path: str, weights: np.ndarray) -> None:
        self.name = name
        self.path = path
        self.weights = weights

    @property
    def nbytes(self) -> int:
        return int(self.weights.nbytes)


def adapter_bytes(path: str, hidden: int, layers: int) -> tuple[int, bytes | None]:
    """(size in bytes, file contents or None) of the adapter at `path`: its weights file when
    there is one, else 2 x r x hidden x modules x layers x 2 (fp16) from adapter_config.json.
    Raises FileNotFoundError (no such adapter) or ValueError (a config without r)."""
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        f = os.path.join(path, name)
        if os.path.isfile(f):
            with open(f, "rb") as fh:
                data = fh.read()
            return len(data), data
    cfg_path = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"no adapter_config.json in {path}")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    r = int(cfg["r"])
    modules = cfg.get("target_modules") or ["q_proj", "v_proj"]
    n = len(modules) if isinstance(modules, list) else 1
    return 2 * r * hidden * n * layers * 2, None


class Lifecycle:
    """The lifecycle routes and the memory they move (see the module doc). Thread-safe."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.flavour = args.metrics_flavour
        self.lock = threading.Lock()
        self.sleeping = False
        self.sleep_level: int | None = None
        self.asleep_tags: set[str] = set()
        self.released: set[str] = set()
        self.adapters: dict[str, Adapter] = {}
        self.lru: dict[str, Adapter] = {}  # vLLM: unloaded adapters' weights, bounded
        self.unloaded: set[str] = set()  # names once loaded, now not
        self.leaked: list[Any] = []
        self.leaked_host_bytes = 0
        self.leaked_device_bytes = 0
        self.cycles = {"sleep": 0, "release": 0, "lora": 0}
        self.host_backup: Any = None
        self.device: dict[str, Any] = {}
        self.lora_slots: list[Any] = []
        self.gauges: dict[str, Any] = {}

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("lifecycle (sleep/wake, release/resume, LoRA)")
        g.add_argument(
            "--weights-mib", type=float, default=32.0, help="model weights on the device"
        )
        g.add_argument("--kv-pool-mib", type=float, default=64.0, help="KV pool on the device")
        g.add_argument("--graph-mib", type=float, default=8.0, help="CUDA graphs on the device")
        g.add_argument(
            "--enable-sleep-mode", action="store_true", help="vLLM's: sleep/wake free memory"
        )
        g.add_argument(
            "--enable-memory-saver",
            action="store_true",
            help="SGLang's: release/resume memory occupation free memory",
        )
        g.add_argument("--enable-lora", action="store_true", help="LoRA adapters can be loaded")
        g.add_argument(
            "--lora-modules",
            "--lora-paths",
            dest="lora_modules",
            nargs="*",
            default=[],
            metavar="NAME=PATH",
            help="adapters loaded at start (vLLM --lora-modules, SGLang --lora-paths)",
        )
        g.add_argument("--max-loras", type=int, default=1, help="LoRA slots on the device")
        g.add_argument(
            "--max-cpu-loras",
            type=int,
            default=None,
            help="vLLM: unloaded adapters kept in the host LRU (default: --max-loras)",
        )
        g.add_argument("--model-hidden-size", type=int, default=1024, help="sizes LoRA weights")
        g.add_argument("--model-layers", type=int, default=8, help="sizes LoRA weights")
        g.add_argument(
            "--cycle-leak-mib",
            type=float,
            default=8.0,
            help="sleep-leak / release-leak: MiB left behind per cycle",
        )

    # --- start -------------------------------------------------------------------------------
    def attach(self, state: State) -> None:
        self.state = state
        dev = state.gpu_mem
        a = self.args
        # The model's device memory exists only where a lifecycle operation can move it (sleep
        # mode, memory saver, a lifecycle-leak mode): other modes' GPU levels stay as they were.
        if (
            a.enable_sleep_mode
            or a.enable_memory_saver
            or getattr(state.mode, "lifecycle_leak", None)
        ):
            with self.lock:
                self.device["weights"] = dev.alloc(int(a.weights_mib * MIB))
                self.device["kv_cache"] = dev.alloc(int(a.kv_pool_mib * MIB))
                self.device["cuda_graph"] = dev.alloc(int(a.graph_mib * MIB))
        if a.enable_lora or a.lora_modules:
            slot = adapter_bytes_default(a)
            self.lora_slots = [dev.alloc(slot) for _ in range(max(1, a.max_loras))]
        for spec in a.lora_modules:
            name, _, path = spec.partition("=")
            if not path:
                name, path = os.path.basename(os.path.normpath(name)), name
            self._load(name, path)
        self._metrics()

    def _metrics(self) -> None:
        from prometheus_client import Gauge

        reg = self.state.registry
        labels = self.state.labels or {"model_name": "vramdoctor-reference"}
        names = list(labels)
        if self.flavour == "vllm":
            g = Gauge(
                "vllm:engine_sleep_state",
                "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
                "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
                "level 2.",
                [*names, "sleep_state"],
                registry=reg,
            )
            self.gauges["sleep"] = (g, labels)
        elif self.flavour == "sglang" and (self.args.enable_lora or self.args.lora_modules):
            used = Gauge(
                "sglang:lora_pool_slots_used",
                "Number of LoRA adapter slots currently occupied in GPU memory.",
                names,
                registry=reg,
            ).labels(**labels)
            total = Gauge(
                "sglang:lora_pool_slots_total",
                "Total number of LoRA adapter slots available (max_loras_per_batch).",
                names,
                registry=reg,
            ).labels(**labels)
            total.set(max(1, self.args.max_loras))
            self.gauges["lora"] = used
        self._publish()

    def _publish(self) -> None:
        if "sleep" in self.gauges:
            g, labels = self.gauges["sleep"]
            for state_name, value in (
                ("awake", 0 if self.sleeping else 1),
                ("weights_offloaded", 1 if self.sleeping and self.sleep_level == 1 else 0),
                ("discard_all", 1 if self.sleeping and self.sleep_level == 2 else 0),
            ):
                g.labels(**labels, sleep_state=state_name).set(value)
        if "lora" in self.gauges:
            self.gauges["lora"].set(min(len(self.adapters), max(1, self.args.max_loras)))

    # --- what the rest of the server asks -----------------------------------------------------
    def server_args(self) -> dict[str, Any]:
        return {
            "enable_memory_saver": self.args.enable_memory_saver,
            "enable_lora": bool(self.args.enable_lora or self.args.lora_modules),
            "lora_paths": {a.name: a.path for a in self.adapters.values()},
            "max_loras_per_batch": self.args.max_loras,
        }

    def model_cards(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {
                    "id": a.name,
                    "object": "model",
                    "owned_by": "vllm",
                    "root": a.path,
                    "parent": "vramdoctor-reference",
                }
                for a in self.adapters.values()
            ]

    def adapter_names(self) -> set[str]:
        with self.lock:
            return set(self.adapters)

    def refuse_request(self, req: Request) -> tuple[int, Any] | None:
        """A request the server cannot serve now: sleeping, or naming an adapter not loaded."""
        with self.lock:
            if self.sleeping:
                return _error(
                    503, "The engine is sleeping; wake it up first.", "ServiceUnavailable"
                )
            model = req.body.get("model")
            if (
                self.flavour in ("sglang", "reference")
                and isinstance(model, str)
                and ":" in model
                and model.split(":", 1)[0] == "vramdoctor-reference"
                and model.split(":", 1)[1] not in self.adapters
            ):
                return _error(
                    400,
                    "The following requested LoRA adapters are not loaded: "
                    + model.split(":", 1)[1],
                )
            if self.flavour == "vllm" and isinstance(model, str) and model in self.unloaded:
                return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        return None

    def info(self) -> dict[str, Any]:
        with self.lock:
            return {
                "sleeping": self.sleeping,
                "sleep_level": self.sleep_level,
                "released": sorted(self.released),
                "adapters": {a.name: a.nbytes for a in self.adapters.values()},
                "adapters_cached": {a.name: a.nbytes for a in self.lru.values()},
                "cycles": dict(self.cycles),
                "leaked_host_bytes": self.leaked_host_bytes,
                "leaked_device_bytes": self.leaked_device_bytes,
                "host_backup_bytes": 0 if self.host_backup is None else _nbytes(self.host_backup),
            }

    # --- routing ------------------------------------------------------------------------------
    def route(
        self, method: str, path: str, query: dict[str, list[str]], raw: bytes
    ) -> tuple[int, Any] | None:
        """(status, JSON payload or plain text) for a lifecycle route, None for any other path."""
        f = self.flavour
        vllm_sleep = f == "reference" or (f == "vllm" and _dev_mode())
        vllm_lora = f == "reference" or (
            f == "vllm" and _truthy("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
        )
        sglang = f in ("sglang", "reference")
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return _error(400, "body is not JSON")
        if not isinstance(body, dict):
            body = {}
        if vllm_sleep and method == "POST" and path == "/sleep":
            return self.sleep(query)
        if vllm_sleep and method == "POST" and path == "/wake_up":
            return self.wake_up(query)
        if vllm_sleep and method == "GET" and path == "/is_sleeping":
            with self.lock:
                return 200, {"is_sleeping": self.sleeping}
        if sglang and path == "/release_memory_occupation":
            return self.release(body.get("tags"))
        if sglang and path == "/resume_memory_occupation":
            return self.resume(body.get("tags"))
        if vllm_lora and method == "POST" and path == "/v1/load_lora_adapter":
            return self.vllm_load(body)
        if vllm_lora and method == "POST" and path == "/v1/unload_lora_adapter":
            return self.vllm_unload(body)
        if sglang and method == "POST" and path == "/load_lora_adapter":
            return self.sglang_lora(body, load=True)
        if sglang and method == "POST" and path == "/unload_lora_adapter":
            return self.sglang_lora(body, load=False)
        return None

    # --- sleep / wake (vLLM) ------------------------------------------------------------------
    def sleep(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        try:
            level = int((query.get("level") or ["1"])[0])
        except ValueError:
            return _error(422, "level: Input should be a valid integer")
        if not 0 <= level <= 2:
            return _error(422, "level: Input should be less than or equal to 2")
        mode = (query.get("mode") or ["abort"])[0]
        if mode not in ("abort", "wait", "keep"):
            return _error(422, "mode: Input should be 'abort', 'wait' or 'keep'")
        dev = self.state.gpu_mem
        with self.lock:
            if self.sleeping:
                return 200, {"status": "sleeping", "level": self.sleep_level}
            self.sleeping, self.sleep_level = True, level
            if level >= 1 and self.args.enable_sleep_mode:
                if level == 1:  # offload the weights to the host, then free them on the device
                    self.host_backup = self._host_buffer(int(self.args.weights_mib * MIB))
                for tag in SLEEP_TAGS:
                    if self.device.get(tag) is not None:
                        dev.free(self.device[tag])
                        self.device[tag] = None
                        self.asleep_tags.add(tag)
                dev.return_to_driver()
            self._publish()
        return 200, {"status": "sleeping", "level": level}

    def wake_up(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        tags = query.get("tags") or None
        dev = self.state.gpu_mem
        with self.lock:
            if not self.sleeping:
                return 200, {"status": "awake", "tags": tags}
            wanted = set(tags) if tags else set(SLEEP_TAGS)
            for tag in sorted(wanted & self.asleep_tags):
                size = self.args.weights_mib if tag == "weights" else self.args.kv_pool_mib
                self.device[tag] = dev.alloc(int(size * MIB))
                self.asleep_tags.discard(tag)
                if tag == "weights" and self.host_backup is not None:
                    self.host_backup = None  # restored from the backup, which is freed
            if not self.asleep_tags:
                self.sleeping = False
                self.cycles["sleep"] += 1
                if self.leaks("sleep"):  # the offload's staging copy is never released
                    self._leak_host(int(self.args.cycle_leak_mib * MIB))
            self._publish()
            return 200, {"status": "sleeping" if self.sleeping else "awake", "tags": tags}

    # --- release / resume (SGLang) ------------------------------------------------------------
    def _tags(self, tags: Any) -> set[str] | tuple[int, Any]:
        if tags in (None, []):
            return set(MEMORY_TAGS)
        if not isinstance(tags, list) or any(t not in MEMORY_TAGS for t in tags):
            return _error(400, f"tags must be a list of {', '.join(MEMORY_TAGS)}")
        return set(tags)

    def _idle(self) -> bool:
        with self.state.lock:
            return self.state.running == 0

    def release(self, tags: Any) -> tuple[int, Any]:
        chosen = self._tags(tags)
        if isinstance(chosen, tuple):
            return chosen
        if not self._idle():
            return _error(
                400, "release_memory_occupation should be called only when server is idle."
            )
        dev = self.state.gpu_mem
        with self.lock:
            if self.args.enable_memory_saver:
                for tag in sorted(chosen - self.released):
                    if self.device.get(tag) is not None:
                        dev.free(self.device[tag])
                        self.device[tag] = None
                    self.released.add(tag)
                dev.return_to_driver()
        return 200, None

    def resume(self, tags: Any) -> tuple[int, Any]:
        chosen = self._tags(tags)
        if isinstance(chosen, tuple):
            return chosen
        dev = self.state.gpu_mem
        sizes = {
            "weights": self.args.weights_mib,
            "kv_cache": self.args.kv_pool_mib,
            "cuda_graph": self.args.graph_mib,
        }
        with self.lock:
            resumed = sorted(chosen & self.released)
            for tag in resumed:
                self.device[tag] = dev.alloc(int(sizes[tag] * MIB))
                self.released.discard(tag)
            if resumed and not self.released:
                self.cycles["release"] += 1
                if self.leaks("release"):  # graphs captured again; the old pool is not freed
                    nbytes = int(self.args.cycle_leak_mib * MIB)
                    self.leaked.append(dev.alloc(nbytes))
                    self.leaked_device_bytes += nbytes
        return 200, None

    # --- LoRA ---------------------------------------------------------------------------------
    def _lora_enabled(self) -> bool:
        return bool(self.args.enable_lora or self.args.lora_modules)

    def _load(self, name: str, path: str) -> Adapter:
        """Load (or, vLLM, take back from its LRU) adapter `name`; raises FileNotFoundError."""
        cached = self.lru.pop(name, None)
        if cached is not None and cached.path == path and not self.leaks("lora"):
            self.adapters[name] = cached
            self.unloaded.discard(name)
            return cached
        size, data = adapter_bytes(path, self.args.model_hidden_size, self.args.model_layers)
        if data is not None:
            weights = np.frombuffer(bytearray(data), dtype=np.uint8)
        else:
            weights = np.ones(size, dtype=np.uint8)  # every page written
        adapter = Adapter(name, path, weights)
        self.adapters[name] = adapter
        self.unloaded.discard(name)
        self._publish()
        return adapter

    def _unload(self, name: str) -> Adapter | None:
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            return None
        self.unloaded.add(name)
        self.cycles["lora"] += 1
        if self.leaks("lora"):  # its host copy stays; the next load makes a new one
            self.leaked.append(adapter.weights)
            self.leaked_host_bytes += adapter.nbytes
        elif self.flavour == "vllm":  # vLLM drops the name only; the weights stay in its LRU
            self.lru[name] = adapter
            cap = self.args.max_cpu_loras or self.args.max_loras
            while len(self.lru) > max(1, cap):
                self.lru.pop(next(iter(self.lru)))
        self._publish()
        return adapter

    def vllm_load(self, body: dict[str, Any]) -> tuple[int, Any]:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if not self._lora_enabled():
            return _error(400, "LoRA is not enabled; start the server with --enable-lora.")
        with self.lock:
            if name == "vramdoctor-reference":
                return _error(400, f"The lora adapter '{name}' conflicts with a served base model.")
            if name in self.adapters and not body.get("load_inplace"):
                return _error(
                    400,
                    f"The lora adapter '{name}' has already been loaded. If you want to load the "
                    "adapter in place, set 'load_inplace' to True.",
                )
            try:
                self._load(name, str(path))
            except (FileNotFoundError, ValueError, KeyError) as exc:
                return _error(404, f"Loading lora {name} failed: {exc}", "NotFoundError")
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def vllm_unload(self, body: dict[str, Any]) -> tuple[int, Any]:
        name = body.get("lora_name")
        if not name:
            return _error(400, "'lora_name' needs to be provided to unload a LoRA adapter.")
        with self.lock:
            if self._unload(str(name)) is None:
                return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    def sglang_lora(self, body: dict[str, Any], *, load: bool) -> tuple[int, Any]:
        def answer(ok: bool, message: str | None) -> tuple[int, Any]:
            loaded = {a.name: a.path for a in self.adapters.values()}
            return (200 if ok else 400), {
                "success": ok,
                "error_message": message,
                "loaded_adapters": loaded,
            }

        if not self._lora_enabled():
            with self.lock:
                return answer(
                    False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
                )
        name = body.get("lora_name")
        with self.lock:
            if not name:
                return answer(False, "lora_name is required")
            if load:
                path = body.get("lora_path")
                if not path:
                    return answer(False, "lora_path is required")
                if name in self.adapters:
                    return answer(False, f"LoRA adapter {name} is already loaded")
                try:
                    self._load(str(name), str(path))
                except (FileNotFoundError, ValueError, KeyError) as exc:
                    return answer(False, f"Failed to load LoRA adapter {name}: {exc}")
                return answer(True, None)
            if self._unload(str(name)) is None:
                return answer(False, f"LoRA adapter {name} is not loaded")
            return answer(True, None)

    # --- leaks of one operation ---------------------------------------------------------------
    def leaks(self, operation: str) -> bool:
        return getattr(self.state.mode, "lifecycle_leak", None) == operation and not (
            self.state.release_buffers
        )

    def _host_buffer(self, nbytes: int) -> Any:
        """A host buffer of `nbytes`, every page written: pinned memory with CUDA (as vLLM's
        CPU backup is), plain RAM otherwise."""
        if self.state.gpu_mem.cuda:
            import torch

            t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            t.fill_(1)
            return t
        return np.ones(nbytes, dtype=np.uint8)

    def _leak_host(self, nbytes: int) -> None:
        self.leaked.append(self._host_buffer(nbytes))
        self.leaked_host_bytes += nbytes


def _nbytes(buf: Any) -> int:
    return int(buf.numel()) if hasattr(buf, "numel") else int(buf.nbytes)


def _dev_mode() -> bool:
    try:
        return bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))
    except ValueError:
        return False


def adapter_bytes_default(args: argparse.Namespace) -> int:
    """One LoRA slot on the device: rank 16, four projections, at the model's shape (fp16)."""
    return 2 * 16 * args.model_hidden_size * 4 * args.model_layers * 2
