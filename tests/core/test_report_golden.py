"""`vramdoctor report --json` on every recorded run under tests/fixtures, against its saved answer.

The saved answers (tests/fixtures/report_golden/, one per run file, named after its path) are
what the analysis says of each recorded run. A change of verdict or figure on a recorded run is a
change of behaviour: it must be deliberate, regenerated with

    python tests/core/test_report_golden.py --write

and listed in the CHANGELOG with its reason.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = FIXTURES / "report_golden"
RUNS = sorted(p for p in FIXTURES.rglob("*.jsonl") if GOLDEN not in p.parents)


def _golden_path(run: Path) -> Path:
    return GOLDEN / (str(run.relative_to(FIXTURES)).replace("/", "__") + ".json")


def _report_json(run: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(run.relative_to(ROOT)), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "LANG": "C.UTF-8"},
        timeout=120,
    )
    assert proc.returncode in (0, 1), (run, proc.returncode, proc.stderr)
    return proc.stdout


def test_every_recorded_run_has_a_saved_answer() -> None:
    assert len(RUNS) >= 25
    missing = [str(r) for r in RUNS if not _golden_path(r).exists()]
    assert not missing, f"no saved answer for {missing}: run this file with --write"


@pytest.mark.parametrize("run", RUNS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_report_json_is_byte_identical_to_the_saved_answer(run: Path) -> None:
    golden = _golden_path(run)
    if not golden.exists():
        pytest.skip("no saved answer (reported by the test above)")
    assert _report_json(run) == golden.read_text(), (
        f"`vramdoctor report {run.relative_to(ROOT)} --json` changed: if deliberate, regenerate "
        "with `python tests/core/test_report_golden.py --write` and list it in the CHANGELOG"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for r in RUNS:
            _golden_path(r).write_text(_report_json(r))
            print("wrote", _golden_path(r).relative_to(ROOT))
