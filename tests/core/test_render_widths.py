"""Every command's output at 60, 80, 120 and 200 columns and piped: no number or word is ever cut.

Each command runs for real (the CLI entry point, in this process for speed: `main([...])` with
stdout and stderr captured, which is what a pipe is) on real inputs: recorded runs, shipped logs,
a loopback exporter page, a real Prometheus with generated history, a recorded watch of the
reference server. Its output at `--width 10000` is the reference: nothing there needs wrapping.

What counts as a cut, at a width W (and in a pipe, with no width at all):
- a word that is not a word of the reference (`INCONCL` / `USIVE`, `pro…`, `--kubernetes-virt`);
- a number standing without the unit it carries in the reference (`0.0` / `MiB`), counted: a
  bare number may appear no more often than it does in the reference;
- at a width W, a line wider than W that holds no word too long for it (output laid out for
  some other width, as a table that ignores --width); example command lines are exempt.
Words are `vramdoctor.render.wrap.unit_words` (a number and its unit are one), with table
borders and punctuation around a word ignored, and the words of a chart drawn to the width it
is given (soak's sparkline and its round axis) left out. Leaving a whole column out is not a cut (the
table says so in a line of its own, which is not compared).

A command that still cuts is listed in `KNOWN_CUTS` with its owner, as a strict xfail: the test
then passes while it cuts and fails the day it stops (remove it from the list then).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from vramdoctor.cli import COMMANDS, main
from vramdoctor.render import console
from vramdoctor.render.wrap import unit_words

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
WIDTHS = (60, 80, 120, 200)
REFERENCE_WIDTH = 10_000

# scenario -> owner: these still cut at some width (tell the owner; remove when fixed)
KNOWN_CUTS: dict[str, str] = {}

_BORDER = "│┃║|─━═┏┓┗┛┡┩╇╋┳┻├┤┼╭╮╰╯┌┐└┘╷╵┬┴╴╶╸╺+"
_STRIP = _BORDER + "()[]{},;:.\"'`"
# soak's time chart: its sparkline (blank where a series has no sample) and its round axis (b
# baseline, 1..N rounds, . idle, - between windows) are drawn to the width they are given; a
# chart of another width is not a cut.
_CHART = re.compile(r"^[▁▂▃▄▅▆▇█_=#-][▁▂▃▄▅▆▇█_=# -]*$|^[b\d. -]*\.\.[b\d. -]*$|^b{2,}[\d. -]*$")
# A wall-clock time or date in the output (census's header: the measurement's own time) differs
# between the reference run and the narrow one by the second it ran in: compared as one word.
_CLOCK = re.compile(r"\b\d{2}:\d{2}(?::\d{2})?\b|\b\d{4}-\d{2}-\d{2}\b")
_NUMBER = re.compile(r"^[+\-−~]?\d[\d,]*(?:\.\d+)?%?$")


def words(text: str) -> list[str]:
    """The words of `text` as the check sees them (module docstring)."""
    out: list[str] = []
    in_note = False
    for line in text.splitlines():
        if line.lstrip().startswith("(not shown at "):
            in_note = True  # the table's own note on columns left out (it may wrap)
        if in_note:
            in_note = not line.rstrip().endswith(")")
            continue
        if _CHART.match(line.strip()):
            continue  # a sparkline or a round axis, drawn to its width: not words
        for start, end in unit_words(line):
            word = line[start:end].strip(_STRIP)
            if word and not all(c in _BORDER for c in word) and not _CHART.match(word):
                out.append(_CLOCK.sub("<time>", word))
    return out


def _example(line: str) -> bool:
    """A command line shown as an example (help pages: indented, naming vramdoctor): printed
    whole, never wrapped."""
    return line.startswith("    ") and "vramdoctor" in line


def overflows(text: str, width: int) -> list[str]:
    """Lines wider than `width` that hold no word too long to fit: laid out for another
    width (a table that ignores --width/COLUMNS). An example command is allowed its length."""
    out = []
    for line in text.splitlines():
        if len(line.rstrip()) <= width or _example(line):
            continue
        longest = max((e - s for s, e in unit_words(line)), default=0)
        if longest < width // 2:
            out.append(f"a line of {len(line.rstrip())} columns: {line.strip()[:60]!r}")
    return out


def cuts(reference: str, narrow: str, width: int | None = None) -> list[str]:
    """What `narrow` cut, compared with `reference` (empty: nothing); with `width`, also the
    lines that overflow it."""
    ref, got = words(reference), words(narrow)
    known = set(ref)
    problems = [f"fragment {w!r}" for w in dict.fromkeys(got) if w not in known]
    if width is not None:
        problems += overflows(narrow, width)
    bare_ref = Counter(w for w in ref if _NUMBER.match(w))
    bare_got = Counter(w for w in got if _NUMBER.match(w))
    for number, n in (bare_got - bare_ref).items():
        problems.append(f"{number!r} without its unit ({n} more time(s) than in the reference)")
    return problems


_lock = threading.Lock()


def render(args: list[str], width: int | None) -> tuple[int, str]:
    """`vramdoctor ARGS` (with `--width W` after them unless None: piped), stdout + stderr."""
    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    with _lock:
        try:
            os.environ.pop("COLUMNS", None)
            os.environ["NO_COLOR"] = "1"
            os.environ["CI"] = "1"
            console._reset()
            argv = [*args, *(["--width", str(width)] if width is not None else [])]
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            console._reset()
    return code, out.getvalue() + err.getvalue()


# --- the scenarios: every command, on real inputs -------------------------------------------


def _logs() -> list[str]:
    return [str(p) for p in sorted((ROOT / "examples" / "logs").glob("*.log"))]


STATIC: dict[str, list[str]] = {
    "soak report (leak)": ["report", str(FIX / "soak" / "h200-leaking.jsonl")],
    "soak report (caching)": ["report", str(FIX / "soak" / "h200-plain.jsonl")],
    "soak report (KV leak)": ["report", str(FIX / "soak" / "h200-kv-page-leak.jsonl")],
    "soak report (churn)": ["report", str(FIX / "soak" / "h200-worker-churn.jsonl")],
    "soak report (attribution)": ["report", str(FIX / "attribute" / "soak_run" / "run.jsonl")],
    "ab-test report": ["report", str(FIX / "abtest" / "h200-qwen2_5_vl.jsonl")],
    # a real watch recorded: `watch --server URL` of the leaking reference server under real
    # bursts, the trial's short settings, `--duration 15s`; rendered as watch's final table
    "watch report": ["report", str(FIX / "watch" / "reference-leaking-15s.jsonl")],
    "diagnose": ["diagnose", *_logs()[:1]],
    "diagnose (two logs)": ["diagnose", *_logs()[1:3]],
    "attribute": [
        "attribute",
        *[str(p) for p in sorted((FIX / "attribute" / "gpu").glob("escape-*.pickle"))],
    ],
    "agent-path": ["agent-path"],
    "help": ["--help"],
    **{f"{name} --help": [name, "--help"] for name in COMMANDS},
}


@pytest.fixture(scope="module")
def exporter_url() -> Iterator[str]:
    from support.sources import metrics_only, nvitop_text, serve

    gpus = [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "total": 81559,
         "used": 72000, "free": 9559},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1", "total": 81559,
         "used": 70500, "free": 11059},
    ]  # fmt: skip
    procs = [
        {"index": 0, "pid": 101, "mib": 70690, "command": "sglang::scheduler_TP0"},
        {"index": 1, "pid": 102, "mib": 70480, "command": "sglang::scheduler_TP1"},
        {"index": 0, "pid": 102, "mib": 514, "command": "sglang::scheduler_TP1"},
    ]
    with serve(metrics_only(nvitop_text("gpu-host-17.example.com", gpus, procs))) as url:
        yield url


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    import shutil

    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("needs prometheus and promtool (apt-get install prometheus; CI installs them)")
    from vramdoctor.trial import local_prometheus

    with local_prometheus(tmp_path_factory.mktemp("prom"), days=3.0) as (url, end, _truth):
        yield url, end


def _scenario_args(name: str, request: pytest.FixtureRequest) -> list[str]:
    if name in STATIC:
        return STATIC[name]
    if name == "census":
        return ["census", "--gpu-metrics", request.getfixturevalue("exporter_url")]
    if name == "fleet":
        url, end = request.getfixturevalue("prometheus")
        return ["fleet", "--prometheus", url, "--since", "3d", "--until", f"{end:.0f}"]
    raise AssertionError(name)


SCENARIOS = [*STATIC, "census", "fleet"]


def _marks(name: str) -> list[pytest.MarkDecorator]:
    owner = KNOWN_CUTS.get(name)
    if owner is None:
        return []
    return [pytest.mark.xfail(strict=True, reason=f"still cuts: {owner} migrates to render.table")]


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=_marks(n), id=n) for n in SCENARIOS]
)  # fmt: skip
def test_nothing_is_cut_at_60_80_120_columns_or_in_a_pipe(
    name: str, request: pytest.FixtureRequest
) -> None:
    args = _scenario_args(name, request)
    code, reference = render(args, REFERENCE_WIDTH)
    assert code in (0, 1), reference[-2000:]
    assert reference.strip(), f"{name}: no output"
    problems: dict[str, list[str]] = {}
    for width in (*WIDTHS, None):
        got_code, text = render(args, width)
        assert got_code == code, (width, text[-2000:])
        found = cuts(reference, text, width)
        if found:
            problems["piped" if width is None else f"{width} columns"] = found[:8]
    assert not problems, f"{name}: {problems}"


# --- the check itself can fail: it sees each kind of cut -------------------------------------


def test_the_check_sees_a_folded_word_an_ellipsis_and_a_split_unit() -> None:
    reference = "verdict  INCONCLUSIVE  growth +2,100.1 MiB  level 0.0 MiB\n"
    assert cuts(reference, "verdict INCONCL\nUSIVE growth +2,100.1 MiB level 0.0 MiB")
    assert cuts(reference, "verdict INCONCLUSIVE growth +2,100.1 MiB level 0.0 …")
    assert cuts(reference, "verdict INCONCLUSIVE growth +2,100.1 MiB level 0.0\nMiB")
    assert cuts(reference, "verdict INCONCLUSIVE growth +2,100.\n1 MiB level 0.0 MiB")
    assert not cuts(reference, "verdict\nINCONCLUSIVE growth\n+2,100.1 MiB level 0.0 MiB")
    assert not cuts(reference, "│ verdict │ INCONCLUSIVE │\n│ growth │ +2,100.1 MiB │")


def test_a_rich_table_at_80_columns_is_caught_cutting() -> None:
    """A rich table folding its cells at 80 columns: the check must call it a cut."""
    from rich.table import Table as RichTable

    t = RichTable()
    for col in ("where", "layer", "level", "growth/hour", "verdict", "basis", "more", "and more"):
        t.add_column(col, overflow="fold")
    t.add_row(
        "PID 30963 (python)", "rss_anon", "263.0 MiB", "+19,280.5 MiB", "INCONCLUSIVE",
        "quiet, 45 points", "x", "y",
    )  # fmt: skip

    def show(width: int) -> str:
        con = console.make_console(record=True, width=width, file=io.StringIO())
        con.print(t)
        return con.export_text()

    assert cuts(show(300), show(80))
    assert not cuts(show(300), show(300))


def test_the_renderer_itself_never_cuts_a_word_or_a_unit() -> None:
    from rich.text import Text

    from vramdoctor.render.table import Table

    t = Table(title="watch: 6 hours window")
    for header, priority in (("where", 0), ("layer", 1), ("level", 0), ("growth/hour", 0),
                             ("verdict", 0), ("basis", 2)):  # fmt: skip
        t.add_column(header, priority=priority, justify="right" if "growth" in header else "left")
    t.add_row("PID 30963 (python) on GPU 0", "rss_anon", "263.0 MiB", "+19,280.5 MiB",
              Text("INCONCLUSIVE", style="dim"), "too few quiet moments (3 of 8)")  # fmt: skip
    t.add_row("KV pool kv", "kv", "1,920 tokens", "0 tokens", "STABLE", "idle, 46 points")
    reference = t.plain(None)
    for width in (20, 40, 60, 80, 120):
        text = t.plain(width)
        assert not cuts(reference, text), (width, text)
        if width >= 40:  # (narrower, a header and its longest word may not fit: they overflow)
            assert all(len(line) <= width for line in text.splitlines()), (width, text)


# --- soak's time chart and headline panel, at every width and piped -------------------------

SOAK_RUNS = sorted(
    p
    for p in FIX.rglob("*.jsonl")
    if "report_golden" not in p.parts and '"command":"soak"' in p.read_text()[:2000]
)

# What the time strip's legend must say for each glyph it may draw (a blank is never one).
_STRIP_GLYPHS = {
    "b": "b baseline",
    **dict.fromkeys("123456789", "1-9 load round"),
    "0": "0 is round 10",
    ".": ". idle",
    "-": "- between windows",
}
_BLANK_IN_A_LINE = "blank where that series has no sample"
_BLOCK = set("▁▂▃▄▅▆▇█")


def time_chart(text: str) -> tuple[str, str, list[str]] | None:
    """(legend, strip, sparklines) of a soak report's time chart: the legend joined back into
    one sentence, the strip's cells and each sparkline's cells (the two-space indent removed);
    None when the report has no time chart."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("time: ")), None)
    if start is None:
        return None
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("  "))
    legend = " ".join(lines[start:end])
    sparks = []
    for line in lines[end + 1 :]:
        if line.startswith("  ") and _BLOCK & set(line):
            sparks.append(line[2:])
        elif line.startswith(("note: ", "to decide: ")):
            break
    return legend, lines[end][2:], sparks


