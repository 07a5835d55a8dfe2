"""The report as a file: FILE.png (the chart of `vramdoctor.render.charts`) or FILE.html
(headline, layers, figures, settled levels and the chart inlined as a data URI).

The chart has one panel per layer (its shown series over time, rounds shaded, settled levels
as dots) and, for each leaking layer, its settled levels against cumulative requests with the
fitted Theil-Sen line and its projection to capacity.
"""

from __future__ import annotations

import base64
import html
import statistics
from pathlib import Path

from vramdoctor.errors import InputError
from vramdoctor.judge.results import LEAK, SoakAnalysis
from vramdoctor.render.charts import LeakFit, Line, Span, memory_chart
from vramdoctor.render.charts import Panel as ChartPanel
from vramdoctor.soak.report.layers import display_name, main_series
from vramdoctor.soak.report.sentences import (
    figures,
    headline,
    layer_order,
    layer_sentence,
    notes,
    suggestion,
)
from vramdoctor.soak.report.series import label, series_reason
from vramdoctor.soak.report.sparklines import time_range
from vramdoctor.soak.report.terminal import shown_series
from vramdoctor.soak.report.text import known, rate, value

__all__ = ["chart_png", "check_report_path", "write_report_file"]


def _fits(a: SoakAnalysis) -> list[LeakFit]:
    """The leaking layers' settled levels against cumulative requests, with capacity."""
    out = []
    cum, total = [], 0.0
    for r in a.rounds:
        total += r.reached
        cum.append(total)
    for name in layer_order(a):
        lay = a.layers[name]
        s = main_series(lay)
        if lay.verdict != LEAK or s is None or not known(s.slope_per_request):
            continue
        assert s.slope_per_request is not None
        pts = [(c, v) for c, v in zip(cum, s.settled, strict=False) if v is not None and known(v)]
        if s.baseline is not None:
            pts.insert(0, (0.0, s.baseline))
        if not pts:
            continue
        # The Theil-Sen line through the median point of the levels it was fitted on.
        xs = [p[0] for p in pts[1:]] or [p[0] for p in pts]
        ys = [p[1] for p in pts[1:]] or [p[1] for p in pts]
        intercept = statistics.median(
            y - s.slope_per_request * x for x, y in zip(xs, ys, strict=True)
        )
        cap = None
        p = lay.projection
        if p is not None and known(p.capacity_left) and s.last is not None:
            assert p.capacity_left is not None
            cap = s.last + p.capacity_left
        out.append(
            LeakFit(
                label(s) if s.kind == "kv" else f"{display_name(name)} {label(s)}",
                s.unit,
                pts,
                s.slope_per_request,
                intercept,
                cap,
            )
        )
    return out


def chart_png(a: SoakAnalysis, title: str) -> bytes:
    """The chart described in `vramdoctor.render.charts`, as PNG bytes."""
    rng = time_range(a)
    t0 = rng[0] if rng else 0.0
    end_all = rng[1] if rng else t0
    spans = []
    for w in a.windows:
        end = w.end if w.end is not None else end_all
        text = (
            f"round {w.round}" if w.kind == "load" else ("baseline" if w.kind == "baseline" else "")
        )
        spans.append(Span(w.kind, w.start - t0, end - t0, text))
    idle_mid = {
        w.round: ((w.start + (w.end or w.start)) / 2 - t0) for w in a.windows if w.kind == "idle"
    }
    panels = []
    for name in layer_order(a):
        lay = a.layers[name]
        lines = []
        for s in shown_series(lay, 5):
            if s.kind in ("arenas",):
                continue
            settled = [
                (idle_mid[r.round], v)
                for r, v in zip(a.rounds, s.settled, strict=False)
                if v is not None and r.round in idle_mid
            ]
            lines.append(
                Line(
                    f"{label(s)} [{s.verdict if s.decides else 'evidence'}]",
                    [(t - t0, v) for t, v in a.points.get(s.key, [])],
                    s.unit,
                    settled,
                )
            )
        unit = lay.unit if lay.unit != "ratio" else "share of the pool"
        panels.append(ChartPanel(f"{display_name(name)}: {lay.verdict}", unit, lines))
    return memory_chart(panels, spans, title, fits=_fits(a))


def check_report_path(path: Path | None) -> None:
    """Before any work: raise InputError (exit 2) for a report name that cannot be written (not
    .html/.htm/.png, a directory, or a path through a file). None passes."""
    if path is None:
        return
    if path.suffix.lower() not in (".html", ".htm", ".png"):
        raise InputError(f"--report {path}: use a .html or .png file name")
    if path.is_dir():  # found now, not after a long soak
        raise InputError(f"--report {path} is a directory: give a file name")
    if any(p.exists() and not p.is_dir() for p in path.parents):
        raise InputError(f"--report {path}: a part of its directory is a file")


