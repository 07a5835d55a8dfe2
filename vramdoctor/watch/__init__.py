"""`vramdoctor watch`: passive, continuous watch of one GPU host, with a Prometheus exporter.

Library use::

    from vramdoctor.watch import Watcher, WatchOptions
    w = Watcher(WatchOptions(server_url="http://127.0.0.1:30000", listen="127.0.0.1:9840")).open()
    w.tick(); result = w.analyse(); w.close()
    result.verdict, result.layers["host"].verdict, result.culprit

The server's own idle moments are watch's rounds (`rounds`), judged by soak's judge
(`judging`: one analysis for soak and watch); `WatchState` is pure and replays recorded runs
(`replay`). Modules: `config` (bounded settings), `rounds`, `quiet` (a server never idle),
`judging`, `state`, `result` (the typed result, schema vramdoctor.watch/2), `runner` (the
loop and its sources), `runfile` (rotating run files), `exporter` (/metrics), `report`
(terminal), `command` (the command as a library call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramdoctor import _lazy

if TYPE_CHECKING:  # the lazy names below, for type checkers
    from vramdoctor.stats.trend import TrendThresholds
    from vramdoctor.watch.config import WatchConfig, WatchOptions, parse_duration
    from vramdoctor.watch.exporter import EXPORTED_METRICS, SamplerHealth, WatchCollector, serve
    from vramdoctor.watch.result import SCHEMA, LayerView, SeriesVerdict, WatchResult
    from vramdoctor.watch.rounds import IdleWindow, PassiveRounds
    from vramdoctor.watch.runfile import RotatingRunWriter
    from vramdoctor.watch.runner import Watcher
    from vramdoctor.watch.state import WatchState, replay

# Public name -> the module that defines it (imported on first access).
_LAZY = {
    "EXPORTED_METRICS": ".exporter",
    "SamplerHealth": ".exporter",
    "WatchCollector": ".exporter",
    "serve": ".exporter",
    "Watcher": ".runner",
    "WatchOptions": ".config",
    "WatchConfig": ".config",
    "parse_duration": ".config",
    "SCHEMA": ".result",
    "LayerView": ".result",
    "SeriesVerdict": ".result",
    "WatchResult": ".result",
    "IdleWindow": ".rounds",
    "PassiveRounds": ".rounds",
    "RotatingRunWriter": ".runfile",
    "WatchState": ".state",
    "replay": ".state",
    "TrendThresholds": "..stats.trend",  # schema-1 spelling of WatchConfig(memory=, kv=)
}

__all__ = [
    "EXPORTED_METRICS",
    "SCHEMA",
    "IdleWindow",
    "LayerView",
    "PassiveRounds",
    "RotatingRunWriter",
    "SamplerHealth",
    "SeriesVerdict",
    "TrendThresholds",
    "WatchCollector",
    "WatchConfig",
    "WatchOptions",
    "WatchResult",
    "WatchState",
    "Watcher",
    "parse_duration",
    "replay",
    "serve",
]


def __getattr__(name: str) -> Any:
    """PEP 562: public names imported on first use, so importing the package (or the CLI) stays light."""
    return _lazy.load(__name__, name, _LAZY)


def __dir__() -> list[str]:
    return _lazy.listing(globals(), _LAZY)
