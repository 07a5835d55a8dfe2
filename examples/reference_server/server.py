"""A small OpenAI-compatible server whose memory behaviour you choose: the soak test target.

It answers /v1/chat/completions and /v1/completions, preprocesses every image of a request
and exposes Prometheus /metrics. `--mode` decides what happens to memory:

- plain:   bounded caching. On the GPU: the fast image processor runs on CUDA and PyTorch's
           caching allocator keeps the freed blocks (rises, then flat). On the CPU: a bounded
           encoder-output cache keyed by image content (fills in the first round, then flat).
- leaking: plain + a real leak. CPU: a buffer of --leak-kib KiB kept per request. GPU:
           `--leak-kind kept` keeps each request's pixel tensor on the GPU; `--leak-kind escape`
           lets it escape a request-scoped CUDA MemPool, so the pool's segments are orphaned;
           `--leak-kind bytes` keeps exactly --leak-kib KiB on the GPU per request.
- fixed:   GPU: the same request-scoped pool done right (vramdoctor.fixes.request_scoped_pool +
           outputs_to_cpu); CPU: the leaking code path with its buffer released at request end.
- stable:  preprocessing only, on the CPU, nothing cached or kept.
- kv-leaking: memory as in stable, but --kv-leak-tokens of each request's KV tokens are never
           returned to the pool (--kv-leak-on abort: only for requests the client abandons):
           KV usage at idle creeps up (publish it with --metrics-flavour sglang or vllm), the
           signature of a KV page leak rather than an allocator leak.
- arena:   host-allocator caching, for real: every request is decoded on a fresh thread
           (thread per request), glibc gives concurrent threads their own malloc arenas and
           keeps freed memory in them. RSS rises while new arenas appear and is bounded by
           MALLOC_ARENA_MAX (default 8 x cores); with MALLOC_ARENA_MAX=2 it stays flat.
- pinned:  CUDA pinned host memory caching (needs torch and a CUDA GPU): each image goes
           through a pinned host buffer; PyTorch's host allocator keeps the freed buffers
           (RssShmem rises, then flat).
- worker-churn: plain, plus a helper process that starts during round 1 (after
           --churn-after requests), fails to bind the server's port and exits, as compile
           workers and failed restarts do on real servers.

The server knows exactly how many bytes it keeps per request (GET /reference/info and the
gauge `reference_kept_bytes`): the truth a leak-rate estimate is checked against.
Needs only the Python standard library, numpy, Pillow and prometheus-client; with torch and
transformers and a CUDA GPU it runs the GPU variants (--device cuda).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from PIL import Image
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

MODEL_ID = "vramdoctor-reference"
MEAN = np.array([0.481, 0.458, 0.408], dtype=np.float32)
STD = np.array([0.269, 0.261, 0.276], dtype=np.float32)


class CpuPreprocessor:
    """Pillow/numpy preprocessing: decode, resize to a multiple of 28 px, normalise to float32."""

    def __init__(self, max_side: int = 448) -> None:
        self.max_side = max_side

    def __call__(self, img: Image.Image) -> np.ndarray:
        w, h = img.size
        scale = min(1.0, self.max_side / max(w, h))
        w2 = max(28, int(w * scale) // 28 * 28)
        h2 = max(28, int(h * scale) // 28 * 28)
        arr = np.asarray(img.convert("RGB").resize((w2, h2)), dtype=np.float32) / 255.0
        return ((arr - MEAN) / STD).transpose(2, 0, 1).copy()


class GpuPreprocessor:
    """A real transformers fast image processor running on CUDA (via AutoImageProcessor)."""

    def __init__(self, processor_dir: str | None, device: str) -> None:
        import tempfile

        import torch
        from transformers import AutoImageProcessor

        self.torch = torch
        self.device = device
        if processor_dir is None:
            # Offline: a preprocessor config naming the Qwen2-VL processor. transformers 5 gives the
            # torchvision ("fast") class under the plain name; 4.x needs use_fast=True.
            processor_dir = tempfile.mkdtemp(prefix="vramdoctor-ref-")
            with open(os.path.join(processor_dir, "preprocessor_config.json"), "w") as fh:
                json.dump({"image_processor_type": "Qwen2VLImageProcessor"}, fh)
        import transformers

        major = int(transformers.__version__.split(".")[0])
        # 5.x: backend="torchvision" (use_fast is deprecated there); 4.x: use_fast=True.
        kwargs = {"backend": "torchvision"} if major >= 5 else {"use_fast": True}
        self.processor = AutoImageProcessor.from_pretrained(processor_dir, **kwargs)
        self.name = type(self.processor).__name__

    def __call__(self, img: Image.Image) -> Any:
        return self.processor(images=[img.convert("RGB")], return_tensors="pt", device=self.device)


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.requests = 0
        self.running = 0
        self.gpu_lock = threading.Lock()
        self.kept: list[Any] = []
        self.kept_bytes = 0
        self.cache: OrderedDict[str, Any] = OrderedDict()
        self.cache_bytes = 0
        self.cache_limit = int(args.cache_mib * 1024 * 1024)
        self.device = args.device
        self.pool_escapes: list[Any] = []
        self.gpu: GpuPreprocessor | None = None
        self.cpu = CpuPreprocessor()
        self._last_data = b""
        if args.mode == "pinned":
            try:
                import torch
            except ImportError:
                raise SystemExit("--mode pinned needs torch (pip install torch)") from None
            if not torch.cuda.is_available():
                raise SystemExit("--mode pinned needs a CUDA GPU (pinned host memory is CUDA's)")
            self.torch_cpu = torch
        if self.device.startswith("cuda"):
            self.gpu = GpuPreprocessor(args.processor_dir, self.device)
        if args.mode == "fixed" and self.gpu is not None:
            try:
                import vramdoctor  # noqa: F401
            except ImportError:  # run from a checkout without installing: use the checkout's copy
                sys.path.insert(
                    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                )
            from vramdoctor.fixes import outputs_to_cpu, request_scoped_pool

            self.request_scoped_pool = request_scoped_pool
            self.outputs_to_cpu = outputs_to_cpu
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
        self.m_engine_requests = None
        self.churned = False
        self.aborted = 0
        self.arena_threads = 0
        if args.metrics_flavour == "sglang":
            labels = {
                "model_name": MODEL_ID,
                "engine_type": "unified",
                "tp_rank": "0",
                "pp_rank": "0",
            }
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
            self.m_engine_requests: Any = Counter(
                "sglang:num_requests", "Number of requests processed.", names, registry=registry
            ).labels(**labels)
        elif args.metrics_flavour == "vllm":
            labels = {"model_name": MODEL_ID, "engine": "0"}
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
    def handle_image(self, data: bytes) -> None:
        self._last_data = data
        img = Image.open(io.BytesIO(data))
        img.load()
        mode = self.args.mode
        if self.gpu is not None:
            # One preprocessing stream, as in SGLang's tokenizer process: concurrent HTTP
            # requests take turns on the GPU, so memory depends on the traffic, not on races.
            with self.gpu_lock:
                self._gpu_image(img, mode)
        else:
            self._cpu_image(img, data, mode)
        self.m_images.inc()

    def _cpu_image(self, img: Image.Image, data: bytes, mode: str) -> None:
        if mode == "arena":
            self._arena_image(data)
            return
        if mode == "pinned":
            self._pinned_image(img)
            return
        if mode in ("plain", "leaking", "worker-churn"):
            key = hashlib.sha1(data).hexdigest()
            with self.lock:
                hit = self.cache.get(key)
                if hit is not None:
                    self.cache.move_to_end(key)
            if hit is None:
                pixels = self.cpu(img)
                # The cached "encoder output": a fixed-size feature block per unique image.
                out = np.resize(pixels.ravel(), int(self.args.cache_entry_kib * 256)).astype(
                    np.float32
                )
                with self.lock:
                    if key not in self.cache:
                        self.cache[key] = out
                        self.cache_bytes += out.nbytes
                    while self.cache_bytes > self.cache_limit and self.cache:
                        _, old = self.cache.popitem(last=False)
                        self.cache_bytes -= old.nbytes
                    self.m_cache.set(self.cache_bytes)
        else:
            self.cpu(img)

    def _arena_image(self, data: bytes) -> None:
        """Decode on a fresh thread, as a thread-per-request server does: the thread's mallocs
        (Pillow's decode buffers, numpy's float arrays) come from the malloc arena glibc gives
        it; the memory is freed when the thread ends but stays in that arena."""

        def decode() -> None:
            img = Image.open(io.BytesIO(data))
            img.load()
            pixels = self.cpu(img)
            # A second, differently sized working buffer, as resize/normalise pipelines have.
            np.resize(pixels.ravel(), pixels.size // 3 + 4096).astype(np.float64).sum()

        threads = [threading.Thread(target=decode) for _ in range(self.args.arena_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _pinned_image(self, img: Image.Image) -> None:
        """Stage the pixels through pinned host memory to the GPU, as data loaders and servers
        do; PyTorch's host allocator caches the freed pinned block for the next request."""
        torch = self.torch_cpu
        pixels = torch.from_numpy(self.cpu(img))
        staging = torch.empty(pixels.shape, dtype=pixels.dtype, pin_memory=True)
        staging.copy_(pixels)
        on_gpu = staging.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        del staging, on_gpu

    def _gpu_image(self, img: Image.Image, mode: str) -> None:
        torch = self.torch_mod()
        assert self.gpu is not None
        if mode in ("stable", "kv-leaking", "arena"):
            if mode == "arena":
                self._arena_image(self._last_data)
            else:
                self.cpu(img)
            return
        if mode == "pinned":
            self._pinned_image(img)
            return
        if mode == "worker-churn":
            mode = "plain"
        if mode == "fixed":
            with self.request_scoped_pool(self.device):
                out = self.outputs_to_cpu(self.gpu(img))
            del out
            return
        if mode == "leaking" and self.args.leak_kind == "escape":
            pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(pool):
                out = self.gpu(img)
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
            with self.lock:
                self.pool_escapes.append(pv)
                self.kept_bytes += reserved or pv.numel() * pv.element_size()
            del out, pool
            return
        if mode == "leaking" and self.args.leak_kind == "bytes":
            self.gpu(img)  # preprocessing as in plain (cached by the allocator), plus a sized leak
            return
        out = self.gpu(img)
        pv = out["pixel_values"]
        cpu_out = {k: (v.cpu() if hasattr(v, "cpu") else v) for k, v in out.items()}
        if mode == "leaking":
            with self.lock:
                self.kept.append(pv)
                self.kept_bytes += pv.numel() * pv.element_size()
        del out, pv, cpu_out

    def warm_up(self) -> None:
        """What real servers do before taking traffic: run the pipeline once on a dummy input,
        so one-time costs (plugin imports, first-use buffers) are not charged to the first round."""
        buf = io.BytesIO()
        Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
        img = Image.open(io.BytesIO(buf.getvalue()))
        img.load()
        self.cpu(img)
        if self.gpu is not None:
            self.gpu(img)

    def running_delta(self, delta: int, tokens: int = 0) -> None:
        """A request starts (+1, its tokens taken from the KV pool) or ends (-1, tokens freed)."""
        with self.lock:
            self.running += delta
            self.kv_used = max(0, min(self.kv_capacity, self.kv_used + tokens))
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

    def after_request(self) -> None:
        with self.lock:
            self.requests += 1
            if (
                self.args.mode == "leaking"
                and self.gpu is not None
                and self.args.leak_kind == "bytes"
            ):
                torch = self.gpu.torch
                t = torch.ones(
                    int(self.args.leak_kib * 1024), dtype=torch.uint8, device=self.device
                )
                self.kept.append(t)
                self.kept_bytes += t.numel()
            if self.args.mode == "leaking" and self.gpu is None:
                buf = np.ones(int(self.args.leak_kib * 1024), dtype=np.uint8)  # touched pages
                self.kept.append(buf)
                self.kept_bytes += buf.nbytes
            self.m_kept.set(self.kept_bytes)
            churn = (
                self.args.mode == "worker-churn"
                and not self.churned
                and self.requests >= self.args.churn_after
            )
            self.churned = self.churned or churn
        if churn:
            spawn_churn_worker(self.args)
        if self.m_engine_requests is not None:
            self.m_engine_requests.inc()
        if self.args.mode == "fixed" and self.gpu is None:
            # The leaking code path, but its buffer is released at the end of the request.
            buf = np.ones(int(self.args.leak_kib * 1024), dtype=np.uint8)
            del buf
        self.m_requests.inc()

    def info(self) -> dict[str, Any]:
        with self.lock:
            per_request = None
            if self.args.mode == "leaking":
                per_request = (
                    self.args.leak_kib * 1024.0
                    if self.gpu is None or self.args.leak_kind == "bytes"
                    else (self.kept_bytes / self.requests if self.requests else None)
                )
            return {
                "mode": self.args.mode,
                "device": self.device,
                "processor": self.gpu.name if self.gpu else "pillow-numpy",
                "requests": self.requests,
                "kept_bytes": self.kept_bytes,
                "leak_bytes_per_request": per_request,
                "cache_bytes": self.cache_bytes,
                "kv_used_tokens": self.kv_used,
                "kv_capacity_tokens": self.kv_capacity,
                "kv_page_size_tokens": self.args.kv_page_size,
                "kv_leak_tokens_per_request": self.args.kv_leak_tokens
                if self.args.mode == "kv-leaking"
                else 0,
                "aborted": self.aborted,
                "churned": self.churned,
                "pid": os.getpid(),
            }


