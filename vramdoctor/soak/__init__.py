"""Soak as a library: run a soak from a config object, analyse a recorded run.

    from vramdoctor.soak import SoakConfig, SoakSession, run_soak
    outcome = run_soak(SoakConfig(url="http://127.0.0.1:30000", rounds=4, requests=30))
    outcome.exit_code, outcome.run_path, outcome.analysis

    outcome = SoakSession(SoakConfig(launch=("vllm", "serve", "M", "--port", "8000")),
                          hooks=[MyHook()]).run()     # vramdoctor starts and stops the server

`SoakSession` runs a soak as named steps (launch, identify, open sources, start, measure, stop,
analyse) with `SoakHook`s as the extension point (`vramdoctor.soak.session`); `run_soak` is
`SoakSession(...).run()`. It identifies the server, samples every memory layer it can reach
(GPU by NVML or an exporter, host memory by kind, the server's KV pool from /metrics) into a
run file, runs the load-then-idle protocol (more rounds while a layer is undecided), watches
the server's life and returns a `SoakOutcome`. `analyse_soak` analyses recorded records again
(pure); `analyse_run` does so for a `vramdoctor.record.Run`. `LaunchSpec` and `launch`
(`vramdoctor.soak.launch`) start a server in its own process group, under a keeper, so that
nothing vramdoctor starts outlives it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramdoctor import _lazy
from vramdoctor.soak.analyse import analyse_run, undecided_layers
from vramdoctor.soak.config import DEFAULT_MAX_ROUNDS, SoakConfig

if TYPE_CHECKING:  # the lazy names below, for type checkers
    from vramdoctor.judge import SoakAnalysis
    from vramdoctor.soak.launch import LaunchedServer, LaunchFailed, LaunchSpec, launch
    from vramdoctor.soak.session import (
        RoundHook,
        SoakHook,
        SoakOutcome,
        SoakSession,
        default_run_path,
        run_soak,
    )


def analyse_soak(
    records: list[Any], header: dict[str, Any] | None = None, **kwargs: Any
) -> SoakAnalysis:
    """The per-layer soak analysis of a run's records (`vramdoctor.judge.analyse_soak`:
    pure; keyword arguments production_rate_rps, raw_host, status, th). Imported on use, so
    `import vramdoctor.soak` does not pay for scipy."""
    from vramdoctor.soak.analysis import analyse_soak as analyse

    return analyse(records, header, **kwargs)


# Public name -> the module that defines it (imported on first access: the runner brings
# requests, numpy and PIL, which `vramdoctor --help` and the analysis do not need).
_LAZY = {
    "LaunchFailed": ".launch",
    "LaunchSpec": ".launch",
    "LaunchedServer": ".launch",
    "RoundHook": ".session",
    "SoakHook": ".session",
    "SoakOutcome": ".session",
    "SoakSession": ".session",
    "default_run_path": ".session",
    "launch": ".launch",
    "run_soak": ".session",
}


__all__ = [
    "DEFAULT_MAX_ROUNDS",
    "LaunchFailed",
    "LaunchSpec",
    "LaunchedServer",
    "RoundHook",
    "SoakConfig",
    "SoakHook",
    "SoakOutcome",
    "SoakSession",
    "analyse_run",
    "analyse_soak",
    "default_run_path",
    "launch",
    "run_soak",
    "undecided_layers",
]


def __getattr__(name: str) -> Any:
    """PEP 562: the names of the runner imported on first use, so importing the package (or the CLI) stays light."""
    return _lazy.load(__name__, name, _LAZY)


def __dir__() -> list[str]:
    return _lazy.listing(globals(), _LAZY)
