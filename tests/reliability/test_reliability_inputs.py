"""Bounded work from one input, damaged run files, and the command line's edges: real files and real
`vramdoctor` subprocesses.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import vd as _vd

from vramdoctor.errors import InputError
from vramdoctor.record import read_run
from vramdoctor.samples import GpuSample

ROOT = Path(__file__).resolve().parents[2]
LEAKING = ROOT / "tests" / "fixtures" / "soak" / "h200-leaking.jsonl"
PLAIN = ROOT / "tests" / "fixtures" / "soak" / "h200-plain.jsonl"


def vd(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return _vd(*args, cwd=cwd, env={"COLUMNS": "100"}, timeout=timeout)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramdoctor: error:"), r.stderr
    return lines[0]


# --- report /dev/zero is refused at once -----------------------------------------------------


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_report_of_dev_zero_is_refused_quickly(tmp_path: Path) -> None:
    started = time.monotonic()
    r = vd("report", "/dev/zero", cwd=tmp_path, timeout=60)
    assert "not a vramdoctor run file" in one_line_error(r)
    assert time.monotonic() - started < 20  # was: read until MemoryError


def test_a_header_line_beyond_64_kib_is_not_a_run_file(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    big.write_text('{"kind": "header", "pad": "' + "x" * 100_000 + '"}\n')
    with pytest.raises(InputError, match="first 64 KiB"):
        read_run(big)


# --- a run file with NaN values, out of order, wrong-typed ------------------------------------


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_nan_and_infinity_in_a_run_file_do_not_crash_the_reports(tmp_path: Path) -> None:
    lines = _lines(PLAIN)
    damaged = []
    for i, line in enumerate(lines):
        if '"kind":"gpu"' in line.replace(" ", "") and i % 7 == 0:
            line = line.replace('"used_mib":', '"used_mib":NaN,"x":', 1)
        elif '"kind":"metrics"' in line.replace(" ", "") and i % 5 == 0:
            line = line.replace(
                '"values":{', '"values":{"kv_usage_ratio":Infinity,"junk":-Infinity,', 1
            )
        damaged.append(line)
    run_file = tmp_path / "nan.jsonl"
    run_file.write_text("".join(damaged))
    html = tmp_path / "nan.html"
    r = vd("report", str(run_file), "--report", str(html), cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr  # was exit 2 half way through the report
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert html.stat().st_size > 1000
    j = vd("report", str(run_file), "--json", cwd=tmp_path)
    assert j.returncode in (0, 1), j.stderr
    assert (
        json.loads(j.stdout)["verdict"]
        == json.loads(vd("report", str(PLAIN), "--json", cwd=tmp_path).stdout)["verdict"]
    )
    run = read_run(run_file)
    assert all(isinstance(g.used_mib, float) for s in run.of(GpuSample) for g in s.gpus)


def test_out_of_order_lines_are_sorted_and_a_leak_stays_a_leak(tmp_path: Path) -> None:
    lines = _lines(LEAKING)
    body = lines[1:-1]
    random.Random(7).shuffle(body)
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join([lines[0], *body, lines[-1]]))
    want = json.loads(vd("report", str(LEAKING), "--json", cwd=tmp_path).stdout)
    r = vd("report", str(shuffled), "--json", cwd=tmp_path)
    got = json.loads(r.stdout)
    assert want["verdict"] == "LEAK"
    assert got["verdict"] == "LEAK", r.stderr  # was INCONCLUSIVE
    run = read_run(shuffled)
    ts = [getattr(rec, "t", None) or rec.get("t") for rec in run.records]
    assert ts == sorted(ts)
    assert any("out of time order" in p for p in run.problems)


def test_a_wrong_typed_field_is_one_sentence_naming_the_line(tmp_path: Path) -> None:
    lines = _lines(PLAIN)
    number = next(i for i, line in enumerate(lines) if '"kind":"gpu"' in line.replace(" ", "")) + 1
    lines[number - 1] = lines[number - 1].replace('"used_mib":', '"used_mib":"lots","was":', 1)
    bad = tmp_path / "typed.jsonl"
    bad.write_text("".join(lines))
    run = read_run(bad)
    assert run.bad_lines == [number]
    assert run.problems == [
        f"{bad}: line {number}: gpus[0].used_mib is a string, not a number; skipped"
    ]
    r = vd("report", str(bad), "--json", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr  # was: internal error: TypeError
    assert "internal error" not in r.stderr


# --- usage errors: one line; with --json an error object on stdout ----------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["soak", "--rounds", "many"],
        ["census", "--no-such-option"],
        ["report"],
        ["no-such-command"],
    ],
)
def test_usage_errors_are_one_line(tmp_path: Path, args: list[str]) -> None:
    r = vd(*args, cwd=tmp_path)
    message = one_line_error(r)
    assert "--help" in message and "╭" not in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["report", "/no/such/run.jsonl", "--json"],
        ["census", "--no-such-option", "--json"],
        ["diagnose", "/no/such/server.log", "--json"],
    ],
)
def test_json_errors_print_an_error_object_on_stdout(tmp_path: Path, args: list[str]) -> None:
    r = vd(*args, cwd=tmp_path)
    message = one_line_error(r)
    err = json.loads(r.stdout)
    assert err == {
        "schema": "vramdoctor.error/1",
        "error": message.removeprefix("vramdoctor: error: "),
        "exit_code": 2,
    }


# --- Ctrl-C in the first half second: no traceback --------------------------------------------


def test_ctrl_c_while_starting_prints_no_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "NO_COLOR": "1"}
    for delay in (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5):
        proc = subprocess.Popen(
            [sys.executable, "-m", "vramdoctor", "report", str(PLAIN)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
        if "init_import_site" in err or ("Traceback" in err and "vramdoctor" not in err):
            continue  # still inside Python's own start-up (site, runpy finding the module): not ours
        assert "Traceback" not in err, (delay, err)
        # 130: our one line; -SIGINT: the signal came before Python set up its handler (silent).
        assert proc.returncode in (0, 130, -signal.SIGINT), (delay, proc.returncode, err)


def test_huge_values_are_damage_not_numpy_warnings(tmp_path: Path) -> None:
    lines = _lines(LEAKING)
    out = []
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec.get("kind") == "gpu" and i % 4 == 0:
            for g in rec["gpus"]:
                g["used_mib"] = 1e300
        if rec.get("kind") == "host" and i % 4 == 1:
            for p in rec["processes"]:
                p["rss_mib"] = -1e308
        out.append(json.dumps(rec) + "\n")
    huge = tmp_path / "huge.jsonl"
    huge.write_text("".join(out))
    r = vd("report", str(huge), cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    assert "Warning" not in r.stderr and "overflow" not in r.stderr, r.stderr
    assert "beyond any measurement" in r.stdout
