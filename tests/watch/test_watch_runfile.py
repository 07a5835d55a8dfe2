"""watch's rotating run files on real filesystems: a full disk, restarts, name collisions.

Each test fails on the writer as it was: on a full disk it kept every later record in memory
and never rotated past the stuck part; `--keep` counted only its own run's parts; a taken name
made the whole watch exit 2 mid-run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.disks import on_small_disk

from vramdoctor.record import make_header, read_run
from vramdoctor.watch.runfile import RotatingRunWriter

# A child process writes through the writer onto the small disk: 40,000 records of ~400 bytes
# (16 MB) into 256 KiB, measuring its own resident memory before and after, then frees space
# (a filler file it made first) and writes again once the retry time has passed.
CHILD = r"""
import json, os, sys, time
from pathlib import Path
from vramdoctor.record import make_header
from vramdoctor.watch.runfile import RotatingRunWriter

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

d = Path(sys.argv[1])
filler = d / "filler.bin"
filler.write_bytes(b"\0" * 96 * 1024)
said = []
w = RotatingRunWriter(d, lambda: make_header("watch", argv=["vramdoctor", "watch"]),
                      max_bytes=1024 * 1024, keep=100, retry_s=0.2, on_problem=said.append)
rec = {"kind": "host_memory", "t": 0.0, "wall": 0.0, "pad": "x" * 360}
for i in range(2000):  # warm the allocator before measuring
    w.write(dict(rec, t=float(i)))
before = rss_kib()
for i in range(40000):
    w.write(dict(rec, t=float(i)))
after = rss_kib()
stuck = w.path is None
filler.unlink()
for p in sorted(d.glob("watch-*.jsonl"))[:-1]:
    p.unlink()  # the operator frees space
time.sleep(0.3)
for i in range(50):
    w.write(dict(rec, t=float(i)))
w.close("complete")
print(json.dumps({"before": before, "after": after, "dropped": w.dropped, "stuck": stuck,
                  "said": said, "parts": [p.name for p in w.parts], "path": str(w.path)}))
