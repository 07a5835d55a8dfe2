"""Record the CPU-side showcase of docs/attribute.md from the situation it describes: ONE server
with ONE leak, the agent in it, nothing else.

The reference server on the CPU (`--mode leaking --device cpu --leak-kib 1024`: 1 MiB of host
memory kept per request, every page touched) started with the agent, soaked by
`vramdoctor soak` (no --attribute: the inside evidence is on by itself) with `--trace-python`,
then `vramdoctor report` on the run. Writes OUT/run.jsonl, OUT/report.txt (NO_COLOR, 100
columns) and OUT/truth.json (the server's own GET /reference/info at the end). The report's JSON
is tests/fixtures/report_golden/'s business (tests/core/test_report_golden.py --write).

    python scripts/record_showcase.py tests/fixtures/attribute/showcase_cpu

The GPU showcase (`--attribute`, one server alone on the GPU) is scripts/gpu_attribute.sh
showcase.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vramdoctor.agent import agent_path  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "showcase_cpu").resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in ("run.jsonl", "report.txt", "truth.json"):
        (out / name).unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vd-showcase-"))
    agent_dir = work / "agent"
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{agent_path()}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["VRAMDOCTOR_AGENT_DIR"] = str(agent_dir)
    port = 18061
    server = subprocess.Popen(
        [
            sys.executable,
            "examples/reference_server/server.py",
            "--mode",
            "leaking",
            "--device",
            "cpu",
            "--leak-kib",
            "1024",
            "--port",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                requests.get(url + "/v1/models", timeout=5).raise_for_status()
                break
            except requests.RequestException:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("the reference server did not start") from None
                time.sleep(0.5)
        clean = {k: v for k, v in os.environ.items() if not k.startswith("VRAMDOCTOR_AGENT")}
        soak = subprocess.run(
            [
                sys.executable,
                "-m",
                "vramdoctor",
                "soak",
                "--url",
                url,
                "--rounds",
                "5",
                "--no-adapt",
                "--requests",
                "30",
                "--idle",
                "4",
                "--trace-python",
                "--out",
                str(out / "run.jsonl"),
                "--json",
            ],
            cwd=REPO,
            env=clean,
            capture_output=True,
            text=True,
            timeout=600,
        )
        print(soak.stderr[-3000:], file=sys.stderr)
        truth = requests.get(url + "/reference/info", timeout=10).json()
        (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    finally:
        server.terminate()
        server.wait(15)
    report_env = {**clean, "NO_COLOR": "1", "COLUMNS": "100"}
    rep = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(out / "run.jsonl")],
        cwd=REPO,
        env=report_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (out / "report.txt").write_text(rep.stdout)
    print(f"soak exit {soak.returncode}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
