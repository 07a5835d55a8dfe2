"""Soak's report: terminal text, the live view, the PNG chart and the self-contained HTML file,
`report_run` over a run file whose writer was killed mid-line, and output that survives 80
columns, pipes, NaN values and out-of-order lines."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console
from test_soak_analysis import _arena_run, caching, flat, leak, synth

from vramdoctor.errors import InputError
from vramdoctor.judge import LEAK
from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.samples import GpuSample, MetricsSample
from vramdoctor.soak.analysis import analyse_soak
from vramdoctor.soak.report import (
    LiveView,
    phase_strip,
    render,
    report_run,
    sparkline,
    time_sparkline,
    write_report_file,
)
from vramdoctor.soak.traffic.client import Outcome
from vramdoctor.soak.traffic.schedule import ProtocolState

BLOCKS = "▁▂▃▄▅▆▇█"


def _text(res: object, width: int = 120) -> str:
    buf = io.StringIO()
    render(res, Console(file=buf, width=width, color_system=None))  # type: ignore[arg-type]
    return buf.getvalue()


def test_sparkline() -> None:
    assert sparkline([]) == ""
    assert sparkline([1, 1, 1]) == "▁▁▁"
    s = sparkline([0, 1, 2, 3, 4, 5, 6, 7])
    assert s[0] == "▁" and s[-1] == "█" and len(s) == 8
    assert len(sparkline(list(range(500)), width=40)) == 40


def test_half_a_mib_of_jitter_does_not_draw_full_height() -> None:
    jitter = [1000.0, 1000.5, 1000.0, 1000.5, 1000.2]
    line = sparkline(jitter, min_span=2.0)  # the series' floor: 2 MiB
    assert max(BLOCKS.index(c) for c in line) <= 2
    pts = [(float(i), v) for i, v in enumerate(jitter)]
    assert max(BLOCKS.index(c) for c in time_sparkline(pts, 0.0, 5.0, 5, min_span=2.0)) <= 2
    # Real growth still uses the whole height.
    assert sparkline([0.0, 100.0], min_span=2.0)[-1] == "█"


def test_terminal_report_says_the_verdict_per_layer_with_units() -> None:
    text = _text(analyse_soak(synth(leak(19.3))), width=250)
    assert "LEAK: VRAM leaks 19.3 MiB per request, in pid 4242 (python3) on GPU 0" in text
    assert "allocator memory that is never freed" in text
    assert "more requests at this rate" in text
    assert "KV pool" in text and "NOT MEASURED" in text
    assert "requests per round" in text


def test_report_at_80_columns_truncates_nothing() -> None:
    runs = [
        synth(
            leak(19.3),
            host_level=lambda k, f: 900.0 + 50 * (k + f),
            kv={"full": lambda k, f: 64.0 * 50 * k},
        ),
        synth(caching(140.0), rounds=12),
        _arena_run(),
    ]
    for recs in runs:
        text = _text(analyse_soak(recs, {"cpu_count": 16}), width=80)
        assert "…" not in text
        assert max(len(line) for line in text.splitlines()) <= 80
        for word in ("CACHING", "LEAK", "STABLE"):
            assert word[:-1] + "…" not in text


def test_report_piped_at_80_columns_truncates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunWriter(
        path, make_header("soak", argv=["vramdoctor", "soak"], config={"min_growth_mib": 2.0})
    ) as w:
        for r in synth(
            leak(2.0),
            rounds=8,
            host_level=lambda k, f: 900.0 + 24 * k,
            kv={"full": lambda k, f: 64.0 * 50 * k, "swa": flat(0.0)},
        ):
            w.write(r)
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    assert "…" not in r.stdout and "Traceback" not in r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    assert "KV pool" in r.stdout and "tokens" in r.stdout


def test_live_view_renders_progress_errors_sparklines_and_undecided_layers() -> None:
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=120, color_system=None)
    recs = synth(leak(2.0), rounds=1, kv={"full": flat(0.0)})
    view = LiveView(con, rounds=4, per_round=10)
    with view:
        for r in recs[:60]:
            view.on_sample("gpu", r)
        view.on_result(None, Outcome("ok", 200, 0.1))
        view.on_result(None, Outcome("timeout", None, 5.0))
        view.on_state(ProtocolState(phase="load", round=1))
        view.on_analysis(analyse_soak(synth(leak(2.0), rounds=2)))
    text = buf.getvalue()
    assert "timeout 1" in text
    assert "GPU 0 used" in text and "pid 4242" in text and "KV pool full" in text
    assert "undecided: VRAM: too few rounds" in text
    assert "▁" in text or "█" in text


def test_html_report_is_self_contained_and_png_is_a_png(tmp_path: Path) -> None:
    res = analyse_soak(
        synth(
            leak(5.0),
            host_level=lambda k, f: 900.0 + 10 * k,
            kv={"full": lambda k, f: 64.0 * 50 * k},
        )
    )
    html = tmp_path / "r.html"
    write_report_file(res, html, target="http://h:1")
    page = html.read_text()
    assert "data:image/png;base64," in page
    assert "http://" not in page.replace("http://h:1", "")  # nothing fetched from anywhere
    assert "Verdict per memory layer" in page and "LEAK" in page
    png = tmp_path / "r.png"
    write_report_file(res, png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(InputError, match=r"\.html or \.png"):
        write_report_file(res, tmp_path / "r.pdf")


def test_report_survives_nan_none_and_out_of_order_lines(tmp_path: Path, capsys) -> None:
    recs = synth(leak(4.0), kv={"full": lambda k, f: 64.0 * 50 * k}, host_level=flat(900.0))
    for i, r in enumerate(recs):
        if isinstance(r, GpuSample) and i % 5 == 0:
            r.processes[0].used_mib = math.nan
            r.gpus[0].free_mib = math.inf
        if isinstance(r, MetricsSample) and i % 9 == 0:
            r.kv[0].used_tokens = None
            r.kv[0].total_tokens = math.nan
    lines = list(recs)
    lines.reverse()  # written out of order
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("soak", argv=["vramdoctor", "soak"], config={})) as w:
        for r in lines:
            w.write(r)
    run = read_run(path)
    code = report_run(run, json_out=True, report_file=tmp_path / "r.html")
    d = json.loads(capsys.readouterr().out)
    assert code == 1 and d["verdict"] == LEAK and d["layers"]["vram"]["verdict"] == LEAK
    assert d["layers"]["kv"]["verdict"] == LEAK
    assert (tmp_path / "r.html").exists()
    code = report_run(run, json_out=False, report_file=None)
    out = capsys.readouterr()
    assert code == 1 and "Traceback" not in out.err and "LEAK" in out.out


def test_report_run_reads_a_run_cut_mid_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "run.jsonl"
    w = RunWriter(
        path, make_header("soak", argv=["vramdoctor", "soak"], config={"min_growth_mib": 2.0})
    )
    for r in synth(leak(4.0)):
        w.write(r)
    w._fh.write('{"kind":"gpu","t":1')  # the writer killed mid-line: no end mark, torn tail
    w._fh.flush()
    run = read_run(path)
    assert run.torn_tail and run.status == "truncated"
    code = report_run(run, json_out=True, report_file=None)
    d = json.loads(capsys.readouterr().out)
    assert code == 1 and d["verdict"] == LEAK and d["status"] == "truncated"
    assert any("torn" in n for n in d["notes"])


def test_collector_and_live_view_can_share_samples_across_threads() -> None:
    con = Console(file=io.StringIO(), force_terminal=True, width=100, color_system=None)
    view = LiveView(con, rounds=1, per_round=100)
    recs = synth(leak(1.0), rounds=1)
    with view:
        ts = [
            threading.Thread(target=lambda: [view.on_sample("gpu", r) for r in recs]),
            threading.Thread(
                target=lambda: [view.on_result(None, Outcome("ok", 200, 0.0)) for _ in range(100)]
            ),
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert view.progress.tasks[1].completed == 100


def test_terminal_chart_marks_rounds_and_idle_on_the_time_axis() -> None:
    recs = synth(leak(5.0))  # 10 s baseline, 4 x (8 s load + 10 s idle)
    res = analyse_soak(recs)
    t0, t1 = 1000.0, 1082.0
    strip = phase_strip(res, t0, t1, 41)  # 2 s a cell
    assert strip.startswith("bbbbb1111.....") and strip.rstrip().endswith(".")
    assert [strip.count(str(k)) for k in range(1, 5)] == [4, 4, 4, 4]
    line = time_sparkline(res.points["gpu0/pid4242"], t0, t1, 41)
    assert len(line) == 41
    assert line[0] == "▁"  # lowest at the baseline
    assert BLOCKS.index(line[-1]) >= 5  # the leak: high at the end (only load peaks are higher)
    assert len(set(line[5:9])) > 1  # load peaks inside round 1
    text = _text(res)
    assert "b baseline, 1-9 load round, . idle" in text
    assert "GPU 0 pid 4242 python3: 600 MiB to" in text  # each line's range, with its unit


@pytest.mark.parametrize("big", [1e300, 1.7e308])
def test_huge_values_reach_neither_stderr_nor_a_crash(big: float) -> None:
    # A broken exporter reporting values near the float limit: numpy/scipy/matplotlib would
    # print overflow warnings on stderr; the analysis and every report stay quiet and finite.
    import warnings

    from vramdoctor.soak.report import chart_png, soak_json

    # matplotlib's own import may warn (3.6 under pyparsing 3.3: 'setParseAction' deprecated,
    # seen in CI's lowest versions): imported first, so only what the huge values cause counts
    pytest.importorskip("matplotlib.figure")
    pytest.importorskip("matplotlib.backends.backend_agg")
    recs = synth(
        lambda k, f: big * (k + f),
        host_level=lambda k, f: big * k,
        kv={"full": lambda k, f: big * k},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = analyse_soak(recs)
        json.dumps(soak_json(res), allow_nan=False)
        _text(res, width=80)
        assert chart_png(res, "t")[:4] == b"\x89PNG"
