"""The IPC arm's orchestration with N consumers, on the CPU.

The processes, the status messages, the barrier, the census while every consumer holds, the
error paths and the records are the real ones (`vramdoctor.abtest.ipc_arm.run_mode`); only the
payload is host shared memory instead of CUDA IPC (`HostShmPayload` in support/ipc.py), and the
census reads which process maps which file from /proc/PID/maps instead of asking NVML. A consumer's "CUDA
context on GPU g" is a 4 MiB file it maps for as long as it lives; the shared "tensor" is a
2 MiB file the producer fills and every consumer maps and checksums. Opened "without the
redirect", a consumer also maps a context on the producer's GPU, as torch's own IPC rebuild
does. So the census sees exactly what the processes hold at that instant: a consumer that let go
or died before the census is missing from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from support.ipc import CONTEXT_MIB, HostShmPayload, host_census
from support.procs import NO_TORCH, run_cli

from vramdoctor.abtest.analysis import analyse
from vramdoctor.abtest.ipc_arm import cuda_visible_count, run_ipc_arm, run_ipc_subprocess, run_mode
from vramdoctor.record import RunWriter, make_header

_BEFORE: set[int] = set()


@pytest.fixture(autouse=True)
def _children_before() -> None:
    """The worker's children before each test (another module's fixture, e.g. fleet's
    Prometheus started for the session on the same xdist worker, is not the arm's)."""
    _BEFORE.clear()
    _BEFORE.update(c.pid for c in psutil.Process().children())


def _no_children_left() -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        # the multiprocessing resource tracker may stay; the arm's children must not
        if not [
            c
            for c in psutil.Process().children()
            if c.pid not in _BEFORE and "resource_tracker" not in " ".join(c.cmdline())
        ]:
            return True
        time.sleep(0.2)
    return False


def test_every_consumer_holds_during_the_census_n5(tmp_path) -> None:
    """5 GPUs: 4 consumers (every visible GPU but the producer's), opening at different times,
    a slow census; each consumer's context on the producer's GPU is counted without the
    redirect, none with it."""
    root = str(tmp_path)
    records: list[dict] = []
    calls: list[float] = []
    out = run_ipc_arm(
        5,
        host_census(root, 5, delay_s=0.8, calls=calls),
        records.append,
        payload=HostShmPayload(root, open_delay_s=0.15),
        timeout_s=60,
    )
    assert [r["mode"] for r in out] == ["no-redirect", "redirect"]
    assert len(calls) == 4  # before + while holding, per mode
    for rec in out:
        assert rec["error"] is None, rec["error"]
        assert rec["gpu_count"] == 5 and rec["consumer_gpus"] == [1, 2, 3, 4]
        assert [c["gpu"] for c in rec["consumers"]] == [1, 2, 3, 4]
        assert len({c["pid"] for c in rec["consumers"]} | {rec["producer"]["pid"]}) == 5
        assert all(c["held_during_census"] and c["error"] is None for c in rec["consumers"])
        # the census was taken while EVERY consumer mapped its context and the data
        held = {(p["pid"], p["gpu"]) for p in rec["census_opened"]["processes"]}
        assert all((c["pid"], c["gpu"]) in held for c in rec["consumers"])
    arms = {a["mode"]: a for a in analyse(records)["ipc"]}
    none, redirect = arms["no-redirect"], arms["redirect"]
    assert [c["on_producer_gpu_mib"] for c in none["consumers"]] == [CONTEXT_MIB] * 4
    assert none["extra_on_producer_gpu_total_mib"] == 4 * CONTEXT_MIB
    assert none["consumer_context_mib"] == CONTEXT_MIB
    assert none["extra_on_producer_gpu_contexts"] == pytest.approx(4.0)
    assert [c["on_producer_gpu_mib"] for c in redirect["consumers"]] == [0] * 4
    assert redirect["extra_on_producer_gpu_total_mib"] == 0
    assert redirect["extra_on_producer_gpu_contexts"] == 0
    assert none["all_correct"] and redirect["all_correct"]
    assert all(c["redirect_applied"] for c in redirect["consumers"])
    assert not any(c["redirect_applied"] for c in none["consumers"])
    # the census covers every GPU; on the producer's GPU: the producer plus each consumer without the redirect
    gpu0 = {a: next(g for g in arms[a]["census"] if g["gpu"] == 0) for a in arms}
    assert sorted(p["role"] for p in gpu0["no-redirect"]["processes"]) == ["consumer"] * 4 + [
        "producer"
    ]
    assert [p["role"] for p in gpu0["redirect"]["processes"]] == ["producer"]
    assert _no_children_left()


