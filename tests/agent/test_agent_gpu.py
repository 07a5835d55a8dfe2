"""The agent in real CUDA processes (real torch, a real GPU): its inside evidence is PyTorch's own
count, it never creates a context, and empty_cache inside a memory-pool context frees nothing.

Run on the GPU machine: `python -m pytest -q -m gpu tests/agent/test_agent_gpu.py`.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from support.agent import agent_server  # noqa: E402

from vramdoctor.agent import Controller, list_agents  # noqa: E402

MIB = 1024 * 1024


def post(port: int, n: int = 1) -> None:
    import requests

    for _ in range(n):
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={}, timeout=60)
        assert r.status_code == 200


def nvml_pids() -> set[int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        out: set[int] = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            out |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return out
    finally:
        pynvml.nvmlShutdown()


def test_cuda_counters_are_pytorchs_own_and_grow_with_kept_tensors(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--keep-kib", "1024", fake_torch=False)
    try:
        post(srv.port)
        deadline = time.monotonic() + 60
        while not [a for a in list_agents(agent_dir) if a.state == "armed"]:
            assert time.monotonic() < deadline, srv.text()
            time.sleep(0.2)
        ctl = Controller(agent_dir)
        allocated = []
        for rnd in range(4):
            post(srv.port, 5 if rnd else 0)
            (reply,), missing = ctl.collect(rnd, want=["inside"], timeout_s=20)
            assert missing == []
            inside = reply.inside or {}
            (dev,) = [d for d in inside["cuda"] if d["allocated_bytes"]]
            assert dev["reserved_bytes"] >= dev["allocated_bytes"]
            assert dev["pools"] and dev["pools"][0]["pool_id"] == [0, 0]
            allocated.append(dev["allocated_bytes"])
            # The first read takes the process's first allocator snapshot: once, slowly (5.1-5.5
            # s on an H200 with the history armed, scripts/gpu_first_snapshot.py); later reads,
            # snapshot included, are fast (1-6 ms) and keep the per-pool split.
            assert inside["cuda_ms"] is not None and (rnd == 0 or inside["cuda_ms"] < 1000)
        steps = [b - a for a, b in itertools.pairwise(allocated)]
        assert all(s == 5 * MIB for s in steps), allocated  # 5 requests x 1 MiB kept, exactly
        ctl.close()
    finally:
        srv.stop()


def test_a_process_with_torch_that_never_uses_cuda_gets_no_context(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    srv = agent_server(tmp_path, agent_dir, "--no-cuda", fake_torch=False)
    try:
        post(srv.port, 3)
        ctl = Controller(agent_dir)
        (reply,), _ = ctl.collect(1, want=["inside", "snapshot"], timeout_s=20)
        assert reply.inside is not None and reply.inside["cuda"] is None
        assert reply.snapshot is None
        time.sleep(1)
        assert srv.proc.pid not in nvml_pids()
        ctl.close()
    finally:
        srv.stop()


MEMPOOL = r"""
import json, torch
MIB = 1 << 20
torch.cuda.init()
pool = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool):
    xs = [torch.empty(64 * MIB, dtype=torch.uint8, device="cuda") for _ in range(8)]
    del xs
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    inside = torch.cuda.memory_reserved()
torch.cuda.empty_cache()
outside = torch.cuda.memory_reserved()
del pool
torch.cuda.empty_cache()
dropped = torch.cuda.memory_reserved()
print(json.dumps({"before": before, "inside": inside, "outside": outside, "dropped": dropped}))
"""


def test_empty_cache_inside_a_mem_pool_context_frees_nothing() -> None:
    """A live MemPool's segments are not the caching allocator's to free: empty_cache() frees
    nothing of them, inside the pool's context or outside it; only dropping the pool does
    (measured on the H200, torch 2.11, 2026-12-01: 512 MiB before, inside and outside; 0 after
    `del pool`; docs/attribute.md)."""
    out = subprocess.run(
        [sys.executable, "-c", MEMPOOL],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("VRAMDOCTOR_AGENT")},
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["before"] >= 8 * 64 * MIB
    assert d["inside"] == d["before"]  # nothing freed inside the context
    assert d["outside"] == d["before"]  # nor outside it, while the pool lives
    assert d["dropped"] < d["before"]  # dropping the pool is what gives its segments back