CHURN_WORKER = """
import socket, sys, time
buf = bytearray(48 * 1024 * 1024)  # a worker's start-up memory, touched
for i in range(0, len(buf), 4096):
    buf[i] = 1
s = socket.socket()
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError as exc:
    print(f"worker: cannot bind {sys.argv[1]}:{sys.argv[2]}: {exc}", flush=True)
time.sleep(float(sys.argv[3]))
sys.exit(1)
"""


def spawn_churn_worker(args: argparse.Namespace) -> None:
    """A helper process that appears, fails to bind the server's port and exits (reaped)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHURN_WORKER,
            args.host,
            str(args.bound_port),
            str(args.churn_lifetime),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    threading.Thread(target=proc.wait, daemon=True).start()


def tune_malloc() -> None:
    """Make host RSS track live data: glibc otherwise raises its mmap threshold after the first
    large free and keeps later large buffers in per-thread arenas (a few MiB of allocator caching
    in the first round). Fixing the threshold returns every large buffer to the OS on free."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: fixed, no dynamic growth
        libc.mallopt(-8, 2)  # M_ARENA_MAX: few arenas for the handler threads
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _images_in(body: dict[str, Any]) -> list[bytes]:
    out: list[bytes] = []
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                if url.startswith("data:") and "," in url:
                    out.append(base64.b64decode(url.split(",", 1)[1]))
    return out


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, payload: Any, ctype: str = "application/json") -> None:
            body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorised(self) -> bool:
            key = state.args.api_key
            if not key:
                return True
            if self.headers.get("Authorization", "") == f"Bearer {key}":
                return True
            self._send(401, {"error": {"message": "invalid api key", "type": "auth"}})
            return False

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(state.registry), CONTENT_TYPE_LATEST)
            elif path == "/health":
                self._send(200, {"status": "ok"})
            elif path == "/get_server_info" and state.args.metrics_flavour == "sglang":
                # As SGLang's: the version and the server args soak reads (page_size).
                self._send(
                    200,
                    {
                        "version": "reference",
                        "page_size": state.args.kv_page_size,
                        "max_total_num_tokens": state.kv_capacity,
                        "served_model_name": MODEL_ID,
                    },
                )
            elif path == "/reference/info":
                self._send(200, state.info())
            elif path == "/v1/models" and state.args.models_status != 200:
                # As `transformers serve` on a host without a Hugging Face cache directory.
                self._send(state.args.models_status, {"error": {"message": "no model list here"}})
            elif path == "/v1/models":
                if self._authorised():
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [
                                {
                                    "id": MODEL_ID,
                                    "object": "model",
                                    "owned_by": "vramdoctor-reference",
                                }
                            ],
                        },
                    )
            else:
                self._send(404, {"error": {"message": f"no route {path}"}})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if path not in ("/v1/chat/completions", "/v1/completions"):
                self._send(404, {"error": {"message": f"no route {path}"}})
                return
            if not self._authorised():
                return
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": {"message": "body is not JSON"}})
                return
            images = _images_in(body)
            tokens = state.args.kv_tokens_per_request + 256 * len(images)
            state.running_delta(+1, tokens)
            aborted = False
            try:
                for data in images:
                    state.handle_image(data)
                state.after_request()
                if body.get("stream"):
                    aborted = not self._stream(path, body)
                    return
            except Exception as exc:  # a bad image must not kill the server
                self._send(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
                return
            finally:
                # kv-leaking: some of the request's KV pages are never returned to the pool
                # (--kv-leak-on abort: only when the client went away mid-stream).
                leaks = state.args.mode == "kv-leaking" and (
                    state.args.kv_leak_on == "every" or aborted
                )
                kept = state.args.kv_leak_tokens if leaks else 0
                state.running_delta(-1, -(tokens - kept))
                if aborted:
                    with state.lock:
                        state.aborted += 1
            n = max(1, min(int(body.get("max_tokens") or 16), 256))
            text = " ".join(["ok"] * n)
            usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
            created = int(time.time())
            if path == "/v1/chat/completions":
                choice = {
                    "index": 0,
                    "finish_reason": "length",
                    "message": {"role": "assistant", "content": text},
                }
                obj = "chat.completion"
            else:
                choice = {"index": 0, "finish_reason": "length", "text": text}
                obj = "text_completion"
            self._send(
                200,
                {
                    "id": f"ref-{created}",
                    "object": obj,
                    "created": created,
                    "model": MODEL_ID,
                    "choices": [choice],
                    "usage": usage,
                },
            )

        def _client_gone(self) -> bool:
            try:
                return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                return False
            except OSError:
                return True

        def _stream(self, path: str, body: dict[str, Any]) -> bool:
            """Server-sent events, one token a chunk; False when the client went away."""
            n = max(1, min(int(body.get("max_tokens") or 16), 256))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            created = int(time.time())
            try:
                for _ in range(n):
                    if path == "/v1/chat/completions":
                        choice: dict[str, Any] = {
                            "index": 0,
                            "delta": {"content": "ok "},
                            "finish_reason": None,
                        }
                        obj = "chat.completion.chunk"
                    else:
                        choice = {"index": 0, "text": "ok ", "finish_reason": None}
                        obj = "text_completion"
                    chunk = {
                        "id": f"ref-{created}",
                        "object": obj,
                        "created": created,
                        "model": MODEL_ID,
                        "choices": [choice],
                    }
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(state.args.stream_token_s)
                    if self._client_gone():
                        return False
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except OSError:  # broken pipe, connection reset: the client went away
                return False
            return True

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on stdout)")
    p.add_argument(
        "--mode",
        choices=[
            "plain",
            "leaking",
            "fixed",
            "stable",
            "kv-leaking",
            "arena",
            "pinned",
            "worker-churn",
        ],
        default="plain",
    )
    p.add_argument(
        "--leak-kib",
        type=float,
        default=1024.0,
        help="KiB kept per request (CPU leak, and GPU with --leak-kind bytes)",
    )
    p.add_argument(
        "--leak-kind",
        choices=["kept", "escape", "bytes"],
        default="escape",
        help="GPU leak: keep each request's pixel tensor (kept), let it escape a "
        "request-scoped MemPool (escape), or keep --leak-kib KiB on the GPU (bytes)",
    )
    p.add_argument("--cache-mib", type=float, default=64.0, help="CPU cache bound (plain/leaking)")
    p.add_argument(
        "--cache-entry-kib",
        type=float,
        default=4096.0,
        help="CPU cache: KiB of features kept per unique image",
    )
    p.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="leave glibc malloc as it is (its own caching then adds a few MiB of RSS)",
    )
    p.add_argument(
        "--metrics-flavour",
        choices=["reference", "sglang", "vllm"],
        default="reference",
        help="also publish KV usage under SGLang's or vLLM's metric names",
    )
    p.add_argument(
        "--kv-pool-tokens",
        "--kv-capacity",
        dest="kv_capacity",
        type=int,
        default=100_000,
        help="KV pool size in tokens",
    )
    p.add_argument(
        "--kv-page-size",
        type=int,
        default=16,
        help="tokens per KV page (SGLang --page-size; vLLM block_size), published in "
        "/get_server_info (sglang flavour) and vllm:cache_config_info",
    )
    p.add_argument(
        "--kv-leak-on",
        choices=["every", "abort"],
        default="every",
        help="kv-leaking: leak on every request, or only on requests the client abandons mid-stream",
    )
    p.add_argument(
        "--stream-token-s", type=float, default=0.01, help="seconds between streamed tokens"
    )
    p.add_argument(
        "--arena-threads",
        type=int,
        default=4,
        help="arena mode: decode threads started per image (each may get its own malloc arena)",
    )
    p.add_argument(
        "--models-status",
        type=int,
        default=200,
        help="answer GET /v1/models with this HTTP status (500: as transformers serve without an HF cache)",
    )
    p.add_argument(
        "--churn-after", type=int, default=5, help="worker-churn: requests before the helper starts"
    )
    p.add_argument(
        "--churn-lifetime", type=float, default=1.5, help="worker-churn: seconds the helper lives"
    )
    p.add_argument(
        "--kv-tokens-per-request", type=int, default=1024, help="KV tokens a request holds"
    )
    p.add_argument(
        "--kv-leak-tokens",
        type=int,
        default=200,
        help="kv-leaking: tokens of each request never returned to the KV pool",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--processor-dir",
        default=None,
        help="a local dir with preprocessor_config.json (default: Qwen2-VL's processor)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("REFERENCE_API_KEY"),
        help="require this bearer key (default: $REFERENCE_API_KEY; none)",
    )
    args = p.parse_args(argv)
    if not args.no_malloc_tuning and args.mode != "arena":  # arena mode is glibc's defaults
        tune_malloc()
    if args.device == "auto":
        try:
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            args.device = "cpu"
    state = State(args)
    state.warm_up()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    args.bound_port = port
    processor = state.gpu.name if state.gpu else "pillow-numpy (CPU)"
    print(
        f"reference server listening on http://{host}:{port} mode={args.mode} "
        f"device={args.device} processor={processor} pid={os.getpid()}",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
