"""What `--launch` costs: the keeper between vramdoctor and the server, side by side in one run.

For the reference server (CPU mode), N times each, interleaved:
- start to first answer: `subprocess.Popen` + polling GET /v1/models, against
  `vramdoctor.soak.launch.launch()` + `LaunchedServer.wait_ready()` (keeper, agent env, log file);
- stop: `terminate()` + `wait()`, against `LaunchedServer.stop()` (SIGTERM to the group and every
  descendant, the tree read twice empty, the keeper's report);
- the keeper's own CPU while the server runs (its 0.2 s select loop and 1 s tree scan), as CPU
  seconds per minute of wall time.

    python benchmarks/launch_overhead.py [--n 5] [--json out.json]

Prints medians and the ratios launch / direct. Nothing here is a test: timings depend on the
machine; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vramdoctor.soak.launch import LaunchSpec, launch  # noqa: E402

SERVER = ROOT / "examples" / "reference_server" / "server.py"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cmd(port: int) -> list[str]:
    return [sys.executable, str(SERVER), "--port", str(port), "--mode", "stable", "--device", "cpu"]


def _wait(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/v1/models", timeout=1).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


def direct() -> tuple[float, float]:
    port = _free_port()
    t0 = time.monotonic()
    p = subprocess.Popen(_cmd(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(f"http://127.0.0.1:{port}", t0 + 60)
    ready = time.monotonic() - t0
    t1 = time.monotonic()
    p.terminate()
    p.wait(30)
    return ready, time.monotonic() - t1


def launched(folder: Path, i: int) -> tuple[float, float, float]:
    port = _free_port()
    spec = LaunchSpec(argv=tuple(_cmd(port)), stop_grace_s=10)
    t0 = time.monotonic()
    server = launch(spec, run_dir=folder, stem=f"b{i}")
    server.wait_ready(f"http://127.0.0.1:{port}", poll_s=0.05)
    ready = time.monotonic() - t0
    keeper = psutil.Process(server.keeper.pid)
    c0 = sum(keeper.cpu_times()[:2])
    w0 = time.monotonic()
    time.sleep(3.0)
    cpu_per_min = (sum(keeper.cpu_times()[:2]) - c0) / (time.monotonic() - w0) * 60.0
    t1 = time.monotonic()
    server.stop()
    return ready, time.monotonic() - t1, cpu_per_min


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    d_ready, d_stop, l_ready, l_stop, l_cpu = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.n):  # interleaved: drift in the machine's load hits both alike
            r, s = direct()
            d_ready.append(r)
            d_stop.append(s)
            r, s, c = launched(Path(tmp), i)
            l_ready.append(r)
            l_stop.append(s)
            l_cpu.append(c)
    med = statistics.median
    out = {
        "n": args.n,
        "direct_ready_s": med(d_ready),
        "launch_ready_s": med(l_ready),
        "ready_ratio": med(l_ready) / med(d_ready),
        "direct_stop_s": med(d_stop),
        "launch_stop_s": med(l_stop),
        "stop_ratio": med(l_stop) / med(d_stop),
        "keeper_cpu_s_per_min": med(l_cpu),
    }
    print(f"start to first answer: direct {out['direct_ready_s']:.2f} s, --launch "
          f"{out['launch_ready_s']:.2f} s (x{out['ready_ratio']:.2f})")  # fmt: skip
    print(f"stop: direct {out['direct_stop_s']:.2f} s, --launch {out['launch_stop_s']:.2f} s "
          f"(x{out['stop_ratio']:.2f})")  # fmt: skip
    print(f"keeper CPU while the server runs: {out['keeper_cpu_s_per_min']:.2f} s per minute")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
