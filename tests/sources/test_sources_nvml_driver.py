"""The NVML source against drivers of different ages, through the real pynvml binding.

A stand-in driver library (tests/support/fake_nvml.py) answers the binding's C calls, so the
binding's own struct handling runs: memory info v2 and its absence, memory partitions with
hard and soft limits (driver R615), MIG devices, and whose process each row is.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pynvml
import pytest
from support.fake_nvml import GIB, MIB, FakeDriver, FakeGpu, FakeMig, FakeProcess, installed

from vramdoctor.samples import GpuSample
from vramdoctor.sources.nvml import LIMIT_MAX, NvmlSource, cgroup_path, reachable

# The memory-limits call arrived in nvidia-ml-py 13.615.71; the floor (12.535) lacks it, and
# there vramdoctor falls back to memory info (test_an_older_binding_without_the_limits_call...).
needs_limits_binding = pytest.mark.skipif(
    not hasattr(pynvml, "nvmlDeviceGetMemoryLimits_v1"),
    reason="nvidia-ml-py < 13.615.71 has no nvmlDeviceGetMemoryLimits_v1 (the fallback is tested)",
)


def sample(driver: FakeDriver, **kw: object) -> GpuSample:
    with installed(driver), NvmlSource(expect_gpu_open=False, **kw) as src:  # type: ignore[arg-type]
        return src.sample()


def test_memory_info_v2_reachable_is_total_minus_driver_reserved() -> None:
    s = sample(FakeDriver([FakeGpu(total=80 * GIB, used=30 * GIB, reserved=615 * MIB)]))
    (g,) = s.gpus
    assert g.total_mib == 80 * 1024 and g.used_mib == 30 * 1024
    assert g.driver_reserved_mib == 615
    assert g.reachable_mib == 80 * 1024 - 615
    assert g.reachable_by == "NVML memory info v2: total minus driver-reserved"
    assert g.soft_limit_mib is None
    assert g.key == (0, None, None) and g.label == "GPU 0"


def test_driver_without_memory_info_v2_falls_back_once_to_v1() -> None:
    driver = FakeDriver(
        [FakeGpu(total=16 * GIB, used=1 * GIB, reserved=300 * MIB)],
        missing=("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryLimits_v1"),
    )
    with installed(driver), NvmlSource(expect_gpu_open=False) as src:
        first, second = src.sample(), src.sample()
    assert driver.calls.count("nvmlDeviceGetMemoryInfo") == 2
    for s in (first, second):
        (g,) = s.gpus
        assert g.driver_reserved_mib is None
        assert g.used_mib == 1024 + 300  # v1 counts the reservation as used
        assert g.reachable_mib == 16 * 1024 and g.reachable_by == "NVML memory info: total"


@needs_limits_binding
def test_container_partition_hard_limit_is_what_the_processes_can_reach() -> None:
    gpu = FakeGpu(total=141 * GIB, used=20 * GIB, limits=(24 * GIB, 40 * GIB, 20 * GIB))
    s = sample(FakeDriver([gpu]))
    (g,) = s.gpus
    assert g.reachable_mib == 40 * 1024
    assert g.soft_limit_mib == 24 * 1024
    assert "NVML hard memory limit" in (g.reachable_by or "")
    own = cgroup_path()
    assert gpu.asked_cgroups and gpu.asked_cgroups[0] == own
    if own:
        assert f"of cgroup {own}" in (g.reachable_by or "")


def test_no_limit_set_reads_as_no_limit() -> None:
    gpu = FakeGpu(total=80 * GIB, used=1 * GIB, limits=(0, LIMIT_MAX, 1 * GIB))
    (g,) = sample(FakeDriver([gpu])).gpus
    assert g.reachable_by == "NVML memory info v2: total minus driver-reserved"
    assert g.soft_limit_mib is None


def test_an_older_binding_without_the_limits_call_is_no_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nvidia-ml-py before 13.615.71 has neither the function nor its struct.
    monkeypatch.delattr(pynvml, "nvmlDeviceGetMemoryLimits_v1", raising=False)
    monkeypatch.delattr(pynvml, "c_nvmlGetMemoryLimits_v1_t", raising=False)
    gpu = FakeGpu(total=80 * GIB, used=1 * GIB, limits=(0, 10 * GIB, 0))
    (g,) = sample(FakeDriver([gpu])).gpus
    assert g.reachable_mib == 80 * 1024 - 615 and gpu.asked_cgroups == []


def test_a_driver_without_the_limits_symbol_is_no_crash() -> None:
    gpu = FakeGpu(total=80 * GIB, used=1 * GIB, limits=(0, 10 * GIB, 0))
    driver = FakeDriver([gpu], missing=("nvmlDeviceGetMemoryLimits_v1",))
    (g,) = sample(driver).gpus
    assert g.reachable_mib == 80 * 1024 - 615


@needs_limits_binding
def test_limits_are_read_again_after_their_ttl() -> None:
    gpu = FakeGpu(total=80 * GIB, used=1 * GIB, limits=(0, 10 * GIB, 0))
    driver = FakeDriver([gpu])
    with installed(driver), NvmlSource(expect_gpu_open=False, limits_ttl_s=0.0) as src:
        a = src.sample()
        gpu.limits = (0, 12 * GIB, 0)
        b = src.sample()
    assert (a.gpus[0].reachable_mib, b.gpus[0].reachable_mib) == (10 * 1024, 12 * 1024)


def test_reachable_is_pure_and_says_what_it_rests_on() -> None:
    assert reachable(100 * MIB, None, None) == (100.0, "NVML memory info: total", None)


def test_mig_gpu_instances_are_rows_and_processes_carry_their_slice() -> None:
    mig_gpu = FakeGpu(
        total=141 * GIB,
        used=0,
        name="NVIDIA H200",
        migs=[
            FakeMig(
                1,
                0,
                total=70 * GIB,
                used=60 * GIB,
                profile="3g.71gb",
                processes=[FakeProcess(9001, 59 * GIB)],
            ),
            # GPU instance 2 has two compute instances: they share its memory
            FakeMig(
                2,
                0,
                total=70 * GIB,
                used=5 * GIB,
                profile="3g.71gb",
                processes=[FakeProcess(9002, 2 * GIB)],
            ),
            FakeMig(
                2,
                1,
                total=70 * GIB,
                used=5 * GIB,
                profile="3g.71gb",
                processes=[FakeProcess(9003, 3 * GIB)],
            ),
        ],
    )
    plain = FakeGpu(total=141 * GIB, used=10 * GIB, processes=[FakeProcess(9100, 9 * GIB)])
    s = sample(FakeDriver([mig_gpu, plain]))
    rows = {g.key: g for g in s.gpus}
    assert set(rows) == {(0, 1, None), (0, 2, None), (1, None, None)}
    assert rows[(0, 1, None)].used_mib == 60 * 1024
    assert rows[(0, 2, None)].used_mib == 5 * 1024  # counted once, not per compute instance
    assert rows[(0, 1, None)].mig_profile == "3g.71gb"
    assert rows[(0, 1, None)].label == "GPU 0 MIG 3g.71gb GI 1"
    assert (rows[(0, 1, None)].uuid or "").startswith("MIG-")
    procs = {p.pid: p for p in s.processes}
    assert procs[9001].key == (0, 1, 0)
    assert procs[9002].key == (0, 2, 0) and procs[9003].key == (0, 2, 1)
    assert procs[9100].key == (1, None, None)
    assert procs[9001].label == "GPU 0 MIG GI 1 CI 0"


def test_scope_owner_and_parent_of_each_process_row() -> None:
    tenant = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gpu = FakeGpu(
            total=80 * GIB,
            used=20 * GIB,
            processes=[FakeProcess(os.getpid(), 18 * GIB), FakeProcess(tenant.pid, 1 * GIB)],
        )
        s = sample(FakeDriver([gpu]), server_pids=lambda: {os.getpid()})
    finally:
        tenant.kill()
        tenant.wait()
    rows = {p.pid: p for p in s.processes}
    me, other = rows[os.getpid()], rows[tenant.pid]
    assert me.scope == "server" and other.scope == "tenant"
    assert me.uid == os.getuid() and other.uid == os.getuid()
    assert me.ppid == os.getppid() and other.ppid == os.getpid()
    assert me.username  # the name of uid os.getuid() (or the uid itself without a passwd entry)
    # Without server_pids the source does not say.
    plain = sample(
        FakeDriver([FakeGpu(total=GIB, used=0, processes=[FakeProcess(os.getpid(), 1)])])
    )
    assert plain.processes[0].scope is None


def test_scope_fields_are_left_out_of_a_run_file_while_unknown() -> None:
    s = sample(FakeDriver([FakeGpu(total=GIB, used=0, processes=[FakeProcess(1, 5)])]))
    d = s.to_dict()
    assert "scope" not in d["processes"][0] and "gpu_instance_id" not in d["gpus"][0]
    assert d["gpus"][0]["reachable_by"]  # known: written
    assert GpuSample.from_dict(d) == s


def test_cgroup_path_reads_the_unified_hierarchy(tmp_path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("0::/kubepods/burstable/pod1/c0\n")
    assert cgroup_path(42, proc=str(tmp_path)) == "/sys/fs/cgroup/kubepods/burstable/pod1/c0"
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "cgroup").write_text("12:memory:/docker/abc\n11:cpu:/docker/abc\n")
    assert cgroup_path(43, proc=str(tmp_path)) is None
    assert cgroup_path(44, proc=str(tmp_path)) is None
