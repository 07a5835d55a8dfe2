"""fleet with the shipped recording rules, in a real Prometheus and a real VictoriaMetrics.

The rules (examples/monitoring/vramdoctor-fleet.rules.yml) are backfilled over the scenario's
history the way an operator would: `promtool tsdb create-blocks-from rules` against a running
Prometheus, the blocks moved into its data directory; `vmalert -replay` against
VictoriaMetrics. fleet must then read the recorded floors (`recorded_rules` names them; no
raw-sample screen is asked) and give every row the same verdict as from the raw samples.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests
from fixtures.fleet.scenario import scenario
from fleet_engines import APT, PROMETHEUS, PROMTOOL, VICTORIA, VMALERT, prometheus, victoriametrics

from vramdoctor.fleet import run_fleet

RULES = Path(__file__).parents[2] / "examples" / "monitoring" / "vramdoctor-fleet.rules.yml"
DAYS = 3.0


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _same_table(raw, recorded) -> None:  # type: ignore[no-untyped-def]
    assert recorded.recorded_rules, "the recording rules were not used"
    assert not any(
        'stddev_over_time((min_over_time({__name__="DCGM_FI_DEV_FB_USED"}' in q["query"]
        for q in recorded.queries
    )
    want = {r.key: r.verdict for r in raw.rows}
    got = {r.key: r.verdict for r in recorded.rows}
    assert set(got) == set(want)
    # the same verdict, or both "not a leak": a cache that fills and is given back every few
    # hours sits between STABLE and CACHING, and hourly floors taken at the rule group's own
    # evaluation times (offset by a hash of its name) can tip it either way
    calm = {"STABLE", "CACHING"}
    differ = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
    assert all(a in calm and b in calm for a, b in differ.values()), differ
    assert len(differ) <= 2, differ
    leaks = {r.key: r.growth_per_hour for r in raw.leaks}
    for r in recorded.leaks:
        assert r.growth_per_hour == pytest.approx(leaks[r.key], rel=0.05), r.key


def _window(end: float) -> tuple[float, float]:
    start = end - DAYS * 86400
    return start, end


@pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None, reason=f"needs prometheus and promtool ({APT})"
)
def test_prometheus_reads_the_backfilled_recording_rules(tmp_path: Path) -> None:
    end = (time.time() // 3600) * 3600 - 600
    sc = scenario(end, DAYS, 120.0)
    start, _ = _window(end)
    data = tmp_path / "data"
    with prometheus(tmp_path / "a", sc.series, data=data) as eng:
        raw = run_fleet(eng.url, since_s=DAYS * 86400, end=end)
        out = tmp_path / "rules-blocks"
        # --start on an even hour: promtool silently writes nothing when the first 2-hour block
        # holds no evaluation point (prometheus/prometheus#19714; the group's evaluation offset
        # is a hash of the file's path), docs/fleet.md
        first = (start - 3600) // 7200 * 7200
        done = subprocess.run(
            [
                str(PROMTOOL),
                "tsdb",
                "create-blocks-from",
                "rules",
                f"--start={_rfc3339(first)}",
                f"--end={_rfc3339(end)}",
                f"--url={eng.url}",
                f"--output-dir={out}",
                str(RULES),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    for block in out.iterdir():
        shutil.move(str(block), str(data / block.name))
    with prometheus(tmp_path / "b", data=data) as eng:
        recorded = run_fleet(eng.url, since_s=DAYS * 86400, end=end)
    assert "gpu:DCGM_FI_DEV_FB_USED:min_over_time1h" in recorded.recorded_rules
    assert "instance:sglang_num_used_tokens_idle:min_over_time1h" in recorded.recorded_rules
    _same_table(raw, recorded)


@pytest.mark.skipif(
    VICTORIA is None or VMALERT is None, reason=f"needs victoria-metrics and vmalert ({APT})"
)
def test_victoriametrics_reads_the_replayed_recording_rules(tmp_path: Path) -> None:
    end = (time.time() // 3600) * 3600 - 600
    sc = scenario(end, DAYS, 120.0)
    start, _ = _window(end)
    with victoriametrics(tmp_path / "vm", sc.series) as eng:
        raw = run_fleet(eng.url, since_s=DAYS * 86400, end=end)
        done = subprocess.run(
            [
                str(VMALERT),
                f"-rule={RULES}",
                f"-datasource.url={eng.url}",
                f"-remoteWrite.url={eng.url}",
                f"-replay.timeFrom={_rfc3339(start - 3600)}",
                f"-replay.timeTo={_rfc3339(end)}",
                "-replay.disableProgressBar",
                "-replay.rulesDelay=0s",
                "-loggerLevel=ERROR",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        requests.get(eng.url + "/internal/force_flush", timeout=60).raise_for_status()
        recorded = run_fleet(eng.url, since_s=DAYS * 86400, end=end)
    assert "gpu:DCGM_FI_DEV_FB_USED:min_over_time1h" in recorded.recorded_rules
    _same_table(raw, recorded)
