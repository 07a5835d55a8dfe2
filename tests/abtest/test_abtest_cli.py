"""`vramdoctor ab-test` and `vramdoctor report` on an ab-test run, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import NO_TORCH

RUN = Path(__file__).parents[1] / "fixtures" / "abtest" / "h200-qwen2_5_vl.jsonl"


def _cli(*args: str, block_torch: bool = False) -> subprocess.CompletedProcess[str]:
    code = (NO_TORCH if block_torch else "import sys\n") + (
        f"from vramdoctor.cli import main\nsys.exit(main({list(args)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "HF_HUB_CACHE": "/nonexistent"},
    )


def test_without_torch_one_line_and_exit_2() -> None:
    proc = _cli("ab-test", "--model", "Qwen/Qwen2.5-VL-7B-Instruct", block_torch=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "pip install 'vramdoctor[gpu]'" in lines[0] and "CUDA GPU" in lines[0]
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "meta-llama/Llama-3.1-8B"], "it can test: qwen3_vl"),
        (["--model", "qwen2_vl", "--count", "0"], "--count"),
        (["--model", "qwen2_vl", "--variants", "turbo"], "unknown variant"),
        (["--model", "qwen2_vl", "--images", "/nonexistent/dir"], "not a directory"),
        (["--model", "qwen2_vl", "--report", "ab.txt"], ".png or .svg"),
        (["--model", "qwen2_vl", "--chart", "ab.txt"], "--report ab.txt"),  # the old spelling
    ],
)
def test_bad_input_one_line_exit_2(args: list[str], needle: str) -> None:
    proc = _cli("ab-test", *args, block_torch=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_report_of_a_recorded_run_prints_table_ipc_and_recommendation() -> None:
    proc = _cli("report", str(RUN))
    assert proc.returncode in (0, 1), proc.stderr
    out = proc.stdout
    for needle in (
        "scoped_pool",
        "escaped_guarded",
        "Recommended for this model on this GPU",
        "no-redirect",
        "extra on producer GPU 0 per consumer",
        "data read back correct",
        "target scoped pool within 8mib of context",
    ):
        assert needle in out, needle


def test_report_json_is_one_object_with_the_figures(tmp_path) -> None:
    chart = tmp_path / "ab.png"
    proc = _cli("report", str(RUN), "--json", "--report", str(chart))
    data = json.loads(proc.stdout)
    assert data["schema"] == "vramdoctor.abtest/1"
    assert {"variants", "recommendation", "targets", "ipc", "run"} <= set(data)
    assert data["run"]["status"] == "complete"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the exit code follows the recorded targets
    t = data["targets"]
    failed = any(v["status"] != "ok" for v in data["variants"])
    expect = (
        1
        if failed or not (t["scoped_pool_within_8mib_of_context"] and t["scoped_pool_bounded"])
        else 0
    )
    assert proc.returncode == expect


def test_ab_test_help_lists_the_options() -> None:
    proc = _cli("ab-test", "--help")
    assert proc.returncode == 0
    for opt in (
        "--model",
        "--images",
        "--count",
        "--rounds",
        "--distribution",
        "--seed",
        "--json",
        "--out",
    ):
        assert opt in proc.stdout


def test_report_of_a_one_gpu_run_says_the_ipc_arm_needs_two(tmp_path) -> None:
    from vramdoctor.record import RunWriter, make_header

    path = tmp_path / "one-gpu.jsonl"
    census = {"processes": [{"pid": 12, "gpu": 0, "used_mib": 650.0}]}
    with RunWriter(path, make_header("ab-test", config={"gpu": 0})) as writer:
        for rec in (
            {
                "kind": "abtest.variant",
                "variant": "baseline",
                "event": "start",
                "title": "b",
                "config": {"mitigation": False},
            },
            {"kind": "abtest.context", "variant": "baseline", "context_mib": 600.0},
            {
                "kind": "abtest.request",
                "variant": "baseline",
                "round": 0,
                "latency_ms": 3.0,
                "nvml_mib": 700.0,
            },
            {
                "kind": "abtest.round",
                "variant": "baseline",
                "round": 0,
                "nvml_mib": 700.0,
                "torch_reserved_mib": 98.0,
            },
            {
                "kind": "abtest.idle",
                "variant": "baseline",
                "nvml_mib": 700.0,
                "torch_reserved_mib": 98.0,
            },
            {"kind": "abtest.variant", "variant": "baseline", "event": "end", "status": "ok"},
            {
                "kind": "abtest.ipc",
                "mode": "same-gpu",
                "note": "the IPC redirect arm needs two GPUs; checked the single-GPU round trip only",
            },
            {
                "kind": "abtest.ipc",
                "mode": "same-gpu",
                "producer_gpu": 0,
                "producer": {"pid": 11},
                "consumers": [
                    {
                        "pid": 12,
                        "gpu": 0,
                        "peer_access": True,
                        "slice_correct": True,
                        "tensor_correct": True,
                    }
                ],
                "census_before": census,
                "census_opened": census,
            },
        ):
            writer.write(rec)
    proc = _cli("report", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "needs two GPUs" in proc.stdout
    assert "same-GPU round trip: data read back correct" in proc.stdout


def test_a_schema_1_run_file_reads_with_the_new_names() -> None:
    # The recorded H200 run predates schema 2: PyTorch's reserved memory was `reserved_mib`.
    assert '"schema":"vramdoctor.run/1"' in RUN.read_text(encoding="utf-8").splitlines()[0].replace(
        " ", ""
    )
    data = json.loads(_cli("report", str(RUN), "--json").stdout)
    rounds = [r for v in data["variants"] for r in v["rounds"]]
    assert rounds and all(r["torch_reserved_mib"] is not None for r in rounds)
    assert all("reserved_mib" not in r for r in rounds)
