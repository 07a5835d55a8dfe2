"""Run files: round trips, a torn last line, Ctrl-C and a hard kill mid-write, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from vramdoctor.cli import main
from vramdoctor.errors import InputError
from vramdoctor.record import SCHEMA, RunWriter, make_header, read_run
from vramdoctor.samples import (
    Event,
    GpuMemory,
    GpuSample,
    HostProcessMemory,
    HostSample,
    MetricsSample,
    ProcessGpuMemory,
)


def gpu_sample(i: int) -> GpuSample:
    return GpuSample(
        t=100.0 + i,
        wall=1.7e9 + i,
        source="nvml",
        gpus=[
            GpuMemory(
                index=0,
                total_mib=81559.0,
                used_mib=1000.0 + i,
                free_mib=80559.0 - i,
                uuid="GPU-0",
                name="NVIDIA H100 80GB HBM3",
                driver_reserved_mib=536.0,
            )
        ],
        processes=[
            ProcessGpuMemory(
                pid=4242,
                gpu=0,
                used_mib=900.0 + i,
                name="python3",
                cmdline=["python3", "-m", "sglang.launch_server"],
            ),
            ProcessGpuMemory(pid=99999, gpu=0, used_mib=None, visible=False),
        ],
    )


def all_kinds() -> list[object]:
    return [
        gpu_sample(0),
        MetricsSample(
            t=100.5,
            wall=1.7e9,
            flavour="sglang",
            values={"kv_usage_ratio": 0.5},
            raw={'sglang:token_usage{tp_rank="0"}': 0.5},
        ),
        HostSample(
            t=100.6,
            wall=1.7e9,
            processes=[
                HostProcessMemory(pid=4242, rss_mib=2048.5, name="python3", role="tokenizer")
            ],
        ),
        Event(t=100.8, wall=1.7e9, name="round_end", data={"round": 1, "requests": 30}),
        gpu_sample(1),
    ]


def test_every_record_kind_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    header = make_header(
        "soak",
        argv=["vramdoctor", "soak", "http://127.0.0.1:30000"],
        target="http://127.0.0.1:30000",
        gpus=[{"index": 0, "name": "H100"}],
        config={"rounds": 3},
    )
    records = all_kinds()
    with RunWriter(path, header) as w:
        for r in records:
            w.write(r)
        w.write({"kind": "result", "verdict": "CACHING"})
    assert w.count == 1 + len(records) + 1 + 1  # header, records, result, end
    run = read_run(path)
    assert run.status == "complete" and not run.torn_tail and run.bad_lines == []
    assert run.command == "soak"
    assert run.header["schema"] == SCHEMA and run.header["config"] == {"rounds": 3}
    assert run.header["gpus"] == [{"index": 0, "name": "H100"}]
    assert [r for r in run.records if not isinstance(r, dict)] == records
    assert run.of(GpuSample) == [records[0], records[4]]
    assert run.raw("result") == [{"kind": "result", "verdict": "CACHING"}]
    # One JSON object per line, each one flushed: the file reads as JSON lines.
    lines = path.read_text().splitlines()
    assert all(json.loads(line)["kind"] for line in lines)


def test_each_record_is_on_disk_before_the_next_is_written(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("census", argv=["x"])) as w:
        for i in range(5):
            w.write(gpu_sample(i))
            # Another reader sees it at once (no buffering until close).
            assert len(read_run(path).of(GpuSample)) == i + 1


def test_torn_last_line_is_dropped_and_noted(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    w = RunWriter(path, make_header("soak", argv=["x"]))
    for i in range(10):
        w.write(gpu_sample(i))
    w._fh.close()  # the process died: no end mark  # type: ignore[union-attr]
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    for cut in (last_start + 1, last_start + 40, len(data) - 3):
        path.write_bytes(data[:cut])
        run = read_run(path)
        assert run.torn_tail, cut
        assert run.bad_lines == []
        assert [s.t for s in run.of(GpuSample)] == [100.0 + i for i in range(9)]
        assert run.status == "truncated"
    # Cut exactly at the end of a line: nothing torn, nothing lost.
    path.write_bytes(data[:last_start])
    run = read_run(path)
    assert not run.torn_tail and len(run.of(GpuSample)) == 9


def test_damaged_middle_line_is_reported_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("soak", argv=["x"])) as w:
        for i in range(3):
            w.write(gpu_sample(i))
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = '{"kind": "gpu", "t": 1\n'  # a corrupt record in the middle
    lines.insert(3, '["not", "an", "object"]\n')
    path.write_text("".join(lines))
    run = read_run(path)
    assert run.bad_lines == [3, 4]
    assert not run.torn_tail
    assert [s.t for s in run.of(GpuSample)] == [100.0, 102.0]
    assert run.status == "complete"


WRITER = textwrap.dedent("""
    import sys
    from vramdoctor.samples import GpuMemory, GpuSample, now
    from vramdoctor.record import RunWriter, make_header
    with RunWriter(sys.argv[1], make_header("soak", argv=["vramdoctor", "soak"])) as w:
        i = 0
        while True:
            t, wall = now()
            w.write(GpuSample(t=t, wall=wall, source="nvml", gpus=[
                GpuMemory(index=0, total_mib=1e6, used_mib=float(i), free_mib=1e6 - i)]))
            i += 1
