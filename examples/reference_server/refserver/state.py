"""What every mode shares: the metrics registry, the KV-pool token accounting, the counters the
truth is read from, and the per-request pipeline that calls the mode's hooks.

The mode (`refserver.modes.base.Mode`) decides what happens to memory; `State` does the rest
the same way for every mode: a request takes `kv_tokens_per_request + 256 x images` tokens from
the KV pool while it runs and gives them back at its end, less what the mode keeps
(`Mode.kv_tokens_kept`); `kept_bytes` is the mode's own count of what it leaked.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from refserver import malloc
from refserver.device import Device
from refserver.processors import CpuPreprocessor, GpuPreprocessor, decode, tiny_png

if TYPE_CHECKING:
    from refserver.modes.base import Mode
    from refserver.request import Request

MODEL_ID = "vramdoctor-reference"


class State:
    """The server's state; `mode` is the `Mode` instance chosen with --mode."""

    def __init__(self, args: argparse.Namespace, mode: Mode) -> None:
        self.args = args
        self.mode = mode
        self.lock = threading.Lock()
        self.requests = 0
        self.running = 0
        self.gpu_lock = threading.Lock()
        self.kept: list[Any] = []
        self.kept_bytes = 0
        self.cache: OrderedDict[str, Any] = OrderedDict()
        self.cache_bytes = 0
        self.cache_limit = int(args.cache_mib * 1024 * 1024)
        self.device: str = args.device
        self.gpu: GpuPreprocessor | None = None
        self.cpu = CpuPreprocessor()
        self.aborted = 0
        # The server's own env knob (#24's variant matrix): every per-request buffer a mode
        # would keep is released at once instead; what a correct fix looks like from outside.
        self.release_buffers = "1" in (
            os.environ.get("REFERENCE_FREE_REQUEST_BUFFERS", ""),
            os.environ.get("REFERENCE_FIX_LEAK", ""),  # the same knob, by its other name
        )
        self.leak_scale = float(getattr(args, "leak_scale", 1.0))
        mode.check(self)
        if self.device.startswith("cuda"):
            self.gpu = GpuPreprocessor(args.processor_dir, self.device)
        registry = CollectorRegistry()
        self.registry = registry
        self.m_requests = Counter("reference_requests", "Requests served.", registry=registry)
        self.m_images = Counter("reference_images", "Images preprocessed.", registry=registry)
        self.m_running = Gauge(
            "reference_running_requests", "Requests in flight.", registry=registry
        )
        self.m_kept = Gauge(
            "reference_kept_bytes", "Bytes kept by the leak so far.", registry=registry
        )
        self.m_cache = Gauge(
            "reference_cache_bytes", "Bytes in the bounded cache.", registry=registry
        )
        self.m_kv = Gauge(
            "reference_kv_usage", "KV pool usage 0..1 (token accounting).", registry=registry
        )
        # The same KV usage under a real server's metric names and labels (read off their source:
        # SGLang's collector.py, vLLM's v1 loggers.py), so soak's /metrics path runs for real.
        self.kv_capacity = int(args.kv_capacity)
        self.kv_used = 0
        self.flavoured: list[Any] = []
        self.m_engine_requests: Any = None
        self.labels: dict[str, str] = {}
        if args.metrics_flavour == "sglang":
            self._sglang_metrics(registry)
        elif args.metrics_flavour == "vllm":
            self._vllm_metrics(registry)
        self.gpu_mem = Device(args)
        from refserver.lifecycle import Lifecycle

        self.lifecycle = Lifecycle(args)
        self.lifecycle.attach(self)
        mode.setup(self)

    # --- metrics under the real servers' names ------------------------------------------------
    def _sglang_metrics(self, registry: CollectorRegistry) -> None:
        labels = {
            "model_name": MODEL_ID,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
        }
        self.labels = labels
        names = list(labels)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, names, registry=registry).labels(**labels)

        self.flavoured = [
            ("ratio", gauge("sglang:token_usage", "The token usage.")),
            ("used", gauge("sglang:num_used_tokens", "The number of used tokens.")),
            ("running", gauge("sglang:num_running_reqs", "The number of running requests.")),
            (
                "queued",
                gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
            ),
            # 0.5.12+: the pool's own triple (used = total - available - evictable).
            (
                "used",
                gauge(
                    "sglang:kv_used_tokens",
                    "Number of actively used token slots in the KV cache pool.",
                ),
            ),
            (
                "available",
                gauge(
                    "sglang:kv_available_tokens",
                    "Number of free token slots in the KV cache pool.",
                ),
            ),
            (
                "evictable",
                gauge(
                    "sglang:kv_evictable_tokens",
                    "Number of evictable (radix-cached) token slots in the KV cache pool.",
                ),
            ),
        ]
        gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
        ).set(self.kv_capacity)
        self.m_engine_requests = Counter(
            "sglang:num_requests", "Number of requests processed.", names, registry=registry
        ).labels(**labels)

    def _vllm_metrics(self, registry: CollectorRegistry) -> None:
        args = self.args
        labels = {"model_name": MODEL_ID, "engine": "0"}
        self.labels = labels
        names = list(labels)
        self.flavoured = [
            (
                "ratio",
                Gauge(
                    "vllm:kv_cache_usage_perc",
                    "KV-cache usage. 1 means 100 percent usage.",
                    names,
                    registry=registry,
                ).labels(**labels),
            ),
            (
                "running",
                Gauge(
                    "vllm:num_requests_running",
                    "Number of requests in model execution batches.",
                    names,
                    registry=registry,
                ).labels(**labels),
            ),
            (
                "queued",
                Gauge(
                    "vllm:num_requests_waiting",
                    "Number of requests waiting to be processed.",
                    names,
                    registry=registry,
                ).labels(**labels),
            ),
        ]
        # vLLM's cache config as labels of an info gauge (value 1): the pool size in blocks.
        block = max(1, args.kv_page_size)
        info = {
            "block_size": str(block),
            "num_gpu_blocks": str(self.kv_capacity // block),
            "gpu_memory_utilization": "0.9",
        }
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(info),
            registry=registry,
        ).labels(**info).set(1)
        self.m_engine_requests = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=registry,
        ).labels(**labels, finished_reason="length")

    # --- per-request work -------------------------------------------------------------------
    def handle_image(self, data: bytes, req: Request | None = None) -> None:
        """Decode one image and hand it to the mode (on the GPU under `gpu_lock`: one
        preprocessing stream, as in SGLang's tokenizer process, so memory depends on the traffic,
        not on races)."""
        img = decode(data)
        if req is not None:
            req.image_sizes.append(img.size)
        if self.gpu is not None:
            with self.gpu_lock:
                self.mode.gpu_image(self, img, data, req)
        else:
            self.mode.cpu_image(self, img, data, req)
        self.m_images.inc()

    def cached_features(self, img: Any, data: bytes) -> None:
        """The bounded encoder-output cache of plain mode (CPU): a fixed-size feature block per
        unique image (keyed by content), least recently used out past --cache-mib."""
        import hashlib

        key = hashlib.sha1(data).hexdigest()
        with self.lock:
            hit = self.cache.get(key)
            if hit is not None:
                self.cache.move_to_end(key)
        if hit is None:
            pixels = self.cpu(img)
            out = np.resize(pixels.ravel(), int(self.args.cache_entry_kib * 256)).astype(np.float32)
            with self.lock:
                if key not in self.cache:
                    self.cache[key] = out
                    self.cache_bytes += out.nbytes
                while self.cache_bytes > self.cache_limit and self.cache:
                    _, old = self.cache.popitem(last=False)
                    self.cache_bytes -= old.nbytes
                self.m_cache.set(self.cache_bytes)

    def warm_up(self) -> None:
        """What real servers do before taking traffic: run the pipeline once on a dummy input,
        so one-time costs (plugin imports, first-use buffers) are not charged to the first round."""
        img = decode(tiny_png())
        self.cpu(img)
        if self.gpu is not None:
            self.gpu(img)
        self.mode.warm_up(self)

    def running_delta(self, delta: int, tokens: int = 0) -> None:
        """A request starts (+1, its tokens taken from the KV pool) or ends (-1, tokens freed)."""
        with self.lock:
            self.running += delta
            self.kv_used = max(0, min(self.kv_capacity, self.kv_used + tokens))
            self._publish_kv()

    def _publish_kv(self) -> None:
        """Set the KV gauges from `kv_used` (the caller holds `lock`)."""
        ratio = self.kv_used / self.kv_capacity if self.kv_capacity else 0.0
        self.m_running.set(self.running)
        self.m_kv.set(ratio)
        for kind, gauge in self.flavoured:
            gauge.set(
                {
                    "ratio": ratio,
                    "used": self.kv_used,
                    "running": self.running,
                    "queued": 0,
                    "available": self.kv_capacity - self.kv_used,
                    "evictable": 0,
                }[kind]
            )

    def torch_mod(self) -> Any:
        assert self.gpu is not None
        return self.gpu.torch

    def keep(self, obj: Any, nbytes: int) -> None:
        """Count `obj` as leaked: kept for the process's life (the caller holds `lock`). With
        $REFERENCE_FREE_REQUEST_BUFFERS=1 it is dropped instead (the fix)."""
        if self.release_buffers:
            return
        self.kept.append(obj)
        self.kept_bytes += nbytes

    def leak_bytes(self, kib: float) -> int:
        """Bytes a mode keeps for a `kib` KiB leak: scaled by --leak-scale (0 with the fix on)."""
        return 0 if self.release_buffers else int(kib * 1024 * self.leak_scale)

    def after_request(self, req: Request | None = None) -> None:
        """The request's work is done (its answer not yet sent): count it, let the mode act."""
        with self.lock:
            self.requests += 1
            self.mode.after_request_locked(self, req)
            self.m_kept.set(self.kept_bytes)
        self.mode.after_request(self, req)
        crash = self.args.crash_after
        if crash and self.requests >= crash:
            from refserver.faults import crash_now

            crash_now(self.args, self.requests)
        if self.m_engine_requests is not None:
            self.m_engine_requests.inc()
        self.m_requests.inc()

    def info(self) -> dict[str, Any]:
        """GET /reference/info: the truth (what the mode keeps and why) and the counters."""
        with self.lock:
            out: dict[str, Any] = {
                "mode": self.args.mode,
                "device": self.device,
                "processor": self.gpu.name if self.gpu else "pillow-numpy",
                "requests": self.requests,
                "kept_bytes": self.kept_bytes,
                "leak_bytes_per_request": self.mode.leak_bytes_per_request(self),
                "cache_bytes": self.cache_bytes,
                "kv_used_tokens": self.kv_used,
                "kv_capacity_tokens": self.kv_capacity,
                "kv_page_size_tokens": self.args.kv_page_size,
                "kv_leak_tokens_per_request": self.mode.kv_leak_tokens_per_request(self),
                "aborted": self.aborted,
                "churned": False,
                "pid": os.getpid(),
            }
            out.update(self.mode.info(self))
        out["lifecycle"] = self.lifecycle.info()
        with self.lock:
            out["truth"] = self.mode.truth(self)
        out["device_memory"] = self.gpu_mem.describe()
        out["release_buffers"] = self.release_buffers
        out["malloc"] = malloc.mallinfo2()
        out["proc"] = malloc.proc_status()
        return out
