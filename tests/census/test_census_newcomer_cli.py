"""census as a newcomer meets it (the first-hour walk, docs/first-hour.md), by the real CLI.

- docs/census.md's `census --json | jq ...` example: a census that could not look must not read
  as "nothing flagged" (where `jq '.flags'` prints null and the pipe exits 0);
- `--only-leftovers` looks at no GPU: its header and its OK line say what it looked at, never
  the GPU verdict ("no process shows a stray-context ...");
- a leftover of a few KiB is said in KiB, not "0.0 MiB";
- the no-NVML hint does not tell a census user to "watch" a host.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli_env, vd

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "census.md").read_text(encoding="utf-8")
DEAD = "http://127.0.0.1:1/metrics"  # nothing listens on port 1: the census cannot look


def _doc_json_example() -> str:
    lines = [
        ln.strip() for ln in DOC.splitlines() if re.match(r"\s+vramdoctor census --json \|", ln)
    ]
    assert lines, "docs/census.md lost its --json example"
    return lines[0].split("#")[0].strip()


def _shell(command: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """The docs' command line, run by a shell, `vramdoctor` being this interpreter's."""
    head, _, tail = command.partition(" | ")
    argv = " ".join([*head.split()[1:], *extra])
    line = f"{sys.executable} -m vramdoctor {argv} | {tail}"
    return subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, env=cli_env(), timeout=120
    )


def test_census_cli_failed_json_says_so_by_its_schema() -> None:
    r = vd("census", "--json", "--gpu-metrics", DEAD)
    assert r.returncode == 2, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["schema"] == "vramdoctor.error/1" and doc["exit_code"] == 2, doc
    assert "flags" not in doc and "problem" not in doc, doc  # never a census that found nothing
    assert "vramdoctor.error/1" in DOC and "no `flags`" in DOC  # documented in docs/census.md


@pytest.mark.skipif(shutil.which("jq") is None, reason="needs jq (the docs' example pipes to it)")
def test_census_cli_docs_json_example_fails_when_the_census_failed() -> None:
    command = _doc_json_example()
    failed = _shell(command, "--gpu-metrics", DEAD)
    assert failed.returncode != 0, (command, failed.stdout, failed.stderr)
    own = vd("census", "--json")
    here = _shell(command)
    if own.returncode == 2:  # no GPU source here: the documented line itself must fail
        assert here.returncode != 0, (command, here.stdout)
    else:  # a GPU here: it prints the flags, a list, and succeeds
        assert here.returncode == 0 and isinstance(json.loads(here.stdout), list), here.stdout


def test_census_cli_only_leftovers_says_what_it_looked_at(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    r = vd("census", "--only-leftovers", "--shm-dir", str(shm))
    assert r.returncode == 0, (r.stdout, r.stderr)
    text = " ".join(r.stdout.split())  # a long path may wrap the line at a space
    assert text.startswith(f"Census of what crashes left: {shm} only, no GPU looked at"), text
    assert "stray-context" not in text and "multi-GPU" not in text, text
    assert text.endswith(f"OK: nothing orphaned is left by crashes in {shm} (no GPU was looked at)")


def test_census_cli_a_few_kib_leftover_is_said_in_kib(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "sgl_shm_mm_999999_0a1b2c3d").write_bytes(b"x" * 4096)  # pid 999999: gone
    r = vd("census", "--only-leftovers", "--shm-dir", str(shm))
    assert r.returncode == 1, (r.stdout, r.stderr)
    row = next(line for line in r.stdout.splitlines() if "sgl_shm_mm_999999" in line)
    assert "4.0 KiB" in row and "0.0 MiB" not in r.stdout, r.stdout


def test_census_cli_no_gpu_hint_does_not_say_watch() -> None:
    r = vd("census")
    if r.returncode != 2 or "NVML" not in r.stderr:
        pytest.skip("NVML works here: the no-GPU line is not printed")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--gpu-metrics" in r.stderr and "watch a GPU host" not in r.stderr, r.stderr
