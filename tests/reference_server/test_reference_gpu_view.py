"""Whose GPU memory it is: the reference server's virtual GPU on a CPU-only
machine, served as real exporter pages (tests/support/vgpu.py), with real processes: a second
process of another owner, two servers on one GPU, two MIG slices, a SIGKILLed server."""

from __future__ import annotations

import os
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from support.refserver import MIB, RefProc, Traffic, alive
from support.vgpu import VirtualGpu


def _samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    text = requests.get(url, timeout=10).text
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out.append((dict(s.labels), float(s.value)))
    return out


def _process_mib(gpu: VirtualGpu) -> dict[int, float]:
    return {
        int(labels["pid"]): value
        for labels, value in _samples(gpu.metrics_url, "process_gpu_memory_MiB")
    }


def _flushed(srv: RefProc) -> None:
    time.sleep(0.35)  # the record is replaced at most every 0.1 s after a change


def test_vram_leaking_process_grows_on_the_exporter_page_by_its_rate(tmp_path) -> None:
    with VirtualGpu(tmp_path / "vgpu") as gpu:
        with RefProc("vram-leaking", "--leak-kib", "1024", "--vgpu-dir", str(gpu.dir)) as srv:
            _flushed(srv)
            before = _process_mib(gpu)[srv.pid]
            Traffic(srv.url, sizes=()).round(20)
            _flushed(srv)
            after = _process_mib(gpu)[srv.pid]
            info = srv.info()
        assert before == pytest.approx(500, abs=0.01)  # the virtual CUDA context
        assert after - before == pytest.approx(20, abs=0.01)  # 1 MiB a request
        assert info["device_memory"]["allocated_bytes"] == 20 * MIB
        assert info["truth"]["layers"]["vram"]["verdict"] == "LEAK"
        time.sleep(0.2)
        assert srv.pid not in _process_mib(gpu)  # gone from the page once it exited


def test_tenant_is_another_owners_process_outside_the_server_tree_and_ends_with_it(
    tmp_path,
) -> None:
    with VirtualGpu(tmp_path / "vgpu") as gpu:
        srv = RefProc("tenant", "--tenant-mib-per-s", "8", "--vgpu-dir", str(gpu.dir))
        try:
            tenant = srv.info()["tenant"]
            pid = tenant["pid"]
            assert pid and alive(pid), srv.stderr_lines
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            assert ppid != srv.pid  # not the server's child
            with open(f"/proc/{srv.pid}/task/{srv.pid}/children") as fh:
                tree = {srv.pid} | {int(c) for c in fh.read().split()}
            assert pid not in tree
            if os.getuid() == 0:
                assert tenant["uid"] != 0 and tenant["user"] == "nobody"
            time.sleep(0.5)
            first, t0 = _process_mib(gpu), time.monotonic()
            Traffic(srv.url).round(8)  # the server's traffic does not drive the tenant
            time.sleep(2.0)
            second, t1 = _process_mib(gpu), time.monotonic()
            assert second[pid] - first[pid] == pytest.approx(8 * (t1 - t0), rel=0.2)
            assert second[srv.pid] == pytest.approx(first[srv.pid], abs=0.01)  # server: flat
            truth = srv.info()["truth"]
            assert truth["tenant"]["pid"] == pid and truth["tenant"]["decides"] is False
        finally:
            srv.stop()
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid)  # nothing outlives the server
        assert pid not in _process_mib(gpu)


def test_two_servers_on_one_gpu_only_the_leaking_one_grows(tmp_path) -> None:
    with VirtualGpu(tmp_path / "vgpu") as gpu:
        with (
            RefProc("vram-leaking", "--leak-kib", "2048", "--vgpu-dir", str(gpu.dir)) as leaky,
            RefProc("plain", "--vgpu-dir", str(gpu.dir)) as other,
        ):
            _flushed(leaky)
            first = _process_mib(gpu)
            for srv in (leaky, other):
                Traffic(srv.url).round(10)
            _flushed(leaky)
            second = _process_mib(gpu)
            gpu_used = _samples(gpu.metrics_url, "gpu_memory_used_MiB")
        assert set(first) == {leaky.pid, other.pid}
        assert second[leaky.pid] - first[leaky.pid] == pytest.approx(20, abs=0.01)
        assert second[other.pid] == first[other.pid]
        assert gpu_used[0][1] == pytest.approx(second[leaky.pid] + second[other.pid], abs=0.2)


def test_mig_slices_are_separate_series_and_only_one_leaks(tmp_path) -> None:
    """dcgm-exporter labels GPU_I_ID / GPU_I_PROFILE: one series per slice of GPU 0; the
    slice whose server leaks 1 MiB/request grows by exactly that, the other stays."""
    common = ["--vgpu-index", "0", "--vgpu-profile", "1g.18gb"]
    with VirtualGpu(tmp_path / "vgpu", flavour="dcgm") as gpu:
        with (
            RefProc(
                "vram-leaking",
                "--leak-kib",
                "1024",
                "--vgpu-dir",
                str(gpu.dir),
                "--vgpu-instance",
                "1",
                *common,
            ) as leaky,
            RefProc("plain", "--vgpu-dir", str(gpu.dir), "--vgpu-instance", "2", *common) as other,
        ):
            _flushed(leaky)
            first = {
                labels["GPU_I_ID"]: v
                for labels, v in _samples(gpu.metrics_url, "DCGM_FI_DEV_FB_USED")
            }
            Traffic(leaky.url, sizes=()).round(30)
            Traffic(other.url, sizes=()).round(30)
            _flushed(leaky)
            samples = _samples(gpu.metrics_url, "DCGM_FI_DEV_FB_USED")
            assert leaky.info()["truth"]["layers"]["vram"]["gpu_instance"] == 1
        second = {labels["GPU_I_ID"]: v for labels, v in samples}
        assert sorted(second) == ["1", "2"]
        assert {labels["gpu"] for labels, _ in samples} == {"0"}
        assert all(labels["GPU_I_PROFILE"] == "1g.18gb" for labels, _ in samples)
        assert second["1"] - first["1"] == pytest.approx(30, abs=1)
        assert second["2"] == first["2"]


def test_a_sigkilled_server_leaves_its_record_but_leaves_the_page(tmp_path) -> None:
    with VirtualGpu(tmp_path / "vgpu") as gpu:
        srv = RefProc("plain", "--vgpu-dir", str(gpu.dir))
        try:
            _flushed(srv)
            assert srv.pid in _process_mib(gpu)
            os.kill(srv.pid, 9)
            srv.wait(10)
        finally:
            srv.stop()
        assert (gpu.dir / f"{srv.pid}.json").exists()  # SIGKILL: no clean-up ran
        assert srv.pid not in _process_mib(gpu)  # the page forgets a dead process
