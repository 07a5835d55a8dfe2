"""`vramdoctor ab-test`: measure the memory mitigations, on a model's processor or your server.

- `--model MODEL`: the processor-level check without a server (`vramdoctor.abtest.model_run`:
  one worker process per mitigation on this GPU);
- `--server CMD` (or `-- CMD ARGS...`) with `--variant NAME=CHANGE` / `--preset NAME`: the
  server launched once per variant with the same seeded traffic, baseline first and last
  (`vramdoctor.abtest.server`). The traffic options are soak's own (`SoakConfig`'s fields).

`report_run` re-renders either kind of run for `vramdoctor report`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from vramdoctor.cli import app
from vramdoctor.cli._config_options import config_command, param
from vramdoctor.errors import InputError, MissingExtra, VramdoctorError
from vramdoctor.record import Run, interrupts_held, make_header, read_run
from vramdoctor.render import console
from vramdoctor.soak.config import SoakConfig

# Default rounds: --model's image workload; --server's soak of each variant, whose live bytes
# need five rounds (vramdoctor.judge.inside.INSIDE_MIN_STEADY_STEPS) and which does not adapt.
MODEL_ROUNDS = 4
SERVER_ROUNDS = 5

__all__ = ["abtest_cmd", "report_run"]

# soak's traffic and launch options, spelled and documented as soak has them (SoakConfig)
SOAK_OPTIONS = ("url", "requests", "concurrency", "baseline_s", "image_sizes", "text_only", "api",
                "max_tokens", "stream", "abort_fraction", "api_key", "interval_s", "min_growth_mib",
                "gpu_metrics", "startup_timeout_s", "stop_grace_s", "agent")  # fmt: skip

_O = typer.Option
_EXTRA = [
    param("model", str | None, _O(None, "--model", "-m", help="--model alone: the model id or local directory whose image processor to test (offline). With --server: the model name to send.")),
    param("server", str | None, _O(None, "--server", metavar="CMD", help="Launch this server once per variant and soak it (also: -- CMD ARGS...).")),
    param("variant", list[str] | None, _O(None, "--variant", metavar="NAME=CHANGE", help="With --server: a variant (repeatable): NAME=--flag [VALUE] (arguments added or replaced), NAME=ENV=VALUE, NAME=drop:--flag, NAME=unset:ENV.")),
    param("preset", list[str] | None, _O(None, "--preset", metavar="NAME", help="With --server: a named variant of the server's kind (repeatable; --list-presets).")),
    param("list_presets", bool, _O(False, "--list-presets", help="Print the presets for --server's kind (SGLang, vLLM, any OpenAI-compatible) and exit.")),
    param("images", Path | None, _O(None, "--images", help="Replay your own images from DIR instead of generated ones.")),
    param("count", int, _O(40, "--count", help="--model: requests (one image each) per round.")),
    param("rounds", int | None, _O(None, "--rounds", help="Rounds each variant replays (default: --model 4; --server 5, the rounds live bytes need to tell a leak from a cache still filling).")),
    param("min_side", int, _O(256, "--min-side", help="--model: smallest image side (px) of random images.")),
    param("max_side", int, _O(2048, "--max-side", help="--model: largest image side (px) of random images.")),
    param("distribution", str, _O("uniform", "--distribution", help="--model: side distribution: uniform, loguniform, fixed.")),
    param("seed", int, _O(0, "--seed", help="Seed of the generated images and workload.")),
    param("same_images", bool, _O(False, "--same-images", help="--model: replay the same images every round (default: new sizes each round).")),
    param("variants", str | None, _O(None, "--variants", help="--model: comma-separated subset (baseline always runs).")),
    param("gpu", int | None, _O(None, "--gpu", help="GPU index (--model: the variants' GPU, default 0; --server: the GPU checked free between variants).")),
    param("idle", float | None, _O(None, "--idle", help="Idle seconds (--model: after the last round, default 3; --server: after each round, default 10).")),
    param("ipc", bool, _O(True, "--ipc/--no-ipc", help="--model: also A/B-test the CUDA IPC device redirect (needs 2 GPUs; 1 GPU: round trip only).")),
    param("ipc_gpus", int | None, _O(None, "--ipc-gpus", help="--model: GPUs for the IPC arm (default: every visible GPU).")),
    param("out", Path | None, _O(None, "--out", help="--model: results file (default runs/ab-test-TIME.jsonl); --server: results folder (default runs/ab-test-TIME/).")),
    param("report_file", Path | None, _O(None, "--report", metavar="FILE", help="--model: also write the chart to FILE.png or FILE.svg (needs the charts extra).")),
    param("chart", Path | None, _O(None, "--chart", hidden=True, help="Old spelling of --report.")),
    param("json_out", bool, _O(False, "--json", help="Print one JSON object.")),
    param("timeout", float | None, _O(None, "--timeout", help="Seconds allowed per variant (--model default 600; --server: no limit).")),
    param("request_timeout", float, _O(120.0, "--request-timeout", help="--server: seconds to wait for one answer.")),
    param("command", list[str] | None, typer.Argument(None, metavar="CMD", help="-- CMD ARGS...: the server's command, as --server.")),
]  # fmt: skip


def report_run(run: Run, *, json_out: bool, report_file: Path | None) -> int:
    """A recorded ab-test (either kind) printed again; its exit code."""
    if (run.header.get("config") or {}).get("mode") == "server":
        from vramdoctor.abtest.server import report_run as report_server

        return report_server(run, json_out=json_out, report_file=report_file)
    from vramdoctor.abtest.model_run import report_run as report_model

    return report_model(run, json_out=json_out, report_file=report_file)


@app.command("ab-test")
@config_command(SoakConfig, only=SOAK_OPTIONS, extra=_EXTRA)
def abtest_cmd(**o: Any) -> None:
    """Measure each memory mitigation: on MODEL's image processor, or on your own server.

    --model: each mitigation runs in its own process on this GPU: baseline, scoped pool
    (vramdoctor.fixes), empty_cache after each request, expandable_segments, CPU
    preprocessing, a GPU output escaping the pool with and without vramdoctor's guard.
    --server: your server is launched once per variant (baseline first and again last) and
    soaked with the same traffic; one table: verdict per memory layer, latency, throughput,
    what each variant stops and costs. Exit 1 when a variant failed; --model: or the scoped pool
    missed a memory target (its latency target is reported only); --server: or the baseline
    leaks and no variant stops it.

    Examples:

      vramdoctor ab-test --model Qwen/Qwen2.5-VL-7B-Instruct

      vramdoctor ab-test --model gemma3 --variants scoped_pool,cpu --no-ipc --json

      vramdoctor ab-test --preset malloc-arena-max-2 -- vllm serve M --port 8000

      vramdoctor ab-test --variant arena=MALLOC_ARENA_MAX=2 -- python srv.py --port 8000
    """
    if o["command"] and o["server"]:
        raise InputError("give the server's command once: --server CMD or -- CMD ARGS...")
    server = o["server"] or o["command"]
    if server or o["variant"] or o["preset"] or o["list_presets"]:
        _server_mode(o, server)
    if o["model"] is None:
        raise InputError("give --model MODEL (the processor check) or --server CMD (your server)")
    _model_mode(o)


def _server_mode(o: dict[str, Any], server: str | list[str] | None) -> None:
    from vramdoctor.abtest.server import ServerExperiment, build_variants, presets_for, report_run
    from vramdoctor.abtest.server.variants import kind_of_command
    from vramdoctor.soak.config import command_words

    argv = command_words(server) if server else None
    if o["list_presets"]:
        kind = kind_of_command(argv) if argv else None
        page = console.stdout()
        for kind_name in [kind] if kind else ["sglang", "vllm", "openai"]:
            for p in presets_for(kind_name):
                page.print(f"{kind_name} {p.name}: {p.describe()}\n  {p.description}\n  trades: {p.trades}",
                              markup=False, highlight=False)  # fmt: skip
        raise typer.Exit(0)
    if argv is None:
        raise InputError("--variant/--preset need the server: --server CMD or -- CMD ARGS...")
    if o["report_file"] or o["chart"]:
        raise InputError("--report: ab-test --server prints its table; it writes no chart")
    variants, kind = build_variants(argv, o["variant"] or (), o["preset"] or ())
    traffic = SoakConfig.from_options(
        {**o, "image_dir": o["images"], "launch": argv},
        rounds=o["rounds"] or SERVER_ROUNDS, seed=o["seed"], model=o["model"], image_dir=o["images"],
        idle_s=10.0 if o["idle"] is None else o["idle"], duration_s=o["timeout"],
        timeout_s=o["request_timeout"], gpus=(o["gpu"],) if o["gpu"] is not None else None,
    )  # fmt: skip
    out = o["out"] or Path("runs") / f"ab-test-{time.strftime('%Y%m%d-%H%M%S')}"
    exp = ServerExperiment(argv, variants, traffic=traffic, out=out, kind=kind, say=console.note)
    from vramdoctor.cli.soak import term_as_interrupt

    term_as_interrupt()  # SIGTERM ends it like Ctrl-C: the variants that ended are kept
    start = time.monotonic()
    exp.run()
    code = report_run(read_run(exp.path), json_out=o["json_out"], report_file=None)
    if not o["json_out"]:
        console.note(f"{len(variants)} launches in {time.monotonic() - start:.0f} s; "
                     f"results: {exp.path} (again: vramdoctor report {exp.path})")  # fmt: skip
    raise typer.Exit(code)


def _model_mode(o: dict[str, Any]) -> None:
    from vramdoctor.abtest.model_run import gpus, run_abtest
    from vramdoctor.abtest.models import resolve_model
    from vramdoctor.abtest.variants import select
    from vramdoctor.abtest.workload import WorkloadSpec, describe
    from vramdoctor.fixes._torch import torch_available

    spec = WorkloadSpec(
        count=o["count"], rounds=o["rounds"] or MODEL_ROUNDS, min_side=o["min_side"], max_side=o["max_side"],
        distribution=o["distribution"], seed=o["seed"], new_sizes_each_round=not o["same_images"],
        images_dir=str(o["images"]) if o["images"] is not None else None,
    ).validate()  # fmt: skip
    chosen = select(
        [v.strip() for v in o["variants"].split(",") if v.strip()] if o["variants"] else None
    )
    if o["ipc_gpus"] is not None and o["ipc_gpus"] < 1:
        raise InputError(
            f"--ipc-gpus {o['ipc_gpus']}: give 1 or more GPUs (1: the same-GPU round trip only)"
        )
    chart = o["report_file"] or o["chart"]
    if chart is not None and chart.suffix.lower() not in (".png", ".svg"):
        raise InputError(f"--report {chart}: ab-test writes its chart as .png or .svg")
    choice = resolve_model(o["model"])
    if not torch_available():
        raise MissingExtra("vramdoctor ab-test", "torch")
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise MissingExtra("vramdoctor ab-test", "transformers")
    devices = gpus()
    gpu = 0 if o["gpu"] is None else o["gpu"]
    if not 0 <= gpu < len(devices):
        raise VramdoctorError(f"--gpu {gpu}: this host has {len(devices)} GPU(s)")
    out = o["out"] or Path("runs") / f"ab-test-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    config = {"model": choice.to_dict(), "workload": spec.to_dict(), "gpu": gpu,
              "idle_s": 3.0 if o["idle"] is None else o["idle"]}  # fmt: skip
    header = make_header(
        "ab-test",
        gpus=devices,
        config={**config, "variants": [v.name for v in chosen], "ipc": o["ipc"],
                "ipc_gpus": o["ipc_gpus"], "workload_text": describe(spec), "model_note": choice.note},
    )  # fmt: skip
    timeout = 600.0 if o["timeout"] is None else o["timeout"]
    try:
        run_abtest(out, header, config, chosen, ipc=o["ipc"], gpu_count=len(devices),
                   timeout_s=timeout, ipc_gpus=o["ipc_gpus"])  # fmt: skip
    except KeyboardInterrupt:
        console.error("interrupted: partial results follow")
        with interrupts_held():
            report_run(read_run(out), json_out=o["json_out"], report_file=chart)
        raise typer.Exit(130) from None
    code = report_run(read_run(out), json_out=o["json_out"], report_file=chart)
    if not o["json_out"]:
        console.note(f"results: {out}  (again: vramdoctor report {out})")
    raise typer.Exit(code)
