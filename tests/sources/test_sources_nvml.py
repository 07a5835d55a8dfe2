"""NVML source. Without NVML (CI): one clear line and exit 2. On a GPU machine (marked `gpu`):
real samples, a real CUDA context seen per process, and census flagging a real stray context.

The GPU tests make CUDA contexts through the driver API (libcuda via ctypes), so they need
an NVIDIA driver but not torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from support.cli import vd as _vd
from support.cuda import NVML_OK, NVML_WHY, hold_contexts, hold_titled, needs_nvml

from vramdoctor.census.analysis import CONTEXT_MIB, census
from vramdoctor.errors import SourceUnavailable
from vramdoctor.samples import GpuSample
from vramdoctor.sources.nvml import NvmlSource

no_nvml_only = pytest.mark.skipif(NVML_OK, reason="NVML works here; this checks the no-driver path")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return _vd(*args)


@no_nvml_only
def test_without_nvml_the_source_names_what_is_missing_and_the_remote_option() -> None:
    with pytest.raises(SourceUnavailable) as err:
        NvmlSource().open()
    message = str(err.value)
    assert "NVML" in message and "--gpu-metrics" in message and "dcgm-exporter" in message
    assert "\n" not in message
    assert message == NVML_WHY


@no_nvml_only
@pytest.mark.parametrize("args", [["census"], ["census", "--json"]])
def test_census_without_nvml_exits_2_with_one_line(args: list[str]) -> None:
    r = run_cli(*args)
    assert r.returncode == 2
    if "--json" in args:  # scripts get the error as a JSON object on stdout too
        error = json.loads(r.stdout)
        assert error["exit_code"] == 2 and error["error"].startswith("NVML")
    else:
        assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0].startswith("vramdoctor: error: NVML")


# --- on a GPU machine -------------------------------------------------------------------


def wait_for_pid(src: NvmlSource, pid: int, gpus: set[int], timeout: float = 20.0) -> GpuSample:
    deadline = time.monotonic() + timeout
    while True:
        s = src.sample()
        if {p.gpu for p in s.processes if p.pid == pid} >= gpus:
            return s
        if time.monotonic() > deadline:
            pytest.fail(f"NVML never listed PID {pid} on GPUs {sorted(gpus)}; rows: {s.processes}")
        time.sleep(0.2)


@pytest.mark.gpu
@needs_nvml
def test_nvml_sample_is_consistent() -> None:
    import pynvml

    with NvmlSource() as src:
        a = src.sample()
        b = src.sample()
        devices = src.devices()
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    assert [g.index for g in a.gpus] == list(range(count)) == [d["index"] for d in devices]
    assert b.t > a.t and b.wall >= a.wall and a.source == "nvml"
    for g in a.gpus:
        assert g.total_mib > 1000 and g.uuid and g.uuid.startswith(("GPU-", "MIG-")) and g.name
        accounted = g.used_mib + g.free_mib + (g.driver_reserved_mib or 0.0)
        assert abs(accounted - g.total_mib) <= 0.01 * g.total_mib, g
    print("NVML sample:", json.dumps(a.to_dict())[:2000])


@pytest.mark.gpu
@needs_nvml
def test_nvml_lists_a_real_cuda_context_with_name_and_command() -> None:
    proc = hold_contexts("0:256")
    try:
        with NvmlSource([0]) as src:
            s = wait_for_pid(src, proc.pid, {0})
        row = next(p for p in s.processes if p.pid == proc.pid)
        print(f"context + 256 MiB on GPU 0: NVML charges {row.used_mib} MiB to PID {proc.pid}")
        assert row.visible and row.name and "python" in row.name
        assert row.cmdline and row.cmdline[-1] == "0:256"  # our holder, read from /proc
        assert row.used_mib is not None and 256 + 100 <= row.used_mib <= 256 + 1500
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.gpu
@needs_nvml
def test_census_flags_a_real_stray_context_on_a_second_gpu() -> None:
    with NvmlSource() as src:
        if len(src.sample().gpus) < 2:
            pytest.skip("needs two GPUs")
        proc = hold_contexts("1:4096", "0:0")  # main work on GPU 1, a bare context on GPU 0
        try:
            s = wait_for_pid(src, proc.pid, {0, 1})
        finally:
            proc.kill()
            proc.wait()
    c = census(s)
    row = next(p for p in c.processes if p.pid == proc.pid)
    print(f"per GPU for the holder: {row.per_gpu}")
    assert row.main_gpu == 1
    assert "multi_gpu" in row.flags
    ctx = row.per_gpu[0]
    assert ctx is not None
    assert CONTEXT_MIB[0] <= ctx <= CONTEXT_MIB[1], (
        f"a bare context measured {ctx} MiB: outside {CONTEXT_MIB}"
    )
    assert "stray_context" in row.flags


@pytest.mark.gpu
@needs_nvml
def test_census_command_on_this_gpu_machine() -> None:
    proc = hold_contexts("0:128")
    try:
        with NvmlSource([0]) as src:
            wait_for_pid(src, proc.pid, {0})
        r = run_cli("census", "--json")
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["source"] == "nvml" and doc["gpus"]
    assert proc.pid in {p["pid"] for p in doc["processes"]}


@pytest.mark.gpu
@needs_nvml
def test_census_with_a_gpu_index_that_does_not_exist() -> None:
    r = run_cli("census", "--gpu", "4096")
    assert r.returncode == 2
    assert "no GPU with index 4096" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
@needs_nvml
def test_nvml_reachable_memory_on_a_real_driver() -> None:
    import pynvml

    with NvmlSource() as src:
        s = src.sample()
    has_limits = hasattr(pynvml, "nvmlDeviceGetMemoryLimits_v1")
    for g in s.gpus:
        print(
            f"GPU {g.index}: total {g.total_mib:.0f} MiB, reachable {g.reachable_mib:.0f} MiB "
            f"({g.reachable_by}); soft limit {g.soft_limit_mib}; binding has limits call: {has_limits}"
        )
        assert g.reachable_mib is not None and 0 < g.reachable_mib <= g.total_mib
        assert g.reachable_by
        if g.driver_reserved_mib is not None and "hard memory limit" not in g.reachable_by:
            assert abs(g.reachable_mib - (g.total_mib - g.driver_reserved_mib)) < 1.0


@pytest.mark.gpu
@needs_nvml
def test_nvml_scope_owner_and_title_of_real_contexts() -> None:
    server = hold_titled("VLLM::Worker_TP0", "0:64")
    tenant = hold_contexts("0:32")
    try:
        with NvmlSource([0], server_pids=lambda: {server.pid}) as src:
            wait_for_pid(src, server.pid, {0})
            s = wait_for_pid(src, tenant.pid, {0})
    finally:
        for p in (server, tenant):
            p.kill()
            p.wait()
    rows = {p.pid: p for p in s.processes}
    assert rows[server.pid].scope == "server" and rows[tenant.pid].scope == "tenant"
    assert rows[server.pid].title_role == "vllm worker TP0"
    assert rows[server.pid].uid == os.getuid() and rows[server.pid].ppid == os.getpid()
    print("scoped rows:", [(p.pid, p.scope, p.title_role, p.used_mib) for p in s.processes])
