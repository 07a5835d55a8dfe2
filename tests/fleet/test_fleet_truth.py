"""fleet on the scenario fleet, against a real Prometheus AND a real VictoriaMetrics.

Every row is checked against the scenario's own parameters (tests/fixtures/fleet/scenario.py):
verdict, the true rate inside the 95 % interval, the change point of a leak that starts late,
restarts counted only for identity changes, counter resets and an emptied GPU (never for an
exporter outage, NaN runs, a cache given back or a decode server's KV), the rise and settled
level of CACHING rows, the host of every row (KV rows too), a stale series never ranked as a
live leak, an impossible free reading giving no time to OOM, and every SGLang/vLLM server a row.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import Loaded

from vramdoctor.fleet import run_fleet


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run(
        [sys.executable, "-m", "vramdoctor", "fleet", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, **(env or {})},
    )


def _json(engine: Loaded, *extra: str) -> tuple[int, dict]:
    done = _cli(
        "--prometheus",
        engine.url,
        "--since",
        "6d",
        "--until",
        f"{engine.end:.0f}",
        "--json",
        *extra,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_every_row_is_what_the_scenario_made_it(engine: Loaded) -> None:
    rc, doc = _json(engine, "--top", "0")
    assert rc == 1, doc  # live leaks found
    assert doc["schema"] == "vramdoctor.fleet/2" and doc["strategy"] == "screen"
    rows = {r["id"]: r for r in doc["rows"]}
    truth = engine.scenario.truth
    assert set(truth) == set(rows), (sorted(set(truth) - set(rows)), sorted(set(rows) - set(truth)))
    start = engine.end - 6 * 86400
    for key, want in truth.items():
        row = rows[key]
        where = (key, row["verdict"], row["why"])
        assert row["verdict"] in want.verdicts, where
        if row["screened"] and row["layer"] == "device":
            # never pulled: its floor never moved but while the GPU was empty; not counted
            assert row["restarts"] is None and want.restarts == 0, where
        else:
            assert row["restarts"] == want.restarts, where
        assert row["stale"] is want.stale, where
        assert row["host"] == want.host, where
        if want.rate is not None and "LEAK" in want.verdicts:
            lo, hi = row["growth_per_hour_ci"]
            assert lo <= want.rate <= hi, where  # the interval covers the truth
            assert row["growth_per_hour"] == pytest.approx(want.rate, rel=0.05), where
        if want.since_h is not None:
            assert row["reason"] == "grew_since_change", where
            assert abs(row["growing_since"] - (start + want.since_h * 3600)) <= 3 * 3600, where
        elif "LEAK" in want.verdicts:
            assert row["growing_since"] is None, where  # a steady leak is not "faster lately"
        if want.reason is not None:
            assert row["reason"] == want.reason, where
        if want.rise is not None:
            assert row["rise"] == pytest.approx(want.rise, rel=0.15), where
            assert row["settled_level"] is not None
        if want.oom_known is True:
            assert row["hours_to_oom"] == pytest.approx(
                row["free"] / row["growth_per_hour"], rel=1e-6
            ), where
            lo_h, hi_h = row["hours_to_oom_ci"]
            assert lo_h <= row["hours_to_oom"] <= hi_h
        if want.oom_known is False:
            assert row["hours_to_oom"] is None and row["free_note"], where
    # the late leak's time to OOM rests on the rate after the change, not the whole range's
    late = rows["gpu-a/device/gpu=0"]
    assert late["hours_to_oom"] == pytest.approx(late["free"] / 191.0, rel=0.05)
    # a KV pool's projection is "pool full"; a never-idle server has its row and says so
    assert rows["gpu-a/kv/pool=full"]["runs_out"] == "pool"
    assert rows["gpu-a/kv/pool=full"]["hours_to_oom"] == pytest.approx(
        (500_000 - rows["gpu-a/kv/pool=full"]["level"])
        / rows["gpu-a/kv/pool=full"]["growth_per_hour"],
        rel=1e-6,
    )
    assert "never idle" in rows["gpu-c/kv/pool=full"]["why"]
    # ranked: live leaks first, soonest out of memory first; the stale leak after them
    verdicts = [r["verdict"] for r in doc["rows"]]
    live = [r for r in doc["rows"] if r["verdict"] == "LEAK" and not r["stale"]]
    assert doc["rows"][: len(live)] == live and doc["leaks"] == len(live)
    ooms = [r["hours_to_oom"] for r in live if r["hours_to_oom"] is not None]
    assert ooms == sorted(ooms)
    assert verdicts[len(live)] == "LEAK" and doc["rows"][len(live)]["stale"]  # the stale leak next
    # every query made is listed: label names, instant and range queries, each with its figures
    kinds = {q["kind"] for q in doc["queries"]}
    assert kinds == {"labels", "instant", "range"}
    assert all(q["status"] == "ok" and q["seconds"] >= 0 for q in doc["queries"])


def test_the_database_screens_and_only_candidates_are_pulled(engine: Loaded) -> None:
    res = run_fleet(engine.url, since_s=6 * 86400, end=engine.end)
    screened = [r for r in res.rows if r.screened]
    assert screened and all(r.verdict == "STABLE" for r in screened)
    floors = [q for q in res.queries if q["kind"] == "range" and "resets(" not in q["query"]]
    pulled = sum(q["series"] for q in floors)
    assert pulled == res.seconds["candidates"]  # only the candidates' floors came back
    assert res.seconds["screened"] == len(screened) > 0
    assert all(q["step_s"] == 3600 for q in floors)  # one point an hour
    # and the screen changes no verdict: pulling everything gives the same table
    full = run_fleet(engine.url, since_s=6 * 86400, end=engine.end, strategy="pull")
    assert {r.key: r.verdict for r in full.rows} == {r.key: r.verdict for r in res.rows}
    assert sum(q["points"] for q in full.queries) > 5 * sum(q["points"] for q in res.queries)


def test_piped_output_is_whole_and_names_hosts_and_units(engine: Loaded) -> None:
    done = _cli(
        "--prometheus", engine.url, "--since", "6d", "--until", f"{engine.end:.0f}", "--top", "0"
    )
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpu-c GPU 0 PID 4242 is leaking GPU memory: +100 MiB per hour")
    body = lines[2:]
    header = body[0]
    assert re.split(r"\s{2,}", header.strip())[:4] == ["#", "where", "layer", "verdict"]
    rows = [ln for ln in body[1:] if re.match(r"\s*\d+\s", ln)]
    assert len(rows) == len(engine.scenario.truth)  # one line per row when piped: nothing wrapped
    text = done.stdout
    assert "gpu-a (10.0.0.1:30000) SGLang" in text  # a KV row names its host
    assert "pool full in" in text and "+64 tokens/h" in text  # KV growth has its sign and unit
    assert ".0 MiB" not in text  # whole MiB print whole
    assert "LEAK (stopped)" in text  # the stale leak is marked
    # a newline inside a label value is shown, not obeyed
    assert "python3\\nSTABLE: no leak anywhere" in text
    assert not any(ln.lstrip().startswith("STABLE: no leak") for ln in lines)


def test_at_80_columns_nothing_is_cut(engine: Loaded) -> None:
    done = _cli(
        "--prometheus",
        engine.url,
        "--since",
        "6d",
        "--until",
        f"{engine.end:.0f}",
        "--top",
        "0",
        env={"COLUMNS": "80"},
    )
    assert done.returncode == 1
    out = done.stdout
    assert max(len(ln) for ln in out.splitlines()) <= 80 or "--width" in out
    words = set(re.findall(r"\S+", out))
    for verdict in ("LEAK", "CACHING", "STABLE", "INCONCLUSIVE"):
        assert verdict in words
    assert not {"INCONCL", "USIVE", "verdic"} & words
    for host in ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e", "gpu-f"):
        assert host in words
    assert not re.search(r"\d\n\s*MiB", out)  # a number never leaves its unit


def test_too_little_history_is_never_called_healthy(engine: Loaded) -> None:
    first = engine.end - 6 * 86400
    done = _cli("--prometheus", engine.url, "--since", "4h", "--until", f"{first + 240:.0f}")
    assert done.returncode == 0, done.stderr
    head = done.stdout.splitlines()[0]
    assert head.startswith("Nothing could be judged: all ") and "INCONCLUSIVE" in head
    assert "No live leak" not in done.stdout and "No leak" not in done.stdout
    short = _cli(
        "--prometheus", engine.url, "--since", "4h", "--until", f"{first + 240:.0f}", "--json"
    )
    d = json.loads(short.stdout)
    assert all(r["verdict"] == "INCONCLUSIVE" for r in d["rows"]) and d["rows"]
    assert all(r["why"] for r in d["rows"])