"""


def test_a_full_disk_drops_records_counts_them_keeps_memory_flat_and_recovers(
    tmp_path: Path,
) -> None:
    disk = tmp_path / "disk"
    r = on_small_disk([sys.executable, "-c", CHILD, str(disk)], disk, size_kib=256)
    assert r.done.returncode == 0, r.done.stderr
    out = json.loads(r.done.stdout)
    # 40,000 records of ~400 bytes cannot fit: most are dropped, and counted
    assert out["dropped"] > 20000, out
    # memory stays flat: nothing refused is kept (the old writer kept them all: ~40 MiB)
    assert out["after"] - out["before"] < 4096, out
    said = " | ".join(out["said"])
    assert out["stuck"], out  # stopped writing (it did not grow the part past the disk)
    assert ("file-size limit" if r.kind == "rlimit" else "no space left on the device") in said
    assert "dropped (counted, not kept in memory)" in said
    assert "recording again in" in said  # it rotated past the stuck part once space came back
    assert len(out["parts"]) >= 2 and out["path"].endswith(out["parts"][-1])


def test_the_gap_is_written_into_the_next_parts_header(tmp_path: Path) -> None:
    # A directory that vanishes while watch records is a disk that refuses; the part after
    # the gap says how many records were dropped, since when and why.
    d = tmp_path / "runs"
    said: list[str] = []
    w = RotatingRunWriter(
        d,
        lambda: make_header("watch", argv=["vramdoctor"]),
        max_bytes=4096,
        retry_s=0.1,
        on_problem=said.append,
    )
    first = w.path
    assert first is not None
    w.write({"kind": "host_memory", "t": 1.0, "wall": 1.0})
    first.unlink()
    d.rmdir()
    d.write_text("not a directory any more")  # a file in its place: every open fails
    # the open part's handle still writes (into the unlinked file) until the part is full;
    # then no next part can be started
    for i in range(60):
        w.write({"kind": "host_memory", "t": float(i), "wall": float(i), "pad": "p" * 200})
    assert w.path is None and w.dropped >= 5
    d.unlink()
    d.mkdir()
    time.sleep(0.15)
    w.write({"kind": "host_memory", "t": 9.0, "wall": 9.0})
    w.close()
    assert w.path is not None
    run = read_run(w.path)
    gap = run.header["config"]["recording_gap"]
    assert gap["dropped_records"] == w.dropped and "cannot start a new run file" in gap["why"]
    assert any("recording again" in s for s in said)
    assert len(run.records) == 1 and run.status == "complete"


def _old_part(d: Path, name: str, *, pid: int, ended: bool, mtime: float) -> Path:
    p = d / name
    lines = [json.dumps({**make_header("watch", argv=["vramdoctor"]), "pid": pid})]
    lines.append(json.dumps({"kind": "host_memory", "t": 1.0, "wall": 1.0}))
    if ended:
        lines.append(json.dumps({"kind": "end", "t": 2.0, "wall": 2.0, "status": "complete"}))
    p.write_text("\n".join(lines) + "\n")
    os.utime(p, (mtime, mtime))
    return p


def test_keep_counts_the_parts_of_earlier_runs_and_spares_live_ones_and_links(
    tmp_path: Path,
) -> None:
    d = tmp_path / "runs"
    d.mkdir()
    dead_pid = 2**22 + 12345  # above pid_max's default: no such process
    t0 = time.time() - 86400
    old = [
        _old_part(
            d, f"watch-20261120-0{i}0000-1.jsonl", pid=dead_pid, ended=i % 2 == 0, mtime=t0 + i
        )
        for i in range(6)
    ]
    # another watch, alive, still writing its part (no end mark): never deleted
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = _old_part(
            d, "watch-20261119-000000-1.jsonl", pid=sleeper.pid, ended=False, mtime=t0 - 100
        )
        outside = tmp_path / "precious.txt"
        outside.write_text("keep me")
        link = d / "watch-20261118-000000-1.jsonl"
        link.symlink_to(outside)
        other = d / "notes.jsonl"  # not a part's name: not ours to count or delete
        other.write_text("{}\n")
        w = RotatingRunWriter(d, lambda: make_header("watch", argv=["vramdoctor"]), keep=3)
        w.close()
        left = sorted(p.name for p in d.iterdir())
        assert live.exists() and link.is_symlink() and outside.read_text() == "keep me"
        assert other.exists()
        # keep=3 counts every part: the live one, the two newest old ones... and ours. The live
        # part cannot go, so only the newest old part survives next to ours.
        survivors = [p for p in old if p.exists()]
        assert survivors == [old[-1]], left
        assert w.path is not None and w.path.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_taken_rotation_name_is_skipped_never_fatal(tmp_path: Path) -> None:
    d = tmp_path / "runs"
    d.mkdir()
    # plant every name of this second and the next one up to -5: files, and a link
    stamps = {time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() + k)) for k in range(3)}
    for stamp in stamps:
        for n in range(1, 6):
            target = d / f"watch-{stamp}-{n}.jsonl"
            if n == 3:
                target.symlink_to(tmp_path / "elsewhere.txt")
            else:
                target.write_text("planted\n")
    w = RotatingRunWriter(
        d, lambda: make_header("watch", argv=["vramdoctor"]), max_bytes=4096, keep=1000
    )
    for i in range(200):
        w.write({"kind": "host_memory", "t": float(i), "wall": float(i), "pad": "y" * 200})
    w.close()
    assert len(w.parts) > 3 and w.dropped == 0
    assert not (tmp_path / "elsewhere.txt").exists()  # nothing written through the link
    for p in w.parts:
        assert read_run(p).command == "watch"
    planted = [p for p in d.iterdir() if not p.is_symlink() and p.read_text() == "planted\n"]
    assert len(planted) == 4 * len(stamps)  # untouched


@pytest.mark.parametrize("keep", [1, 2])
def test_rotation_keeps_disk_bounded_within_one_run(tmp_path: Path, keep: int) -> None:
    d = tmp_path / "runs"
    w = RotatingRunWriter(
        d, lambda: make_header("watch", argv=["vramdoctor"]), max_bytes=4096, keep=keep
    )
    for i in range(500):
        w.write({"kind": "host_memory", "t": float(i), "wall": float(i), "pad": "z" * 100})
    w.close()
    parts = sorted(d.glob("watch-*.jsonl"))
    assert len(parts) == keep
    assert sum(p.stat().st_size for p in parts) < keep * (4096 + 1024)
    runs = [read_run(p) for p in parts]
    assert runs[-1].status == "complete"
    assert max(r.header["config"]["part"] for r in runs) > 10
