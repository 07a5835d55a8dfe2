"""soak --cycle: what one lifecycle operation leaves behind, per cycle, through the server's
real endpoints: vLLM's sleep/wake_up and LoRA load/unload, SGLang's release/resume
memory occupation and LoRA load/unload, on real reference-server processes whose memory moves
for real (examples/reference_server/refserver/lifecycle.py). The truth is the server's own
count (GET /reference/info "lifecycle")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.cli import vd
from support.procs import free_port, pid_alive, ref_cmd, wait_gone
from support.refserver import MIB, ROOT, RefProc
from support.vgpu import VirtualGpu

from vramdoctor.record import read_run
from vramdoctor.samples import Event
from vramdoctor.soak.cycle import CYCLE_DO, CYCLE_UNDO

FAST = [
    "--requests",
    "5",
    "--concurrency",
    "2",
    "--idle",
    "1.5",
    "--interval",
    "0.1",
    "--text-only",
]
ADAPTER = str(ROOT / "examples" / "reference_server" / "adapters" / "tiny-lora")
VLLM_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}


def cycle(url: str, tmp: Path, what: str, *extra: str, env: dict | None = None) -> dict:
    r = vd(
        "soak",
        "--url",
        url,
        "--cycle",
        what,
        *FAST,
        *extra,
        "--out",
        str(tmp / "run.jsonl"),
        "--json",
        cwd=tmp,
        env=env,
        timeout=300,
    )
    assert r.returncode in (0, 1), r.stderr[-2000:]
    d = json.loads(r.stdout)
    d["_exit"] = r.returncode
    return d


def test_each_sleep_wake_cycle_that_keeps_a_staging_copy_is_a_leak_of_sleep(tmp_path) -> None:
    with RefProc(
        "sleep-leak",
        "--metrics-flavour",
        "vllm",
        "--enable-sleep-mode",
        "--cycle-leak-mib",
        "12",
        env=VLLM_ENV,
    ) as srv:
        d = cycle(srv.url, tmp_path, "sleep")
        info = srv.info()
    c = d["cycle"]
    assert d["_exit"] == 1 and c["verdict"] == "LEAK" and c["operation"] == "sleep"
    per_cycle = info["lifecycle"]["leaked_host_bytes"] / info["lifecycle"]["cycles"]["sleep"] / MIB
    assert per_cycle == pytest.approx(12)
    host = c["layers"]["host_anon"]
    assert host["verdict"] == "LEAK" and host["residue"]["value"] == pytest.approx(
        per_cycle, rel=0.1
    )
    assert host["held_change"] == pytest.approx(32, rel=0.2)  # the weights offloaded to the host
    assert c["layers"]["kv"]["verdict"] == "STABLE"
    run = read_run(tmp_path / "run.jsonl")
    calls = [
        e.data["call"]
        for e in run.records
        if isinstance(e, Event) and e.name in (CYCLE_DO, CYCLE_UNDO)
    ]
    assert calls[:2] == ["POST /sleep?level=1", "POST /wake_up"]
    assert len(calls) == 2 * info["lifecycle"]["cycles"]["sleep"]


def test_a_healthy_sleep_wake_leaves_nothing_and_exits_0(tmp_path) -> None:
    with RefProc("stable", "--metrics-flavour", "vllm", "--enable-sleep-mode", env=VLLM_ENV) as srv:
        d = cycle(srv.url, tmp_path, "sleep:2")
        info = srv.info()
    assert info["lifecycle"]["cycles"]["sleep"] >= 3
    assert d["_exit"] == 0 and d["cycle"]["verdict"] in ("STABLE", "INCONCLUSIVE"), d["cycle"][
        "headline"
    ]
    assert d["cycle"]["layers"]["host"]["verdict"] != "LEAK"


def test_release_resume_residue_on_the_gpu_page(tmp_path) -> None:
    with (
        VirtualGpu(tmp_path / "vgpu") as gpu,
        RefProc(
            "release-leak",
            "--metrics-flavour",
            "sglang",
            "--enable-memory-saver",
            "--cycle-leak-mib",
            "8",
            "--vgpu-dir",
            str(gpu.dir),
        ) as srv,
    ):
        d = cycle(srv.url, tmp_path, "release", "--gpu-metrics", gpu.metrics_url)
        info = srv.info()
    vram = d["cycle"]["layers"]["vram"]
    assert (
        info["lifecycle"]["leaked_device_bytes"] == 8 * MIB * info["lifecycle"]["cycles"]["release"]
    )
    assert vram["verdict"] == "LEAK" and vram["residue"]["value"] == pytest.approx(8, rel=0.1)
    # while released: weights (32), KV (64) and graphs (8) freed on the device
    assert vram["held_change"] == pytest.approx(-104, abs=9)
    assert d["cycle"]["layers"]["host"]["verdict"] != "LEAK"


@pytest.mark.parametrize(
    ("mode", "flavour", "leaks"),
    [("lora-leak", "vllm", True), ("lora-leak", "sglang", True), ("stable", "vllm", False)],
)
def test_lora_load_unload_cycles(tmp_path, mode, flavour, leaks) -> None:
    """lora-leak keeps each unloaded copy (2 MiB a cycle); vLLM's own LRU keeps the first copy
    (one rise, then flat): that is caching, not a leak of the operation."""
    with RefProc(mode, "--metrics-flavour", flavour, "--enable-lora", env=VLLM_ENV) as srv:
        d = cycle(srv.url, tmp_path, f"lora:tiny={ADAPTER}", env=VLLM_ENV)
        info = srv.info()
    host = d["cycle"]["layers"]["host_anon"]
    assert info["lifecycle"]["cycles"]["lora"] >= 3
    if leaks:
        assert host["verdict"] == "LEAK" and host["residue"]["value"] == pytest.approx(
            2.0, rel=0.15
        )
        assert d["_exit"] == 1
    else:
        assert host["verdict"] != "LEAK", host
        assert info["lifecycle"]["adapters_cached"] == {"tiny": 2 * MIB}


def test_a_lora_adapter_loaded_at_start_is_found_by_name_and_cycled_unload_first(tmp_path) -> None:
    """vLLM --lora-modules: the adapter is listed in /v1/models with its path (root); --cycle
    lora:NAME finds it, and as it is loaded, each cycle unloads it and loads it again."""
    with RefProc(
        "lora-leak",
        "--metrics-flavour",
        "vllm",
        "--enable-lora",
        "--lora-modules",
        f"tiny={ADAPTER}",
        env=VLLM_ENV,
    ) as srv:
        d = cycle(srv.url, tmp_path, "lora:tiny", env=VLLM_ENV)
        info = srv.info()
    c = d["cycle"]
    assert c["lora_path"] == ADAPTER and c["display"].startswith("unload and load again")
    run = read_run(tmp_path / "run.jsonl")
    calls = [
        e.data["call"]
        for e in run.records
        if isinstance(e, Event) and e.name in (CYCLE_DO, CYCLE_UNDO)
    ]
    assert calls[0].startswith("POST /v1/unload_lora_adapter") and calls[1].startswith(
        "POST /v1/load_lora_adapter"
    )
    assert "tiny" in info["lifecycle"]["adapters"]  # loaded again after the last cycle
    # each unloaded copy is kept: 2 MiB a cycle (the default suite's LoRA leak; the started-
    # empty variants of test_lora_load_unload_cycles are in the extended suite)
    host = c["layers"]["host_anon"]
    assert host["verdict"] == "LEAK", host
    assert host["residue"]["value"] == pytest.approx(2.0, rel=0.15), host
    assert d["_exit"] == 1


def test_a_request_leak_is_not_blamed_on_the_cycle(tmp_path) -> None:
    """The rounds themselves leak 512 KiB a request; the release/resume cycle leaves nothing:
    the residue per cycle is zero while every round grows."""
    with (
        VirtualGpu(tmp_path / "vgpu") as gpu,
        RefProc(
            "leaking",
            "--leak-kib",
            "512",
            "--cache-mib",
            "0",
            "--metrics-flavour",
            "sglang",
            "--enable-memory-saver",
            "--vgpu-dir",
            str(gpu.dir),
        ) as srv,
    ):
        d = cycle(srv.url, tmp_path, "release", "--gpu-metrics", gpu.metrics_url)
    host = d["cycle"]["layers"]["host_anon"]
    assert host["verdict"] != "LEAK", host
    assert abs(host["residue"]["value"]) < 1.0
    assert host["plain"]["value"] == pytest.approx(5 * 0.5, rel=0.2)  # what each round leaves
    assert d["cycle"]["layers"]["vram"]["verdict"] != "LEAK"


def test_vllm_sleep_without_dev_mode_is_one_line_naming_the_switch(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"}
    with RefProc("stable", "--metrics-flavour", "vllm", "--enable-sleep-mode", env=env) as srv:
        r = vd(
            "soak",
            "--url",
            srv.url,
            "--cycle",
            "sleep",
            *FAST,
            "--out",
            str(tmp_path / "r.jsonl"),
            cwd=tmp_path,
            env={"VLLM_SERVER_DEV_MODE": ""},
        )
    assert r.returncode == 2
    assert "VLLM_SERVER_DEV_MODE=1" in r.stderr and "Traceback" not in r.stderr


def test_an_operation_the_server_kind_has_not_is_refused_naming_what_it_has(tmp_path) -> None:
    with RefProc("stable", "--metrics-flavour", "sglang") as srv:
        r = vd(
            "soak",
            "--url",
            srv.url,
            "--cycle",
            "sleep",
            *FAST,
            "--out",
            str(tmp_path / "r.jsonl"),
            cwd=tmp_path,
        )
    assert r.returncode == 2
    assert "SGLang has no such operation (it has: release, lora)" in r.stderr


def test_a_lifecycle_call_that_fails_mid_soak_stops_with_exit_2(tmp_path) -> None:
    """LoRA routes gated off on this vLLM: the first load answers 404; one line, exit 2."""
    env = {"VLLM_SERVER_DEV_MODE": "1"}  # no VLLM_ALLOW_RUNTIME_LORA_UPDATING
    with RefProc("stable", "--metrics-flavour", "vllm", "--enable-lora", env=env) as srv:
        r = vd(
            "soak",
            "--url",
            srv.url,
            "--cycle",
            f"lora:tiny={ADAPTER}",
            *FAST,
            "--out",
            str(tmp_path / "r.jsonl"),
            "--json",
            cwd=tmp_path,
        )
    assert r.returncode == 2, r.stderr[-500:]
    d = json.loads(r.stdout)
    assert d["cycle"]["verdict"] == "FAILED"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in d["cycle"]["failed"]


@pytest.mark.parametrize("what", ["sleep:3", "release:x", "nap"])
def test_bad_cycle_values_are_one_line_and_exit_2(tmp_path, what) -> None:
    r = vd(
        "soak",
        "--url",
        "http://127.0.0.1:9",
        "--cycle",
        what,
        "--out",
        str(tmp_path / "r.jsonl"),
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "--cycle" in r.stderr and "Traceback" not in r.stderr


def test_cycle_with_launch_and_the_agent_leaves_nothing_behind(tmp_path) -> None:
    """--launch starts the server (the agent in its environment), --cycle runs against it,
    the verdict holds, and no process of the launch outlives the soak."""
    port = free_port()
    cmd = ref_cmd(
        "sleep-leak",
        port,
        "--metrics-flavour",
        "vllm",
        "--enable-sleep-mode",
        "--cycle-leak-mib",
        "12",
    )
    r = vd(
        "soak",
        "--cycle",
        "sleep",
        *FAST,
        "--out",
        str(tmp_path / "run.jsonl"),
        "--json",
        "--",
        *cmd,
        cwd=tmp_path,
        env=VLLM_ENV,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["cycle"]["layers"]["host_anon"]["verdict"] == "LEAK"
    assert d["cycle"]["layers"]["host_anon"]["residue"]["value"] == pytest.approx(12, rel=0.1)
    pid = d["launch"]["pid"]
    assert wait_gone([pid]) == [] and not pid_alive(pid)
