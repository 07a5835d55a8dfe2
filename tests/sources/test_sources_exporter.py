"""Remote GPU memory from dcgm-exporter and nvitop-exporter over real HTTP on loopback."""

from __future__ import annotations

import contextlib

import pytest
from support.sources import dcgm_text, metrics_only, nvitop_text, serve, sglang_text

from vramdoctor.errors import SourceUnavailable
from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.samples import GpuSample
from vramdoctor.sources.exporter import ExporterSource

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
