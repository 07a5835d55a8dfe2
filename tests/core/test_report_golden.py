"""`vramdoctor report --json` on every recorded run under tests/fixtures, against its saved answer.

Byte for byte, except that a float may differ in its last digits (see REL_TOL).

The saved answers (tests/fixtures/report_golden/, one per run file, named after its path) are
what the analysis says of each recorded run. A change of verdict or figure on a recorded run is a
change of behaviour: it must be deliberate, regenerated with

    python tests/core/test_report_golden.py --write

and listed in the CHANGELOG with its reason.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

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


# Figures derived by least squares and Student's t differ in their last digits between numpy/BLAS
# builds and scipy releases (the CI's newest and lowest versions): a float is the same answer when
# it agrees to 1e-7 relative or 1e-8 absolute (an interval's end near zero inherits the absolute
# noise of the larger terms it is computed from: 0.04206656580 against 0.04206656569, and
# 0.24100177388 against 0.24100177086 where the interval's half-width is 1.29, under numpy 1.23 /
# scipy 1.10, both seen in CI). A changed figure moves far more than that.
REL_TOL = 1e-7
ABS_TOL = 1e-8


def _same(a: Any, b: Any) -> bool:
    """Equal JSON values, floats compared to REL_TOL; every string, key and order exactly."""
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        if isinstance(a, bool) or isinstance(b, bool):
            return a is b
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _matches(text: str, saved: str) -> bool:
    if text == saved:
        return True
    try:
        return _same(json.loads(text), json.loads(saved))
    except ValueError:
        return False


def test_the_comparison_tells_a_changed_figure_from_float_noise() -> None:
    saved = '{"rate": 0.28954161617749874, "verdict": "LEAK", "n": 3}'
    assert _matches('{"rate": 0.2895416161733023, "verdict": "LEAK", "n": 3}', saved)
    assert not _matches('{"rate": 0.2896, "verdict": "LEAK", "n": 3}', saved)
    assert not _matches('{"rate": 0.28954161617749874, "verdict": "CACHING", "n": 3}', saved)
    assert not _matches('{"rate": 0.28954161617749874, "verdict": "LEAK", "n": 3.0001}', saved)
    assert not _matches('{"verdict": "LEAK", "rate": 0.28954161617749874, "n": 3}', saved)


def test_every_recorded_run_has_a_saved_answer() -> None:
    assert len(RUNS) >= 25
    missing = [str(r) for r in RUNS if not _golden_path(r).exists()]
    assert not missing, f"no saved answer for {missing}: run this file with --write"


@pytest.mark.parametrize("run", RUNS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_report_json_is_byte_identical_to_the_saved_answer(run: Path) -> None:
    golden = _golden_path(run)
    if not golden.exists():
        pytest.skip("no saved answer (reported by the test above)")
    assert _matches(_report_json(run), golden.read_text()), (
        f"`vramdoctor report {run.relative_to(ROOT)} --json` changed: if deliberate, regenerate "
        "with `python tests/core/test_report_golden.py --write` and list it in the CHANGELOG"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for r in RUNS:  # an answer that only moved in float noise is kept as it was
            out, path = _report_json(r), _golden_path(r)
            if path.exists() and _matches(out, path.read_text()):
                continue
            path.write_text(out)
            print("wrote", path.relative_to(ROOT))
