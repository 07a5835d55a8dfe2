"""`vramdoctor watch`: passive, continuous watch of one GPU host, with a Prometheus exporter.

Library use::

    from vramdoctor.watch import Watcher, WatchOptions
    w = Watcher(WatchOptions(server_url="http://127.0.0.1:30000", listen="127.0.0.1:9840")).open()
    w.tick(); result = w.analyse(); w.close()

The rolling analysis (`WatchState`, `classify`) is pure and replays recorded runs (`replay`).
"""

from __future__ import annotations

from .exporter import EXPORTED_METRICS, SamplerHealth, WatchCollector, serve
from .runner import Watcher, WatchOptions
from .state import SCHEMA, SeriesVerdict, WatchConfig, WatchResult, WatchState, replay
from .trend import CACHING, INCONCLUSIVE, LEAK, STABLE, Trend, TrendThresholds, classify

__all__ = [
    "CACHING",
    "EXPORTED_METRICS",
    "INCONCLUSIVE",
    "LEAK",
    "SCHEMA",
    "STABLE",
    "SamplerHealth",
    "SeriesVerdict",
    "Trend",
    "TrendThresholds",
    "WatchCollector",
    "WatchConfig",
    "WatchOptions",
    "WatchResult",
    "WatchState",
    "Watcher",
    "classify",
    "replay",
    "serve",
]
