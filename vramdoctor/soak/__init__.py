"""Soak as a library: run a soak from a config object, analyse a recorded run.

    from vramdoctor.soak import SoakConfig, run_soak
    outcome = run_soak(SoakConfig(url="http://127.0.0.1:30000", rounds=4, requests=30))
    outcome.exit_code, outcome.run_path, outcome.analysis

`run_soak` identifies the server, samples every memory layer it can reach (GPU by NVML or an
exporter, host memory by kind, the server's KV pool from /metrics) into a run file, runs the
load-then-idle protocol (more rounds while a layer is undecided), watches the server's life
and returns a `SoakOutcome`. `analyse_soak` analyses recorded records again (pure);
`analyse_run` does so for a `vramdoctor.record.Run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramdoctor import _lazy
from vramdoctor.soak.analyse import analyse_run, undecided_layers
from vramdoctor.soak.config import DEFAULT_MAX_ROUNDS, SoakConfig

if TYPE_CHECKING:  # the lazy names below, for type checkers
    from vramdoctor.judge import SoakAnalysis
    from vramdoctor.soak.runner import RoundHook, SoakOutcome, default_run_path, run_soak


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
    "RoundHook": ".runner",
    "SoakOutcome": ".runner",
    "default_run_path": ".runner",
    "run_soak": ".runner",
}


__all__ = [
    "DEFAULT_MAX_ROUNDS",
    "RoundHook",
    "SoakConfig",
    "SoakOutcome",
    "analyse_run",
    "analyse_soak",
    "default_run_path",
    "run_soak",
    "undecided_layers",
]


def __getattr__(name: str) -> Any:
    """PEP 562: the names of the runner imported on first use, so importing the package (or the CLI) stays light."""
    return _lazy.load(__name__, name, _LAZY)


def __dir__() -> list[str]:
    return _lazy.listing(globals(), _LAZY)
