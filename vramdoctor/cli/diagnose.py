"""`vramdoctor diagnose LOG...`: known causes of GPU-memory growth and OOM in server logs."""

from __future__ import annotations

import sys

import typer

from vramdoctor.cli import app
from vramdoctor.diagnose import diagnose
from vramdoctor.diagnose.report import KNOWN_SERVERS
from vramdoctor.errors import ExitCode, InputError
from vramdoctor.render import console


@app.command("diagnose")
def diagnose_cmd(
    logs: list[str] = typer.Argument(
        ...,
        metavar="LOG",
        help="Server log files (one per TP rank is fine), .gz files, or - for stdin.",
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object (schema vramdoctor.diagnose/2)."
    ),
) -> None:
    """Find what explains GPU-memory growth or an OOM in a server's log, with evidence and fixes.

    Reads SGLang, vLLM, TGI, TensorRT-LLM, llama.cpp, Ollama and LMDeploy logs (CUDA, ROCm, NPU);
    every fix is in the server's own flags. Each finding says what it rests on: a line read, a
    figure derived from read ones, or unknown.

    Exit code 0: no warning or critical finding; 1: at least one; 2: no input can be read, or no
    input is a server log (an unreadable file next to readable ones is noted, not fatal).

    Examples:

      vramdoctor diagnose server.log

      vramdoctor diagnose tp0.log tp1.log.gz --json

      docker logs sglang 2>&1 | vramdoctor diagnose -
    """
    if logs.count("-") > 1:
        raise InputError("stdin (-) can be given only once")
    if "-" in logs and sys.stdin.isatty():
        console.note("reading the log from stdin (end with Ctrl-D)")
    d = diagnose(logs)
    if not any(f.recognised for f in d.files):
        names = ", ".join(f.file for f in d.files)
        lines = sum(f.lines for f in d.files)
        raise InputError(
            f"{names}: not a server log diagnose reads ({KNOWN_SERVERS}; read {lines} line(s): no "
            "server line, argument dump, memory figure or known error found)"
        )
    if json_out:
        console.print_json(d.to_json())
    else:
        from vramdoctor.diagnose.report import render

        render(d, console.stdout())
    problem = any(f.severity in ("warning", "critical") for f in d.findings)
    raise typer.Exit(int(ExitCode.PROBLEM if problem else ExitCode.OK))
