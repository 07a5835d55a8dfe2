"""Soak analysis: one verdict per memory layer (VRAM, KV pool, host RAM) from a recorded run.

Pure: no I/O, no clock, no sentences (those are `vramdoctor.report.soak`'s). The modules:
`protocol` (windows, rounds, server lives from the run's events), `series` (every memory series
and its settled level after each round), `stats` (leak/caching/stable of one series: Theil-Sen
slope and Kendall trend over cumulative requests), `judge` (one series over one server life),
`vram`, `kv`, `host` (each layer's physics), `verdict` (the overall rule and the production
rate), `results` (the typed results), `analyse_run` (`analyse_soak`, the entry point).

    from vramdoctor.analysis.soak import analyse_soak
    from vramdoctor.record import read_run

    run = read_run("runs/soak-....jsonl")
    result = analyse_soak(run.records, run.header, raw_host=run.raw("host_memory"))
    result.verdict, result.layers["kv"].verdict, result.undecided_layers()
"""

from __future__ import annotations

from .analyse_run import analyse_soak
from .results import (
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
from .series import Series, extract_series, kv_usage
from .stats import SeriesFit, classify_series

# The names this module had before the per-layer split, kept for one release.
analyse = analyse_soak
SoakResult = SoakAnalysis

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
    "SoakResult",
    "Thresholds",
    "Undecided",
    "Window",
    "analyse",
    "analyse_soak",
    "classify_series",
    "extract_series",
    "kv_usage",
]
