"""`vramdoctor watch`: passive and continuous; a rolling verdict per memory layer and a /metrics exporter.

Thin: parses the options (every number bounded, `vramdoctor.watch.config`), builds
`WatchOptions` in one call and hands them to `vramdoctor.watch.command.run_watch` (the run,
the report, the exit code); `report_run` re-analyses a recorded part for `vramdoctor report`.
The launch options are soak's own (`SoakConfig`'s flags and help).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from vramdoctor.cli import app
from vramdoctor.cli._config_options import config_command, param
from vramdoctor.cli._options import GPU_HELP, parse_gpu_indices
from vramdoctor.errors import InputError
from vramdoctor.soak.config import SoakConfig, command_words
from vramdoctor.watch.config import parse_duration

if TYPE_CHECKING:
    from vramdoctor.record import Run

__all__ = ["parse_duration", "report_run", "watch_cmd"]

_OPTIONS = [
    param("server", str | None, typer.Option(None, "--server", metavar="URL", help="The inference server's base URL (SGLang, vLLM, any OpenAI-compatible): its /metrics is read and, on this host, its process tree is the server.")),
    param("metrics", str | None, typer.Option(None, "--metrics", metavar="URL", help="The server's /metrics URL, when not SERVER/metrics.")),
    param("pid", list[int], typer.Option([], "--pid", help="Also the server's: this process (repeat).")),
    param("gpu_metrics", list[str], typer.Option([], "--gpu-metrics", metavar="URL", help="Read GPUs from dcgm-exporter or nvitop-exporter instead of NVML here (repeat).")),
    param("gpu", list[str], typer.Option([], "--gpu", metavar="N", help=GPU_HELP)),
    param("gpus", str | None, typer.Option(None, "--gpus", hidden=True, help="Old spelling of --gpu.")),
    param("interval", str, typer.Option("5s", "--interval", help="Time between samples.")),
    param("window", str, typer.Option("6h", "--window", help="Length of the rolling analysis window.")),
    param("bucket", str, typer.Option("1m", "--bucket", help="History resolution: one bucket (min, max, mean) per this long.")),
    param("warmup", str, typer.Option("30m", "--warmup", help="Left out of the analysis after each server start.")),
    param("min_idle", str, typer.Option("10s", "--min-idle", help="An idle stretch of the server (0 requests running or queued) this long is a comparable moment.")),
    param("analyse_every", str, typer.Option("30s", "--analyse-every", help="How often the verdicts are recomputed.")),
    param("listen", str, typer.Option("127.0.0.1:9840", "--listen", metavar="HOST:PORT", help="Serve /metrics here (0.0.0.0:PORT to reach it from other hosts).")),
    param("no_exporter", bool, typer.Option(False, "--no-exporter", help="Do not serve /metrics.")),
    param("out", Path | None, typer.Option(None, "--out", metavar="DIR", help="Record samples into rotating run files in DIR.")),
    param("rotate_mib", str, typer.Option("64", "--rotate-mib", help="Start a new run file past this size (MiB).")),
    param("keep", int, typer.Option(8, "--keep", help="Run files of DIR to keep, earlier runs' included (oldest deleted).")),
    param("duration", str | None, typer.Option(None, "--duration", help="Stop after this long (default: until Ctrl-C or SIGTERM).")),
    param("inside_every", str, typer.Option("60s", "--inside-every", help="With the agent in the server: ask it for its allocators' counters at most this often (at the end of idle stretches; each ask walks glibc's free lists, up to ~200 ms).")),
    param("trace_python", bool, typer.Option(False, "--trace-python", help="With the agent in the server: also trace Python allocations by line.")),
    param("json_out", bool, typer.Option(False, "--json", help="At the end, print the result as one JSON object.")),
    param("command", list[str] | None, typer.Argument(None, metavar="CMD", help="-- CMD ARGS...: the server's command, as --launch.")),
]  # fmt: skip


@app.command("watch")
@config_command(
    SoakConfig, only=("launch", "startup_timeout_s", "stop_grace_s", "agent"), extra=_OPTIONS
)
def watch_cmd(**o: Any) -> None:
    """Watch one GPU host passively (no traffic): a rolling leak/caching verdict per memory layer, served as Prometheus /metrics.

    The server's own idle moments are its rounds: the memory settled in each, against the requests its counter served, is judged by soak's judge (growth model, lives, other tenants, MIG slices, the agent's inside evidence). A server never idle is compared at its quietest moments; without a request counter, over time. See docs/watch.md.

    Exit code (when it stops): 0 no leak, 1 a leak, 2 usage or input error, 130 interrupted (Ctrl-C, SIGTERM) before a leak was found.

    Examples:

      vramdoctor watch --server http://127.0.0.1:30000

      vramdoctor watch --server http://127.0.0.1:8000 --out /var/lib/vramdoctor --listen 0.0.0.0:9840

      vramdoctor watch --gpu-metrics http://gpu-host:9400/metrics --duration 1h --json

      vramdoctor watch --duration 2h -- vllm serve Qwen/Qwen2.5-VL-3B-Instruct --port 8000
    """
    from vramdoctor.watch.command import run_watch, watch_options

    if o["command"] and o["launch"]:
        raise InputError("give the server's command once: --launch CMD or -- CMD ARGS...")
    launch = command_words(o["launch"]) or (tuple(o["command"]) if o["command"] else None)
    options, duration_s = watch_options(
        o, launch=launch, gpus=parse_gpu_indices([*o["gpu"], *([o["gpus"]] if o["gpus"] else [])])
    )
    raise typer.Exit(run_watch(options, duration_s, json_out=o["json_out"]))


def report_run(run: Run, *, json_out: bool, report_file: Path | None) -> int:
    """Re-run the rolling analysis over a recorded watch run file (one rotated part at a time)."""
    from vramdoctor.watch.command import report_part

    return report_part(run, json_out=json_out, report_file=report_file)
