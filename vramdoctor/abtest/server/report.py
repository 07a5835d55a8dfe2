"""`ab-test --server` for people and scripts: the one table, the evidence, the recommendation.

`report_run(run)` reads the experiment file (`OUT/abtest.jsonl`), re-analyses each variant's
soak run file beside it (`vramdoctor.soak.analyse_run`) and prints the table (or `--json`,
schema `vramdoctor.abtest-server/1`, docs/abtest.md). The same function runs at the end of the
live experiment and for `vramdoctor report OUT/abtest.jsonl`, so both say the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text

from vramdoctor.abtest.server.analysis import server_abtest
from vramdoctor.abtest.server.experiment import VARIANT_EVENT
from vramdoctor.errors import ExitCode, InputError
from vramdoctor.judge.results import LAYERS, SoakAnalysis
from vramdoctor.samples import Event
from vramdoctor.soak.report.layers import display_name
from vramdoctor.units import format_duration

if TYPE_CHECKING:
    from vramdoctor.record import Run

__all__ = ["render", "report_run", "result_of"]

_STYLE = {
    "LEAK": "bold red",
    "CACHING": "yellow",
    "STABLE": "green",
    "INCONCLUSIVE": "magenta",
    "NOT_MEASURED": "dim",
}
_STATUS = {
    "complete": "ran",
    "failed_to_start": "FAILED TO START",
    "crashed": "CRASHED",
    "errors": "ANSWERED ERRORS",
    "interrupted": "interrupted",
    "not_run": "not run",
    "leftover": "LEFT A PROCESS",
}


def result_of(run: Run) -> dict[str, Any]:
    """The experiment's data (`analysis.server_abtest`) from its run file: each variant's soak
    run file beside it analysed again (a missing one leaves that row without verdicts)."""
    from vramdoctor.record import read_run
    from vramdoctor.soak.analyse import analyse_run

    folder = Path(run.path).parent
    records = [r.data for r in run.records if isinstance(r, Event) and r.name == VARIANT_EVENT]
    files = {str(r["name"]): r.get("run_file") for r in records}
    cache: dict[str, SoakAnalysis | None] = {}

    def analyses(name: str) -> SoakAnalysis | None:
        if name not in cache:
            f = files.get(name)
            path = folder / f if f else None
            try:
                cache[name] = analyse_run(read_run(path)) if path is not None else None
            except InputError:
                cache[name] = None
        return cache[name]

    out = server_abtest(run.header, records, analyses)
    out["run"] = {"path": str(run.path), "status": run.status}
    return out


def _layer_cell(lay: dict[str, Any] | None) -> Text:
    if lay is None:
        return Text("-")
    verdict = str(lay["verdict"])
    text = verdict.replace("_", " ")
    if lay.get("rate_text"):
        text += f" {lay['rate_text']}/request"
    if lay.get("settled_text"):
        text += f", settles at {lay['settled_text']}"
    return Text(text, style=_STYLE.get(verdict, ""))


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.0f} %"


def _seconds(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f} ms" if v < 10 else format_duration(v)


def render(result: dict[str, Any], console: Any) -> None:
    """The table, each variant's evidence and cost, the recommendation and the drift check."""
    from vramdoctor.render.table import Table

    rows = result["rows"]
    t = Table(title=f"ab-test --server: {len(rows)} launches of {' '.join(result['server'] or [])}")
    t.add_column("variant")
    t.add_column("status")
    for name in LAYERS:
        t.add_column(display_name(name))
    t.add_column("p50 / p99 latency", justify="right", priority=2)
    t.add_column("throughput", justify="right", priority=2)
    t.add_column("vs baseline", priority=1)
    for row in rows:
        layers = row["layers"] or {}
        lat = row["latency"]
        vs = row["vs_baseline"]
        thr = row["throughput_rps"]
        cells: list[str | Text | None] = [
            row["name"],
            Text(_STATUS.get(str(row["status"]), str(row["status"])),
                 style="bold red" if row["status"] not in ("complete", "not_run") else ""),
            *[_layer_cell(layers.get(n)) for n in LAYERS],
            f"{_seconds(lat.get('p50_s'))} / {_seconds(lat.get('p99_s'))}",
            "-" if thr is None else f"{thr:.2f} requests/s",
            "" if row["name"] == "baseline" else
            f"p50 {_pct(vs['p50_pct'])}, p99 {_pct(vs['p99_pct'])}, throughput {_pct(vs['throughput_pct'])}",
        ]  # fmt: skip
        t.add_row(*cells)
    console.print(t)
    for row in rows:
        head = f"{row['name']}: {row['change']}"
        console.print(head, style="bold", markup=False, highlight=False)
        if row["status"] not in ("complete",):
            console.print(f"  {row['message']}", markup=False, highlight=False)
            for line in row["log_tail"][-8:]:
                console.print(f"    | {line}", style="dim", markup=False, highlight=False)
        for name, lay in (row["layers"] or {}).items():
            console.print(
                f"  {display_name(name)} {str(lay['verdict']).replace('_', ' ')}: {lay['evidence']}",
                markup=False,
                highlight=False,
            )
        for what in row["stops"]:
            console.print(f"  stops {what}", style="green", markup=False, highlight=False)
        for what in row["worse"]:
            console.print(f"  makes it worse: {what}", style="red", markup=False, highlight=False)
        for what in row["settled_vs_baseline"]:
            console.print(f"  {what}", markup=False, highlight=False)
        if row.get("trades") and row["name"] not in ("baseline", "baseline-again"):
            console.print(f"  trades: {row['trades']}", style="dim", markup=False, highlight=False)
    rec = result["recommendation"]
    console.print(
        ("recommended: " if rec["variant"] else "recommendation: ") + rec["text"],
        style="bold",
        markup=False,
        highlight=False,
    )
    console.print(f"drift: {result['drift']['text']}", markup=False, highlight=False)


def report_run(run: Run, *, json_out: bool, report_file: Path | None) -> int:
    """Print an ab-test --server experiment (table or JSON). Exit 1 when a variant failed to
    start, crashed, answered errors or left a process, or the baseline leaks and no variant
    stops it; else 0."""
    from vramdoctor.render import console

    if report_file is not None:
        raise InputError("--report: ab-test --server prints its table; it writes no chart")
    result = result_of(run)
    if json_out:
        console.print_json(result)
    else:
        render(result, console.stdout())
        if run.status != "complete":
            console.note(f"run status: {run.status} (the variants that ended are shown)")
    base = next((r for r in result["rows"] if r["name"] == "baseline"), None)
    base_leaks = base is not None and any(
        lay["verdict"] == "LEAK" for lay in (base["layers"] or {}).values()
    )
    unfixed = base_leaks and result["recommendation"]["variant"] is None
    return int(ExitCode.PROBLEM) if result["problem"] or unfixed else int(ExitCode.OK)
