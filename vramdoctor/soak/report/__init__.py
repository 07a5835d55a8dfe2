"""What soak users see: the live view while it runs, and the final report.

The analysis (`vramdoctor.judge`) gives numbers and codes; this package turns them into
sentences, tables, sparklines, a chart and the `--json` object (schema `vramdoctor.soak/2`,
documented in docs/soak.md). Every number is formatted by `vramdoctor.units` with its unit. The
headline answers the VRAM question first, then names every other layer that is not STABLE or
CACHING; it is built from the same layer results as the table, so the two cannot disagree.
Nothing is cut at 80 columns or when piped: cells wrap, the verdict column never shrinks,
sparklines sit on their own line with their range printed.

One concern per module:

    text.py        numbers with their units (size, value, count, rate)
    series.py      one series in words: its label and why it got its verdict
    layers/        one block of sentences per memory layer (vram, kv, host) and their registry
    sentences.py   shared sentences: layer verdicts, headline, undecided, suggestion, notes, figures
    json_doc.py    the --json object
    sparklines.py  sparklines and the protocol's phase strip on one time axis
    live.py        the live view while the soak runs
    terminal.py    the terminal report
    files.py       --report FILE.png / FILE.html
    run.py         report_run: a recorded run, analysed and reported (soak's end, `vramdoctor report`)
"""

from __future__ import annotations

from vramdoctor.soak.report import layers
from vramdoctor.soak.report.files import chart_png, check_report_path, write_report_file
from vramdoctor.soak.report.json_doc import soak_json
from vramdoctor.soak.report.live import LiveView, SoakFeed
from vramdoctor.soak.report.run import report_run
from vramdoctor.soak.report.sentences import (
    figures,
    headline,
    layer_order,
    layer_sentence,
    notes,
    suggestion,
    undecided_text,
)
from vramdoctor.soak.report.series import label, series_reason
from vramdoctor.soak.report.sparklines import phase_strip, sparkline, time_sparkline
from vramdoctor.soak.report.terminal import VERDICT_STYLE, render
from vramdoctor.soak.report.text import count, rate, size, value

__all__ = [
    "VERDICT_STYLE",
    "LiveView",
    "SoakFeed",
    "chart_png",
    "check_report_path",
    "count",
    "figures",
    "headline",
    "label",
    "layer_order",
    "layer_sentence",
    "layers",
    "notes",
    "phase_strip",
    "rate",
    "render",
    "report_run",
    "series_reason",
    "size",
    "soak_json",
    "sparkline",
    "suggestion",
    "time_sparkline",
    "undecided_text",
    "value",
    "write_report_file",
]
