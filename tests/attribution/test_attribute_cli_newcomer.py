"""`vramdoctor attribute` as README.md's example runs it (the first-hour walk, docs/first-hour.md),
by the real CLI on the shipped GPU snapshots: its output starts with its title (no empty first
line) and no size reads "0 Bytes" beside MiB figures."""

from __future__ import annotations

from pathlib import Path

from support.cli import vd

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "attribute" / "gpu"


def test_attribute_cli_starts_with_its_title_and_speaks_mib() -> None:
    snaps = [str(FIX / f"leak-{i}.pickle") for i in (1, 2, 3)]
    r = vd("attribute", *snaps, "--requests", "10")
    assert r.returncode == 1, (r.stdout, r.stderr)  # a growing stack: a problem found
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Attribution (PyTorch allocator snapshots"), lines[:2]
    assert "Bytes" not in r.stdout, r.stdout
    assert any(line.split()[-1:] == ["MiB"] and " 0 MiB" in line for line in lines), r.stdout
    assert "record_attribute_fixtures.py:46 keep_per_request" in r.stdout
