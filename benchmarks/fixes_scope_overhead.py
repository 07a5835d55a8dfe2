"""Cost of request_scoped_pool per request, side by side in one process, on a CUDA GPU.

Replays the default ab-test workload (40 images a round, sides 256..2048, 4 rounds) through a
model family's fast image processor, in blocks of 40 requests per way, way after way, three
times over, so clocks and caches drift equally: no pool (the caching allocator, warm), a
plain MemPool per request (no guard), vramdoctor's guarded scope with its one-segment reserve
and without it. `empty_cache()` after each request runs in its own phase at the end, because
it also flushes the no-pool way's warm cache and would bill that way for it. Prints p50/mean
per way, the ratios against no pool, and one JSON line.

    python benchmarks/fixes_scope_overhead.py [--model qwen2_5_vl] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2_5_vl")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    from vramdoctor.abtest.models import resolve_model
    from vramdoctor.abtest.processor import load_processor
    from vramdoctor.abtest.workload import WorkloadSpec, round_images
    from vramdoctor.fixes import outputs_to_cpu, request_scoped_pool
    from vramdoctor.fixes._torch import load_torch
    from vramdoctor.fixes.scoped_pool import unguarded_scoped_pool

    torch = load_torch("benchmark")
    proc, name = load_processor(resolve_model(args.model))
    spec = WorkloadSpec()
    images = [im for r in range(spec.rounds) for im in round_images(spec, r)]

    def request(image):
        return outputs_to_cpu(proc(images=[image], return_tensors="pt", device="cuda:0"))

    ways = {
        "no_pool": lambda: nullcontext(),
        "plain_pool": lambda: unguarded_scoped_pool("cuda:0"),
        "guarded_pool": lambda: request_scoped_pool("cuda:0"),
        "guarded_no_reserve": lambda: request_scoped_pool("cuda:0", reserve=False),
    }
    for image in images[:8]:  # warm-up: kernels, lru caches, the reserve's window
        for scope in ways.values():
            with scope():
                request(image)
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.reps):
        for b in range(0, len(images), spec.count):
            for way, scope in ways.items():
                for image in images[b : b + spec.count]:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    with scope():
                        request(image)
                    times[way].append((time.perf_counter() - t0) * 1000)
    times["empty_cache"] = []
    for image in images:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        request(image)
        torch.cuda.empty_cache()
        times["empty_cache"].append((time.perf_counter() - t0) * 1000)

    base = statistics.median(times["no_pool"])
    print(
        f"{name} on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {len(images)} images x {args.reps}"
    )
    print(f"{'way':<20}{'p50 ms':>9}{'mean ms':>9}{'p50 vs no_pool':>16}")
    result = {}
    for way, ts in times.items():
        p50 = statistics.median(ts)
        result[way] = {
            "p50_ms": round(p50, 3),
            "mean_ms": round(statistics.fmean(ts), 3),
            "ratio": round(p50 / base, 3),
        }
        print(f"{way:<20}{p50:>9.3f}{statistics.fmean(ts):>9.3f}{p50 / base:>15.3f}x")
    print(json.dumps({"benchmark": "fixes_scope_overhead", "processor": name, **result}))


if __name__ == "__main__":
    main()
