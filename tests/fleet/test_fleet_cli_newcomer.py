"""fleet as a newcomer meets it (the first-hour walk, docs/first-hour.md), by the real CLI
against a real Prometheus holding the scenario fleet (conftest: 6 days of history).

- a `--match` that matches nothing is not "healthy": exit 2 and one line naming the match;
- a window longer than the history: the header names the span the data cover (and the
  window asked), never the window alone, and every row's verdict is the one the exact window
  gives on the same data.

Skipped only where prometheus/promtool are absent (CI installs them).
"""

from __future__ import annotations

import json
import re

from conftest import DAYS, Loaded
from support.cli import vd


def _fleet(loaded: Loaded, *args: str) -> tuple[int, str, str]:
    r = vd(
        "fleet",
        "--prometheus",
        loaded.url,
        "--until",
        f"{loaded.end:.0f}",
        *args,
        timeout=240,
    )
    return r.returncode, r.stdout, r.stderr


def test_fleet_cli_match_that_matches_nothing_is_exit_2_in_one_line(prometheus_fleet) -> None:
    code, out, err = _fleet(prometheus_fleet, "--match", 'cluster="no-such-cluster"')
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert 'cluster="no-such-cluster"' in lines[0] and "nothing to judge" in lines[0], lines
    assert "No series to judge" not in out  # no empty table posing as a result
    code_j, out_j, _ = _fleet(prometheus_fleet, "--match", 'cluster="no-such-cluster"', "--json")
    assert code_j == 2
    doc = json.loads(out_j)
    assert doc["schema"] == "vramdoctor.error/1" and "no-such-cluster" in doc["error"]


def test_fleet_cli_window_longer_than_history_says_the_data_span(prometheus_fleet) -> None:
    asked = 20
    code_long, out_long, err_long = _fleet(prometheus_fleet, "--since", f"{asked}d")
    assert code_long in (0, 1), err_long
    title = next(line for line in out_long.splitlines() if line.startswith("fleet: "))
    m = re.match(r"fleet: (.+) of data \((\d+) days asked\), floors of", title)
    assert m, title
    assert m.group(2) == str(asked)
    covered = m.group(1)
    assert f"{asked} days" not in covered and re.match(r"(5|6) days", covered), title
    # the summary sentence speaks of the same span, not of the window
    assert f"over {asked} days" not in out_long.splitlines()[0]

    exact = _fleet(prometheus_fleet, "--since", f"{DAYS:g}d", "--json")
    longer = _fleet(prometheus_fleet, "--since", f"{asked}d", "--json")
    assert exact[0] == longer[0] == code_long
    verdicts_exact = {r["id"]: r["verdict"] for r in json.loads(exact[1])["rows"]}
    verdicts_long = {r["id"]: r["verdict"] for r in json.loads(longer[1])["rows"]}
    assert verdicts_exact and verdicts_long == verdicts_exact
    # the exact window's header is the window itself
    _, out_e, _ = _fleet(prometheus_fleet, "--since", f"{DAYS:g}d")
    title_e = next(line for line in out_e.splitlines() if line.startswith("fleet: "))
    assert title_e.startswith(f"fleet: {DAYS:g} days, floors of"), title_e
