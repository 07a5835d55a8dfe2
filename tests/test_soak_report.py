"""Soak's report: terminal text, the live view, the PNG chart and the self-contained HTML file,
and `report_run` over a run file whose writer was killed mid-line."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
from rich.console import Console
from test_soak_analysis import leak, synth

from vramdoctor.analysis.soak import LEAK, analyse
from vramdoctor.cli.soak import report_run
from vramdoctor.errors import InputError
from vramdoctor.load.client import Outcome
from vramdoctor.load.protocol import ProtocolState
from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.report.soak import LiveView, render, sparkline, write_report_file


def test_sparkline() -> None:
    assert sparkline([]) == ""
    assert sparkline([1, 1, 1]) == "▁▁▁"
    s = sparkline([0, 1, 2, 3, 4, 5, 6, 7])
    assert s[0] == "▁" and s[-1] == "█" and len(s) == 8
    assert len(sparkline(list(range(500)), width=40)) == 40


def test_terminal_report_says_the_verdict_and_the_numbers() -> None:
    recs = synth(leak(19.3))
    res = analyse(recs)
    buf = io.StringIO()
    render(res, Console(file=buf, width=120, color_system=None))
    text = buf.getvalue()
    assert "LEAK: GPU 0 memory of pid 4242" in text
    assert "19.300 MiB" in text
    assert "allocator" in text
    assert "r4" in text and "requests" in text


def test_live_view_renders_progress_errors_and_sparklines() -> None:
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=120, color_system=None)
    recs = synth(leak(2.0), rounds=1)
    view = LiveView(con, rounds=4, per_round=10)
    with view:
        for r in recs[:40]:
            view.on_sample("gpu", r)
        view.on_result(None, Outcome("ok", 200, 0.1))
        view.on_result(None, Outcome("timeout", None, 5.0))
        st = ProtocolState(phase="load", round=1)
        view.on_state(st)
    text = buf.getvalue()
    assert "timeout 1" in text
    assert "GPU 0 used" in text and "pid 4242" in text
    assert "▁" in text or "█" in text


def test_html_report_is_self_contained_and_png_is_a_png(tmp_path: Path) -> None:
    recs = synth(leak(5.0))
    res = analyse(recs)
    html = tmp_path / "r.html"
    write_report_file(res, html, target="http://h:1")
    page = html.read_text()
    assert "data:image/png;base64," in page
    assert "http://" not in page.replace("http://h:1", "")  # nothing fetched from anywhere
    assert res.sentence.split(":")[0] in page
    png = tmp_path / "r.png"
    write_report_file(res, png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(InputError, match=r"\.html or \.png"):
        write_report_file(res, tmp_path / "r.pdf")


def test_report_run_reads_a_run_cut_mid_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "run.jsonl"
    w = RunWriter(path, make_header("soak", argv=["vramdoctor", "soak"], config={"min_growth_mib": 2.0}))
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
    # The collector thread feeds the live view while the load threads advance it.
    con = Console(file=io.StringIO(), force_terminal=True, width=100, color_system=None)
    view = LiveView(con, rounds=1, per_round=100)
    recs = synth(leak(1.0), rounds=1)
    with view:
        ts = [threading.Thread(target=lambda: [view.on_sample("gpu", r) for r in recs]),
              threading.Thread(target=lambda: [view.on_result(None, Outcome("ok", 200, 0.0)) for _ in range(100)])]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert view.progress.tasks[1].completed == 100


def test_terminal_chart_marks_rounds_and_idle_on_the_time_axis() -> None:
    from vramdoctor.analysis.soak import extract_series
    from vramdoctor.report.soak import phase_strip, time_sparkline

    recs = synth(leak(5.0))  # 10 s baseline, 4 x (8 s load + 10 s idle)
    res = analyse(recs)
    _, points = extract_series(recs)
    t0, t1 = 1000.0, 1082.0
    strip = phase_strip(res, t0, t1, 41)  # 2 s a cell
    assert strip.startswith("bbbbb1111.....") and strip.rstrip().endswith(".")
    assert [strip.count(str(k)) for k in range(1, 5)] == [4, 4, 4, 4]
    line = time_sparkline(points["gpu0/pid4242"], t0, t1, 41)
    assert len(line) == 41
    blocks = "▁▂▃▄▅▆▇█"
    assert line[0] == "▁"  # lowest at the baseline
    assert blocks.index(line[-1]) >= 5  # the leak: high at the end (only load peaks are higher)
    assert len(set(line[5:9])) > 1  # load peaks inside round 1
    buf = io.StringIO()
    render(res, Console(file=buf, width=120, color_system=None))
    assert "b base, N load, . idle" in buf.getvalue()
