"""`vramdoctor soak --url`: is this server leaking, only caching, or stable; per memory layer.

Thin: options -> `vramdoctor.soak.SoakConfig` -> `run_soak` (the library: sources, run file,
protocol, adaptive rounds, the server's life) -> the report (`vramdoctor.soak.report`).
`report_run` re-renders a recorded run for `vramdoctor report`.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import typer

from vramdoctor.cli import app
from vramdoctor.cli._options import GPU_HELP, parse_gpu_indices
from vramdoctor.errors import ExitCode, InputError, Interrupted
from vramdoctor.record import Run, interrupts_held, read_run
from vramdoctor.render import console
from vramdoctor.samples import SERVER_DIED, Event
from vramdoctor.soak.analyse import is_leak
from vramdoctor.soak.config import DEFAULT_MAX_ROUNDS, DEFAULT_SIZES, MIN_GROWTH_MIB, SoakConfig

__all__ = ["MIN_GROWTH_MIB", "report_run", "soak_cmd"]


def _check_report_suffix(report_file: Path | None) -> None:
    """Before any work: a report name we cannot write is a usage error (exit 2)."""
    if report_file is not None and report_file.suffix.lower() not in (".html", ".htm", ".png"):
        raise InputError(f"--report {report_file}: use a .html or .png file name")
    if report_file is not None and report_file.is_dir():  # found now, not after a long soak
        raise InputError(f"--report {report_file} is a directory: give a file name")
    if report_file is not None and any(p.exists() and not p.is_dir() for p in report_file.parents):
        raise InputError(f"--report {report_file}: a part of its directory is a file")


def _server_died(run: Run) -> dict[str, Any] | None:
    for r in run.records:
        if isinstance(r, Event) and r.name == SERVER_DIED:
            return dict(r.data)
    return None


def _emit(
    result: Any,
    *,
    json_out: bool,
    report_file: Path | None,
    target: str | None,
    run_path: Path | None,
    died: dict[str, Any] | None,
) -> int:
    from vramdoctor.soak.report import render, write_report_file

    if report_file is not None:
        try:
            write_report_file(result, report_file, target=target)
        except InputError as exc:  # the measurement stands; only the extra file is missing
            console.error(str(exc))
            report_file = None
    if json_out:
        d = result.to_dict()
        d["run_file"] = str(run_path) if run_path else None
        d["report_file"] = str(report_file) if report_file else None
        d.setdefault("server_died", died)
        console.print_json(d)
    else:
        render(result, console.stdout())
        if died is not None:
            console.note(
                f"the server died during the soak ({died.get('reason')}, round "
                f"{died.get('round')}): the rounds it cut short carry no verdict"
            )
        if run_path is not None:
            console.note(f"run file: {run_path}  (re-analyse: vramdoctor report {run_path})")
        if report_file is not None:
            console.note(f"report: {report_file}")
    if died is not None or is_leak(result):
        return int(ExitCode.PROBLEM)
    return int(ExitCode.OK)


def report_run(
    run: Run,
    *,
    json_out: bool,
    report_file: Path | None,
    run_path: Path | None = None,
    analysis: Any = None,
) -> int:
    """A soak run's analysis and report from its run file: at the end of `soak` (which passes
    the run's path and its analysis) and offline in `vramdoctor report RUN.jsonl`.
    Exit 1 when a layer leaks or the server died during the run, else 0."""
    _check_report_suffix(report_file)
    from vramdoctor.soak.report import report_run as report_soak_run

    return report_soak_run(
        run, json_out=json_out, report_file=report_file, run_path=run_path, analysis=analysis
    )


@app.command("soak")
def soak_cmd(
    url: str = typer.Option(
        ..., "--url", help="The server's base URL, e.g. http://127.0.0.1:30000"
    ),
    gpu_metrics: str | None = typer.Option(
        None,
        "--gpu-metrics",
        help="dcgm-exporter or nvitop-exporter URL when the server's GPUs are on another host "
        "(also --gpu-exporter).",
    ),
    gpu_exporter: str | None = typer.Option(None, "--gpu-exporter", hidden=True),  # the old name
    gpus: list[str] | None = typer.Option(None, "--gpu", metavar="N", help=GPU_HELP),
    rounds: int = typer.Option(4, "--rounds", help="Rounds of identical traffic (at least)."),
    max_rounds: int | None = typer.Option(
        None,
        "--max-rounds",
        help=f"While a memory layer is undecided after --rounds, run more rounds up to this many "
        f"(default: {DEFAULT_MAX_ROUNDS}, or --rounds when larger).",
    ),
    no_adapt: bool = typer.Option(False, "--no-adapt", help="Run exactly --rounds rounds."),
    requests_n: int = typer.Option(50, "--requests", help="Requests per round."),
    concurrency: int = typer.Option(4, "--concurrency", help="Requests in flight at once."),
    idle: float = typer.Option(
        10.0, "--idle", help="Idle seconds after each round (and the baseline)."
    ),
    baseline: float | None = typer.Option(
        None, "--baseline", help="Idle seconds before the first round (default: --idle)."
    ),
    image_size: list[str] | None = typer.Option(
        None,
        "--image-size",
        help="Generated image size WxH (repeatable). Default: 448x448 and 896x672.",
    ),
    image_dir: Path | None = typer.Option(
        None, "--image-dir", help="Send these images instead (sorted by name)."
    ),
    text_only: bool = typer.Option(False, "--text-only", help="No images: text prompts only."),
    api: str = typer.Option(
        "chat", "--api", help="chat (/v1/chat/completions) or completions (/v1/completions, text)."
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Model name to send (default: the server's first /v1/models id). "
        "With --model, a failing /v1/models is only a note.",
    ),
    max_tokens: int = typer.Option(16, "--max-tokens", help="max_tokens of each request."),
    seed: int = typer.Option(
        0, "--seed", help="Seed of the generated images (same seed, same bytes)."
    ),
    stream: bool = typer.Option(
        False, "--stream", help="Stream every response (server-sent events)."
    ),
    abort_fraction: float = typer.Option(
        0.0,
        "--abort-fraction",
        help="Share of each round's requests (0..1) streamed and closed by the client after the first tokens.",
    ),
    production_rate: float | None = typer.Option(
        None,
        "--production-rate",
        help="Your production request rate (requests/s) for time-to-OOM in hours (default: the "
        "server's own request counters during the baseline, when they show traffic).",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Run file (default: runs/soak-UTCTIME-PID-RANDOM.jsonl)."
    ),
    report_file: Path | None = typer.Option(
        None, "--report", help="Also write FILE.html or FILE.png."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    max_requests: int | None = typer.Option(
        None, "--max-requests", help="Never send more requests than this in total."
    ),
    duration: float | None = typer.Option(
        None, "--duration", help="Never run longer than this many seconds."
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        help="Bearer key (default: $OPENAI_API_KEY or $VRAMDOCTOR_API_KEY). Never printed or recorded.",
    ),
    interval: float = typer.Option(0.5, "--interval", help="Seconds between memory samples."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for one answer."),
    min_growth_mib: float = typer.Option(
        MIN_GROWTH_MIB, "--min-growth-mib", help="Smallest change (MiB) that counts as growth."
    ),
    pids: list[int] | None = typer.Option(
        None, "--pid", help="Also sample this PID's host memory (repeatable)."
    ),
    attribute: str | None = typer.Option(
        None,
        "--attribute",
        help="Name the code that holds growing GPU memory: DIR (the VRAMDOCTOR_AGENT_DIR of a server "
        "started with PYTHONPATH=$(vramdoctor agent-path)) or sglang[:DIR] (SGLang's /start_profile, "
        "scheduler processes only). See docs/attribute.md.",
    ),
) -> None:
    """Replay identical traffic in rounds with idle windows; a verdict per memory layer.

    Caching (PyTorch's allocator, glibc's malloc arenas, pinned host memory) rises in the
    first rounds and then stays flat; a leak grows every round in proportion to the requests.
    VRAM, the KV pool (server /metrics) and host RAM are judged separately. Exit 1 on LEAK or
    when the server died during the soak.

    Examples:

      vramdoctor soak --url http://127.0.0.1:30000

      vramdoctor soak --url http://gpu-host:8000 --gpu-metrics http://gpu-host:9400/metrics --report soak.html

      vramdoctor soak --url http://127.0.0.1:8000 --rounds 6 --requests 30 --idle 20 --stream --abort-fraction 0.25
    """
    if gpu_exporter is not None and gpu_metrics is not None and gpu_exporter != gpu_metrics:
        raise InputError("--gpu-metrics and --gpu-exporter are one option: give it once")
    gpu_metrics = gpu_metrics or gpu_exporter
    cfg = SoakConfig(
        url=url,
        rounds=rounds,
        requests=requests_n,
        concurrency=concurrency,
        idle_s=idle,
        baseline_s=baseline,
        adapt=not no_adapt,
        max_rounds=max_rounds,
        image_sizes=tuple(image_size or DEFAULT_SIZES),
        image_dir=image_dir,
        text_only=text_only,
        api=api,
        model=model,
        max_tokens=max_tokens,
        seed=seed,
        stream=stream,
        abort_fraction=abort_fraction,
        out=out,
        max_requests=max_requests,
        duration_s=duration,
        api_key=api_key,
        interval_s=interval,
        timeout_s=timeout,
        min_growth_mib=min_growth_mib,
        gpu_metrics=gpu_metrics,
        gpus=tuple(parse_gpu_indices(gpus) or ()) or None,
        pids=tuple(pids or ()),
        production_rate_rps=production_rate,
    ).validate()
    _check_report_suffix(report_file)

    live_box: list[Any] = []

    def before_run(protocol: Any) -> Any:
        if not console.interactive() or json_out:
            return None
        from vramdoctor.soak.report import LiveView

        live = LiveView(console.stderr(), cfg.rounds, len(protocol.plan))
        live_box.append(live)
        previous = protocol.on_result

        def on_result(req: Any, outcome: Any) -> None:
            if previous is not None:
                previous(req, outcome)
            live.on_result(req, outcome)

        protocol.on_result = on_result
        return live

    def progress(state: Any) -> None:
        if live_box:
            live = live_box[0]
            live.on_state(state)
            if state.undecided and state.round >= cfg.rounds:
                live.phase += "; undecided: " + ", ".join(
                    f"{layer} ({why})" for layer, why in state.undecided
                )
        else:
            plain(state)

    def on_sample(name: str, record: Any) -> None:
        if live_box:
            live_box[0].on_sample(name, record)

    # typer turns a KeyboardInterrupt into a silent exit 130: every Ctrl-C here says what it kept.
    previous_term = _term_as_interrupt()
    try:
        try:
            with interrupts_held():  # numpy's C import turns a Ctrl-C into ImportError
                from vramdoctor.soak.runner import (
                    run_soak,  # here: it brings requests, numpy, PIL, psutil
                )

            plain = _plain_progress(cfg.requests, cfg.rounds)
            hooks = _attribute_hooks(
                attribute, cfg
            )  # soak --attribute (vramdoctor.attribution.hooks)
        except KeyboardInterrupt:
            raise Interrupted(
                "interrupted before measuring: nothing was sent or recorded"
            ) from None
        if hooks:
            cfg = hooks[0].cfg
        try:  # run_soak turns its own interrupts into a partial report or `Interrupted`
            outcome = run_soak(
                cfg,
                notify=console.note,
                progress=progress,
                on_sample=on_sample,
                before_run=before_run,
                hooks=[h.hook for h in hooks],
            )
        finally:
            for h in hooks:
                h.hook.close()
        try:
            # Exit code (README "Exit codes"): the analysis's, interrupted runs included (130,
            # or 1 when a problem was found before the interrupt).
            code = report_run(
                read_run(outcome.run_path),
                json_out=json_out,
                report_file=report_file,
                run_path=outcome.run_path,
                analysis=outcome.analysis,
            )
        except KeyboardInterrupt:
            raise Interrupted(
                f"interrupted while reporting; the run file is kept: {outcome.run_path} "
                f"(re-analyse: vramdoctor report {outcome.run_path})"
            ) from None
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
    raise typer.Exit(code)


def _attribute_hooks(value: str | None, cfg: SoakConfig) -> list[Any]:
    """`--attribute`: the round hook that snapshots every process (none without the option)."""
    if value is None:
        return []
    import dataclasses
    from types import SimpleNamespace

    from vramdoctor.attribution.hooks import build_hook
    from vramdoctor.soak.runner import default_run_path

    if cfg.out is None:  # the snapshots live beside the run file: fix its name now
        cfg = dataclasses.replace(cfg, out=default_run_path())
    assert cfg.out is not None
    key = cfg.resolved_api_key
    hook = build_hook(
        value,
        url=cfg.url,
        run_path=cfg.out,
        headers={"Authorization": f"Bearer {key}"} if key else None,
    )
    if hasattr(hook, "start_note"):
        console.note(hook.start_note())
    return [SimpleNamespace(hook=hook, cfg=cfg)]


def _term_as_interrupt() -> Any:
    """SIGTERM (e.g. `timeout`, a container stop) ends the soak like Ctrl-C: partial report,
    run file closed as interrupted. Returns the previous handler (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def _plain_progress(per_round: int, rounds: int) -> Any:
    """Non-interactive progress: one line per phase change on stderr."""
    seen: set[tuple[str, int]] = set()

    def progress(state: Any) -> None:
        key = (state.phase, state.round)
        if key in seen:
            return
        seen.add(key)
        if state.phase == "load":
            extra = ""
            if state.round > rounds and state.undecided:
                extra = (
                    " (extra round: undecided "
                    + ", ".join(f"{layer}: {why}" for layer, why in state.undecided)
                    + ")"
                )
            console.note(
                f"round {state.round}/{max(rounds, state.round)}: sending {per_round} requests{extra}"
            )
        elif state.phase == "idle" and state.results:
            r = state.results[-1]
            errs = r.sent - r.ok - r.outcomes["aborted"]
            aborted = (
                f", {r.outcomes['aborted']} aborted by the client" if r.outcomes["aborted"] else ""
            )
            console.note(f"round {state.round}: {r.sent} sent, {errs} failed{aborted}; idle")
        elif state.phase == "baseline":
            console.note("baseline: idle")

    return progress
