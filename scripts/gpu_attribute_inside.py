"""GPU checks of the agent's inside evidence, the MemPool/empty_cache fact, torch 2.14's pinned
host history, and the attribution showcase run. Run by scripts/gpu_attribute.sh on a CUDA host:

    bash scripts/gpu_attribute.sh inside mempool showcase

Steps (argv; default all), one JSON object per step in $OUT/attribute_inside.json, written as each
step ends (a run cut short keeps what finished):

  inside    the reference server with the agent, one at a time on the GPU: `--mode leaking
            --leak-kind bytes --leak-kib 1024` (truth: CUDA allocated +1 MiB per request),
            `--mode plain` (allocated flat; reserved rises in round 1 and stays), `--leak-kind
            escape` (output escapes a request-scoped MemPool: private pools in the split); and a
            process that imports real torch and never initialises CUDA (`agent_server.py
            --no-cuda`): its answers must say "no CUDA" and NVML must never list it. For each:
            the InsideSample fields per round (through vramdoctor.agent.Controller, the code soak
            uses), the time each part took inside the server, NVML per process.
  mempool   torch.cuda.empty_cache() inside an active torch.cuda.use_mem_pool context and
            outside it: reserved bytes before/after each (facts.md says: nothing freed inside).
  torch214  with torch >= 2.14 only: arm `_record_memory_history(..., record_pinned_host_memory=
            True)`, keep pinned tensors from a named function, snapshot; writes the snapshot's
            keys and the shape of one host segment, and the pickle as a fixture for the CPU
            tests ($OUT/fixtures-214/). Older torch: says so and does nothing else.
  showcase  the attribution showcase of docs/attribute.md, recorded from the situation it
            describes: ONE server (reference, 1 MiB kept per request) alone on the GPU (refuses
            to run when NVML lists any other process), `vramdoctor soak --attribute DIR`, then
            `vramdoctor report` of the run; $OUT/showcase/ holds run.jsonl, run.attribution/,
            report.txt and soak.json: copy the first two to tests/fixtures/attribute/soak_run/.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vramdoctor.agent import Controller, agent_path  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
WORK = Path(tempfile.mkdtemp(prefix="vd-inside-"))
RESULTS: dict[str, Any] = {}
MIB = 1024 * 1024


def save() -> None:
    (OUT / "attribute_inside.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def step(name: str, fn: Callable[[], dict[str, Any]]) -> None:
    t0 = time.time()
    try:
        RESULTS[name] = fn()
    except Exception as exc:
        RESULTS[name] = {
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-3000:],
        }
    RESULTS[name]["wall_s"] = round(time.time() - t0, 1)
    print(
        f"[{time.strftime('%H:%M:%S')}] {name}: {RESULTS[name].get('error') or 'done'} "
        f"({RESULTS[name]['wall_s']} s)",
        flush=True,
    )
    save()


def nvml_by_pid() -> dict[int, int]:
    import pynvml

    out: dict[int, int] = {}
    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            out[p.pid] = out.get(p.pid, 0) + int(p.usedGpuMemory or 0)
    return out


def png(w: int, h: int, seed: int) -> str:
    import base64
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
        buf, format="PNG"
    )
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


IMAGES = [png(448, 448, 1), png(896, 672, 2)]


def agent_env(agent_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{agent_path()}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["VRAMDOCTOR_AGENT_DIR"] = str(agent_dir)
    return env


class Server:
    def __init__(self, name: str, argv: list[str], port: int) -> None:
        self.name, self.port = name, port
        self.agent_dir = WORK / f"agent-{name}"
        self.log = WORK / f"{name}.log"
        self.fh = open(self.log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv, env=agent_env(self.agent_dir), stdout=self.fh, stderr=subprocess.STDOUT, cwd=REPO
        )

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, i: int) -> bool:
        import requests

        body = {
            "model": "vramdoctor-reference",
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "describe"},
                        {"type": "image_url", "image_url": {"url": IMAGES[i % 2]}},
                    ],
                }
            ],
        }
        try:
            return (
                requests.post(
                    self.url() + "/v1/chat/completions", json=body, timeout=120
                ).status_code
                == 200
            )
        except requests.RequestException:
            return False

    def wait_ready(self, timeout_s: float = 240) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.tail()}")
            if self.post(0):
                return
            time.sleep(1)
        raise RuntimeError(f"{self.name} not ready: {self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-1500:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.fh.close()


def reference(name: str, port: int, *args: str) -> Server:
    return Server(
        name,
        [
            sys.executable,
            "examples/reference_server/server.py",
            "--port",
            str(port),
            "--device",
            "cuda",
            *args,
        ],
        port,
    )


def inside_rounds(srv: Server, rounds: int = 4, per_round: int = 30) -> dict[str, Any]:
    ctl = Controller(srv.agent_dir)
    time.sleep(2)
    rows: list[dict[str, Any]] = []
    for rnd in range(rounds + 1):
        ok = sum(srv.post(i) for i in range(per_round)) if rnd else 0
        time.sleep(2)
        t0 = time.perf_counter()
        replies, missing = ctl.collect(rnd, want=["inside"], timeout_s=20)
        took = (time.perf_counter() - t0) * 1e3
        nv = nvml_by_pid()
        for r in replies:
            inside = r.inside or {}
            rows.append(
                {
                    "round": rnd,
                    "ok": ok,
                    "pid": r.pid,
                    "program": r.program,
                    "collect_ms": round(took, 1),
                    "nvml_bytes": nv.get(r.pid),
                    "cuda": inside.get("cuda"),
                    "cuda_ms": inside.get("cuda_ms"),
                    "pinned": inside.get("pinned"),
                    "glibc": inside.get("glibc"),
                    "python": inside.get("python"),
                    "error": inside.get("error"),
                }
            )
        if missing:
            rows.append({"round": rnd, "missing": [a.label() for a in missing]})
    ctl.close()
    return {"rows": rows, "server_pid": srv.proc.pid, "log_tail": srv.tail()[-600:]}


def run_inside() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, args in (
        ("leak-1mib", ("--mode", "leaking", "--leak-kind", "bytes", "--leak-kib", "1024")),
        ("plain", ("--mode", "plain")),
        ("escape", ("--mode", "leaking", "--leak-kind", "escape")),
    ):
        srv = reference(name, 18040, *args)
        try:
            srv.wait_ready()
            out[name] = inside_rounds(srv)
            import requests

            out[name]["truth"] = requests.get(srv.url() + "/reference/info", timeout=10).json()
        finally:
            srv.stop()
        save()
    cpu = Server(
        "torch-no-cuda",
        [sys.executable, "tests/fixtures/attribute/agent_server.py", "--no-cuda"],
        0,
    )
    try:
        time.sleep(8)
        port = next(
            int(line.split()[1])
            for line in cpu.log.read_text().splitlines()
            if line.startswith("listening")
        )
        import requests

        for _ in range(10):
            requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={}, timeout=30)
        ctl = Controller(cpu.agent_dir)
        replies, missing = ctl.collect(1, want=["inside", "snapshot"], timeout_s=20)
        ctl.close()
        out["torch-no-cuda"] = {
            "pid": cpu.proc.pid,
            "answers": [r.inside for r in replies],
            "missing": [a.label() for a in missing],
            "nvml_has_pid": cpu.proc.pid in nvml_by_pid(),
            "alive": cpu.proc.poll() is None,
            "log_tail": cpu.tail()[-600:],
        }
    finally:
        cpu.stop()
    return out


MEMPOOL = r"""
import json, torch
torch.cuda.init()
MIB = 1 << 20
res = {"torch": torch.__version__}
pool = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool):
    xs = [torch.empty(64 * MIB, dtype=torch.uint8, device="cuda") for _ in range(32)]
    del xs
    res["reserved_before_inside_mib"] = torch.cuda.memory_reserved() / MIB
    torch.cuda.empty_cache()
    res["reserved_after_empty_cache_inside_mib"] = torch.cuda.memory_reserved() / MIB
