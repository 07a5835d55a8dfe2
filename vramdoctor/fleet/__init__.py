"""`vramdoctor fleet`: which server in a fleet is leaking, how fast, and when it will die.

Reads the history Prometheus already stores (`sources.prometheus`), maps every exporter's
labels to host, GPU and process (`collect`), and runs the same trend test as `watch` per
series (`analysis`). Library use::

    from vramdoctor.fleet import run_fleet
    result = run_fleet("http://prometheus:9090", days=7)
    for row in result.leaks: print(row.key, row.growth_per_hour, row.hours_to_oom)
"""

from __future__ import annotations

import time

from vramdoctor.fleet.analysis import (
    SCHEMA,
    FleetConfig,
    FleetResult,
    FleetRow,
    FleetSeries,
    analyse,
)
from vramdoctor.fleet.collect import FAMILIES, KV_QUERIES, collect, metric_names_used

__all__ = [
    "FAMILIES",
    "KV_QUERIES",
    "SCHEMA",
    "FleetConfig",
    "FleetResult",
    "FleetRow",
    "FleetSeries",
    "analyse",
    "collect",
    "metric_names_used",
    "run_fleet",
]


def run_fleet(
    prometheus_url: str,
    *,
    days: float = 7.0,
    end: float | None = None,
    step_s: float = 300.0,
    matchers: list[str] | None = None,
    virtual_gpus: bool = False,
    config: FleetConfig | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> FleetResult:
    """Query `days` of history ending at `end` (default now) and analyse every series."""
    from vramdoctor.sources.prometheus import PrometheusClient  # here: it brings requests and numpy

    end = time.time() if end is None else end
    start = end - days * 86400.0
    with PrometheusClient(prometheus_url, headers=headers, timeout_s=timeout_s) as client:
        series, free, notes = collect(
            client,
            start=start,
            end=end,
            step_s=step_s,
            matchers=matchers,
            virtual_gpus=virtual_gpus,
        )
        result = analyse(series, start=start, end=end, step_s=step_s, free=free, config=config)
        result.notes.extend(notes)
        result.source_url = client.shown_url
        result.queries = [
            {
                "query": s.query,
                "chunks": s.chunks,
                "series": s.series,
                "points": s.points,
                "seconds": round(s.seconds, 3),
            }
            for s in client.stats
        ]
    return result
