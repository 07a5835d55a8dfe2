"""A small OpenAI-compatible server whose memory behaviour you choose: the soak test target.

It answers /v1/chat/completions and /v1/completions, preprocesses every image of a request
and exposes Prometheus /metrics. `--mode` decides what happens to memory; each mode is one
module of `refserver/modes/` whose docstring states its TRUTH (what a correct verdict is and
why), also served at GET /reference/info ("truth"). The modes:

- plain:   bounded caching (GPU: PyTorch's caching allocator; CPU: an encoder-output cache).
- leaking: plain + a real leak per request (--leak-kib; GPU: --leak-kind kept|escape|bytes).
- fixed:   the leaking code path done right (request-scoped pool; CPU: buffer released).
- stable:  preprocessing only, on the CPU, nothing cached or kept.
- kv-leaking: --kv-leak-tokens of each request (or each aborted stream) never return to the
           KV pool: a KV page leak, VRAM flat.
- arena:   threads per image with glibc's defaults: arena retention (CACHING), bounded by
           MALLOC_ARENA_MAX.
- pinned:  CUDA pinned host memory caching (needs torch and a CUDA GPU).
- worker-churn: plain, plus a helper process that starts, fails to bind the port and exits.
- retention: thread per connection decoding PNGs of varying size, glibc defaults: allocator
           retention (in use flat, kept free bytes and RssAnon grow); host-leak: the same plus
           a real malloc leak per request.
- converging: a tile cache with sampled admission filling towards its bound (each round adds
           less); background: a thread allocating in time, idle windows too.
- vram-leaking: a device leak per request (real CUDA, or the virtual GPU of --vgpu-dir).
- tenant:  plain, and another owner's process (parent pid 1) growing on the same GPU.
- restart: the serving pid is replaced after --restart-after requests (handover/supervisor).
- sleep-leak / release-leak / lora-leak: one lifecycle operation (sleep/wake, release/resume,
           LoRA load/unload, through the real endpoints) leaves memory behind per cycle.
- leak-on-FEATURE: only requests with one feature leak (images, large-images, multi-image,
           stream, abort, max-tokens-1, prefix, structured, n, lora); leak-on-every: all alike.
Fault switches for any mode: --fail-start, --crash-after N, --leak-scale X, and the env knob
REFERENCE_FREE_REQUEST_BUFFERS=1.

The server knows exactly how many bytes it keeps per request (GET /reference/info and the
gauge `reference_kept_bytes`): the truth a leak-rate estimate is checked against.
Needs only the Python standard library, numpy, Pillow and prometheus-client; with torch and
transformers and a CUDA GPU it runs the GPU variants (--device cuda).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from refserver.cli import main

if __name__ == "__main__":
    sys.exit(main())
