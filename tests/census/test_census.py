"""`census`: grouping, the stray-context flags, and the command end to end over loopback."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.cli import vd as _vd
from support.sources import dcgm_text, metrics_only, nvitop_text, serve

from vramdoctor.census.analysis import census, role_of
from vramdoctor.cli import main
from vramdoctor.samples import GpuMemory, GpuSample, ProcessGpuMemory

H100 = "NVIDIA H100 80GB HBM3"


def gpu(i: int, used: float) -> GpuMemory:
    return GpuMemory(index=i, total_mib=81559, used_mib=used, free_mib=81559 - used, name=H100)


def proc(
    pid: int,
    g: int,
    mib: float | None,
    name: str = "python3",
    cmd: str | None = None,
    visible: bool = True,
) -> ProcessGpuMemory:
    return ProcessGpuMemory(
        pid=pid,
        gpu=g,
        used_mib=mib,
        name=name,
        cmdline=(cmd or name).split() if visible else None,
        visible=visible,
    )


def sglang_tp2_with_ipc_context() -> GpuSample:
    """SGLang VLM, TP=2, CUDA IPC feature transport: the TP1 rank rebuilt the producer's
    handle on GPU 0 and got a full context there; the tokenizer runs the image processor on GPU 0."""
    return GpuSample(
        t=1.0,
        wall=1.7e9,
        source="nvml",
        gpus=[gpu(0, 72000), gpu(1, 70500)],
        processes=[
            proc(
                100,
                0,
                788,
                cmd="python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-VL-72B-Instruct --tp 2",
            ),
            proc(101, 0, 70690, cmd="sglang::scheduler_TP0"),
            proc(102, 1, 70480, cmd="sglang::scheduler_TP1"),
            proc(102, 0, 514, cmd="sglang::scheduler_TP1"),
        ],
    )


def test_tp_rank_context_on_producer_gpu_is_flagged() -> None:
    c = census(sglang_tp2_with_ipc_context(), groups={100: 100, 101: 100, 102: 100})
    assert c.problem
    by_pid = {p.pid: p for p in c.processes}
    rank1 = by_pid[102]
    assert rank1.per_gpu == {0: 514, 1: 70480}
    assert rank1.main_gpu == 1 and rank1.total_mib == 70994
    assert rank1.role == "sglang scheduler TP1"
    assert set(rank1.flags) == {"multi_gpu", "stray_context"}
    stray = next(f for f in c.flags if f.code == "stray_context")
    assert (stray.pid, stray.gpu, stray.mib) == (102, 0, 514)
    # The tokenizer's context sits on GPU 0 beside scheduler TP0: a note, not a problem.
    assert by_pid[100].role == "sglang server (tokenizer)"
    assert by_pid[100].flags == ["helper_context"]
    assert by_pid[101].flags == []
    assert {f.code for f in c.flags if f.problem} == {"multi_gpu", "stray_context"}


def test_tokenizer_on_gpu0_while_model_runs_on_gpu2_and_3() -> None:
    # --base-gpu-id 2 without CUDA_VISIBLE_DEVICES: the fast image processor uses bare "cuda".
    s = GpuSample(
        t=1.0,
        wall=1.7e9,
        source="nvml",
        gpus=[gpu(0, 640), gpu(2, 70000), gpu(3, 70000)],
        processes=[
            proc(200, 0, 640, cmd="python3 -m sglang.launch_server --base-gpu-id 2 --tp 2"),
            proc(201, 2, 69500, cmd="sglang::scheduler_TP0"),
            proc(202, 3, 69500, cmd="sglang::scheduler_TP1"),
        ],
    )
    c = census(s, groups={200: 200, 201: 200, 202: 200})
    assert c.problem
    assert [(f.code, f.pid, f.gpu) for f in c.flags] == [("off_main_gpu", 200, 0)]
    # Without knowing the process tree (remote rows, other PID namespace) nothing ties them.
    assert not census(s).problem


def test_healthy_tp2_has_no_flags_and_attributes_memory() -> None:
    s = GpuSample(
        t=1.0,
        wall=1.7e9,
        source="nvml",
        gpus=[gpu(0, 70700), gpu(1, 70500)],
        processes=[
            proc(301, 0, 70200, cmd="VLLM::Worker_TP0"),
            proc(302, 1, 70000, cmd="VLLM::Worker_TP1"),
        ],
    )
    c = census(s, groups={301: 300, 302: 300})
    assert not c.problem and c.flags == []
    assert [p.role for p in c.processes] == ["vllm worker TP0", "vllm worker TP1"]
    assert [(g.processes, g.processes_mib, g.unattributed_mib) for g in c.gpus] == [
        (1, 70200, 500),
        (1, 70000, 500),
    ]


def test_vllm_api_server_context_on_engine_gpus_is_named_not_a_stray() -> None:
    # vLLM 0.33, TP=2 with multimodal inputs over GPU IPC: the API server opens contexts on
    # both engine GPUs. That is the API server's own context, not a stray one.
    s = GpuSample(
        t=1.0,
        wall=1.7e9,
        source="nvml",
        gpus=[gpu(0, 71300), gpu(1, 71200)],
        processes=[
            proc(700, 0, 520, cmd="vllm serve Qwen/Qwen3-VL-8B-Instruct --tensor-parallel-size 2"),
            proc(700, 1, 510, cmd="vllm serve Qwen/Qwen3-VL-8B-Instruct --tensor-parallel-size 2"),
            proc(701, 0, 70200, cmd="VLLM::Worker_TP0"),
            proc(702, 1, 70100, cmd="VLLM::Worker_TP1"),
        ],
    )
    c = census(s, groups={700: 700, 701: 700, 702: 700})
    assert not c.problem
    assert [(f.code, f.gpu) for f in c.flags] == [
        ("api_server_context", 0),
        ("api_server_context", 1),
    ]
    assert "API server's own CUDA context" in c.flags[0].message
    # The same footprint on a GPU the engine does not use is still off its server's GPUs.
    s.processes[1] = proc(700, 2, 510, cmd="vllm serve Qwen/Qwen3-VL-8B-Instruct")
    s.gpus.append(gpu(2, 600))
    c = census(s, groups={700: 700, 701: 700, 702: 700})
    assert c.problem and {f.code for f in c.flags} >= {"multi_gpu", "stray_context"}
    # An SGLang tokenizer may not: its context off the model GPU stays a problem.
    sg = GpuSample(
        t=1.0,
        wall=1.7e9,
        source="nvml",
        gpus=[gpu(0, 600), gpu(1, 71000)],
        processes=[
            proc(800, 0, 540, cmd="python3 -m sglang.launch_server --base-gpu-id 1"),
            proc(801, 1, 70400, cmd="sglang::scheduler"),
        ],
    )
    assert [f.code for f in census(sg, groups={800: 800, 801: 800}).flags] == ["off_main_gpu"]


def test_big_second_footprint_is_multi_gpu_but_not_a_stray_context() -> None:
    s = GpuSample(
        t=1.0,
        wall=1.7e9,
        source="nvml",
        gpus=[gpu(0, 30000), gpu(1, 30000)],
        processes=[
            proc(400, 0, 30000, cmd="python train.py"),
            proc(400, 1, 29000, cmd="python train.py"),
        ],
    )
    c = census(s)
    assert [f.code for f in c.flags] == ["multi_gpu"]
    # A custom context range changes what counts as context-sized.
    assert "stray_context" in {f.code for f in census(s, context_mib=(20000, 29500)).flags}


def test_hidden_pids_and_unknown_sizes_are_kept_and_noted() -> None:
    s = GpuSample(
        t=1.0,
        wall=1.7e9,
        source="nvml",
        gpus=[gpu(0, 9000)],
        processes=[
            proc(999999, 0, 8000, visible=False),
            proc(500, 0, None, name="Xorg"),
        ],
    )
    c = census(s)
    assert {p.pid for p in c.processes} == {999999, 500}
    assert not next(p for p in c.processes if p.pid == 999999).visible
    assert any("PID namespace" in n for n in c.notes)
    assert any("per-process memory" in n for n in c.notes)
    assert c.gpus[0].processes_mib is None and c.gpus[0].unattributed_mib is None


def test_roles_from_process_titles() -> None:
    assert role_of("sglang::schedul", ["sglang::scheduler_DP1_TP3"]) == "sglang scheduler DP1 TP3"
    assert role_of(None, ["sglang::detokenizer"]) == "sglang detokenizer"
    assert (
        role_of("python3", ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"])
        == "vllm API server"
    )
    assert role_of("VLLM::EngineCor", ["VLLM::EngineCore_DP0"]) == "vllm engine core DP0"
    assert role_of("python", ["python", "train.py"]) is None


# --- the command --------------------------------------------------------------------

GPUS = [
    {"index": 0, "name": H100, "uuid": "GPU-0", "total": 81559, "used": 72000, "free": 9559},
    {"index": 1, "name": H100, "uuid": "GPU-1", "total": 81559, "used": 70500, "free": 11059},
]
PROCS = [
    {"index": 0, "pid": 101, "mib": 70690, "command": "sglang::scheduler_TP0"},
    {"index": 1, "pid": 102, "mib": 70480, "command": "sglang::scheduler_TP1"},
    {"index": 0, "pid": 102, "mib": 514, "command": "sglang::scheduler_TP1"},
]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return _vd(*args, env={"COLUMNS": "200"})


def test_census_command_over_nvitop_exporter_json_and_exit_code() -> None:
    with serve(metrics_only(nvitop_text("gpu-host", GPUS, PROCS))) as url:
        r = run_cli("census", "--gpu-exporter", url, "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["source"] == "nvitop" and doc["problem"] is True
    assert {(f["code"], f["pid"], f["gpu"]) for f in doc["flags"]} == {
        ("multi_gpu", 102, None),
        ("stray_context", 102, 0),
    }
    rank1 = next(p for p in doc["processes"] if p["pid"] == 102)
    assert rank1["per_gpu"] == {"0": 514.0, "1": 70480.0} and rank1["main_gpu"] == 1


def test_census_command_plain_report_then_offline_report(tmp_path) -> None:
    out = tmp_path / "census.jsonl"
    html = tmp_path / "census.html"
    with serve(metrics_only(nvitop_text("gpu-host", GPUS, PROCS))) as url:
        r = run_cli("census", "--gpu-exporter", url, "--out", str(out), "--report", str(html))
    assert r.returncode == 1, r.stderr
    assert "\x1b[" not in r.stdout  # plain when piped
    assert "stray_context" in r.stdout and "PROBLEM" in r.stdout
    assert "sglang scheduler TP1" in r.stdout
    assert "<html" in html.read_text()
    again = run_cli("report", str(out), "--json")
    assert again.returncode == 1, again.stderr
    assert {f["code"] for f in json.loads(again.stdout)["flags"]} == {"multi_gpu", "stray_context"}


def test_healthy_remote_census_exits_0() -> None:
    with serve(metrics_only(nvitop_text("h", GPUS[:1], PROCS[:1]))) as url:
        code = main(["census", "--gpu-exporter", url, "--json"])
    assert code == 0


@pytest.mark.parametrize(
    "args, text",
    [
        (
            ["census", "--context-mib", "700-300", "--gpu-exporter", "http://127.0.0.1:9"],
            "LOW must be below HIGH",
        ),
        (["census", "--gpus", "zero"], "--gpu"),
        (["census", "--gpu", "zero"], "--gpu"),
        (["census", "--gpu", "-1"], "--gpu"),
        (["census", "--gpu-exporter", "gopher://x"], "scheme"),
        (["census", "--report", "census.png"], "not .png"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], text: str) -> None:
    r = run_cli(*args)
    assert r.returncode == 2
    assert text in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "selection",
    [["--gpu", "1"], ["--gpus", "1"], ["--gpu", "1,1"]],
    ids=["--gpu", "old --gpus", "comma list"],
)
def test_gpu_filter_applies_to_exporter_rows(
    selection: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(metrics_only(nvitop_text("gpu-host", GPUS, PROCS))) as url:
        code = main(["census", "--gpu-exporter", url, *selection, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0  # seen from GPU 1 alone, rank 1 holds memory on one GPU only
    assert doc["schema"] == "vramdoctor.census/1"
    assert [g["index"] for g in doc["gpus"]] == [1]
    assert [(p["pid"], p["per_gpu"]) for p in doc["processes"]] == [(102, {"1": 70480.0})]


def test_dcgm_census_is_device_level_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = [
        {
            "gpu": i,
            "uuid": f"GPU-{i}",
            "model": H100,
            "host": "node-a",
            "used": 70000 + i,
            "free": 11000,
        }
        for i in range(2)
    ]
    with serve(metrics_only(dcgm_text(gpus))) as url:
        code = main(["census", "--gpu-exporter", url + "/metrics"])
    out = capsys.readouterr().out
    assert code == 0
    assert "source dcgm" in out and "70,001" in out
    assert "device memory only" in out


def test_gpu_selection_is_one_spelling_repeated_or_comma_separated() -> None:
    from vramdoctor.cli._options import parse_gpu_indices

    assert (
        parse_gpu_indices(["0", "1"])
        == parse_gpu_indices(["0,1"])
        == parse_gpu_indices("1, 0")
        == [0, 1]
    )
    assert parse_gpu_indices([]) is None
    help_text = run_cli("census", "--help").stdout
    assert (
        "--gpu " in help_text and "--gpus" not in help_text
    )  # the old spelling still works, unlisted