def headline_panel(text: str) -> tuple[int, int] | None:
    """(the headline panel's width, the widest line of the tables between it and the time
    chart or the notes); None when there is no panel (piped)."""
    lines = text.splitlines()
    top = next((i for i, line in enumerate(lines) if line.startswith("╭")), None)
    if top is None:
        return None
    bottom = next(i for i in range(top, len(lines)) if lines[i].startswith("╰"))
    widths = {len(line) for line in lines[top : bottom + 1]}
    assert len(widths) == 1, f"a ragged panel: {widths}"
    tables = []
    for line in lines[bottom + 1 :]:
        if line.startswith(("time: ", "note: ", "to decide: ")):
            break
        tables.append(line)
    return widths.pop(), max((len(line) for line in tables), default=0)


def _chart_faults(text: str) -> list[str]:
    chart = time_chart(text)
    if chart is None:
        return []
    legend, strip, sparks = chart
    faults = []
    for glyph in sorted(set(strip)):
        named = _STRIP_GLYPHS.get(glyph)
        if named is None:
            faults.append(f"the strip draws {glyph!r}, a glyph it has no meaning for: {strip!r}")
        elif named not in legend:
            faults.append(f"the strip draws {glyph!r} but the legend never says {named!r}")
    blanks = [s for s in sparks if " " in s or len(s) < len(strip)]  # blank inside, or cut off
    if blanks and _BLANK_IN_A_LINE not in legend:
        faults.append(f"a sparkline with blank cells, unexplained by the legend: {blanks[0]!r}")
    faults += [f"a sparkline longer than the strip: {s!r}" for s in sparks if len(s) > len(strip)]
    return faults


