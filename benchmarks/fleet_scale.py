"""fleet's cost on a real Prometheus: 100 GPU series x 7 days at 15 s resolution, and how it grows.

Builds the history with promtool's backfill (dcgm-exporter-shaped series: 13 hosts x 8 GPUs,
one series in ten leaking), starts Prometheus on loopback, then times `run_fleet` end to end
(Prometheus query time, JSON transfer and parsing, analysis) for several series counts and
ranges, at the raw 15 s resolution (chunked: 40,320 points a series over 7 days) and at the
default 5-minute step (Prometheus's min_over_time does the downsampling).

    python3 benchmarks/fleet_scale.py            # ~2-3 minutes on 2 cores; prints a table
    python3 benchmarks/fleet_scale.py --quick    # 2 days only
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).parents[1]))
from vramdoctor.fleet import run_fleet

STEP_S = 15.0
HOSTS, GPUS = 13, 8  # 104 GPU series


def write_history(path: Path, end: float, days: float) -> int:
    n = int(days * 86400 / STEP_S)
    t = end - STEP_S * np.arange(n)[::-1]
    hours = (t - t[0]) / 3600
    rng = np.random.default_rng(3)
    ts_text = [f"{x:.0f}" for x in t]
    count = 0
    with path.open("w") as fh:
        fh.write("# TYPE DCGM_FI_DEV_FB_USED gauge\n")
        for h in range(HOSTS):
            for g in range(GPUS):
                leak = 30.0 if (h * GPUS + g) % 10 == 0 else 0.0
                busy = rng.random(n) < 0.6
                used = np.round(
                    30_000 + leak * hours + busy * rng.random(n) * 800 + rng.normal(0, 3, n)
                )
                lab = f'{{gpu="{g}",Hostname="h{h:03d}",UUID="GPU-{h}-{g}",instance="h{h:03d}:9400",job="dcgm"}}'
                fh.writelines(
                    f"DCGM_FI_DEV_FB_USED{lab} {v:.0f} {s}\n"
                    for v, s in zip(used.tolist(), ts_text, strict=True)
                )
                count += n
        fh.write("# EOF\n")
    return count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--repeat", type=int, default=1, help="run each row this many times (the best is shown)"
    )
    args = ap.parse_args()
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        sys.exit("needs prometheus and promtool (apt-get install prometheus)")
    days = 2.0 if args.quick else 7.0
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    try:
        end = (time.time() // 60) * 60 - 600
        t0 = time.perf_counter()
        samples = write_history(tmp / "h.om", end, days)
        t1 = time.perf_counter()
        subprocess.run(
            [
                "promtool",
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "--max-block-duration=192h",
                "-q",
                str(tmp / "h.om"),
                str(tmp / "data"),
            ],
            check=True,
        )
        t2 = time.perf_counter()
        (tmp / "h.om").unlink()
        print(
            f"history: {samples:,} samples ({HOSTS * GPUS} series x {days:g} days at {STEP_S:g} s); "
            f"text {t1 - t0:.1f} s, promtool backfill {t2 - t1:.1f} s"
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        (tmp / "p.yml").write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp / 'p.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=3650d",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(150):
                try:
                    if requests.get(url + "/-/ready", timeout=1).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.2)
            print(f"cpu cores: {os.cpu_count()}")
            print(
                f"{'series':>7} {'days':>5} {'step':>6} {'points':>11} {'query s':>8} {'total s':>8} {'leaks':>6}"
            )
            host_sets = {13: r"h00[0-1]", 26: r"h00[0-3]", 52: r"h00[0-6]", 104: r"h0.*"}
            runs = [
                (104, days, 300.0),
                (52, days, 300.0),
                (26, days, 300.0),
                (104, days / 2, 300.0),
                (104, 1.0, 300.0),
                (104, days, 60.0),
                (104, days, 15.0),
                (52, days, 15.0),
                (26, days, 15.0),
                (104, days / 2, 15.0),
                (104, 1.0, 15.0),
            ]
            for n_series, d, step in runs:
                regex = host_sets[n_series]
                best = None
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    res = run_fleet(
                        url, days=d, end=end, step_s=step, matchers=[f'Hostname=~"{regex}"']
                    )
                    total = time.perf_counter() - start
                    if best is None or total < best[0]:
                        best = (total, res)
                assert best is not None
                total, res = best
                q = sum(x["seconds"] for x in res.queries)
                pts = sum(x["points"] for x in res.queries)
                print(
                    f"{len(res.rows):>7} {d:>5g} {step:>5g}s {pts:>11,} {q:>8.2f} {total:>8.2f} {len(res.leaks):>6}"
                )
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
