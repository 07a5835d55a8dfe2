"""soak --vary and --cycle on a real CUDA GPU (NVML per process; real pinned host memory).
Skipped without an NVIDIA GPU (tests/conftest.py). Run on the GPU host: pytest -m gpu."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import vd
from support.refserver import MIB, RefProc

pytestmark = pytest.mark.gpu
FAST = ["--requests", "8", "--concurrency", "4", "--idle", "2", "--interval", "0.25"]


def _soak(url: str, tmp: Path, *args: str, env: dict | None = None) -> dict:
    r = vd(
        "soak",
        "--url",
        url,
        *FAST,
        *args,
        "--out",
        str(tmp / "run.jsonl"),
        "--json",
        cwd=tmp,
        env=env,
        timeout=900,
    )
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return json.loads(r.stdout)


def test_vary_names_a_vram_leak_of_large_images_on_nvml(tmp_path) -> None:
    with RefProc(
        "leak-on-large-images",
        "--leak-layer",
        "vram",
        "--leak-kib",
        "1024",
        device="cuda",
        timeout=300,
    ) as srv:
        d = _soak(srv.url, tmp_path, "--vary", "image-size,stream")
        info = srv.info()
    vram = d["vary"]["layers"]["vram"]
    assert info["device_memory"]["kind"] == "cuda"
    assert vram["culprits"] == ["image-size"], vram
    # NVML sees the caching allocator's segments: 1 MiB tensors land in 2 MiB-rounded blocks
    assert 0.9 <= vram["features"]["image-size"]["value"] <= 2.1


def test_cycle_names_pinned_host_memory_kept_per_sleep_wake(tmp_path) -> None:
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    with RefProc(
        "sleep-leak", "--metrics-flavour", "vllm", "--enable-sleep-mode", "--weights-mib", "128",
        "--cycle-leak-mib", "16", env=env, device="cuda", timeout=300,
    ) as srv:  # fmt: skip
        d = _soak(srv.url, tmp_path, "--cycle", "sleep", "--text-only", env=env)
        info = srv.info()
    pinned = d["cycle"]["layers"]["host_pinned"]
    assert info["lifecycle"]["leaked_host_bytes"] == 16 * MIB * info["lifecycle"]["cycles"]["sleep"]
    assert pinned["verdict"] == "LEAK" and pinned["residue"]["value"] == pytest.approx(16, rel=0.2)
    vram = d["cycle"]["layers"]["vram"]
    assert vram["held_change"] is not None and vram["held_change"] < -100  # weights + KV freed