def test_max_gpus_caps_n(tmp_path) -> None:
    root = str(tmp_path)
    records: list[dict] = []
    run_ipc_arm(
        5,
        host_census(root, 5),
        records.append,
        max_gpus=3,
        payload=HostShmPayload(root),
        timeout_s=60,
    )
    assert [r["consumer_gpus"] for r in records] == [[1, 2], [1, 2]]
    assert {(r["gpu_count"], r["visible_gpu_count"]) for r in records} == {(3, 5)}
    arms = analyse(records)["ipc"]
    assert arms[0]["extra_on_producer_gpu_total_mib"] == 2 * CONTEXT_MIB


def test_max_gpus_1_checks_the_round_trip_and_says_why(tmp_path) -> None:
    root = str(tmp_path)
    records: list[dict] = []
    run_ipc_arm(
        4,
        host_census(root, 4),
        records.append,
        max_gpus=1,
        payload=HostShmPayload(root),
        timeout_s=60,
    )
    assert records[0]["note"] == "--ipc-gpus 1: checked the single-GPU round trip only"
    (arm,) = analyse(records)["ipc"]
    assert arm["mode"] == "same-gpu" and arm["all_correct"] and arm["error"] is None


def test_a_consumer_that_fails_to_open_is_named_and_the_others_are_kept(tmp_path) -> None:
    root = str(tmp_path)
    rec = run_mode(
        False,
        0,
        [1, 2, 3],
        host_census(root, 4),
        60,
        payload=HostShmPayload(root, fail={2: "open"}),
    )
    assert (
        rec["error"]
        == "consumer on GPU 2: open: RuntimeError: cudaIpcOpenMemHandle: invalid argument"
    )
    by = {c["gpu"]: c for c in rec["consumers"]}
    assert by[2]["error"] and not by[2]["held_during_census"]
    assert by[1]["slice_correct"] and by[3]["slice_correct"]  # what the others read is kept
    assert "census_opened" not in rec  # no census of a half-opened arm
    (arm,) = analyse([{"kind": "abtest.ipc", "mode": "no-redirect", **rec}])["ipc"]
    assert not arm["all_correct"] and arm["extra_on_producer_gpu_total_mib"] is None
    assert all(c["on_producer_gpu_mib"] is None for c in arm["consumers"])
    assert _no_children_left()
    # the report names the consumer in its row and the arm's error; exit 1 (a problem found)
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("ab-test", config={"gpu": 0})) as writer:
        writer.write({"kind": "abtest.ipc", "mode": "no-redirect", **rec})
        writer.close("complete")
    proc = run_cli("report", str(path), env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert proc.returncode == 1, proc.stderr
    assert (
        "no-redirect: error: consumer on GPU 2: open: RuntimeError: cudaIpcOpenMemHandle"
        in proc.stdout
    )
    row = next(line for line in proc.stdout.splitlines() if "error: open:" in line)
    assert row.split()[:3] == ["no-redirect", "0", "2"]  # mode, producer GPU, consumer GPU


def test_a_consumer_that_dies_silently_is_named_by_its_exit_code_without_waiting_for_the_timeout(
    tmp_path,
) -> None:
    root = str(tmp_path)
    started = time.monotonic()
    rec = run_mode(
        True,
        0,
        [1, 2, 3],
        host_census(root, 4),
        60,
        payload=HostShmPayload(root, fail={3: "crash"}),
    )
    assert time.monotonic() - started < 30
    assert rec["error"] == "consumer on GPU 3: exited with code 139 before 'opened'"
    assert _no_children_left()


def test_a_consumer_that_hangs_is_named_at_the_timeout_and_killed(tmp_path) -> None:
    root = str(tmp_path)
    rec = run_mode(
        False, 0, [1, 2], host_census(root, 3), 8, payload=HostShmPayload(root, fail={2: "hang"})
    )
    assert rec["error"] == "consumer on GPU 2: did not report 'opened' within 8 s"
    assert rec["consumers"][0]["slice_correct"] and rec["consumers"][0]["error"] is None
    assert _no_children_left()


def test_a_consumer_that_cannot_create_its_context_stops_the_mode_before_sharing(tmp_path) -> None:
    root = str(tmp_path)
    calls: list[float] = []
    rec = run_mode(
        False,
        0,
        [1, 2],
        host_census(root, 3, calls=calls),
        60,
        payload=HostShmPayload(root, fail={1: "prepare"}),
    )
    assert (
        rec["error"]
        == "consumer on GPU 1: prepare: RuntimeError: CUDA error: invalid device ordinal 1"
    )
    assert calls == [] and "producer" not in rec  # nothing shared, nothing measured
    assert _no_children_left()


def test_wrong_data_on_one_consumer_is_reported(tmp_path) -> None:
    root = str(tmp_path)
    rec = run_mode(
        True,
        0,
        [1, 2],
        host_census(root, 3),
        60,
        payload=HostShmPayload(root, fail={2: "bad-data"}),
    )
    assert rec["error"] is None
    (arm,) = analyse([{"kind": "abtest.ipc", "mode": "redirect", **rec}])["ipc"]
    assert [c["correct"] for c in arm["consumers"]] == [True, False] and not arm["all_correct"]


def test_a_hold_that_runs_out_before_the_census_ends_is_an_error(tmp_path) -> None:
    """The consumers may hold at most 0.5 s; the census takes 2 s: the arm must not pass off a
    census taken after they let go as one taken while they held."""
    root = str(tmp_path)
    rec = run_mode(
        False,
        0,
        [1, 2],
        host_census(root, 3, delay_s=2.0),
        60,
        payload=HostShmPayload(root),
        hold_s=0.5,
    )
    assert rec["error"] is not None
    for c in rec["consumers"]:
        assert c["error"] == "stopped holding the shared memory before the census ended"
        assert c["held_during_census"] is False


def test_census_gpus_are_matched_by_uuid(tmp_path) -> None:
    """CUDA ordinals 0..2 are NVML indices 2..4 (CUDA_VISIBLE_DEVICES=2,3,4)."""
    root = str(tmp_path)
    rec = run_mode(
        False, 0, [1, 2], host_census(root, 3, nvml_offset=2), 60, payload=HostShmPayload(root)
    )
    assert [c["census_gpu"] for c in rec["consumers"]] == [3, 4] and rec["producer"][
        "census_gpu"
    ] == 2
    (arm,) = analyse([{"kind": "abtest.ipc", "mode": "no-redirect", **rec}])["ipc"]
    assert [c["on_producer_gpu_mib"] for c in arm["consumers"]] == [CONTEXT_MIB, CONTEXT_MIB]
    assert [c["on_own_gpu_mib"] for c in arm["consumers"]] == [CONTEXT_MIB, CONTEXT_MIB]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 4),
        ("", 0),
        ("0,1", 2),
        ("3,1,0,2", 4),
        ("0,7,1", 1),
        ("1,-1,2", 1),
        ("GPU-6b9a1c2e,GPU-0f3d", 2),
        ("0,1,2,3,4,5", 4),
    ],
)
def test_cuda_visible_count(value: str | None, expected: int) -> None:
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert cuda_visible_count(4, env) == expected


