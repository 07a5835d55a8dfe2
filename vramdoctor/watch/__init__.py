"""`vramdoctor watch`: passive, continuous watch of one GPU host, with a Prometheus exporter.

Library use::

    from vramdoctor.watch import Watcher, WatchOptions
    w = Watcher(WatchOptions(server_url="http://127.0.0.1:30000", listen="127.0.0.1:9840")).open()
    w.tick(); result = w.analyse(); w.close()

The rolling analysis (`WatchState`, `classify`) is pure and replays recorded runs (`replay`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramdoctor import _lazy

if TYPE_CHECKING:  # the lazy names below, for type checkers
    from vramdoctor.stats.trend import (
        CACHING,
        INCONCLUSIVE,
        LEAK,
        STABLE,
        Trend,
        TrendThresholds,
        classify,
    )
    from vramdoctor.watch.exporter import EXPORTED_METRICS, SamplerHealth, WatchCollector, serve
    from vramdoctor.watch.runner import Watcher, WatchOptions
    from vramdoctor.watch.state import (
        SCHEMA,
        SeriesVerdict,
        WatchConfig,
        WatchResult,
        WatchState,
        replay,
    )

# Public name -> the module that defines it (imported on first access).
_LAZY = {
    "EXPORTED_METRICS": ".exporter",
    "SamplerHealth": ".exporter",
    "WatchCollector": ".exporter",
    "serve": ".exporter",
    "Watcher": ".runner",
    "WatchOptions": ".runner",
    "SCHEMA": ".state",
    "SeriesVerdict": ".state",
    "WatchConfig": ".state",
    "WatchResult": ".state",
    "WatchState": ".state",
    "replay": ".state",
    "CACHING": "..stats.trend",
    "INCONCLUSIVE": "..stats.trend",
    "LEAK": "..stats.trend",
    "STABLE": "..stats.trend",
    "Trend": "..stats.trend",
    "TrendThresholds": "..stats.trend",
    "classify": "..stats.trend",
}

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


def __getattr__(name: str) -> Any:
    """PEP 562: public names imported on first use, so importing the package (or the CLI) stays light."""
    return _lazy.load(__name__, name, _LAZY)


def __dir__() -> list[str]:
    return _lazy.listing(globals(), _LAZY)
