"""What crashes leave behind, on real /dev/shm segments and POSIX semaphores made by real child
processes that stay alive, close them, exit, or are killed; and `vramdoctor census` on them.

Segments are made as shm_open makes them (a file in /dev/shm, sized and written, mmap'd);
semaphores with CPython's own SemLock (sem_open: /dev/shm/sem.NAME), with unlink=False, as a
process that crashed before unlinking leaves them. Every name carries this test's random tag,
and every file is removed at the end (the test cleans up; vramdoctor never does).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vramdoctor.samples import GpuSample, ProcessGpuMemory
from vramdoctor.sources.leftovers import (
    Leftovers,
    LeftoverWatch,
    cleanup_commands,
    family_of,
    orphan_gpu_processes,
    scan,
)

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(
    not SHM.is_dir() or not os.access(SHM, os.W_OK), reason="no writable /dev/shm here"
)

MAKER = textwrap.dedent(
    """
    import mmap, os, sys, time
    import _multiprocessing
    name, mode, size = sys.argv[1].format(pid=os.getpid()), sys.argv[2], int(sys.argv[3])
    if name.startswith("sem."):
        # sem_open("/NAME") creates /dev/shm/sem.NAME; unlink=False keeps it, as a crash does
        sem = _multiprocessing.SemLock(1, 1, 1, "/" + name[4:], False)
        path = "/dev/shm/" + name
    else:
        path = "/dev/shm/" + name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size)
        m[:] = b"\\x01" * size          # touch every page: tmpfs now holds it
        if mode == "close":
            m.close()
            os.close(fd)
    print(path, flush=True)
    if mode == "exit":
        os._exit(0)                      # no clean-up: the file stays
    time.sleep(120)
    """
)


class Made:
    def __init__(self, proc: subprocess.Popen[str], path: Path) -> None:
        self.proc, self.path = proc, path

    @property
    def pid(self) -> int:
        return self.proc.pid


@pytest.fixture
def make() -> Iterator[object]:
    made: list[Made] = []

    def _make(name: str, mode: str = "hold", size: int = 1 << 20) -> Made:
        proc = subprocess.Popen(
            [sys.executable, "-c", MAKER, name, mode, str(size)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line, "the maker did not start"
        m = Made(proc, Path(line))
        made.append(m)
        if mode == "exit":
            proc.wait(timeout=30)
        return m

    yield _make
    for m in made:
        if m.proc.poll() is None:
            m.proc.kill()
        m.proc.wait(timeout=30)
        m.path.unlink(missing_ok=True)


def kill(m: Made) -> None:
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait(timeout=30)


def entry(lo: Leftovers, path: Path) -> object:
    found = [e for e in lo.entries if e.path == str(path)]
    assert found, f"{path.name} not listed: {[e.name for e in lo.entries]}"
    return found[0]


def tag() -> str:
    return secrets.token_hex(4)


def test_a_killed_sglang_creator_leaves_an_orphaned_pid_stamped_segment(make) -> None:
    m = make(f"sgl_shm_mm_{{pid}}_{tag()}", "hold", 3 << 20)
    alive = scan()
    e = entry(alive, m.path)
    assert (e.state, e.family, e.server, e.creator_pid) == (
        "in use",
        "sglang sgl_shm",
        "sglang",
        m.pid,
    )
    assert m.pid in e.holders and e.type == "segment"
    assert e.size_bytes >= 3 << 20  # tmpfs holds every page it wrote
    kill(m)
    dead = scan()
    e = entry(dead, m.path)
    assert e.state == "orphaned" and e.creator_alive is False and e.holders == []
    assert f"creator PID {m.pid} is gone" in e.why
    assert dead.problem and e in dead.orphaned


def test_a_live_creator_that_closed_its_segment_keeps_it(make) -> None:
    m = make(f"sgl_shm_mq_{{pid}}_{tag()}", "close")
    e = entry(scan(), m.path)
    assert e.state == "kept by its creator" and e.holders == [] and e.creator_alive is True


def test_a_crashed_loky_semaphore_is_an_orphaned_semaphore(make) -> None:
    m = make(f"sem.loky-{{pid}}-{tag()}", "hold")
    e = entry(scan(), m.path)
    assert e.type == "semaphore" and e.family == "loky semaphore" and e.state == "in use"
    kill(m)
    e = entry(scan(), m.path)
    assert e.state == "orphaned" and e.creator_pid == m.pid


def test_pid_less_segments_are_orphaned_only_when_every_process_could_be_inspected(make) -> None:
    held = make(f"vllm_offload_{tag()}-5f3c-4d58.mmap", "hold")
    gone = make(f"psm_{tag()}", "exit")
    lo = scan()
    h, g = entry(lo, held.path), entry(lo, gone.path)
    assert h.state == "in use" and h.server == "vllm" and h.family == "vllm offload region"
    assert g.creator_pid is None and g.holders == []
    if lo.processes_uninspectable:
        assert g.state == "unknown" and "could not be inspected" in g.why
        assert any("cannot be called orphaned" in n for n in lo.notes)
    else:
        assert g.state == "orphaned" and "no process has it open or mapped" in g.why


def test_a_reused_pid_is_not_a_live_creator(tmp_path) -> None:
    # A segment named after our own PID but made "before" this process started (its mtime
    # set back): the PID now belongs to a newer process, so its creator is gone.
    path = SHM / f"torch_{os.getpid()}_{secrets.randbelow(10**9)}_0"
    path.write_bytes(b"x" * 4096)
    try:
        started = time.time() - 3600 * 24 * 30
        os.utime(path, (started, started))
        e = entry(scan(), path)
        assert e.family == "torch shared tensor" and e.creator_alive is False
        assert "newer process" in e.why and e.state == "orphaned"
    finally:
        path.unlink(missing_ok=True)


def test_unknown_files_are_counted_not_listed(tmp_path) -> None:
    (tmp_path / "my_own_cache.bin").write_bytes(b"y" * 8192)
    (tmp_path / f"nccl-{tag()[:6]}").write_bytes(b"z" * 4096)
    lo = scan(str(tmp_path))
    assert [e.family for e in lo.entries] == ["nccl"]
    assert lo.other_files == 1 and lo.other_bytes >= 8192


def test_cleanup_is_text_quoted_per_family_and_nothing_is_removed(make) -> None:
    a = make(f"sgl_shm_mm_{{pid}}_{tag()}", "exit")
    b = make(f"sgl_shm_mm_{{pid}}_{tag()}", "exit")
    lo = scan()
    lines = cleanup_commands(lo)
    line = next(x for x in lines if "sglang sgl_shm" in x)
    assert line.startswith("rm -f -- ") and str(a.path) in line and str(b.path) in line
    assert a.path.exists() and b.path.exists()  # listed, never run


def test_the_watch_reports_what_appeared_and_became_orphaned_during_a_run(make) -> None:
    watch = LeftoverWatch()
    watch.start()
    m = make(f"sgl_shm_mm_{{pid}}_{tag()}", "hold", 2 << 20)
    change = watch.check()
    assert [e.name for e in change.appeared if e.path == str(m.path)] == [m.path.name]
    assert not [e for e in change.newly_orphaned if e.path == str(m.path)]
    kill(m)
    change = watch.check()
    assert [e.path for e in change.newly_orphaned if e.path == str(m.path)] == [str(m.path)]
    assert "became orphaned" in change.sentence() and "MiB" in change.sentence()
    assert json.loads(json.dumps(change.to_dict()))["newly_orphaned"]


def test_families_of_servers_and_runtimes() -> None:
    assert family_of("nccl-AbC123") == (None, family_of("nccl-AbC123")[1])  # type: ignore[index]
    assert family_of("sem.mp-4a5b6c7d")[1].semaphore  # type: ignore[index]
    assert family_of("joblib_memmapping_folder_12_ab_cd")[1].pid_stamped  # type: ignore[index]
    assert family_of("sgl_shm_mm_1_0a1b2c3d")[0] == "sglang"  # type: ignore[index]
    assert family_of("random.bin") is None


# --- GPU memory of a server that is gone --------------------------------------------------------


def _gpu_sample(*rows: tuple[int, str, float]) -> GpuSample:
    return GpuSample(
        t=1.0,
        wall=1.7e9,
        source="nvml",
        processes=[
            ProcessGpuMemory(pid=pid, gpu=0, used_mib=mib, name=title[:15], cmdline=[title])
            for pid, title, mib in rows
        ],
    )


def test_workers_whose_server_is_gone_are_orphans() -> None:
    parents = {
        100: (1, "systemd", ["/sbin/init"]),  # reparented: the server died
        101: (90, "python3", ["python3", "-m", "vllm.entrypoints.openai.api_server"]),
        102: (101, "VLLM::EngineCor", ["VLLM::EngineCore"]),
        103: (1, "systemd", ["/sbin/init"]),  # a frontend is the server itself
        104: (7, "raylet", ["raylet"]),  # Ray's workers are Ray's children
    }
    sample = _gpu_sample(
        (100, "VLLM::Worker_TP1", 70000.0),
        (101, "VLLM::EngineCore", 1200.0),
        (102, "VLLM::Worker_TP0", 70000.0),
        (103, "vllm serve Qwen/Qwen3-VL", 600.0),
        (104, "ray::RayWorkerWrapper.execute_method", 70000.0),
    )
    orphans = orphan_gpu_processes(sample, parent_of=parents.get)
    assert [(o.pid, o.role, o.ppid) for o in orphans] == [(100, "vllm worker TP1", 1)]
    assert "not a vLLM process" in orphans[0].why


def test_a_real_orphan_reparented_after_its_parent_died() -> None:
    # A "server" whose worker (argv[0] sglang::scheduler_TP0) outlives it, reparented.
    code = textwrap.dedent(
        """
        import subprocess, sys
        p = subprocess.Popen(
            ["sglang::scheduler_TP0", "120"], executable="/bin/sleep",
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        print(p.pid, flush=True)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    worker = int(out.stdout.strip())
    try:
        sample = _gpu_sample((worker, "sglang::scheduler_TP0", 512.0))
        orphans = orphan_gpu_processes(sample)
        assert [o.pid for o in orphans] == [worker]
        assert orphans[0].role == "sglang scheduler TP0" and orphans[0].kind == "sglang"
    finally:
        os.kill(worker, signal.SIGKILL)


# --- the command --------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "vramdoctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_census_only_leftovers_exit_1_json_text_and_report(make, tmp_path) -> None:
    m = make(f"sgl_shm_mm_{{pid}}_{tag()}", "hold")
    kill(m)
    r = run_cli("census", "--only-leftovers", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    names = [e["name"] for e in doc["leftovers"]["entries"] if e["state"] == "orphaned"]
    assert m.path.name in names
    assert any(f["code"] == "orphaned_shm" and f["problem"] for f in doc["flags"])
    assert any(str(m.path) in line for line in doc["leftovers"]["cleanup"])
    text = run_cli("census", "--only-leftovers")
    assert text.returncode == 1
    assert m.path.name in text.stdout and "orphaned" in text.stdout
    assert "vramdoctor never runs this" in text.stdout and "rm -f -- " in text.stdout
    assert m.path.exists()
    # Recorded and re-read: the same finding, offline.
    out = tmp_path / "c.jsonl"
    assert run_cli("census", "--only-leftovers", "--out", str(out)).returncode == 1
    again = run_cli("report", str(out), "--json")
    assert again.returncode == 1, again.stderr
    assert m.path.name in [e["name"] for e in json.loads(again.stdout)["leftovers"]["entries"]]


def test_census_only_leftovers_on_a_clean_directory_exits_0(tmp_path) -> None:
    r = run_cli("census", "--only-leftovers", "--shm-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "nothing orphaned is left by crashes" in r.stdout
    bad = run_cli("census", "--only-leftovers", "--no-leftovers")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_a_file_name_with_control_characters_is_counted_never_printed(tmp_path) -> None:
    hostile = "nccl-\x1b[2J\rOK: nothing left"
    (tmp_path / hostile).write_bytes(b"x" * 4096)
    (tmp_path / "nccl-\nSTABLE").write_bytes(b"x" * 4096)
    lo = scan(str(tmp_path))
    assert lo.entries == [] and lo.other_files == 2
    assert any("control characters" in n for n in lo.notes)
    r = run_cli("census", "--only-leftovers", "--shm-dir", str(tmp_path))
    assert "\x1b" not in r.stdout and "\r" not in r.stdout and "STABLE" not in r.stdout