def write_report_file(
    a: SoakAnalysis,
    path: Path,
    *,
    target: str | None = None,
    run_file: str | None = None,
    attribution_text: str | None = None,
) -> None:
    """FILE.png: the chart. FILE.html: what made it (`ReportMeta`: version, run file, time),
    headline, layers, figures, levels, the chart inlined, and for a `--attribute` run the
    attribution (`attribution_text`, as the terminal shows it). Written through
    `vramdoctor.render.files.write_report` (temp file + rename: never through a symlink)."""
    from vramdoctor.render.files import ReportMeta, write_report

    suffix = path.suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise InputError(f"--report {path}: use a .html or .png file name")
    title = f"vramdoctor soak: {a.verdict}" + (f" — {target}" if target else "")
    png = chart_png(a, title)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot write report {path}: {exc.strerror}") from None
    if suffix == ".png":
        write_report(path, png)
        return
    meta = ReportMeta("soak", run_file=run_file)
    write_report(path, _html(a, png, title, meta=meta.html(), attribution=attribution_text))


def _html(
    a: SoakAnalysis, png: bytes, title: str, *, meta: str = "", attribution: str | None = None
) -> str:
    e = html.escape
    layers = "".join(
        f"<tr><th>{e(display_name(n))}</th><td class='{e(a.layers[n].verdict)}'>"
        f"{e(a.layers[n].verdict.replace('_', ' '))}</td>"
        f"<td style='text-align:left'>{e(layer_sentence(a.layers[n], a))}</td></tr>"
        for n in layer_order(a)
    )
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in figures(a))
    head = "".join(f"<th>r{r.round}</th>" for r in a.rounds)
    body = ""
    for n in layer_order(a):
        for s in shown_series(a.layers[n], 12):
            cells = "".join(f"<td>{e(value(v, s.unit))}</td>" for v in s.settled)
            body += (
                f"<tr><td>{e(label(s))}</td><td>{e(value(s.baseline, s.unit))}</td>{cells}"
                f"<td>{e(rate(s.slope_per_request, s.unit) if s.verdict == LEAK and s.kind != 'arenas' else '-')}</td>"
                f"<td class='{e(s.verdict)}'>{e(s.verdict.replace('_', ' ') if s.decides else '(evidence)')}</td>"
                f"<td style='text-align:left'>{e(series_reason(s))}</td></tr>"
            )
    reqs = "".join(f"<td>{r.sent} ({r.errors} failed)</td>" for r in a.rounds)
    note_items = "".join(f"<li>{e(n)}</li>" for n in notes(a))
    sugg = suggestion(a)
    sugg_html = f"<p><b>To decide:</b> {e(sugg)}</p>" if sugg else ""
    img = base64.b64encode(png).decode("ascii")
    attribution_html = (
        f"<h2>Which code holds it (attribution)</h2><pre>{e(attribution)}</pre>"
        if attribution and attribution.strip()
        else ""
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{e(title)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
th{{background:#f4f4f4}}.LEAK{{color:#b00;font-weight:bold}}.CACHING{{color:#a60}}
.STABLE{{color:#080}}.INCONCLUSIVE{{color:#808}}.sentence{{font-size:1.2em;padding:.6em;border-left:4px solid #888}}</style>
</head><body><h1>{e(title)}</h1>{meta}
<p class="sentence {e(a.verdict)}">{e(headline(a))}</p>{sugg_html}
<h2>Verdict per memory layer</h2><table>{layers}</table>
<table>{rows}</table>
<img alt="memory over time per layer, rounds shaded; leak fit against requests" src="data:image/png;base64,{img}" style="max-width:100%">
<h2>Settled level after each round</h2>
<table><tr><th>series</th><th>baseline</th>{head}<th>rate / request</th><th>verdict</th><th>why</th></tr>
{body}<tr><td>requests</td><td></td>{reqs}<td></td><td></td><td></td></tr></table>
{attribution_html}<ul>{note_items}</ul>
<p style="color:#777">Shaded orange: load rounds; blue: idle windows; dots: settled levels; red line:
the fitted leak and its projection to capacity (in requests).
Generated by vramdoctor; the run file re-creates this report with <code>vramdoctor report RUN.jsonl</code>.</p>
</body></html>
"""


# --- a recorded run, end to end -----------------------------------------------------------------
