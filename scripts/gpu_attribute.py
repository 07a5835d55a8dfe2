"""GPU acceptance of `soak --attribute` (issue 13), run by scripts/gpu_attribute.sh on a CUDA host.

Every server runs with vramdoctor's agent (PYTHONPATH=$(agent path), VRAMDOCTOR_AGENT_DIR);
this driver sends identical rounds of image requests, triggers a snapshot in every armed
process at the end of each idle window (vramdoctor.agent.Controller, the same code soak uses),
reads each server process's NVML usage at that moment, and diffs with vramdoctor.attribution.
Results: one JSON object per scenario in OUT/attribute_gpu.json.

Scenarios (run concurrently, each server on its own port):
  ref-bytes   reference server --mode leaking --leak-kind bytes --leak-kib 1024 (1 MiB kept/request)
  ref-kept    --leak-kind kept (each request's pixel tensor kept)
  ref-escape  --leak-kind escape (the output escapes a request-scoped MemPool)
  ref-plain   --mode plain (caching only)      ref-fixed  --mode fixed (request-scoped pool done right)
  ref-cpu     --device cpu with the agent: must create no CUDA context
  torch-cpu   a process that imports real torch but never initialises CUDA, with the agent
  tserve      `transformers serve` with a tiny random VLM (CACHING expected)
  tserve-leak the same, with VRAMDOCTOR_AGENT_TEST_LEAK on a request-path function
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vramdoctor.agent import Controller, agent_path  # noqa: E402
from vramdoctor.attribution import attribute, load_snapshot  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
WORK = Path(tempfile.mkdtemp(prefix="vd-attr-"))
ROUNDS = int(os.environ.get("ATTR_ROUNDS", "4"))
REQUESTS = int(os.environ.get("ATTR_REQUESTS", "40"))
IDLE_S = float(os.environ.get("ATTR_IDLE_S", "2"))
TSERVE_DEVICE = os.environ.get("ATTR_TSERVE_DEVICE", "cuda:0")
LOCK = threading.Lock()
LOG: list[str] = []


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    with LOCK:
        LOG.append(line)
    print(line, flush=True)


def nvml_by_pid() -> dict[int, int]:
    import pynvml

    out: dict[int, int] = {}
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        return out
    for i in range(count):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            out[p.pid] = out.get(p.pid, 0) + int(p.usedGpuMemory or 0)
    return out


def png(w: int, h: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


IMAGES = [png(448, 448, 1), png(896, 672, 2)]
SMALL = [png(64, 64, 3), png(96, 80, 4)]


def body(i: int, model: str, small: bool = False) -> dict:
    img = (SMALL if small else IMAGES)[i % 2]
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe this image"},
        {"type": "image_url", "image_url": {"url": img}}]}]}


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, env_extra: dict[str, str], agent: bool = True):
        self.name, self.cmd, self.port = name, cmd, port
        self.agent_dir = WORK / f"agent-{name}"
        self.env = dict(os.environ)
        if agent:
            self.env["PYTHONPATH"] = str(agent_path()) + os.pathsep + self.env.get("PYTHONPATH", "")
            self.env["VRAMDOCTOR_AGENT_DIR"] = str(self.agent_dir)
        self.env.update(env_extra)
        self.log_path = WORK / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.fh = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.fh, stderr=subprocess.STDOUT,
                                     cwd=str(REPO))

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, model: str, timeout_s: float = 240, small: bool = False) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.tail()}")
            try:
                r = requests.post(self.url() + "/v1/chat/completions", json=body(0, model, small), timeout=30)
                if r.status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} not ready: {self.tail()}")

    def tail(self) -> str:
        try:
            return self.log_path.read_text()[-1500:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def send_round(srv: Server, model: str, n: int, concurrency: int, small: bool = False) -> int:
    def one(i: int) -> bool:
        try:
            r = requests.post(srv.url() + "/v1/chat/completions", json=body(i, model, small), timeout=120)
            return r.status_code == 200
        except requests.RequestException:
            return False

    with ThreadPoolExecutor(concurrency) as ex:
        return sum(ex.map(one, range(n)))


def drive(srv: Server, model: str, *, rounds: int = ROUNDS, n: int = REQUESTS, concurrency: int = 4,
          small: bool = False) -> dict:
    """Baseline snapshot, then rounds; snapshots + NVML per armed pid after each idle window."""
    ctl = Controller(srv.agent_dir)
    time.sleep(IDLE_S)
    per_pid: dict[int, list[tuple[Path, int | None]]] = {}
    ok_per_round: list[int] = []
    snap_s: list[float] = []
    for rnd in range(rounds + 1):
        if rnd:
            ok_per_round.append(send_round(srv, model, n, concurrency, small))
            time.sleep(IDLE_S)
        files, missing = ctl.snapshot(rnd, timeout_s=15)
        files = ctl.move(files, WORK / f"snaps-{srv.name}")  # out of the agent dir: kept after close
        nv = nvml_by_pid()
        if missing:
            log(f"{srv.name}: round {rnd}: no answer from {[a.label() for a in missing]}")
        for f in files:
            per_pid.setdefault(f.pid, []).append((f.pickle_path, nv.get(f.pid)))
            if f.snapshot_s is not None:
                snap_s.append(f.snapshot_s)
    ctl.clear()
    result: dict = {"ok_per_round": ok_per_round, "armed": [a.label() for a in ctl.armed()],
                    "snapshot_s_max": max(snap_s) if snap_s else None, "processes": []}
    for pid, items in per_pid.items():
        snaps = [load_snapshot(p) for p, _ in items]
        nvml = [v for _, v in items]
        pa = attribute(snaps, requests=ok_per_round[-(len(snaps) - 1):] if len(snaps) > 1 else [],
                       nvml_used_bytes=nvml if all(v is not None for v in nvml) else None,
                       label=f"pid {pid}", pid=pid)
        d = pa.to_dict()
        d["nvml_bytes"] = nvml
        d["snapshot_files"] = [str(p) for p, _ in items]
        d["pickle_bytes"] = [p.stat().st_size for p, _ in items]
        result["processes"].append(d)
    return result


def scenario(name: str, fn, results: dict) -> None:
    t0 = time.time()
    try:
        results[name] = fn()
    except Exception as exc:
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    results[name]["wall_s"] = round(time.time() - t0, 1)
    log(f"{name}: done in {results[name]['wall_s']} s")
    with LOCK:  # written as each scenario ends: a run cut short keeps what finished
        (OUT / "attribute_gpu.json").write_text(json.dumps({**results, "log": LOG}, indent=1, default=str))


def ref_server(name: str, port: int, args: list[str]) -> Server:
    return Server(name, [sys.executable, "examples/reference_server/server.py", "--port", str(port), *args], port, {})


def run_reference(results: dict) -> None:
    servers = {
        "ref-bytes": ref_server("ref-bytes", 18001, ["--mode", "leaking", "--leak-kind", "bytes", "--leak-kib", "1024", "--device", "cuda"]),
        "ref-kept": ref_server("ref-kept", 18002, ["--mode", "leaking", "--leak-kind", "kept", "--device", "cuda"]),
        "ref-escape": ref_server("ref-escape", 18003, ["--mode", "leaking", "--leak-kind", "escape", "--device", "cuda"]),
        "ref-plain": ref_server("ref-plain", 18004, ["--mode", "plain", "--device", "cuda"]),
        "ref-fixed": ref_server("ref-fixed", 18005, ["--mode", "fixed", "--device", "cuda"]),
        "ref-cpu": ref_server("ref-cpu", 18006, ["--mode", "plain", "--device", "cpu"]),
    }
    for s in servers.values():
        s.start()
    threads = []
    for name, s in servers.items():
        def job(s=s, name=name) -> dict:
            s.wait_ready("vramdoctor-reference")
            res = drive(s, "vramdoctor-reference")
            res["truth"] = requests.get(s.url() + "/reference/info", timeout=10).json()
            res["server_pid"] = s.proc.pid if s.proc else None
            res["nvml_has_server_pid"] = (s.proc.pid in nvml_by_pid()) if s.proc else None
            res["agent_status_files"] = sorted(p.name for p in (s.agent_dir / "agents").glob("*.json")) if (s.agent_dir / "agents").exists() else []
            res["server_log_tail"] = s.tail()[-600:]
            return res
        t = threading.Thread(target=scenario, args=(name, job, results))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    for s in servers.values():
        s.stop()


def run_torch_cpu(results: dict) -> None:
    """Real torch imported, CUDA never initialised by the program: the agent must not create a context."""
    srv = Server("torch-cpu", [sys.executable, "tests/fixtures/attribute/agent_server.py", "--no-cuda"], 0, {})

    def job() -> dict:
        srv.start()
        time.sleep(8)
        port = None
        for line in srv.log_path.read_text().splitlines():
            if line.startswith("listening"):
                port = int(line.split()[1])
        if port:
            for _ in range(20):
                requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={}, timeout=30)
        time.sleep(3)
        pid = srv.proc.pid if srv.proc else -1
        nv = nvml_by_pid()
        return {"pid": pid, "nvml_has_pid": pid in nv, "nvml_pids": sorted(nv),
                "agent_status_files": sorted(p.name for p in (srv.agent_dir / "agents").glob("*.json"))
                if (srv.agent_dir / "agents").exists() else [], "log": srv.tail()[-400:]}

    try:
        scenario("torch-cpu", job, results)
    finally:
        srv.stop()


def run_tserve(results: dict) -> None:
    model_dir = WORK / "tinyvlm"
    subprocess.run([sys.executable, str(REPO / "scripts/make_tiny_vlm.py"), str(model_dir)], check=True,
                   capture_output=True, timeout=180)
    exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
    hf = WORK / "hf-cache"
    (hf / "hub").mkdir(parents=True, exist_ok=True)
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(hf), "HF_HUB_CACHE": str(hf / "hub")}
    serve_site = os.environ.get("ATTR_SERVE_SITE")  # fastapi/uvicorn/openai wheels (transformers[serving])
    if serve_site:
        env["PYTHONPATH"] = f"{agent_path()}{os.pathsep}{serve_site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    target = "transformers.cli.serving.chat_completion:ChatCompletionHandler._build_generation_config"
    servers = {
        "tserve": Server("tserve", [exe, "serve", str(model_dir), "--device", TSERVE_DEVICE, "--port", "18011",
                                    "--host", "127.0.0.1"], 18011, env),
        "tserve-leak": Server("tserve-leak", [exe, "serve", str(model_dir), "--device", TSERVE_DEVICE, "--port",
                                              "18012", "--host", "127.0.0.1"], 18012,
                              {**env, "VRAMDOCTOR_AGENT_TEST_LEAK": f"{target}:512"}),
    }
    for s in servers.values():
        s.start()
    threads = []
    for name, s in servers.items():
        def job(s=s) -> dict:
            s.wait_ready(str(model_dir), small=True)
            res = drive(s, str(model_dir), n=20, concurrency=2, small=True)
            res["target"] = target if "leak" in s.name else None
            res["server_log_tail"] = s.tail()[-800:]
            return res
        t = threading.Thread(target=scenario, args=(name, job, results))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    for s in servers.values():
        s.stop()


def run_soak_e2e(results: dict, name: str = "soak-e2e", srv: Server | None = None, model: str = "vramdoctor-reference",
                 extra: tuple[str, ...] = ()) -> None:
    """`vramdoctor soak --attribute DIR` end to end (default: the 1 MiB-per-request leak), then `report`."""
    srv = srv or ref_server(name, 18020, ["--mode", "leaking", "--leak-kind", "bytes", "--leak-kib", "1024",
                                          "--device", "cuda"])
    run_dir = OUT / name
    run_dir.mkdir(parents=True, exist_ok=True)

    def job() -> dict:
        srv.start()
        srv.wait_ready(model, small=bool(extra))
        env = {k: v for k, v in os.environ.items() if k not in ("VRAMDOCTOR_AGENT_DIR",)}
        cmd = [sys.executable, "-m", "vramdoctor", "soak", "--url", srv.url(), "--rounds", "3", "--no-adapt",
               "--requests", "30", "--idle", "4", "--attribute", str(srv.agent_dir),
               "--out", str(run_dir / "run.jsonl"), "--json", *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(REPO), env=env)
        rep = subprocess.run([sys.executable, "-m", "vramdoctor", "report", str(run_dir / "run.jsonl")],
                             capture_output=True, text=True, timeout=120, cwd=str(REPO), env=env)
        (run_dir / "soak.stdout").write_text(p.stdout)
        (run_dir / "soak.stderr").write_text(p.stderr)
        (run_dir / "report.txt").write_text(rep.stdout + rep.stderr)
        try:
            attribution = json.loads(p.stdout).get("attribution")
        except ValueError:
            attribution = None
        return {"cmd": " ".join(cmd), "rc": p.returncode, "report_rc": rep.returncode,
                "attribution": attribution, "stderr_tail": p.stderr[-1500:],
                "report_tail": (rep.stdout + rep.stderr)[-2500:],
                "verdict": (json.loads(p.stdout).get("verdict") if p.stdout.strip().startswith("{") else None),
                "truth": requests.get(srv.url() + "/reference/info", timeout=10).json() if not extra else None}

    try:
        scenario(name, job, results)
    finally:
        srv.stop()


def main() -> int:
    results: dict = {"rounds": ROUNDS, "requests": REQUESTS, "idle_s": IDLE_S}
    import torch

    results["torch"] = torch.__version__
    results["python"] = sys.version.split()[0]
    results["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    del torch
    which = sys.argv[1:] or ["reference", "torch-cpu", "tserve", "soak"]
    t_ref = threading.Thread(target=run_reference, args=(results,)) if "reference" in which else None
    t_ts = threading.Thread(target=scenario, args=("tserve-all", lambda: (run_tserve(results) or {}), results)) \
        if "tserve" in which else None
    for t in (t_ref, t_ts):
        if t:
            t.start()
    if "torch-cpu" in which:
        run_torch_cpu(results)
    if "soak" in which:
        run_soak_e2e(results)
    if "soak-tserve" in which:  # soak --attribute on transformers serve with the test-only leak
        model_dir = WORK / "tinyvlm-soak"
        subprocess.run([sys.executable, str(REPO / "scripts/make_tiny_vlm.py"), str(model_dir)], check=True,
                       capture_output=True, timeout=180)
        exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
        hf = WORK / "hf-cache-soak"
        (hf / "hub").mkdir(parents=True, exist_ok=True)
        target = "transformers.cli.serving.chat_completion:ChatCompletionHandler._build_generation_config"
        env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(hf), "HF_HUB_CACHE": str(hf / "hub"),
               "VRAMDOCTOR_AGENT_TEST_LEAK": f"{target}:512"}
        serve_site = os.environ.get("ATTR_SERVE_SITE")
        if serve_site:
            env["PYTHONPATH"] = f"{agent_path()}{os.pathsep}{serve_site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        srv = Server("soak-tserve", [exe, "serve", str(model_dir), "--device", TSERVE_DEVICE, "--port", "18021",
                                     "--host", "127.0.0.1"], 18021, env)
        run_soak_e2e(results, "soak-tserve", srv, str(model_dir),
                     ("--model", str(model_dir), "--image-size", "64x64", "--max-tokens", "4", "--concurrency", "2"))
    for t in (t_ref, t_ts):
        if t:
            t.join()
    results["log"] = LOG
    (OUT / "attribute_gpu.json").write_text(json.dumps(results, indent=1, default=str))
    keep = OUT / "ref-snapshots"
    keep.mkdir(exist_ok=True)
    # real servers' snapshot series (small) for the CPU tests
    for name in ("ref-bytes", "ref-escape", "tserve-leak"):
        for proc in (results.get(name) or {}).get("processes", []):
            for f in proc.get("snapshot_files", []):
                shutil.copy(f, keep / (f"{name}-" + Path(f).name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
