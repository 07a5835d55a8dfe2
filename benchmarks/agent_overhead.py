"""What vramdoctor's agent costs a server, side by side in one run (CUDA GPU, or --host on CPU).

Two copies of the reference server (`--mode plain --device cuda`: the fast image processor on
the GPU, one request = one 448x448 or 896x672 image), one started with the agent
(PYTHONPATH=$(vramdoctor agent-path), VRAMDOCTOR_AGENT_DIR) and one without, warmed up alike.
Requests go one at a time, alternating between the two in blocks of 10 so clock and thermal
drift hit both equally; each server gets --requests (>= 200). Prints request p50/p99 for both
and their ratios, plus a micro-benchmark in one process: the cost of one allocation+free with
the agent's history setting (state, Python stacks) against none, and one snapshot's time.

    python benchmarks/agent_overhead.py --requests 300 --json out.json

`--host` (no GPU needed): the inside evidence on the host side. Three copies of the reference
server on the CPU (`--mode plain --device cpu`: PIL decoding and the image processor in numpy),
without the agent, with it, and with it tracing Python allocations (`--trace-python`), requests
alternating in blocks of 5 (the order rotated each block), latency and the CPU time each server
process spent per request; then what one answer costs inside the server (glibc's
`mallinfo2()`, tracemalloc's snapshot, the trigger-to-answer round trip), and `mallinfo2()`'s
time against the number of free chunks it walks (a process that fragments its heap on purpose).

    python benchmarks/agent_overhead.py --host --requests 200 --json host.json
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


MALLINFO = r"""
import ctypes, json, random, sys, time
n = int(sys.argv[1])
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
class M(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = M
rng = random.Random(0)
ptrs = [libc.malloc(rng.randrange(64, 4096)) for _ in range(n)]
for p in ptrs[::2]:
    libc.free(p)          # every other chunk freed: holes the later ones pin in place
libc.free(libc.malloc(1 << 16))  # a larger request sorts the freed chunks into bins
times = []
for _ in range(7):
    t0 = time.perf_counter(); info = libc.mallinfo2(); times.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"chunks_allocated": n, "free_chunks": info.ordblks + info.smblks,
                  "free_kept_mib": info.fordblks / 2**20, "in_use_mib": info.uordblks / 2**20,
                  "call_ms_median": sorted(times)[3], "call_ms_max": max(times)}))
