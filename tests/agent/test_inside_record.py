"""The InsideSample run-file record (COMMON_CONTRACTS §2): written by RunWriter, read back by
record.read_run as the same typed record; a record whose fields have the wrong type is damage
(skipped and named), not a crash; run files without it read as before."""

from __future__ import annotations

import json
from pathlib import Path

from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.samples import SAMPLE_TYPES, InsideSample


def sample(round_: int = 1) -> InsideSample:
    return InsideSample(
        t=100.0 + round_,
        wall=1.7e9 + round_,
        pid=4242,
        round=round_,
        window="idle_end",
        cuda=[
            {
                "device": 0,
                "allocated_bytes": 3 * 2**20,
                "reserved_bytes": 20 * 2**20,
                "active_bytes": 3 * 2**20,
                "inactive_split_bytes": 2**20,
                "pools": [
                    {"pool_id": [0, 0], "reserved_bytes": 18 * 2**20, "allocated_bytes": 2**20},
                    {"pool_id": [1, 2], "reserved_bytes": 2 * 2**20, "allocated_bytes": 2**21},
                ],
            }
        ],
        glibc={
            "in_use_bytes": 5_000_000,
            "free_kept_bytes": 123_456,
            "mmap_bytes": 1_000_000,
            "arena_bytes": 4_500_000,
            "keepcost": 1024,
            "call_ms": 0.021,
        },
        python={"traced_bytes": 77, "top": [{"file": "a.py", "line": 3, "bytes": 77, "count": 1}]},
        error=None,
        host="h",
        program="server.py",
    )


def test_inside_sample_round_trips_through_a_run_file(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("soak")) as w:
        w.write(sample(0))
        w.write(InsideSample(t=102.0, wall=1.7e9, pid=4243, round=1, error="no glibc"))
        w.write(sample(2))
    run = read_run(path)
    assert run.problems == []
    got = run.of(InsideSample)
    assert got == [
        sample(0),
        InsideSample(t=102.0, wall=1.7e9, pid=4243, round=1, error="no glibc"),
        sample(2),
    ]
    assert got[1].cuda is None and got[1].glibc is None and got[1].window == "idle_end"
    line = json.loads(path.read_text().splitlines()[1])
    assert line["kind"] == "inside" and line["glibc"]["in_use_bytes"] == 5_000_000
    assert SAMPLE_TYPES["inside"] is InsideSample


def test_a_damaged_inside_record_is_skipped_and_named(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("soak")) as w:
        w.write(sample(1))
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["cuda"] = "lots"
    worse = json.loads(lines[1])
    worse["pid"] = "init"
    path.write_text("\n".join([lines[0], json.dumps(bad), json.dumps(worse), *lines[1:]]) + "\n")
    run = read_run(path)
    assert run.of(InsideSample) == [sample(1)]
    assert run.bad_lines == [2, 3]
    assert "line 2: cuda is a string, not a list" in run.problems[0]


def test_an_answer_from_a_hostile_directory_is_reduced_to_the_records_fields(
    tmp_path: Path,
) -> None:
    """The agent directory may belong to another user: what an answer says reaches the run file
    only as InsideSample's fields, each of its type and bounded."""
    from vramdoctor.agent.control import clean_inside

    hostile = {
        "cuda": [
            {"device": 0, "allocated_bytes": 10, "reserved_bytes": 1e400, "evil": "x" * 10**6},
            {"device": "0; rm -rf /", "allocated_bytes": 1},
            {"device": 1, "allocated_bytes": True, "pools": [{"pool_id": [1, "a", 2.5]}, "junk"]},
        ]
        + [{"device": 2}] * 500,
        "glibc": {"in_use_bytes": 2**70, "free_kept_bytes": -5, "call_ms": float("nan")},
        "python": {
            "allocated_blocks": 3,
            "tracing": "yes",
            "top": [{"file": "a" * 9999, "line": 1, "bytes": 2}] * 999,
        },
        "pinned": ["not", "a", "dict"],
        "error": "e" * 100_000,
        "extra": {"x": 1},
    }
    got = clean_inside(hostile)
    assert set(got) == {"cuda", "pinned", "glibc", "python", "cuda_ms", "error"}
    cuda = got["cuda"]
    assert cuda[0] == {"device": 0, "allocated_bytes": 10}
    assert cuda[1] == {"device": 1, "pools": [{"pool_id": [1]}]}
    assert len(cuda) == 63  # the first 64 entries read, one of them not a device
    assert got["glibc"] == {}  # too large, negative, NaN: none is a measurement
    assert got["python"]["tracing"] is False and len(got["python"]["top"]) == 50
    assert len(got["python"]["top"][0]["file"]) == 500
    assert got["pinned"] is None and len(got["error"]) == 500
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("soak")) as w:
        w.write(
            InsideSample(
                t=1.0, wall=1.0, pid=1, **{k: got[k] for k in ("cuda", "glibc", "python", "error")}
            )
        )
    run = read_run(path)
    assert run.problems == [] and len(run.of(InsideSample)) == 1