res["reserved_after_leaving_context_mib"] = torch.cuda.memory_reserved() / MIB
torch.cuda.empty_cache()
res["reserved_after_empty_cache_outside_mib"] = torch.cuda.memory_reserved() / MIB
del pool
torch.cuda.empty_cache()
res["reserved_after_pool_deleted_mib"] = torch.cuda.memory_reserved() / MIB
ys = [torch.empty(64 * MIB, dtype=torch.uint8, device="cuda") for _ in range(32)]
del ys
res["default_pool_reserved_before_mib"] = torch.cuda.memory_reserved() / MIB
torch.cuda.empty_cache()
res["default_pool_reserved_after_mib"] = torch.cuda.memory_reserved() / MIB
print(json.dumps(res))
"""


def run_mempool() -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-c", MEMPOOL], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


TORCH214 = r"""
import json, pickle, sys, torch
v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
if v < (2, 14):
    print(json.dumps({"torch": torch.__version__, "skipped": "torch older than 2.14: no host_segments"}))
    sys.exit(0)
torch.cuda.init()
torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python",
                                         record_pinned_host_memory=True)
KEPT = []
def keep_pinned():
    KEPT.append(torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True))
snaps = []
for rnd in range(4):
    for _ in range(3):
        keep_pinned()
    s = torch.cuda.memory._snapshot()
    snaps.append(s)
    pickle.dump(s, open(sys.argv[1] + f"/pinned-{rnd}.pickle", "wb"), protocol=4)