"""


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("RssAnon:")).split()[1])


def _physics() -> dict[str, object]:
    """What each allocator counts for three kinds of host growth (tests/fixtures/attribute/
    agent_server.py, 4 requests a round, 3 rounds): glibc in-use, Python blocks, RssAnon."""
    import re

    import requests

    from vramdoctor.agent import Controller, agent_path

    work = Path(tempfile.mkdtemp(prefix="vd-agent-physics-"))
    server = REPO / "tests" / "fixtures" / "attribute" / "agent_server.py"
    out: dict[str, object] = {}
    for name, flags in (
        ("malloc 256 KiB kept", ["--malloc-leak-kib", "256"]),
        ("4 MiB malloc'd and freed (1 in 32 kept until the next)", ["--churn-kib", "4096"]),
        ("20,000 small Python objects kept", ["--py-leak-objects", "20000"]),
    ):
        agent_dir = work / re.sub(r"[^a-z0-9]+", "-", name)
        env = dict(os.environ)
        env["PYTHONPATH"] = f"{agent_path()}{os.pathsep}{env.get('PYTHONPATH', '')}"
        env["VRAMDOCTOR_AGENT_DIR"] = str(agent_dir)
        env["VRAMDOCTOR_AGENT_POLL_S"] = "0.05"
        proc = subprocess.Popen(
            [sys.executable, str(server), "--no-torch", *flags],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline().split()[1])
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            requests.post(url, json={}, timeout=10)
            ctl = Controller(agent_dir)
            rows = []
            for rnd in range(4):
                for _ in range(4 if rnd else 0):
                    requests.post(url, json={}, timeout=10)
                (reply,), _ = ctl.collect(rnd, want=["inside"], timeout_s=15)
                inside = reply.inside or {}
                rows.append(
                    {
                        "round": rnd,
                        "glibc_in_use_kib": (inside.get("glibc") or {}).get("in_use_bytes", 0)
                        // 1024,
                        "python_blocks": (inside.get("python") or {}).get("allocated_blocks"),
                        "rss_anon_kib": _rss_anon_kib(proc.pid),
                    }
                )
            ctl.close()
            out[name] = rows
        finally:
            proc.terminate()
            proc.wait(10)
    return out


def _host(args: argparse.Namespace) -> dict[str, object]:
    """--host: see the module docstring."""
    import requests

    from vramdoctor.agent import Controller, agent_path

    images = [_png(448, 448, 1), _png(896, 672, 2)]
    work = Path(tempfile.mkdtemp(prefix="vd-agent-host-"))
    procs: dict[str, tuple[subprocess.Popen[bytes], int, Path | None]] = {}
    for name, port, agent in (
        ("without", 18111, False),
        ("with", 18112, True),
        ("with_trace_python", 18113, True),
    ):
        env = dict(os.environ)
        agent_dir = work / name if agent else None
        if agent_dir is not None:
            env["PYTHONPATH"] = f"{agent_path()}{os.pathsep}{env.get('PYTHONPATH', '')}"
            env["VRAMDOCTOR_AGENT_DIR"] = str(agent_dir)
        procs[name] = (
            subprocess.Popen(
                [
                    sys.executable,
                    "examples/reference_server/server.py",
                    "--mode",
                    "plain",
                    "--device",
                    "cpu",
                    "--port",
                    str(port),
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            port,
            agent_dir,
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

    res: dict[str, object] = {}
    controllers: dict[str, Controller] = {}
    try:
        for _name, (_proc, port, _d) in procs.items():
            deadline = time.time() + 120
            while True:
                try:
                    post(port, 0)
                    break
                except Exception:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.5)
        for name, (_proc, _port, agent_dir) in procs.items():
            if agent_dir is not None:
                ctl = controllers[name] = Controller(agent_dir, expires_s=3600)
                deadline = time.time() + 30
                while not ctl.ready() and time.time() < deadline:
                    time.sleep(0.1)
                ctl.collect(0, want=["inside"], trace_python=name.endswith("trace_python"))
        for i in range(args.warmup):
            for _name, (_proc, port, _d) in procs.items():
                post(port, i)
        lat: dict[str, list[float]] = {k: [] for k in procs}
        cpu0 = {k: _cpu_s(proc.pid) for k, (proc, _port, _d) in procs.items()}
        order = list(procs)
        i = 0
        while min(len(v) for v in lat.values()) < args.requests:
            for name in order:  # blocks of 5, the order rotated each time: no server goes first
                port = procs[name][1]
                for j in range(5):
                    lat[name].append(post(port, i + j))
            order = order[1:] + order[:1]
            i += 5
        res["requests_each"] = min(len(v) for v in lat.values())
        # CPU time the server process spent per request (/proc/PID/stat utime + stime): what the
        # agent costs the server itself, much less sensitive than latency to other load on the host
        res["server_cpu_ms_per_request"] = {
            k: (_cpu_s(proc.pid) - cpu0[k]) * 1e3 / len(lat[k])
            for k, (proc, _p, _d) in procs.items()
        }
        res["p50_ms"] = {k: statistics.median(v) * 1e3 for k, v in lat.items()}
        res["p99_ms"] = {k: _pct(v, 0.99) * 1e3 for k, v in lat.items()}
        p50, p99 = res["p50_ms"], res["p99_ms"]
        assert isinstance(p50, dict) and isinstance(p99, dict)
        res["p50_ratio"] = {k: p50[k] / p50["without"] for k in p50}
        res["p99_ratio"] = {k: p99[k] / p99["without"] for k in p99}
        answers: dict[str, object] = {}
        for name, ctl in controllers.items():
            rows = []
            for seq in range(1, 6):
                t0 = time.perf_counter()
                (reply,), _ = ctl.collect(
                    seq, want=["inside"], trace_python=name.endswith("trace_python")
                )
                inside = reply.inside or {}
                glibc = inside.get("glibc") or {}
                python = inside.get("python") or {}
                rows.append(
                    {
                        "round_trip_ms": (time.perf_counter() - t0) * 1e3,
                        "mallinfo2_ms": glibc.get("call_ms"),
                        "free_chunks": glibc.get("free_chunks"),
                        "tracemalloc_ms": python.get("call_ms"),
                        "tracemalloc_overhead_mib": (python.get("overhead_bytes") or 0) / 2**20,
                    }
                )
            answers[name] = rows
            ctl.close()
        res["answers"] = answers
    finally:
        for proc, _port, _d in procs.values():
            proc.terminate()
    res["physics"] = _physics()
    res["mallinfo2_vs_free_chunks"] = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", MALLINFO, str(n)],
                capture_output=True,
                text=True,
                timeout=300,
            ).stdout
        )
        for n in (200, 20_000, 200_000, 1_600_000)
    ]
    return res


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
    p.add_argument(
        "--host",
        action="store_true",
        help="No GPU: the host-side inside evidence (reference server on the CPU; mallinfo2's cost)",
    )
    args = p.parse_args()
    if args.host:
        res = _host(args)
        print(json.dumps(res, indent=1))
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
        return 0
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
