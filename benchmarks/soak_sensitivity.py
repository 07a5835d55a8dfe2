"""How small a leak does `vramdoctor soak` call LEAK, without calling caching a leak?

Runs the real thing: the reference server (examples/reference_server) as a subprocess, and
`vramdoctor soak --json` against it, side by side in one run:

- a ladder of leak sizes per request (leaking mode), largest first, each against a fresh server;
  the smallest size called LEAK (with every larger one called LEAK too) is the sensitivity;
- N caching runs (plain mode, fresh server each): every LEAK verdict there is a false alarm;
- the wall time of each soak, which is the time to a verdict at these settings.

CPU (default): the leak and the cache are host RAM; the RSS series carries the verdict.
GPU (--gpu): the server keeps --leak-kib KiB on the GPU per request (--leak-kind bytes) next to
the real fast image processor on CUDA; NVML per process carries the verdict.

    python benchmarks/soak_sensitivity.py                 # CPU, 4 rounds x 50 requests
    python benchmarks/soak_sensitivity.py --gpu --idle 5  # on a GPU host

Prints a table and one JSON line (also written to --out/sensitivity.json when --out is given).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples" / "reference_server" / "server.py"


# The checkout's package, whether or not it is installed (the GPU machine may run it in place).
ENV = {**os.environ, "NO_COLOR": "1", "CI": "1",
       "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def start_server(mode: str, device: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0", "--mode", mode,
                             "--device", device, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"reference server did not start: {line.strip()} {proc.stdout.read()[-500:]}")
    return proc, m.group(1)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def soak(url: str, args: argparse.Namespace, out: Path) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "vramdoctor", "soak", "--url", url, "--json", "--out", str(out),
           "--rounds", str(args.rounds), "--requests", str(args.requests),
           "--concurrency", str(args.concurrency), "--idle", str(args.idle),
           "--interval", str(args.interval)]
    for size in args.image_size:
        cmd += ["--image-size", size]
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    wall = time.monotonic() - start
    if r.returncode not in (0, 1):
        raise SystemExit(f"soak failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout), wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="VRAM on a CUDA GPU instead of host RSS")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--idle", type=float, default=2.0)
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--caching-runs", type=int, default=10)
    p.add_argument("--sizes-kib", default=None,
                   help="comma-separated leak sizes per request, KiB (default: 512 down to 8)")
    p.add_argument("--image-size", action="append", default=None)
    p.add_argument("--out", type=Path, default=None, help="keep run files and the JSON here")
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when piped to a file
    args.image_size = args.image_size or ["128x128", "256x192"]
    device = "cuda" if args.gpu else "cpu"
    sizes = [float(x) for x in (args.sizes_kib or "512,256,128,64,32,16,8").split(",")]
    work = args.out or Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-sensitivity-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    extra_leak = ["--leak-kind", "bytes"] if args.gpu else []

    rows = []
    misses = 0
    print(f"{'run':<22}{'verdict':<14}{'estimate MiB/req':>18}{'truth MiB/req':>15}{'error':>8}{'wall s':>8}")
    for kib in sizes:
        proc, url = start_server("leaking", device, ["--leak-kib", str(kib), *extra_leak])
        try:
            d, wall = soak(url, args, work / f"leak-{kib:g}.jsonl")
            truth = requests.get(url + "/reference/info", timeout=10).json()["leak_bytes_per_request"] / 2**20
        finally:
            stop(proc)
        est = d["leak_mib_per_request"]
        err = None if est is None else (est - truth) / truth
        rows.append({"leak_kib": kib, "verdict": d["verdict"], "estimate_mib": est, "truth_mib": truth,
                     "rel_error": err, "wall_s": wall})
        print(f"{'leak ' + format(kib, 'g') + ' KiB/req':<22}{d['verdict']:<14}"
              f"{'-' if est is None else format(est, '.4f'):>18}{truth:>15.4f}"
              f"{'-' if err is None else format(err, '+.0%'):>8}{wall:>8.1f}")
        misses = misses + 1 if d["verdict"] != "LEAK" else 0
        if misses >= 2:
            break
    caching = []
    for i in range(args.caching_runs):
        proc, url = start_server("plain", device, [])
        try:
            d, wall = soak(url, args, work / f"caching-{i}.jsonl")
        finally:
            stop(proc)
        caching.append({"verdict": d["verdict"], "wall_s": wall})
        print(f"{'caching run ' + str(i + 1):<22}{d['verdict']:<14}{'-':>18}{'-':>15}{'-':>8}{wall:>8.1f}")

    smallest = None
    for r in rows:  # largest first: the sensitivity is the end of the unbroken LEAK run
        if r["verdict"] != "LEAK":
            break
        smallest = r
    false_leaks = sum(1 for c in caching if c["verdict"] == "LEAK")
    summary = {
        "benchmark": "soak_sensitivity",
        "target": "vram" if args.gpu else "host_rss",
        "rounds": args.rounds, "requests_per_round": args.requests, "idle_s": args.idle,
        "concurrency": args.concurrency,
        "smallest_leak_called_kib": None if smallest is None else smallest["leak_kib"],
        "smallest_leak_called_mib_per_request": None if smallest is None else smallest["truth_mib"],
        "rate_error_at_smallest": None if smallest is None else smallest["rel_error"],
        "false_leaks": false_leaks, "caching_runs": len(caching),
        "caching_verdicts": {v: sum(1 for c in caching if c["verdict"] == v)
                             for v in sorted({c["verdict"] for c in caching})},
        "time_to_verdict_s_median": sorted(r["wall_s"] for r in rows + caching)[len(rows + caching) // 2]
        if rows or caching else None,
        "ladder": rows,
    }
    print()
    print(f"smallest leak called LEAK: {summary['smallest_leak_called_kib']} KiB/request "
          f"({args.rounds} rounds x {args.requests} requests); false LEAK in caching runs: "
          f"{false_leaks}/{len(caching)}; time to a verdict ~{summary['time_to_verdict_s_median']:.0f} s")
    line = json.dumps(summary)
    print(line)
    if args.out:
        (args.out / "sensitivity.json").write_text(line + "\n")
    return 0 if false_leaks == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