s = snaps[-1]
host = s.get("host_segments") or []
print(json.dumps({"torch": torch.__version__, "keys": sorted(s), "host_segments": len(host),
                  "host_traces": len(s.get("host_traces") or []),
                  "first_host_segment_keys": sorted(host[0]) if host else None,
                  "first_host_block_keys": sorted(host[0]["blocks"][0]) if host and host[0].get("blocks") else None,
                  "host_memory_stats": {k: v for k, v in torch.cuda.host_memory_stats().items() if k.endswith("current")}}))
"""


def run_torch214() -> dict[str, Any]:
    fx = OUT / "fixtures-214"
    fx.mkdir(exist_ok=True)
    p = subprocess.run(
        [sys.executable, "-c", TORCH214, str(fx)], capture_output=True, text=True, timeout=120
    )
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    if "skipped" not in res:
        from vramdoctor.attribution.snapshots import attribute_memories, load_snapshot

        snaps = [load_snapshot(q) for q in sorted(fx.glob("pinned-*.pickle"))]
        res["attribution"] = [pa.to_dict() for pa in attribute_memories(snaps, requests=[3, 3, 3])]
    return res


def run_showcase() -> dict[str, Any]:
    others = nvml_by_pid()
    if others:
        return {
            "error": f"refused: other processes use the GPU {sorted(others)}; the showcase is one server alone"
        }
    run_dir = OUT / "showcase"
    run_dir.mkdir(exist_ok=True)
    srv = reference(
        "showcase", 18050, "--mode", "leaking", "--leak-kind", "bytes", "--leak-kib", "1024"
    )
    try:
        srv.wait_ready()
        time.sleep(2)
        env = {k: v for k, v in os.environ.items() if k != "VRAMDOCTOR_AGENT_DIR"}
        cmd = [
            sys.executable,
            "-m",
            "vramdoctor",
            "soak",
            "--url",
            srv.url(),
            "--rounds",
            "3",
            "--no-adapt",
            "--requests",
            "30",
            "--idle",
            "4",
            "--attribute",
            str(srv.agent_dir),
            "--out",
            str(run_dir / "run.jsonl"),
            "--json",
        ]
        seen: set[int] = set()
        p = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env
        )
        while p.poll() is None:  # who is on the GPU while the showcase runs
            seen.update(nvml_by_pid())
            time.sleep(1)
        stdout, stderr = p.communicate()
        rep = subprocess.run(
            [sys.executable, "-m", "vramdoctor", "report", str(run_dir / "run.jsonl")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env={**env, "NO_COLOR": "1"},
        )
        (run_dir / "soak.json").write_text(stdout)
        (run_dir / "soak.stderr").write_text(stderr)
        (run_dir / "report.txt").write_text(rep.stdout + rep.stderr)
        import requests

        return {
            "cmd": " ".join(cmd),
            "rc": p.returncode,
            "report_rc": rep.returncode,
            "gpu_pids_seen": sorted(seen),
            "server_pid": srv.proc.pid,
            "only_the_server_on_the_gpu": seen <= {srv.proc.pid},
            "truth": requests.get(srv.url() + "/reference/info", timeout=10).json(),
            "report_head": (rep.stdout + rep.stderr)[:3000],
        }
    finally:
        srv.stop()


def main() -> int:
    import torch

    RESULTS["torch"] = torch.__version__
    RESULTS["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    RESULTS["python"] = sys.version.split()[0]
    del torch
    steps = {
        "inside": run_inside,
        "mempool": run_mempool,
        "torch214": run_torch214,
        "showcase": run_showcase,
    }
    for name in sys.argv[1:] or list(steps):
        step(name, steps[name])
    save()
    pickle.dumps(RESULTS)  # plain data only
    return 0


if __name__ == "__main__":
    sys.exit(main())