ARM_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from support.ipc import HostShmPayload, host_census
    from vramdoctor.abtest.ipc_arm import main

    if __name__ == "__main__":
        n = int(sys.argv[1])
        root = {root!r}
        raise SystemExit(main(sys.argv[1:], census=host_census(root, n), payload=HostShmPayload(root)))
    """
)


def _arm_script(tmp_path: Path) -> list[str]:
    script = tmp_path / "arm.py"
    script.write_text(ARM_SCRIPT.format(tests=str(Path(__file__).parents[1]), root=str(tmp_path)))
    return [sys.executable, str(script)]


def test_line_protocol_to_run_file_to_report(tmp_path, monkeypatch) -> None:
    """The arm as its own process (5 GPUs, --ipc-gpus 4), streamed over `@@VD` lines into a run
    file, then `vramdoctor report` as a table and as --json, with the per-consumer figures."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("ab-test", config={"gpu": 0})) as writer:
        rc = run_ipc_subprocess(
            5, writer.write, command=_arm_script(tmp_path), max_gpus=4, timeout_s=120
        )
        writer.close("complete")
    assert rc == 0
    proc = run_cli("report", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    arms = {a["mode"]: a for a in json.loads(proc.stdout)["ipc"]}
    assert arms["no-redirect"]["extra_on_producer_gpu_total_mib"] == 3 * CONTEXT_MIB
    assert arms["no-redirect"]["extra_on_producer_gpu_contexts"] == pytest.approx(3.0)
    assert arms["redirect"]["extra_on_producer_gpu_total_mib"] == 0
    assert [c["gpu"] for c in arms["redirect"]["consumers"]] == [1, 2, 3]
    assert {a["gpu_count"] for a in arms.values()} == {4}
    text = run_cli("report", str(path), env={"NO_COLOR": "1", "COLUMNS": "250"}).stdout
    assert (
        "no-redirect: 4 MiB extra on producer GPU 0 per consumer (4 MiB, 4 MiB, 4 MiB), 12 MiB in all "
        "over 3 consumer(s) = 3.0 x a consumer's own CUDA context (4 MiB)\n"
        "  no-redirect: data read back correct on 3 of 3 consumer(s)"
    ) in text
    assert (
        "redirect: 0 MiB extra on producer GPU 0 per consumer (0 MiB, 0 MiB, 0 MiB), 0 MiB in all"
        in text
    )


def test_the_arm_process_uses_the_gpus_cuda_visible_devices_leaves_it(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    records: list[dict] = []
    assert run_ipc_subprocess(5, records.append, command=_arm_script(tmp_path), timeout_s=120) == 0
    assert [(r["mode"], r["consumer_gpus"], r["visible_gpu_count"]) for r in records] == [
        ("no-redirect", [1], 2),
        ("redirect", [1], 2),
    ]


def test_a_crashed_arm_process_leaves_one_failed_record(tmp_path) -> None:
    script = tmp_path / "boom.py"
    script.write_text("import sys\nprint('Segmentation fault', flush=True)\nsys.exit(139)\n")
    records: list[dict] = []
    assert (
        run_ipc_subprocess(4, records.append, command=[sys.executable, str(script)], max_gpus=2)
        == 139
    )
    (rec,) = records
    assert rec["mode"] == "failed" and rec["error"] == "IPC arm exited with code 139"
    assert rec["log_tail"] == ["Segmentation fault"]


def test_real_arm_without_torch_names_every_consumer(tmp_path) -> None:
    """`python -m vramdoctor.abtest.ipc_arm 3` where torch cannot be imported, in the arm and in
    the processes it spawns (a sitecustomize blocks it): each consumer says what to install."""
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()]),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [sys.executable, "-m", "vramdoctor.abtest.ipc_arm", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    records = [
        json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("@@VD ")
    ]
    assert [r["mode"] for r in records] == ["no-redirect", "redirect"]
    for rec in records:
        assert rec["consumer_gpus"] == [1, 2]
        for gpu in (1, 2):
            assert f"consumer on GPU {gpu}: prepare: MissingExtra: " in rec["error"]
        assert "pip install 'vramdoctor[gpu]'" in rec["error"]
        assert "census_before" not in rec and "producer" not in rec


@pytest.mark.parametrize("value", ["0", "-2"])
def test_ab_test_ipc_gpus_below_one_is_a_usage_error(value: str) -> None:
    code = (
        NO_TORCH
        + f"from vramdoctor.cli import main\nsys.exit(main(['ab-test', '--model', 'qwen2_vl', '--ipc-gpus', '{value}']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--ipc-gpus {value}: give 1 or more GPUs" in lines[0], proc.stderr
