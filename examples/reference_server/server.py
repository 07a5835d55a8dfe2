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
           returned to the pool: KV usage at idle creeps up (publish it with --metrics-flavour
           sglang or vllm), the signature of a KV page leak rather than an allocator leak.

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
        if self.device.startswith("cuda"):
            self.gpu = GpuPreprocessor(args.processor_dir, self.device)
        if args.mode == "fixed" and self.gpu is not None:
            try:
                import vramdoctor  # noqa: F401
            except ImportError:  # run from a checkout without installing: use the checkout's copy
                sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
            from vramdoctor.fixes import outputs_to_cpu, request_scoped_pool

            self.request_scoped_pool = request_scoped_pool
            self.outputs_to_cpu = outputs_to_cpu
        registry = CollectorRegistry()
        self.registry = registry
        self.m_requests = Counter("reference_requests", "Requests served.", registry=registry)
        self.m_images = Counter("reference_images", "Images preprocessed.", registry=registry)
        self.m_running = Gauge("reference_running_requests", "Requests in flight.", registry=registry)
        self.m_kept = Gauge("reference_kept_bytes", "Bytes kept by the leak so far.", registry=registry)
        self.m_cache = Gauge("reference_cache_bytes", "Bytes in the bounded cache.", registry=registry)
        self.m_kv = Gauge("reference_kv_usage", "KV pool usage 0..1 (token accounting).", registry=registry)
        # The same KV usage under a real server's metric names and labels (read off their source:
        # SGLang's collector.py, vLLM's v1 loggers.py), so soak's /metrics path runs for real.
        self.kv_capacity = int(args.kv_capacity)
        self.kv_used = 0
        self.flavoured: list[Any] = []
        if args.metrics_flavour == "sglang":
            labels = {"model_name": MODEL_ID, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
            names = list(labels)
            self.flavoured = [
                ("ratio", Gauge("sglang:token_usage", "The token usage.", names, registry=registry).labels(**labels)),
                ("used", Gauge("sglang:num_used_tokens", "The number of used tokens.", names, registry=registry).labels(**labels)),
                ("running", Gauge("sglang:num_running_reqs", "The number of running requests.", names, registry=registry).labels(**labels)),
            ]
            Gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
                  names, registry=registry).labels(**labels).set(self.kv_capacity)
        elif args.metrics_flavour == "vllm":
            labels = {"model_name": MODEL_ID, "engine": "0"}
            names = list(labels)
            self.flavoured = [
                ("ratio", Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", names, registry=registry).labels(**labels)),
                ("running", Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", names, registry=registry).labels(**labels)),
            ]

    # --- per-request work -------------------------------------------------------------------
    def handle_image(self, data: bytes) -> None:
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
        if mode in ("plain", "leaking"):
            key = hashlib.sha1(data).hexdigest()
            with self.lock:
                hit = self.cache.get(key)
                if hit is not None:
                    self.cache.move_to_end(key)
            if hit is None:
                pixels = self.cpu(img)
                # The cached "encoder output": a fixed-size feature block per unique image.
                out = np.resize(pixels.ravel(), int(self.args.cache_entry_kib * 256)).astype(np.float32)
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

    def _gpu_image(self, img: Image.Image, mode: str) -> None:
        torch = self.torch_mod()
        assert self.gpu is not None
        if mode in ("stable", "kv-leaking"):
            self.cpu(img)
            return
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
            reserved = sum(seg.get("total_size", 0) for seg in segments
                           if any(b.get("state") == "active_allocated" for b in seg.get("blocks", [])))
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
                gauge.set({"ratio": ratio, "used": self.kv_used, "running": self.running}[kind])

    def torch_mod(self) -> Any:
        assert self.gpu is not None
        return self.gpu.torch

    def after_request(self) -> None:
        with self.lock:
            self.requests += 1
            if self.args.mode == "leaking" and self.gpu is not None and self.args.leak_kind == "bytes":
                torch = self.gpu.torch
                t = torch.ones(int(self.args.leak_kib * 1024), dtype=torch.uint8, device=self.device)
                self.kept.append(t)
                self.kept_bytes += t.numel()
            if self.args.mode == "leaking" and self.gpu is None:
                buf = np.ones(int(self.args.leak_kib * 1024), dtype=np.uint8)  # touched pages
                self.kept.append(buf)
                self.kept_bytes += buf.nbytes
            self.m_kept.set(self.kept_bytes)
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
                "pid": os.getpid(),
            }


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
            elif path == "/reference/info":
                self._send(200, state.info())
            elif path == "/v1/models":
                if self._authorised():
                    self._send(200, {"object": "list", "data": [
                        {"id": MODEL_ID, "object": "model", "owned_by": "vramdoctor-reference"}]})
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
            try:
                for data in images:
                    state.handle_image(data)
                state.after_request()
            except Exception as exc:  # a bad image must not kill the server
                self._send(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
                return
            finally:
                # kv-leaking: some of the request's KV pages are never returned to the pool.
                kept = state.args.kv_leak_tokens if state.args.mode == "kv-leaking" else 0
                state.running_delta(-1, -(tokens - kept))
            n = max(1, min(int(body.get("max_tokens") or 16), 256))
            text = " ".join(["ok"] * n)
            usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
            created = int(time.time())
            if path == "/v1/chat/completions":
                choice = {"index": 0, "finish_reason": "length",
                          "message": {"role": "assistant", "content": text}}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "finish_reason": "length", "text": text}
                obj = "text_completion"
            self._send(200, {"id": f"ref-{created}", "object": obj, "created": created,
                             "model": MODEL_ID, "choices": [choice], "usage": usage})

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on stdout)")
    p.add_argument("--mode", choices=["plain", "leaking", "fixed", "stable", "kv-leaking"], default="plain")
    p.add_argument("--leak-kib", type=float, default=1024.0,
                   help="KiB kept per request (CPU leak, and GPU with --leak-kind bytes)")
    p.add_argument("--leak-kind", choices=["kept", "escape", "bytes"], default="escape",
                   help="GPU leak: keep each request's pixel tensor (kept), let it escape a "
                        "request-scoped MemPool (escape), or keep --leak-kib KiB on the GPU (bytes)")
    p.add_argument("--cache-mib", type=float, default=64.0, help="CPU cache bound (plain/leaking)")
    p.add_argument("--cache-entry-kib", type=float, default=4096.0,
                   help="CPU cache: KiB of features kept per unique image")
    p.add_argument("--no-malloc-tuning", action="store_true",
                   help="leave glibc malloc as it is (its own caching then adds a few MiB of RSS)")
    p.add_argument("--metrics-flavour", choices=["reference", "sglang", "vllm"], default="reference",
                   help="also publish KV usage under SGLang's or vLLM's metric names")
    p.add_argument("--kv-capacity", type=int, default=100_000, help="KV pool size in tokens")
    p.add_argument("--kv-tokens-per-request", type=int, default=1024, help="KV tokens a request holds")
    p.add_argument("--kv-leak-tokens", type=int, default=200,
                   help="kv-leaking: tokens of each request never returned to the KV pool")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--processor-dir", default=None,
                   help="a local dir with preprocessor_config.json (default: Qwen2-VL's processor)")
    p.add_argument("--api-key", default=os.environ.get("REFERENCE_API_KEY"),
                   help="require this bearer key (default: $REFERENCE_API_KEY; none)")
    args = p.parse_args(argv)
    if not args.no_malloc_tuning:
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
    processor = state.gpu.name if state.gpu else "pillow-numpy (CPU)"
    print(f"reference server listening on http://{host}:{port} mode={args.mode} "
          f"device={args.device} processor={processor} pid={os.getpid()}", flush=True)
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
