"""Cost of request_scoped_pool per request, side by side in one process, on a CUDA GPU.

Runs the same images through a model family's fast image processor four ways, interleaved
request by request so clocks and caches drift equally: no pool (the caching allocator), a
plain MemPool per request (no guard), vramdoctor's guarded scope, and empty_cache() after
each request. Prints p50/mean per way, the ratios against no pool, and one JSON line.

    python benchmarks/fixes_scope_overhead.py [--model qwen2_vl] [--count 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2_vl")
    parser.add_argument("--count", type=int, default=60)
    args = parser.parse_args()

    from vramdoctor.abtest.models import resolve_model
    from vramdoctor.abtest.processor import load_processor
    from vramdoctor.abtest.workload import WorkloadSpec, round_images
    from vramdoctor.fixes import outputs_to_cpu, request_scoped_pool
    from vramdoctor.fixes._torch import load_torch
    from vramdoctor.fixes.scoped_pool import unguarded_scoped_pool

    torch = load_torch("benchmark")
    proc, name = load_processor(resolve_model(args.model))
    images = round_images(WorkloadSpec(count=args.count, rounds=1), 0)
    ways = {
        "no_pool": lambda: nullcontext(),
        "plain_pool": lambda: unguarded_scoped_pool("cuda:0"),
        "guarded_pool": lambda: request_scoped_pool("cuda:0"),
        "empty_cache": lambda: nullcontext(),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for image in images[:3]:  # warm-up: kernels, lru caches
        for scope in ways.values():
            with scope():
                outputs_to_cpu(proc(images=[image], return_tensors="pt", device="cuda:0"))
    for image in images:
        for way, scope in ways.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with scope():
                outputs_to_cpu(proc(images=[image], return_tensors="pt", device="cuda:0"))
            if way == "empty_cache":
                torch.cuda.empty_cache()
            times[way].append((time.perf_counter() - t0) * 1000)
    base = statistics.median(times["no_pool"])
    print(f"{name} on {torch.cuda.get_device_name(0)}, {args.count} images interleaved")
    print(f"{'way':<14}{'p50 ms':>9}{'mean ms':>9}{'p50 vs no_pool':>16}")
    result = {}
    for way, ts in times.items():
        p50 = statistics.median(ts)
        result[way] = {"p50_ms": round(p50, 3), "mean_ms": round(statistics.fmean(ts), 3), "ratio": round(p50 / base, 3)}
        print(f"{way:<14}{p50:>9.2f}{statistics.fmean(ts):>9.2f}{p50 / base:>15.2f}x")
    print(json.dumps({"benchmark": "fixes_scope_overhead", "processor": name, **result}))


if __name__ == "__main__":
    main()
