"""`vramdoctor soak --url URL` (or `--launch CMD`): leaking, only caching, or stable; per layer.

Thin: the options are `SoakConfig`'s own (`vramdoctor.cli._config_options`: flag and help live
beside each field) -> `SoakConfig.from_options` in one call -> `SoakSession` (the library) ->
`vramdoctor.soak.report.report_run`, which `vramdoctor report RUN.jsonl` also uses.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import typer

from vramdoctor.cli import app
from vramdoctor.cli._config_options import config_command, param
from vramdoctor.cli._options import GPU_HELP, parse_gpu_indices
from vramdoctor.errors import InputError, Interrupted
from vramdoctor.record import interrupts_held, read_run
from vramdoctor.render import console
from vramdoctor.soak.config import MIN_GROWTH_MIB, SoakConfig

__all__ = ["MIN_GROWTH_MIB", "soak_cmd", "term_as_interrupt"]

_EXTRA = [
    param("gpu_exporter", str | None, typer.Option(None, "--gpu-exporter", hidden=True)),
    param("gpu", list[str] | None, typer.Option(None, "--gpu", metavar="N", help=GPU_HELP)),
    param("report_file", Path | None, typer.Option(None, "--report", help="Also write FILE.html or FILE.png.")),
    param("json_out", bool, typer.Option(False, "--json", help="Print one JSON object on stdout.")),
    param("command", list[str] | None, typer.Argument(None, metavar="CMD", help="-- CMD ARGS...: the server's command, as --launch.")),
]  # fmt: skip


@app.command("soak")
@config_command(SoakConfig, skip=("gpus",), extra=_EXTRA)
def soak_cmd(**o: Any) -> None:
    """Replay identical traffic in rounds with idle windows; a verdict per memory layer.

    Caching (PyTorch's allocator, glibc's malloc arenas, pinned host memory) rises in the
    first rounds and then stays flat; a leak grows every round in proportion to the requests.
    VRAM, the KV pool (server /metrics) and host RAM are judged separately. Exit 1 on LEAK or
    when the server died during the soak. With --launch (or -- CMD ARGS...) vramdoctor starts
    the server itself, soaks it, stops it and reads its log.

    Examples:

      vramdoctor soak --url http://127.0.0.1:30000

      vramdoctor soak --url http://gpu:8000 --gpu-metrics http://gpu:9400/metrics

      vramdoctor soak --rounds 6 --report soak.html --url http://127.0.0.1:8000

      vramdoctor soak -- vllm serve Qwen/Qwen2.5-VL-3B-Instruct --port 8000
    """
    if o["gpu_exporter"] and o["gpu_metrics"] and o["gpu_exporter"] != o["gpu_metrics"]:
        raise InputError("--gpu-metrics and --gpu-exporter are one option: give it once")
    if o["command"] and o["launch"]:
        raise InputError("give the server's command once: --launch CMD or -- CMD ARGS...")
    o.update(gpu_metrics=o["gpu_metrics"] or o["gpu_exporter"], launch=o["launch"] or o["command"])
    cfg = SoakConfig.from_options(o, gpus=tuple(parse_gpu_indices(o["gpu"]) or ()) or None)
    if cfg.vary or cfg.cycle:  # their plans fix the rounds (vramdoctor.soak.variations)
        from vramdoctor.soak.variations import adjust

        cfg = adjust(cfg)
    previous_term = term_as_interrupt()  # typer makes a Ctrl-C a silent 130: we say what we kept
    try:
        try:
            with interrupts_held():  # numpy's C import turns a Ctrl-C into ImportError
                from vramdoctor.soak.report import SoakFeed, check_report_path, report_run
                from vramdoctor.soak.session import SoakSession  # requests, numpy, PIL, psutil
        except KeyboardInterrupt:
            raise Interrupted(
                "interrupted before measuring: nothing was sent or recorded"
            ) from None
        check_report_path(o["report_file"])
        live = console.interactive() and not o["json_out"]
        feed = SoakFeed(
            console.stderr(), live=live, rounds=cfg.rounds, per_round=cfg.requests, say=console.note
        )
        session = SoakSession(
            cfg,
            notify=console.note,
            progress=feed.progress,
            on_sample=feed.on_sample,
            before_run=feed.before_run,
        )
        outcome = session.run()  # its own interrupts become a partial report or `Interrupted`
        try:  # exit code: the analysis's (README "Exit codes"), interrupted runs included
            code = report_run(
                read_run(outcome.run_path),
                json_out=o["json_out"],
                report_file=o["report_file"],
                run_path=outcome.run_path,
                analysis=outcome.analysis,
            )
            if code == 0 and cfg.fail_on_inconclusive and _undecided(outcome.analysis):
                console.note(
                    "exit 1: --fail-on-inconclusive, and the verdict is INCONCLUSIVE (an "
                    "undecided layer is not a pass)"
                )
                code = 1
        except KeyboardInterrupt:
            raise Interrupted(
                f"interrupted while reporting; the run file is kept: {outcome.run_path} (re-analyse: vramdoctor report {outcome.run_path})"
            ) from None
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
    raise typer.Exit(code)  # fmt: skip


def _undecided(analysis: Any) -> bool:
    """Whether the run's verdict is INCONCLUSIVE (for --fail-on-inconclusive)."""
    return str(getattr(analysis, "verdict", "")) == "INCONCLUSIVE"


def term_as_interrupt() -> Any:
    """SIGTERM (e.g. `timeout`, a container stop) ends the command like Ctrl-C: partial report,
    run file closed as interrupted. Returns the previous handler (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)
