"""Remote GPU memory from dcgm-exporter and nvitop-exporter over real HTTP on loopback."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from support.sources import dcgm_text, metrics_only, nvitop_text, serve, sglang_text

from vramdoctor.errors import SourceUnavailable
from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.samples import GpuSample
from vramdoctor.sources.exporter import ExporterSource, unit_of

H100 = "NVIDIA H100 80GB HBM3"


def sample_of(*texts: str) -> GpuSample:
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(serve(metrics_only(t))) + "/metrics" for t in texts]
        with ExporterSource(urls) as src:
            return src.sample()


def test_dcgm_two_gpus_on_a_kubernetes_node() -> None:
    gpus = [
        {
            "gpu": 0,
            "uuid": "GPU-1b2c3d4e-0000-1111-2222-333344445555",
            "model": H100,
            "host": "node-a",
            "used": 71234,
            "free": 9765,
            "container": "sglang",
            "namespace": "llm",
            "pod": "sglang-0",
        },
        {
            "gpu": 1,
            "uuid": "GPU-9f8e7d6c-0000-1111-2222-333344445555",
            "model": H100,
            "host": "node-a",
            "used": 70102,
            "free": 10897,
            "container": "sglang",
            "namespace": "llm",
            "pod": "sglang-0",
        },
    ]
    s = sample_of(
        dcgm_text(
            gpus, fields=("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED")
        )
    )
    assert s.source == "dcgm"
    assert s.processes == []
    assert [g.index for g in s.gpus] == [0, 1]
    g0 = s.gpus[0]
    assert (g0.used_mib, g0.free_mib, g0.total_mib) == (71234, 9765, 71234 + 9765)
    assert g0.uuid == "GPU-1b2c3d4e-0000-1111-2222-333344445555"
    assert g0.name == H100 and g0.host == "node-a" and g0.pod == "sglang-0"
    assert g0.driver_reserved_mib is None
    assert s.t > 0 and s.wall > 1.6e9


def test_dcgm_reserved_total_and_lowercase_uuid_label() -> None:
    gpus = [
        {
            "gpu": 0,
            "uuid": "GPU-aa",
            "model": "NVIDIA A100-SXM4-80GB",
            "host": "gpu7",
            "used": 1000,
            "free": 79000,
            "reserved": 555,
            "total": 81920,
        }
    ]
    s = sample_of(
        dcgm_text(
            gpus,
            uuid_label="uuid",
            fields=(
                "DCGM_FI_DEV_FB_FREE",
                "DCGM_FI_DEV_FB_USED",
                "DCGM_FI_DEV_FB_RESERVED",
                "DCGM_FI_DEV_FB_TOTAL",
            ),
        )
    )
    g = s.gpus[0]
    assert g.uuid == "GPU-aa"
    assert g.total_mib == 81920 and g.driver_reserved_mib == 555


def test_dcgm_mig_instances_are_separate_rows() -> None:
    gpus = [
        {
            "gpu": 0,
            "uuid": "GPU-mig",
            "model": "NVIDIA A100-SXM4-40GB",
            "host": "h",
            "used": 300,
            "free": 9500,
            "mig_profile": "2g.10gb",
            "mig_id": "3",
        },
        {
            "gpu": 0,
            "uuid": "GPU-mig",
            "model": "NVIDIA A100-SXM4-40GB",
            "host": "h",
            "used": 4000,
            "free": 5800,
            "mig_profile": "2g.10gb",
            "mig_id": "5",
        },
    ]
    s = sample_of(dcgm_text(gpus))
    assert len(s.gpus) == 2
    assert sorted(g.used_mib for g in s.gpus) == [300, 4000]
    assert all("MIG 2g.10gb" in (g.name or "") for g in s.gpus)


def test_two_hosts_merge_into_one_sample() -> None:
    a = dcgm_text(
        [{"gpu": 0, "uuid": "GPU-a", "model": H100, "host": "node-a", "used": 10, "free": 90}]
    )
    b = dcgm_text(
        [{"gpu": 0, "uuid": "GPU-b", "model": H100, "host": "node-b", "used": 20, "free": 80}]
    )
    s = sample_of(a, b)
    assert [(g.host, g.used_mib) for g in s.gpus] == [("node-a", 10), ("node-b", 20)]


def test_nvitop_gpus_and_processes_with_commands() -> None:
    gpus = [
        {"index": 0, "name": H100, "uuid": "GPU-0", "total": 81559, "used": 71000, "free": 10559},
        {"index": 1, "name": H100, "uuid": "GPU-1", "total": 81559, "used": 70900, "free": 10659},
    ]
    procs = [
        {"index": 0, "pid": 4100, "mib": 70200, "command": "sglang::scheduler_TP0"},
        {"index": 1, "pid": 4101, "mib": 69900, "command": "sglang::scheduler_TP1"},
        {"index": 0, "pid": 4101, "mib": 516, "command": "sglang::scheduler_TP1"},
        {
            "index": 0,
            "pid": 4000,
            "mib": 612,
            "command": "python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-VL-7B-Instruct --api-key sk-prod-0123456789abcdef",
        },
    ]
    s = sample_of(nvitop_text("10.0.0.7", gpus, procs))
    assert s.source == "nvitop"
    assert [(g.index, g.total_mib, g.used_mib, g.free_mib) for g in s.gpus] == [
        (0, 81559, 71000, 10559),
        (1, 81559, 70900, 10659),
    ]
    rows = {(p.pid, p.gpu): p for p in s.processes}
    assert rows[(4101, 0)].used_mib == 516 and rows[(4101, 1)].used_mib == 69900
    assert rows[(4100, 0)].cmdline == ["sglang::scheduler_TP0"]
    launcher = rows[(4000, 0)]
    assert launcher.name == "python3" and launcher.host == "10.0.0.7"
    assert "sk-prod-0123456789abcdef" not in " ".join(launcher.cmdline or [])
    assert "--api-key" in (launcher.cmdline or [])


def test_only_used_memory_is_refused_not_guessed() -> None:
    text = dcgm_text(
        [{"gpu": 0, "uuid": "GPU-a", "model": H100, "used": 10}], fields=("DCGM_FI_DEV_FB_USED",)
    )
    with pytest.raises(SourceUnavailable, match="DCGM_FI_DEV_FB_FREE"):
        sample_of(text)


def test_a_server_metrics_page_is_not_an_exporter() -> None:
    with pytest.raises(SourceUnavailable, match="no GPU memory series"):
        sample_of(sglang_text())


def test_exporter_sample_round_trips_through_a_run_file(tmp_path) -> None:
    s = sample_of(
        nvitop_text(
            "h",
            [{"index": 0, "name": H100, "uuid": "GPU-0", "total": 100, "used": 60, "free": 40}],
            [{"index": 0, "pid": 7, "mib": 60, "command": "python x.py"}],
        )
    )
    path = tmp_path / "r.jsonl"
    with RunWriter(path, make_header("census", argv=["vramdoctor", "census"])) as w:
        w.write(s)
    assert read_run(path).of(GpuSample) == [s]


# --- every spelling of 2026, pages written from the released source (tests/fixtures/sources) ---

PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "sources"


def page(name: str) -> str:
    return (PAGES / name).read_text(encoding="utf-8")


def test_dcgm_482_capital_hostname_and_483_lowercase_hostname_read_the_same() -> None:
    old = sample_of(page("dcgm-exporter-4.8.2.prom"))
    new = sample_of(page("dcgm-exporter-4.8.3.prom"))
    for s in (old, new):
        assert s.source == "dcgm"
        assert [g.host for g in s.gpus] == ["gpu-node-1", "gpu-node-1"]
    assert [(g.index, g.used_mib, g.free_mib) for g in new.gpus] == [
        (g.index, g.used_mib, g.free_mib) for g in old.gpus
    ]
    g0 = new.gpus[0]
    assert (g0.used_mib, g0.free_mib) == (128560, 14321)


def test_dcgm_49_bytes_are_read_as_bytes_not_mib() -> None:
    s = sample_of(page("dcgm-exporter-4.9.0.prom"))
    g0 = s.gpus[0]
    assert g0.used_mib == pytest.approx(134805913600 / 2**20)
    assert g0.free_mib == pytest.approx(15016656896 / 2**20)
    assert g0.total_mib == pytest.approx(150754820096 / 2**20)  # DCGM_FI_DEV_FB_CAPACITY_BYTES
    assert g0.driver_reserved_mib == pytest.approx(933232640 / 2**20)
    assert g0.host == "gpu-node-1"
    assert g0.reachable_mib == pytest.approx((150754820096 - 933232640) / 2**20)
    # 4.10 renamed the PCIe counters only: the memory reads the same.
    s10 = sample_of(page("dcgm-exporter-4.10.0.prom"))
    assert [g.used_mib for g in s10.gpus] == [g.used_mib for g in s.gpus]


def test_dcgm_49_with_only_the_capacity_field_and_used_still_reads() -> None:
    # The unit comes from the suffix whatever the field's quantity; a bytes page with
    # capacity and used (no free) gives free = capacity - used.
    text = page("dcgm-exporter-4.9.0.prom")
    keep = [
        line
        for line in text.splitlines()
        if "FB_FREE_BYTES" not in line and "FB_RESERVED_BYTES" not in line
    ]
    s = sample_of("\n".join(keep) + "\n")
    g0 = s.gpus[0]
    assert g0.free_mib == pytest.approx((150754820096 - 134805913600) / 2**20)


def test_dcgm_mig_slices_are_keyed_by_gpu_instance() -> None:
    s = sample_of(page("dcgm-exporter-mig.prom"))
    rows = {g.key: g for g in s.gpus}
    assert set(rows) == {(0, 1, None), (0, 2, None), (1, None, None)}
    a, b = rows[(0, 1, None)], rows[(0, 2, None)]
    assert (a.used_mib, b.used_mib) == (66958, 0)
    assert a.mig_profile == "3g.71gb" and a.label == "GPU 0 MIG 3g.71gb GI 1"
    assert a.pod == "vllm-qwen-7d9f8-abcde" and b.pod is None
    assert rows[(1, None, None)].label == "GPU 1"


def test_dcgm_virtual_gpus_device_row_is_the_gpu_per_pod_rows_do_not_overwrite_it() -> None:
    text = page("dcgm-exporter-4.8.3-virtual-gpus.prom")
    free = text.replace("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE").replace(
        "Framebuffer memory used", "Framebuffer memory free"
    )
    free_rows = [
        line.replace("} 70518", "} 72000") for line in free.splitlines() if "pod_uid" not in line
    ]
    s = sample_of(
        text + "\n".join(line for line in free_rows if not line.startswith("# source")) + "\n"
    )
    (g,) = s.gpus
    assert g.used_mib == 70518  # the device row, not the last pod's 8320
    assert g.pod == "vllm-a-6f5d4-k1,jupyter-alice"


def test_nvitop_170_page() -> None:
    s = sample_of(page("nvitop-exporter-1.7.0.prom"))
    assert s.source == "nvitop"
    assert [(g.index, g.used_mib) for g in s.gpus] == [(0, 128560.0), (1, 127998.0)]
    rows = {p.pid: p for p in s.processes}
    assert rows[3377].username == "alice" and rows[2101].username == "root"
    assert rows[2101].title_role == "vllm worker TP0"
    assert rows[3377].title_role is None


def test_nvitop_mig_devices_are_their_own_rows() -> None:
    gpus = [
        {
            "index": "0:0",
            "name": "NVIDIA A100 MIG 3g.20gb",
            "uuid": "MIG-a",
            "total": 19968,
            "used": 900,
            "free": 19068,
        },
        {
            "index": "0:1",
            "name": "NVIDIA A100 MIG 3g.20gb",
            "uuid": "MIG-b",
            "total": 19968,
            "used": 15000,
            "free": 4968,
        },
    ]
    procs = [{"index": "0:1", "pid": 55, "mib": 14500, "command": "VLLM::EngineCore"}]
    s = sample_of(nvitop_text("h", gpus, procs))
    assert sorted(g.key for g in s.gpus) == [(0, 0, None), (0, 1, None)]
    (p,) = s.processes
    assert p.key == (0, 1, None) and p.title_role == "vllm engine core"


def test_nvidia_gpu_exporter_bytes_despite_help_saying_mib_and_mig_rows() -> None:
    text = page("nvidia_gpu_exporter-1.14.0.prom")
    # The page shows the slice's used bytes only: with them alone a slice has no size, so
    # the whole GPU is its row; the exporter's total/free rows of the slice make it its own.
    assert (1, None, None) in {g.key for g in sample_of(text).gpus}
    labels = '{gpu_instance_id="1",uuid="8b7d6c5e-aaaa-bbbb-cccc-ddddeeeeffff"}'
    text += (
        f"# TYPE nvidia_smi_mig_memory_total_bytes gauge\nnvidia_smi_mig_memory_total_bytes{labels} 7.6e+10\n"
        f"# TYPE nvidia_smi_mig_memory_free_bytes gauge\nnvidia_smi_mig_memory_free_bytes{labels} 5.8e+10\n"
    )
    s = sample_of(text)
    assert s.source == "nvidia_smi"
    by_key = {g.key: g for g in s.gpus}
    g0 = by_key[(0, None, None)]
    assert g0.uuid == "GPU-3f1c2a9e-1111-2222-3333-444455556666"
    assert g0.used_mib == pytest.approx(1.35094337536e11 / 2**20)  # bytes, HELP says [MiB]
    assert g0.total_mib == pytest.approx(1.50754820096e11 / 2**20)
    assert g0.name == "NVIDIA H200"
    # GPU 1 is in MIG mode: its GPU instance is the row, with the profile.
    assert (1, None, None) not in by_key
    mig = by_key[(1, 1, None)]
    assert mig.mig_profile == "3g.71gb" and mig.used_mib == pytest.approx(1.7782800384e10 / 2**20)
    rows = {p.pid: p for p in s.processes}
    assert rows[2101].gpu == 0 and rows[2101].used_mib == pytest.approx(1.33611012096e11 / 2**20)
    assert (
        rows[2101].title_role == "vllm worker TP0" and rows[4410].title_role == "sglang scheduler"
    )


def test_a_page_with_gpu_series_but_no_memory_field_names_what_it_saw() -> None:
    text = "\n".join(
        line for line in page("dcgm-exporter-4.9.0.prom").splitlines() if "_FB_" not in line
    )
    with pytest.raises(SourceUnavailable) as err:
        sample_of(text + "\n")
    message = str(err.value)
    assert "no memory field vramdoctor knows" in message
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO" in message and "DCGM_FI_PROF_PCIE_TX_BYTES" in message
    assert "\n" not in message


def test_a_framebuffer_family_without_a_unit_is_not_read_and_said() -> None:
    text = (
        "# HELP DCGM_FI_DEV_FB_USED_X Framebuffer used.\n# TYPE DCGM_FI_DEV_FB_USED_X gauge\n"
        'DCGM_FI_DEV_FB_USED_X{gpu="0",UUID="GPU-a"} 5\n'
        "# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n"
        "# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a"} 100\n'
        "# HELP DCGM_FI_DEV_FB_TOTAL Framebuffer total.\n# TYPE DCGM_FI_DEV_FB_TOTAL gauge\n"
        'DCGM_FI_DEV_FB_TOTAL{gpu="0",UUID="GPU-a"} 200\n'
    )
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serve(metrics_only(text))) + "/metrics"
        src = stack.enter_context(ExporterSource(url))
        with pytest.raises(SourceUnavailable, match="used but not free or total"):
            src.sample()  # no readable `used`: refused, not read as 5 MiB
        assert any("DCGM_FI_DEV_FB_USED_X: no unit" in n for n in src.notes)


@pytest.mark.parametrize(
    "name, help_text, factor, rests",
    [
        ("nvidia_smi_memory_used_bytes", "memory.used [MiB]", 1 / 2**20, "from the name"),
        ("gpu_memory_used_MiB", "GPU memory used (MiB).", 1.0, "from the name"),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 1.0, "from # HELP"),
        ("DCGM_FI_DEV_FB_USED", "Used Frame Buffer in MB", 1.0, "from # HELP"),
        ("DCGM_FI_DEV_FB_USED", "", 1.0, "field definition"),
        ("DCGM_FI_DEV_FB_USED_NEW", "framebuffer used in bytes", 1 / 2**20, "from # HELP"),
    ],
)
def test_unit_rules(name: str, help_text: str, factor: float, rests: str) -> None:
    found = unit_of(name, help_text)
    assert found is not None and found[0] == pytest.approx(factor) and rests in found[1]
    assert unit_of("DCGM_FI_DEV_FB_USED_NEW", "used") is None
