"""The judge: pure per-layer verdicts over recorded memory series (VRAM, KV pool, host RAM).

No I/O, no clock, no sentences (those are each command's report). The modules: `timeline`
(windows, rounds, server lives from a run's events), `series` (every memory series and its
settled level after each round), `series_verdict` (one series over one server life, with the
growth statistics of `vramdoctor.stats`), `layers` (each memory layer's physics: `vram`, `kv`,
`host`), `run_verdict` (the run's rule and the production rate), `results` (the typed results).
A soak run is analysed by `vramdoctor.soak.analyse_soak`:

    from vramdoctor.soak import analyse_run
    from vramdoctor.record import read_run

    result = analyse_run(read_run("runs/soak-....jsonl"))
    result.verdict, result.layers["kv"].verdict, result.undecided
"""

from __future__ import annotations

from vramdoctor.judge.results import (
    CACHING,
    HOST,
    INCONCLUSIVE,
    KV,
    LAYERS,
    LEAK,
    NOT_MEASURED,
    SCHEMA,
    STABLE,
    VRAM,
    Culprit,
    HostProcessResult,
    KvPoolResult,
    LayerResult,
    Life,
    ProcessChange,
    Projection,
    RoundInfo,
    SeriesResult,
    SoakAnalysis,
    Thresholds,
    Undecided,
    Window,
)
from vramdoctor.judge.series import Series, extract_series, kv_usage
from vramdoctor.stats.rounds import SeriesFit, classify_series

__all__ = [
    "CACHING",
    "HOST",
    "INCONCLUSIVE",
    "KV",
    "LAYERS",
    "LEAK",
    "NOT_MEASURED",
    "SCHEMA",
    "STABLE",
    "VRAM",
    "Culprit",
    "HostProcessResult",
    "KvPoolResult",
    "LayerResult",
    "Life",
    "ProcessChange",
    "Projection",
    "RoundInfo",
    "Series",
    "SeriesFit",
    "SeriesResult",
    "SoakAnalysis",
    "Thresholds",
    "Undecided",
    "Window",
    "classify_series",
    "extract_series",
    "kv_usage",
]
