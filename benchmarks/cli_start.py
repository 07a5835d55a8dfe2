"""Start-up cost of `vramdoctor --help` in one or more virtual environments, timed interleaved.

    N=20 python3 benchmarks/cli_start.py /tmp/venv-before /tmp/venv-after

Each iteration runs `VENV/bin/vramdoctor --help` once in every venv given, so load from other
processes falls on all of them alike; prints the wall and CPU (user+sys) medians per venv and
the CPU ratio of each to the first. docs/install.md records the figures.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time


def main(venvs: list[str], runs: int) -> None:
    wall: dict[str, list[float]] = {v: [] for v in venvs}
    cpu: dict[str, list[float]] = {v: [] for v in venvs}
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    for _ in range(runs):
        for v in venvs:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(
                [os.path.join(v, "bin", "vramdoctor"), "--help"],
                stdout=subprocess.DEVNULL,
                check=True,
                env=env,
            )
            wall[v].append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[v].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    first = statistics.median(cpu[venvs[0]])
    for v in venvs:
        c = statistics.median(cpu[v])
        print(
            f"{v}: wall median {statistics.median(wall[v]):.3f} s, CPU median {c:.3f} s "
            f"({c / first:.2f}x of the first) over {runs} runs"
        )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: N=20 python3 benchmarks/cli_start.py VENV [VENV...]")
    main(sys.argv[1:], int(os.environ.get("N", "20")))