""")


def _writer_until(path: Path, lines: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0 and path.read_bytes().count(b"\n") >= lines:
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"writer exited early with {proc.returncode}")
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("writer did not start")


def test_ctrl_c_mid_write_keeps_every_sample_and_marks_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    proc = _writer_until(path, 300)
    seen = path.read_bytes().count(b"\n") - 1
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    run = read_run(path)
    assert run.status == "interrupted"
    assert not run.torn_tail and run.bad_lines == []
    used = [s.gpus[0].used_mib for s in run.of(GpuSample)]
    assert len(used) >= seen
    assert used == [float(i) for i in range(len(used))]  # nothing lost before the signal


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_hard_kill_mid_write_loses_at_most_the_last_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    proc = _writer_until(path, 300)
    proc.kill()
    proc.wait(timeout=30)
    run = read_run(path)
    assert run.status == "truncated"
    assert run.bad_lines == []
    used = [s.gpus[0].used_mib for s in run.of(GpuSample)]
    assert len(used) >= 299
    assert used == [float(i) for i in range(len(used))]
    complete_lines = path.read_bytes().count(b"\n")
    assert len(used) == complete_lines - 1  # every complete line after the header is a sample


def test_several_threads_write_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("soak", argv=["x"])) as w:

        def worker(k: int) -> None:
            for i in range(200):
                w.write(Event(t=float(i), wall=0.0, name=f"w{k}", data={"i": i, "pad": "x" * 300}))

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    run = read_run(path)
    assert run.bad_lines == [] and not run.torn_tail
    events = run.of(Event)
    assert len(events) == 1600
    for k in range(8):
        assert [e.data["i"] for e in events if e.name == f"w{k}"] == list(range(200))


def test_writer_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    RunWriter(path, make_header("soak", argv=["x"])).close()
    before = path.read_bytes()
    with pytest.raises(InputError, match="already exists"):
        RunWriter(path, make_header("soak", argv=["x"]))
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty"),
        ("hello\nworld\n", "no header"),
        ('{"kind": "gpu", "t": 1, "wall": 2}\n', "no header"),
        ('{"kind": "header", "schema": "otherthing/1"}\n', "schema"),
        ('{"kind": "header", "schema": "vramdoctor.run/9"}\n', "upgrade vramdoctor"),
    ],
)
def test_foreign_files_are_input_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        read_run(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such run file"):
        read_run(tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match="directory"):
        read_run(tmp_path)


def test_report_command_on_bad_files_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\n")
    env = {**os.environ, "NO_COLOR": "1"}
    for target in (path, tmp_path / "missing.jsonl"):
        r = subprocess.run(
            [sys.executable, "-m", "vramdoctor", "report", str(target)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 2
        assert r.stdout == ""
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_report_reads_a_census_run_with_a_torn_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "census.jsonl"
    s = GpuSample(
        t=1.0,
        wall=1.7e9,
        source="nvml",
        gpus=[
            GpuMemory(index=0, total_mib=100, used_mib=50, free_mib=50),
            GpuMemory(index=1, total_mib=100, used_mib=50, free_mib=50),
        ],
        processes=[
            ProcessGpuMemory(pid=7, gpu=1, used_mib=40000.0),
            ProcessGpuMemory(pid=7, gpu=0, used_mib=512.0),
        ],
    )
    w = RunWriter(
        path,
        make_header("census", argv=["vramdoctor", "census"], config={"context_mib": [300, 700]}),
    )
    w.write(s)
    w._fh.write('{"kind": "gpu", "t": 2, "wal')  # type: ignore[union-attr]
    w._fh.close()  # type: ignore[union-attr]
    assert read_run(path).torn_tail
    code = main(["report", str(path), "--json"])
    assert code == 1
    doc = json.loads(capsys.readouterr().out)
    assert {f["code"] for f in doc["flags"]} == {"multi_gpu", "stray_context"}
