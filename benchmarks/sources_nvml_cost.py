"""Cost of one full NVML sample against one `nvidia-smi` process, and the sampler's CPU at 10 Hz.

Run on a GPU machine:

    python benchmarks/sources_nvml_cost.py                  # defaults: 2000 samples, 30 nvidia-smi, 30 s at 10 Hz
    python benchmarks/sources_nvml_cost.py --json-out nvml_cost.json

What is measured, side by side in one run:
- `NvmlSource.sample()`: every GPU's memory (v2 where present) and both process lists, with
  process names from the cache, i.e. exactly what `soak` and `census` pay per sample;
- the bare NVML calls of that sample (no Python objects built), for reference;
- one `nvidia-smi --query-gpu=memory.used --format=csv` process (what people script today);
- a 10 Hz sampling loop (sample + append-and-flush to a run file) for `--seconds`, as the
  fraction of one core it uses (process CPU time / wall time).

Targets (issue 2): a full sample >= 200x cheaper than one nvidia-smi; the 10 Hz sampler
under 1% of a core. Exit code 0 when both hold, 1 when one does not, 2 without NVML.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _quantiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "median": statistics.median(values),
        "p10": values[int(0.1 * (len(values) - 1))],
        "p90": values[int(0.9 * (len(values) - 1))],
        "n": len(values),
    }


def time_calls(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--smi", type=int, default=30, help="nvidia-smi runs")
    ap.add_argument(
        "--seconds", type=float, default=30.0, help="duration of the 10 Hz CPU measurement"
    )
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    from vramdoctor.errors import SourceUnavailable
    from vramdoctor.record import RunWriter, make_header
    from vramdoctor.sources.nvml import NvmlSource

    t0 = time.perf_counter()
    src = NvmlSource()
    try:
        src.open()
    except SourceUnavailable as exc:
        print(f"sources_nvml_cost: {exc}", file=sys.stderr)
        return 2
    init_s = time.perf_counter() - t0
    first = src.sample()
    n_gpus, n_procs = len(first.gpus), len(first.processes)

    import pynvml

    handles = [pynvml.nvmlDeviceGetHandleByIndex(g.index) for g in first.gpus]

    def bare() -> None:
        for h in handles:
            pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)

    try:
        bare()
    except pynvml.NVMLError:

        def bare() -> None:  # older driver: v1 memory call
            for h in handles:
                pynvml.nvmlDeviceGetMemoryInfo(h)
                pynvml.nvmlDeviceGetComputeRunningProcesses(h)

    sample_s = time_calls(src.sample, args.samples)
    bare_s = time_calls(bare, args.samples)

    smi = shutil.which("nvidia-smi")
    smi_s: list[float] = []
    if smi:
        cmd = [smi, "--query-gpu=memory.used", "--format=csv"]
        smi_s = time_calls(lambda: subprocess.run(cmd, capture_output=True, check=True), args.smi)

    # 10 Hz sampler: sample, append one flushed line, sleep to the next tick.
    period = 1.0 / args.hz
    with tempfile.TemporaryDirectory() as tmp:
        writer = RunWriter(Path(tmp) / "bench.jsonl", make_header("bench", argv=sys.argv))
        cpu0, wall0 = time.process_time(), time.monotonic()
        next_tick, ticks = wall0, 0
        while time.monotonic() - wall0 < args.seconds:
            writer.write(src.sample())
            ticks += 1
            next_tick += period
            time.sleep(max(0.0, next_tick - time.monotonic()))
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        writer.close()
        run_bytes = (Path(tmp) / "bench.jsonl").stat().st_size
    src.close()

    result = {
        "gpus": n_gpus,
        "processes_seen": n_procs,
        "driver": src.driver_version,
        "nvml_init_ms": init_s * 1e3,
        "full_sample_us": {
            k: (v * 1e6 if k != "n" else v) for k, v in _quantiles(sample_s).items()
        },
        "bare_nvml_calls_us": {
            k: (v * 1e6 if k != "n" else v) for k, v in _quantiles(bare_s).items()
        },
        "nvidia_smi_ms": {k: (v * 1e3 if k != "n" else v) for k, v in _quantiles(smi_s).items()}
        if smi_s
        else None,
        "ratio_smi_over_full_sample": (statistics.median(smi_s) / statistics.median(sample_s))
        if smi_s
        else None,
        "sampler": {
            "hz": args.hz,
            "seconds": wall,
            "ticks": ticks,
            "cpu_s": cpu,
            "core_percent": 100.0 * cpu / wall,
            "run_file_bytes_per_sample": run_bytes / max(ticks, 1),
        },
        "host_cpus": os.cpu_count(),
    }
    fs, bs = result["full_sample_us"], result["bare_nvml_calls_us"]
    print(
        f"GPUs: {n_gpus}, processes seen: {n_procs}, driver {src.driver_version}, nvmlInit {init_s * 1e3:.1f} ms"
    )
    print(
        f"full NvmlSource.sample(): median {fs['median']:.1f} us (p10 {fs['p10']:.1f}, p90 {fs['p90']:.1f}) over {fs['n']}"
    )
    print(
        f"bare NVML calls:          median {bs['median']:.1f} us (p10 {bs['p10']:.1f}, p90 {bs['p90']:.1f})"
    )
    ok = True
    if smi_s:
        sm = result["nvidia_smi_ms"]
        ratio = result["ratio_smi_over_full_sample"]
        print(
            f"nvidia-smi process:       median {sm['median']:.1f} ms (p10 {sm['p10']:.1f}, p90 {sm['p90']:.1f}) over {sm['n']}"
        )
        print(f"ratio nvidia-smi / full sample: {ratio:.0f}x (target >= 200x)")
        ok &= ratio >= 200
    else:
        print("nvidia-smi not found: no ratio")
    sp = result["sampler"]
    print(
        f"sampler at {args.hz:g} Hz for {sp['seconds']:.1f} s: {sp['core_percent']:.3f}% of one core "
        f"({sp['ticks']} samples, {sp['run_file_bytes_per_sample']:.0f} B each on disk; target < 1%)"
    )
    ok &= sp["core_percent"] < 1.0
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
