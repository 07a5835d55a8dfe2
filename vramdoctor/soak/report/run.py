"""A recorded soak run, end to end: analysis (`vramdoctor.soak.analyse_run`), the run file's
own damage as notes, the optional report file, then `--json` or the terminal report.

The one `report_run` of soak: `vramdoctor soak` calls it at its end (with the analysis it
already has) and `vramdoctor report RUN.jsonl` calls it offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vramdoctor.errors import InputError
from vramdoctor.judge.results import SoakAnalysis
from vramdoctor.soak.report.files import write_report_file
from vramdoctor.soak.report.json_doc import soak_json
from vramdoctor.soak.report.launch import launch_json, render_launch
from vramdoctor.soak.report.terminal import render

if TYPE_CHECKING:
    from vramdoctor.record import Run

__all__ = ["report_run"]


def report_run(
    run: Run,
    *,
    json_out: bool,
    report_file: Path | None,
    run_path: Path | None = None,
    production_rate_rps: float | None = None,
    analysis: SoakAnalysis | None = None,
) -> int:
    """Analyse a soak run file and print its report (or `--json`); write `report_file` when
    given. Used at the end of `soak` and by `vramdoctor report RUN.jsonl`. Returns the exit
    code: 0 healthy, 1 a problem (LEAK in any layer, the server died, sampling failed).
    `analysis` is the run's analysis when the caller has it already (soak's adaptive rounds)."""
    from vramdoctor.attribution.report import render_run_attribution, run_attribution_json
    from vramdoctor.render import console
    from vramdoctor.soak.analyse import analyse_run
    from vramdoctor.soak.variations import (
        render_variations,
        variations_exit_code,
        variations_json,
    )

    if report_file is not None and report_file.suffix.lower() not in (".png", ".html", ".htm"):
        raise InputError(
            f"--report {report_file}: use a .html or .png file name"
        )  # before any work
    if analysis is None:  # the thresholds and the production rate the run recorded, unless given
        result = analyse_run(run, production_rate_rps=production_rate_rps)
    else:  # soak's own analysis of this run: the run file's damage as read now, once each
        result = analysis
        extra = [*run.problems, *run.dropped()]
        if run.torn_tail:
            extra.append(
                "the run file's last line was torn (the writer was killed); it was skipped"
            )
        result.notes.extend(n for n in extra if n not in result.notes)
    if report_file is not None:
        try:
            write_report_file(
                result,
                report_file,
                target=run.header.get("target"),
                run_file=str(run_path or run.path),
                attribution_text=_attribution_text(run),
            )
        except InputError as exc:  # the measurement stands; only the extra file is missing
            console.error(str(exc))
            report_file = None
    if json_out:
        d = soak_json(result)
        d["run_file"] = str(run_path or run.path)  # the file the report was made from
        d["report_file"] = str(report_file) if report_file else None
        d["attribution"] = run_attribution_json(run)  # soak --attribute (vramdoctor.attribution)
        d.update(variations_json(run))  # soak --vary / --cycle (vramdoctor.soak.variations)
        launched = launch_json(run)
        if launched is not None:  # soak --launch: only then, so other runs' JSON is unchanged
            d["launch"] = launched
        console.print_json(d)
    else:
        render_variations(run, console.stdout())  # --vary / --cycle decide first: rounds differ
        render(result, console.stdout())
        render_run_attribution(run, console.stdout())
        render_launch(run, console.stdout())
        if run_path is not None:
            console.note(f"run file: {run_path}  (re-analyse: vramdoctor report {run_path})")
        if report_file is not None:
            console.note(f"report: {report_file}")
    return max(result.exit_code, variations_exit_code(run))


def _attribution_text(run: Run) -> str | None:
    """The attribution block as the terminal shows it (plain text), for the HTML report of a
    `--attribute` run; None for a run without one."""
    import io

    from vramdoctor.attribution.report import render_run_attribution
    from vramdoctor.render.console import make_console

    rec = make_console(record=True, width=120, file=io.StringIO(), color_system=None)
    render_run_attribution(run, rec)
    text = rec.export_text()
    return text if text.strip() else None
