"""Cost of one leftovers scan (/dev/shm + every /proc/PID/fd and maps) on this host.

    python benchmarks/sources_leftovers_cost.py [--files N]

Makes N small files of a known family in a temporary directory (the scan reads a tmpfs like
/dev/shm), scans it 20 times, and prints the median and max next to a scan of an empty
directory, side by side in one run: the processes' fd and maps dominate, the files add little.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from vramdoctor.sources.leftovers import scan


def timed(directory: str, n: int = 20) -> tuple[float, float, int]:
    scan(directory)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        lo = scan(directory)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, max(times) * 1000, lo.processes_inspected


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
        empty = timed(d)
        for i in range(args.files):
            (Path(d) / f"sgl_shm_mm_{100000 + i}_{i:08x}").write_bytes(b"x" * 4096)
        full = timed(d)
    print(f"processes inspected: {empty[2]}")
    print(f"empty directory: median {empty[0]:.1f} ms, max {empty[1]:.1f} ms")
    print(f"{args.files} files:   median {full[0]:.1f} ms, max {full[1]:.1f} ms")
    print(f"ratio (files / empty): {full[0] / empty[0]:.2f}x")


if __name__ == "__main__":
    main()
