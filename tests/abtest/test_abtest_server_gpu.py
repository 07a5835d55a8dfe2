"""`soak --launch` and `ab-test --server` on a CUDA GPU (skipped without one: `pytest -m gpu`).

The reference server keeps 1 MiB on the GPU per request (`--leak-kind bytes`): launched by
vramdoctor, its VRAM leak is found through NVML per process at about that rate, the server's
own fix (REFERENCE_FREE_REQUEST_BUFFERS=1) is the recommended variant, and after the run no
process of the server holds the GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import cli_env, free_port, pid_alive

pytestmark = pytest.mark.gpu

REF = ["examples/reference_server/server.py", "--device", "cuda", "--mode", "leaking"]
REF += ["--leak-kind", "bytes", "--leak-kib", "1024"]
TRAFFIC = ["--rounds", "4", "--requests", "16", "--concurrency", "2", "--idle", "3"]
TRAFFIC += ["--interval", "0.25", "--stop-grace", "20", "--startup-timeout", "300"]


def _gpu_pids() -> set[int]:
    from vramdoctor.sources.nvml import NvmlSource

    with NvmlSource() as src:
        return {p.pid for p in src.sample().processes}


def test_soak_launch_finds_the_vram_leak_and_leaves_the_gpu(tmp_path: Path) -> None:
    port = free_port()
    before = _gpu_pids()
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "soak", "--out", str(tmp_path / "run.jsonl"),
         *TRAFFIC, "--json", "--", sys.executable, *REF, "--port", str(port)],
        capture_output=True, text=True, env=cli_env(), timeout=600, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    vram = doc["layers"]["vram"]
    assert vram["verdict"] == "LEAK", doc["headline"]
    assert 0.8 <= vram["rate_mib_per_request"] <= 1.5, vram
    assert doc["culprit"]["pid"] == doc["launch"]["pid"]
    assert not pid_alive(doc["launch"]["pid"])
    assert _gpu_pids() <= before  # nothing of the server is left on the GPU


def test_ab_test_server_recommends_the_servers_own_fix_on_the_gpu(tmp_path: Path) -> None:
    port = free_port()
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "ab-test", "--out", str(tmp_path / "ab"), *TRAFFIC,
         "--json", "--preset", "expandable-segments", "--variant",
         "fixed=REFERENCE_FREE_REQUEST_BUFFERS=1", "--", sys.executable, *REF, "--port", str(port)],
        capture_output=True, text=True, env=cli_env(), timeout=900, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {row["name"]: row for row in doc["rows"]}
    assert rows["baseline"]["layers"]["vram"]["verdict"] == "LEAK"
    assert rows["expandable-segments"]["layers"]["vram"]["verdict"] == "LEAK"  # not a fix
    assert rows["fixed"]["layers"]["vram"]["verdict"] in ("STABLE", "CACHING")
    assert doc["recommendation"]["variant"] == "fixed"
    assert all(not row["leftovers"] for row in doc["rows"])
