"""What vramdoctor's agent costs a server, side by side in one run, on a CUDA GPU.

Two copies of the reference server (`--mode plain --device cuda`: the fast image processor on
the GPU, one request = one 448x448 or 896x672 image), one started with the agent
(PYTHONPATH=$(vramdoctor agent-path), VRAMDOCTOR_AGENT_DIR) and one without, warmed up alike.
Requests go one at a time, alternating between the two in blocks of 10 so clock and thermal
drift hit both equally; each server gets --requests (>= 200). Prints request p50/p99 for both
and their ratios, plus a micro-benchmark in one process: the cost of one allocation+free with
the agent's history setting (state, Python stacks) against none, and one snapshot's time.

    python benchmarks/agent_overhead.py --requests 300 --json out.json
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MICRO = r"""
import json, time, torch
torch.cuda.init()
x = torch.empty(1, device="cuda")
def loop(n):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n):
        t = torch.empty(4096, device="cuda"); del t
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / n
res = {}
for rep in range(3):
    res.setdefault("off_us", []).append(loop(20000) * 1e6)
    torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")
    res.setdefault("state_python_us", []).append(loop(20000) * 1e6)
    torch.cuda.memory._record_memory_history(enabled=None)
torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")
keep = [torch.empty(1 << 20, device="cuda") for _ in range(200)]
for i in range(3):
    t0 = time.perf_counter(); s = torch.cuda.memory._snapshot(); res.setdefault("snapshot_ms_200_blocks", []).append((time.perf_counter() - t0) * 1e3)
print(json.dumps(res))
"""


LONG = r"""
import json, os, resource, sys, time, torch
toggle = sys.argv[1] == "toggle"
torch.cuda.init()
def rss_mib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
keep = [torch.empty(1 << 20, device="cuda") for _ in range(50)]
torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")
rows = []
for i in range(6):
    t0 = time.perf_counter()
    for _ in range(100000):
        t = torch.empty(4096, device="cuda"); del t
    loop_s = time.perf_counter() - t0
    if toggle:
        torch.cuda.memory._record_memory_history(enabled=None)
        torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")
    t0 = time.perf_counter(); torch.cuda.memory._snapshot(); snap_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter(); torch.cuda.memory._snapshot(); snap2_ms = (time.perf_counter() - t0) * 1e3
    rows.append({"allocs": (i + 1) * 100000, "alloc_free_us": loop_s * 10, "snapshot_ms": snap_ms,
                 "snapshot_again_ms": snap2_ms, "rss_mib": rss_mib()})
print(json.dumps(rows))
"""


def _png(w: int, h: int, seed: int) -> str:
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
        buf, format="PNG"
    )
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> int:
    import requests

    from vramdoctor.agent import agent_path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--micro-only", action="store_true", help="Only the in-process allocation/snapshot costs."
    )
    p.add_argument(
        "--long",
        action="store_true",
        help="600,000 allocations under the agent's history: snapshot time and host RSS as they go "
        "(armed once, and re-armed after every 100,000)",
    )
    args = p.parse_args()
    if args.long:
        res = {}
        for mode in ("once", "toggle"):
            out = subprocess.run(
                [sys.executable, "-c", LONG, mode], capture_output=True, text=True, timeout=300
            )
            res[mode] = (
                json.loads(out.stdout.strip().splitlines()[-1])
                if out.returncode == 0
                else out.stderr[-2000:]
            )
        print(json.dumps(res, indent=1))
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
        return 0
    if args.micro_only:
        out = subprocess.run(
            [sys.executable, "-c", MICRO], capture_output=True, text=True, timeout=300
        )
        print(out.stdout + out.stderr[-2000:])
        if args.json:
            args.json.write_text(
                out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
            )
        return 0
    images = [_png(448, 448, 1), _png(896, 672, 2)]
    agent_dir = tempfile.mkdtemp(prefix="vd-agent-bench-")
    procs = {}
    for name, port, agent in (("without", 18101, False), ("with", 18102, True)):
        env = dict(os.environ)
        if agent:
            env["PYTHONPATH"] = f"{agent_path()}{os.pathsep}{env.get('PYTHONPATH', '')}"
            env["VRAMDOCTOR_AGENT_DIR"] = agent_dir
        procs[name] = (
            subprocess.Popen(
                [
                    sys.executable,
                    "examples/reference_server/server.py",
                    "--mode",
                    "plain",
                    "--device",
                    "cuda",
                    "--port",
                    str(port),
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            port,
        )

    def post(port: int, i: int) -> float:
        body = {
            "model": "vramdoctor-reference",
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": images[i % 2]}}],
                }
            ],
        }
        t0 = time.perf_counter()
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
        r.raise_for_status()
        return time.perf_counter() - t0

    try:
        for _name, (_proc, port) in procs.items():
            deadline = time.time() + 240
            while True:
                try:
                    post(port, 0)
                    break
                except Exception:
                    if time.time() > deadline:
                        raise
                    time.sleep(1)
        armed = list(Path(agent_dir, "agents").glob("*.json"))
        for i in range(args.warmup):
            for _name, (_proc, port) in procs.items():
                post(port, i)
        lat: dict[str, list[float]] = {"without": [], "with": []}
        i = 0
        while min(len(v) for v in lat.values()) < args.requests:
            for name, (_proc, port) in procs.items():
                for j in range(10):
                    lat[name].append(post(port, i + j))
            i += 10
    finally:
        for proc, _port in procs.values():
            proc.terminate()
    micro = json.loads(
        subprocess.run([sys.executable, "-c", MICRO], capture_output=True, text=True, timeout=300)
        .stdout.strip()
        .splitlines()[-1]
    )
    res = {
        "requests_each": len(lat["with"]),
        "agent_armed_status_files": len(armed),
        "p50_ms": {k: statistics.median(v) * 1e3 for k, v in lat.items()},
        "p99_ms": {k: _pct(v, 0.99) * 1e3 for k, v in lat.items()},
        "micro": micro,
    }
    res["p50_ratio"] = res["p50_ms"]["with"] / res["p50_ms"]["without"]
    res["p99_ratio"] = res["p99_ms"]["with"] / res["p99_ms"]["without"]
    print(json.dumps(res, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