@pytest.mark.parametrize("run", SOAK_RUNS, ids=lambda p: str(p.relative_to(FIX)))
def test_soak_time_chart_legend_names_every_glyph_and_blank_and_no_line_ends_in_a_space(
    run: Path,
) -> None:
    """The review's fault: blank cells in the time strip (between windows, after the last
    one) and in a sparkline (a process that appeared later) that the legend did not explain,
    and a round past 9 drawn as 0 with no word of it. Also no line of the report ends in a
    space, piped or at any width."""
    problems: dict[str, list[str]] = {}
    for width in (None, *WIDTHS):
        code, text = render(["report", str(run)], width)
        assert code in (0, 1), text[-2000:]
        where = "piped" if width is None else f"{width} columns"
        assert time_chart(text) is not None, f"{where}: no time chart"
        found = _chart_faults(text)
        found += [
            f"line {i + 1} ends in a space: {line[-40:]!r}"
            for i, line in enumerate(text.splitlines())
            if line != line.rstrip()
        ]
        if found:
            problems[where] = found[:6]
    assert not problems, f"{run.relative_to(FIX)}: {problems}"


@pytest.mark.parametrize("run", SOAK_RUNS, ids=lambda p: str(p.relative_to(FIX)))
def test_soak_headline_panel_is_as_wide_as_the_tables_under_it(run: Path) -> None:
    """The review's fault: `report --width 200` drew an 87-wide headline panel over a
    200-wide table. The rule (vramdoctor.soak.report.terminal.panel_width): the panel is never
    narrower than the widest table line under it, never wider than the width (a table holding
    a word longer than the width overflows it; the panel does not), and exactly as wide as that
    table whenever the table is at least PANEL_MIN wide."""
    from vramdoctor.soak.report.terminal import PANEL_MIN

    problems = []
    for width in WIDTHS:
        _code, text = render(["report", str(run)], width)
        panel = headline_panel(text)
        assert panel is not None, f"{width} columns: no headline panel"
        panel_w, widest = panel
        widest = min(widest, width)  # (a word longer than the width overflows its table)
        if not widest <= panel_w <= width or (widest >= PANEL_MIN and panel_w != widest):
            problems.append(f"{width} columns: a {panel_w}-wide panel over {widest}-wide tables")
    _code, piped = render(["report", str(run)], None)
    if headline_panel(piped) is not None or not piped.startswith("vramdoctor soak: "):
        problems.append("piped: the headline is not one line")
    assert not problems, f"{run.relative_to(FIX)}: {problems}"


def test_the_chart_check_sees_a_blank_an_unnamed_glyph_and_a_round_past_9() -> None:
    legend = "time: 9 seconds from left to right; b baseline, 1-9 load round, . idle; each line"
    spark = "  ▁▁▁▁▁▁▁▁▁▁"
    good = f"{legend}\n  bb11..22..\nGPU 0: 1 MiB to 2 MiB\n{spark}\n"
    assert not _chart_faults(good)
    assert _chart_faults(good.replace("bb11..22..", "bb11.. 22."))  # a blank between windows
    assert _chart_faults(good.replace("bb11..22..", "bb11..22.-"))  # '-' not in the legend
    assert _chart_faults(good.replace("bb11..22..", "bb11..00.."))  # round 10 drawn as 0
    assert _chart_faults(good.replace(spark, "      ▁▁▁▁▁"))  # a line blank before its start
    assert not _chart_faults(
        good.replace(spark, "      ▁▁▁▁▁").replace("each line", f"each line, {_BLANK_IN_A_LINE}")
    )
