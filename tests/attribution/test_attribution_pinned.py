"""PyTorch 2.14-2.15 snapshot keys: `host_segments` / `host_traces` (pinned host memory recorded
with `_record_memory_history(record_pinned_host_memory=True)`), and snapshots taken with
`record_cuda=False` (no GPU segments at all). Read by `vramdoctor attribute` and a soak's diff;
pinned memory is attributed to its stack the way GPU memory is.

The host segment's shape is the device segment's (PyTorch 2.14's docstring says the host
allocator's traces "appear in the host_segments and host_traces keys"; the C++ that builds them is
not in the wheel: docs/attribute.md says what was and was not checked on a real 2.14).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

from vramdoctor.attribution import attribute_memories, has_device, has_pinned, load_snapshot
from vramdoctor.attribution.analysis import summarise

ROOT = Path(__file__).resolve().parents[2]
KIB = 1024
APP = [
    {"filename": "/srv/app/batching.py", "line": 88, "name": "stage_inputs"},
    {"filename": "/srv/app/server.py", "line": 40, "name": "handle"},
]
TORCH = {
    "filename": "/venv/lib/python3.12/site-packages/torch/cuda/memory.py",
    "line": 1,
    "name": "x",
}


def host_block(addr: int, size: int, live: bool) -> dict:
    return {
        "address": addr,
        "size": size,
        "requested_size": size,
        "state": "active_allocated" if live else "inactive",
        "frames": [TORCH, *APP] if live else [],
    }


def snapshot(kept: int, *, cuda: bool = True, traces: bool = False) -> dict:
    """`kept` pinned 512 KiB blocks held by stage_inputs, one cached free block, a GPU segment."""
    host = [
        {
            "address": 0x7E0000000000 + i * 512 * KIB,
            "total_size": 512 * KIB,
            "allocated_size": 512 * KIB,
            "blocks": [host_block(0x7E0000000000 + i * 512 * KIB, 512 * KIB, True)],
        }
        for i in range(kept)
    ]
    host.append(
        {"address": 1, "total_size": 2048 * KIB, "blocks": [host_block(1, 2048 * KIB, False)]}
    )
    snap: dict = {
        "segments": (
            [
                {
                    "device": 0,
                    "total_size": 2 << 20,
                    "segment_pool_id": (0, 0),
                    "blocks": [{"size": 2 << 20, "state": "active_allocated", "frames": APP}],
                }
            ]
            if cuda
            else []
        ),
        "device_traces": [[]],
        "allocator_settings": {"pinned_use_cuda_host_register": False},
        "external_annotations": [],
        "host_segments": [] if traces else host,
        "host_traces": (
            [
                {
                    "action": "alloc",
                    "addr": 0x7E0000000000 + i * 512 * KIB,
                    "size": 512 * KIB,
                    "frames": [TORCH, *APP],
                }
                for i in range(kept + 1)
            ]
            + [
                {
                    "action": "free_completed",
                    "addr": 0x7E0000000000 + kept * 512 * KIB,
                    "size": 512 * KIB,
                }
            ]
            if traces
            else []
        ),
    }
    return snap


def test_pinned_memory_is_attributed_to_the_stack_that_keeps_it() -> None:
    snaps = [snapshot(n) for n in (2, 6, 10, 14)]
    assert all(has_pinned(s) and has_device(s) for s in snaps)
    procs = attribute_memories(snaps, requests=[4, 4, 4], label="pid 7 (server)")
    assert [p.memory for p in procs] == ["cuda", "pinned"]
    gpu, pinned = procs
    assert gpu.growing == []  # the GPU segment is constant
    (g,) = pinned.growing
    assert [f.function for f in g.stack.frames] == ["stage_inputs"]
    assert g.bytes_per_request == 512 * KIB
    summary = summarise(snaps[-1], "pinned")
    assert summary.reserved_bytes == 14 * 512 * KIB + 2048 * KIB  # the cached free block held too
    assert summary.live_bytes == 14 * 512 * KIB
    assert pinned.to_dict()["memory"] == "pinned"


def test_record_cuda_false_snapshots_hold_pinned_memory_only() -> None:
    snaps = [snapshot(n, cuda=False) for n in (2, 6, 10)]
    assert not any(has_device(s) for s in snaps)
    (pinned,) = attribute_memories(snaps, requests=[4, 4], label="p")
    assert pinned.memory == "pinned" and pinned.growing
    assert any("record_cuda=False" in n for n in pinned.notes)


def test_host_traces_are_replayed_when_no_host_segments_are_given() -> None:
    snaps = [snapshot(n, traces=True) for n in (1, 5, 9)]
    (_gpu, pinned) = attribute_memories(snaps, requests=[4, 4], label="p")
    assert [s.live_bytes for s in pinned.summaries] == [n * 512 * KIB for n in (1, 5, 9)]
    (g,) = pinned.growing
    assert g.stack.frames[0].function == "stage_inputs"


def test_snapshots_of_older_torch_have_no_pinned_part() -> None:
    old = {k: v for k, v in snapshot(3).items() if k not in ("host_segments", "host_traces")}
    procs = attribute_memories([old, old], label="p")
    assert [p.memory for p in procs] == ["cuda"]


def test_the_attribute_command_reads_2_14_snapshots(tmp_path: Path) -> None:
    paths = []
    for i, n in enumerate((2, 6, 10, 14)):
        path = tmp_path / f"s{i}.pickle"
        path.write_bytes(pickle.dumps(snapshot(n, cuda=False), protocol=4))
        paths.append(path)
    assert load_snapshot(paths[0])["segments"] == []
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "attribute",
            *map(str, paths),
            "--requests",
            "4",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 1, out.stderr  # a stack grows: exit 1
    (proc,) = json.loads(out.stdout)["processes"]
    assert (
        proc["memory"] == "pinned"
        and proc["growing"][0]["stack"]["frames"][0]["function"] == "stage_inputs"
    )
    text = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "attribute", *map(str, paths), "--requests", "4"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "COLUMNS": "100"},
    )
    assert "pinned host memory held by a stack that grows every round" in text.stdout, text.stdout
    assert "batching.py:88 stage_inputs" in text.stdout
