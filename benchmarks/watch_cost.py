"""watch's own cost: CPU at its default rate, and its memory after a simulated week.

1. CPU: a Watcher at the defaults (sample every 5 s, analyse every 30 s, /metrics served and
   scraped every 15 s as Prometheus would) over loopback sources shaped like production: an
   SGLang /metrics page (tests/support/sources.sglang_text), an nvitop-exporter page with 8 GPUs
   and 16 processes (standing in for NVML, which this CPU host lacks; NVML calls cost less than
   parsing that page), and host memory by kind of 8 real processes. Measured two ways: the
   process's CPU time over a real run at the default rate, and the cost of one tick and of
   one analysis with a full 6-hour window, scaled to the default rate.
2. Memory: seven days of samples at the default 5 s (120,960 ticks, 8 GPU processes, their host
   memory and the server's metrics; every "day" new PIDs, as restarts do) fed into the
   rolling state; traced Python memory after each day.

    python3 benchmarks/watch_cost.py              # ~3 minutes (a 120 s real run)
    python3 benchmarks/watch_cost.py --run-s 30   # shorter real run
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import requests

ROOT = Path(__file__).parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from fixtures.fleet.histories import History, Proc, records  # noqa: E402
from support.sources import nvitop_text, serve, sglang_text  # noqa: E402

from vramdoctor.watch import WatchConfig, Watcher, WatchOptions, WatchState  # noqa: E402


def cpu_cost(run_s: float) -> None:
    gpus = [
        {
            "index": i,
            "name": "NVIDIA H200",
            "uuid": f"GPU-{i}",
            "total": 143771,
            "used": 90000,
            "free": 53771,
        }
        for i in range(8)
    ]
    procs = [
        {
            "index": i % 8,
            "pid": 1000 + i,
            "username": "svc",
            "mib": 40000 + i,
            "command": "python3 -m sglang",
        }
        for i in range(16)
    ]
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(100000)"])
        for _ in range(8)
    ]
    try:
        with serve(sglang_text()) as server, serve(nvitop_text("h1", gpus, procs)) as gpu:
            opts = WatchOptions(
                server_url=server,
                gpu_metrics=[gpu + "/metrics"],
                pids=[p.pid for p in sleepers],
                listen="127.0.0.1:0",
            )
            w = Watcher(opts).open()
            try:
                for _ in range(3):
                    w.tick()
                # per tick and per analysis, back to back
                n = 100
                c0 = time.process_time()
                for _ in range(n):
                    w.tick()
                tick_cpu = (time.process_time() - c0) / n
                # a full 6-hour window: the state filled with 6 h of buckets for every series
                full = WatchState(WatchConfig())
                h = History(
                    hours=6,
                    step_s=15,
                    procs=[Proc(pid=p, name="python3", gpu=p % 8) for p in range(16)],
                )
                for r in records(h):
                    full.ingest(r)
                c0 = time.process_time()
                for _ in range(5):
                    res = full.analyse(r.wall)
                analyse_cpu = (time.process_time() - c0) / 5
                scaled = tick_cpu / opts.interval_s + analyse_cpu / opts.analyse_every_s
                print(
                    f"one tick: {tick_cpu * 1000:.1f} ms CPU; one analysis of a full 6 h window "
                    f"({len(res.series)} series): {analyse_cpu * 1000:.0f} ms CPU"
                )
                print(
                    f"scaled to the defaults (tick every {opts.interval_s:g} s, analysis every "
                    f"{opts.analyse_every_s:g} s): {scaled * 100:.2f} % of one core"
                )
                # a real run at the default rate, with Prometheus-style scrapes every 15 s
                stop = threading.Event()
                scrapes = []

                def scrape() -> None:
                    while not stop.wait(15):
                        with contextlib.suppress(requests.RequestException):
                            scrapes.append(len(requests.get(w.exporter.url, timeout=5).text))

                t = threading.Thread(target=scrape, daemon=True)
                t.start()
                c0, w0 = time.process_time(), time.monotonic()
                w.run(stop, duration_s=run_s)
                cpu, wall = time.process_time() - c0, time.monotonic() - w0
                stop.set()
                print(
                    f"real run: {wall:.0f} s at the defaults, {len(scrapes)} scrapes of /metrics "
                    f"({scrapes[-1] if scrapes else 0} bytes): {cpu:.2f} s CPU = {cpu / wall * 100:.2f} % of one core"
                )
            finally:
                w.close()
    finally:
        for p in sleepers:
            p.kill()


def memory_week() -> None:
    state = WatchState(WatchConfig())
    day = History(
        hours=24, step_s=5, procs=[Proc(pid=p, name="python3", gpu=p % 8) for p in range(8)]
    )
    base = records(day)
    print(f"one simulated day: {len(base):,} records (every 5 s: GPU, host, server metrics)")
    tracemalloc.start()
    only_state = [
        tracemalloc.Filter(True, "*vramdoctor*")
    ]  # what the state allocated, not the input
    for d in range(7):
        if d:
            for rec in base:  # the next day, with new PIDs (restarts)
                rec.wall += 86400
                for p in getattr(rec, "processes", []):
                    p.pid += 100
        last_hour = -1.0
        for rec in base:
            state.ingest(rec)
            if rec.wall - last_hour >= 3600:
                state.analyse(rec.wall)
                last_hour = rec.wall
        state.analyse(rec.wall)
        held = sum(
            st.size
            for st in tracemalloc.take_snapshot().filter_traces(only_state).statistics("filename")
        )
        print(
            f"after day {d + 1}: {held / 2**20:6.2f} MiB held by the watch state, {state.series_count} series"
        )
    tracemalloc.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-s", type=float, default=120.0)
    ap.add_argument("--only", choices=("cpu", "memory"), help="run one part")
    args = ap.parse_args()
    print(f"cpu cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    if args.only != "memory":
        cpu_cost(args.run_s)
    if args.only != "cpu":
        memory_week()


if __name__ == "__main__":
    main()
