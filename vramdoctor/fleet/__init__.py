"""`vramdoctor fleet`: which server in a fleet is leaking, how fast, and when it will die.

Reads the history the operator's time-series database already stores (Prometheus,
VictoriaMetrics, Thanos, Mimir: `sources.prometheus`), with the work done where the data is:
the database screens every series (how much its floor moved, whether it grows now) and only
the candidates' hourly floors come back (`collect`); each row's lives, change point, verdict
and time to OOM are judged here (`analysis`, pure). Library use::

    from vramdoctor.fleet import run_fleet
    result = run_fleet("http://prometheus:9090", since_s=7 * 86400)
    for row in result.leaks:
        print(row.key, row.growth_per_hour, row.hours_to_oom)

Modules: `families` (what is read, whose series it is), `promql` (every expression and the
recording rules), `collect` (screen, pull, join), `analysis` (rows), `report` (table,
sentence, charts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vramdoctor import _lazy
from vramdoctor.fleet.config import FleetConfig

if TYPE_CHECKING:  # the lazy names below, for type checkers
    from vramdoctor.fleet.analysis import (
        REASONS,
        SCHEMA,
        FleetResult,
        FleetRow,
        FleetSeries,
        analyse,
    )
    from vramdoctor.fleet.collect import Collected  # annotations only: not exported
    from vramdoctor.fleet.families import FAMILIES, metric_names_used

__all__ = [
    "FAMILIES",
    "REASONS",
    "SCHEMA",
    "STRATEGIES",
    "FleetConfig",
    "FleetResult",
    "FleetRow",
    "FleetSeries",
    "analyse",
    "metric_names_used",
    "run_fleet",
]

# numpy-backed names load on first use: the command line builds its FleetConfig and sends its
# first query while numpy and scipy load on a thread (see run_fleet)
_LAZY = {
    "REASONS": ".analysis",
    "SCHEMA": ".analysis",
    "FleetResult": ".analysis",
    "FleetRow": ".analysis",
    "FleetSeries": ".analysis",
    "analyse": ".analysis",
    "FAMILIES": ".families",
    "metric_names_used": ".families",
}


def __getattr__(name: str) -> Any:
    return _lazy.load(__name__, name, _LAZY)


def __dir__() -> list[str]:
    return _lazy.listing(globals(), _LAZY)


STRATEGIES = ("screen", "pull")
"""`screen`: the database screens every series, candidates are pulled (the default);
`pull`: every series' step minima are pulled and judged here (for comparison)."""


def run_fleet(
    prometheus_url: str,
    *,
    since_s: float | None = None,
    days: float = 7.0,
    end: float | None = None,
    step_s: float = 300.0,
    matchers: Sequence[str] | None = None,
    virtual_gpus: bool = False,
    config: FleetConfig | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    max_answer_bytes: int = 64 * 1024 * 1024,
    strategy: str = "screen",
    parallel: int = 3,
    max_candidates: int = 5000,
) -> FleetResult:
    """Read `since_s` (default `days` days) of history ending at `end` (default now) and rank
    every GPU, process and KV pool.

    `timeout_s` is each query's total deadline and `max_answer_bytes` each answer's size cap;
    `step_s` the resolution of the `pull` strategy and of charts; `parallel` how many queries
    are asked at once; `max_candidates` how many series are pulled after the screen at most.
    Raises InputError (bad range, nothing stored) and SourceUnavailable (the database
    unreachable, refusing, or answering malformed JSON)."""
    from vramdoctor.errors import InputError
    from vramdoctor.fleet.promql import check_matchers
    from vramdoctor.sources.prometheus import PrometheusClient

    if strategy not in STRATEGIES:
        raise InputError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    config = config or FleetConfig()
    start, end = _window(since_s, days, end)
    matched = tuple(check_matchers(list(matchers or [])))
    # numpy, the analysis and scipy.stats (about a second in all) load on a thread while the
    # first queries are on their way and the database works on the screen
    threading.Thread(target=_warm, name="vramdoctor-import", daemon=True).start()
    t0 = time.perf_counter()
    with PrometheusClient(
        prometheus_url,
        headers=headers,
        deadline_s=timeout_s,
        max_answer_bytes=max_answer_bytes,
        parallel=parallel,
    ) as client:
        try:
            names = client.metric_names(start, end)  # needs no numpy: out at once
            from vramdoctor.fleet.analysis import analyse
            from vramdoctor.fleet.collect import Plan, collect

            plan = Plan(
                start=start,
                end=end,
                step_s=float(step_s),
                config=config,
                matchers=matched,
                virtual_gpus=virtual_gpus,
                strategy=strategy,
                max_candidates=int(max_candidates),
                names=frozenset(names),
            )
            got = collect(client, plan)
        finally:
            calls = [c.to_dict() for c in client.calls]
        t1 = time.perf_counter()
        result = analyse(
            got.series,
            start=start,
            end=end,
            step_s=step_s,
            free=got.free,
            free_notes=got.free_notes,
            config=config,
            rows=got.rows,
        )
        _add_figures(result, got, client.shown_url, calls, strategy, t0=t0, t1=t1)
    return result


def _window(since_s: float | None, days: float, end: float | None) -> tuple[float, float]:
    """Returns the range (start, end) in unix s: `since_s` (default `days` days) ending at
    `end` (default now)."""
    end = time.time() if end is None else float(end)
    window = float(since_s) if since_s is not None else days * 86400.0
    start = end - window
    return start, end


def _add_figures(
    result: FleetResult,
    got: Collected,
    source_url: str,
    calls: list[dict[str, Any]],
    strategy: str,
    *,
    t0: float,
    t1: float,
) -> None:
    """Adds to `result` what the collection found besides the series (notes, rules read) and
    how it went (the database, its queries, the strategy, the seconds of each stage since `t0`,
    the analysis since `t1`); returns nothing."""
    result.notes.extend(got.notes)
    result.source_url = source_url
    result.queries = calls
    result.strategy = strategy
    result.recorded_rules = got.recorded
    result.seconds = {
        **got.seconds,
        "collect": t1 - t0,
        "analyse": time.perf_counter() - t1,
        "candidates": float(got.candidates),
        "screened": float(got.screened),
    }


def _warm() -> None:
    """Import what the analysis needs (numpy, scipy.stats: about a second) ahead of it."""
    try:
        import vramdoctor.fleet.analysis
        import vramdoctor.fleet.collect
        import vramdoctor.stats.changepoint
        import vramdoctor.stats.trend  # noqa: F401
    except Exception:  # the analysis imports them again and says what is wrong
        pass
