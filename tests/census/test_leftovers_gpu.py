"""On a GPU: a server's worker that outlives its server, holding GPU memory, is an orphan.

A launcher starts a real CUDA context holder titled `VLLM::Worker_TP0` (as vLLM's worker
processes are) and exits at once, as a crashed API server would: the worker lives on,
reparented, with its GPU memory. `vramdoctor census` must flag it (exit 1) and give the kill
command as text only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from support.cuda import CONTEXT_HOLDER, needs_nvml

from vramdoctor.sources.nvml import NvmlSource


@pytest.mark.gpu
@needs_nvml
def test_census_flags_a_real_orphaned_worker_holding_gpu_memory() -> None:
    launcher = textwrap.dedent(
        """
        import subprocess, sys
        p = subprocess.Popen(
            ["VLLM::Worker_TP0", "-c", sys.argv[1], "0:256"], executable=sys.executable,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        assert p.stdout.readline().strip() == "ready"
        print(p.pid, flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", launcher, CONTEXT_HOLDER],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    worker = int(out.stdout.strip())
    try:
        with NvmlSource([0]) as src:
            deadline = time.monotonic() + 20
            while worker not in {p.pid for p in src.sample().processes}:
                assert time.monotonic() < deadline, "NVML never listed the worker"
                time.sleep(0.2)
        r = subprocess.run(
            [sys.executable, "-m", "vramdoctor", "census", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "NO_COLOR": "1"},
        )
        assert r.returncode == 1, r.stderr
        doc = json.loads(r.stdout)
        orphans = doc["leftovers"]["orphan_processes"]
        print("orphans:", orphans)
        assert [o["pid"] for o in orphans if o["pid"] == worker] == [worker]
        assert any(f["code"] == "orphaned_gpu_process" and f["pid"] == worker for f in doc["flags"])
        assert any(
            f"kill {worker}" in line or f" {worker}" in line for line in doc["leftovers"]["cleanup"]
        )
        os.kill(worker, 0)  # still alive: census printed the command, it did not run it
    finally:
        os.kill(worker, signal.SIGKILL)
