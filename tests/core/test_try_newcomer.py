"""`vramdoctor try` says only true things (the first-hour walk, docs/first-hour.md), real runs.

- try fleet prints a fleet command to paste, but stops its Prometheus when it ends: the line
  after the command must say so and name `--keep`, and that command must indeed fail after the
  trial (what the note says is what happens);
- try watch's final table names its window as the most watch keeps (not as the run's length:
  never "10 minutes window" on a 45 s run) and counts rounds as the rows do (never "10 idle
  windows" above rows of "9 rounds").
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli_env, vd


@pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="needs prometheus and promtool (apt-get install prometheus; CI installs them)",
)
def test_try_fleet_says_its_printed_command_needs_keep(tmp_path: Path) -> None:
    r = vd("try", "fleet", "--dir", str(tmp_path), "--json", timeout=300)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    i = next(i for i, line in enumerate(lines) if line.strip().startswith("vramdoctor fleet "))
    note = " ".join(line.strip() for line in lines[i + 1 : i + 3])  # the note under it
    assert "stops when the trial ends" in note and "vramdoctor try fleet --keep" in note, note
    own = [line for j, line in enumerate(lines[: i + 3]) if j != i]  # the command: one line
    assert max(len(line) for line in own) <= 80, own  # its own lines fit 80 columns
    printed = shlex.split(lines[i].strip())
    after = subprocess.run(
        [sys.executable, "-m", "vramdoctor", *printed[1:]],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert after.returncode == 2, (after.stdout, after.stderr)  # gone, as the note said
    assert "cannot connect" in after.stderr or "refused" in after.stderr, after.stderr


def test_try_watch_table_title_says_true_words(tmp_path: Path) -> None:
    r = vd("try", "watch", "--duration", "20", "--dir", str(tmp_path), timeout=240)
    assert r.returncode in (0, 1), (r.stdout, r.stderr)
    title = next(line for line in r.stdout.splitlines() if line.startswith("watch: "))
    assert "window" not in title.split(",")[0], title  # not "10 minutes window" on a 20 s run
    assert title.startswith("watch: the last 10 minutes at most, "), title
    m = re.search(r"rounds \((\d+) rounds? between (\d+) idle windows\)", title)
    if m is None:
        pytest.skip(f"watch did not decide by rounds on this loaded machine: {title}")
    rounds, idle = int(m.group(1)), int(m.group(2))
    assert idle == rounds + 1, title
    per_row = set(re.findall(r"rounds, (\d+) rounds?\b", r.stdout))
    assert per_row <= {str(rounds)}, (title, per_row)  # the rows count the rounds the title does
