"""What `watch` knows at one moment: typed results, numbers and codes, never sentences.

`WatchResult.to_dict()` is the `--json` document (schema `vramdoctor.watch/2`). Memory is MiB,
the KV pool tokens, rates per served request and per hour (at the request rate the server
served over the window), times to out of memory in hours.

Schema 2 (from 1): series are the judge's series (`key` "gpu0/pid42", "rss_anon/pid42",
"kv/full", "gpu0-gi1": a MIG slice), each with its `scope` ("server" or "tenant": another
tenant's process never decides), its `memory_layer` (vram, host, kv) and `layer` (vram,
device, rss, rss_anon, rss_file, rss_shmem, kv, dev_shm: the names the exporter's `layer`
label has always carried); `layers` gives one verdict per memory layer as soak does (reason,
what decided it, the rate and the time to OOM); `culprit` is the one series the headline
names, with the same rate and time to OOM as its layer; `mode` says how comparable moments
were found (`rounds`: the server's own idle windows; `quiet`: its quietest moments, it is
never idle; `time`: no request counter, growth per hour only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.judge.results import finite
from vramdoctor.verdicts import RANK, Verdict

__all__ = ["SCHEMA", "LayerView", "SeriesVerdict", "WatchResult", "rank_key"]

SCHEMA = "vramdoctor.watch/2"


@dataclass
class SeriesVerdict:
    """The rolling verdict of one series (module doc for the units and names)."""

    key: str
    layer: str
    memory_layer: str
    unit: str
    verdict: str
    reason: str
    mode: str  # "rounds", "quiet", "time"
    pid: int | None = None
    gpu: int | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    device: str | None = None
    pool: str | None = None
    process: str | None = None
    role: str | None = None
    scope: str = "server"
    username: str | None = None
    alive: bool = True
    decides: bool = True
    level: float | None = None
    floor_level: float | None = None
    points: int = 0
    growth: float | None = None
    growth_per_request: float | None = None
    growth_per_request_ci: tuple[float, float] | None = None
    growth_per_hour: float | None = None
    growth_per_hour_ci: tuple[float, float] | None = None
    hours_to_oom: float | None = None
    free: float | None = None
    bound: float | None = None
    model: str | None = None
    explanation: str | None = None
    decided_by: str | None = None
    steps_to_decide: int | None = None
    warmup_until: float | None = None
    life: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("growth_per_request_ci", "growth_per_hour_ci"):
            d[k] = list(d[k]) if d[k] is not None else None
        return finite(d)  # type: ignore[no-any-return]


@dataclass
class LayerView:
    """One memory layer's verdict over the window, as soak's judge gave it."""

    layer: str
    verdict: str
    reason: str
    unit: str
    explanation: str | None = None
    decided_by: str | None = None
    main_series: str | None = None
    rate_per_request: float | None = None
    rate_ci: tuple[float, float] | None = None
    rate_per_hour: float | None = None
    rate_per_hour_ci: tuple[float, float] | None = None
    hours_to_oom: float | None = None
    capacity_left: float | None = None
    capacity_of: str | None = None
    tenants: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    steps_to_decide: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("rate_ci", "rate_per_hour_ci"):
            d[k] = list(d[k]) if d[k] is not None else None
        return finite(d)  # type: ignore[no-any-return]


def rank_key(s: SeriesVerdict) -> tuple[Any, ...]:
    """Sort order of the table: deciding before evidence, worst verdict, soonest OOM, fastest."""
    return (
        not s.decides,
        s.scope != "server",
        -RANK.get(s.verdict, -1),
        s.hours_to_oom if s.hours_to_oom is not None else math.inf,
        -(s.growth_per_hour or 0.0),
        s.key,
    )


@dataclass
class WatchResult:
    """The rolling verdicts (module doc). `verdict` is the run's, by soak's rule (LEAK if a
    layer leaks; else INCONCLUSIVE if one is undecided; else CACHING; else STABLE);
    `culprit_key` the series the headline names."""

    wall: float
    window_s: float
    verdict: str
    mode: str
    series: list[SeriesVerdict]
    layers: dict[str, LayerView] = field(default_factory=dict)
    culprit_key: str | None = None
    culprit_layer: str | None = None
    rounds: int = 0
    idle_windows: int = 0
    requests_per_hour: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    strays: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    kv_idle_used_tokens: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    interrupted: bool = False

    @property
    def culprit(self) -> SeriesVerdict | None:
        return next((s for s in self.series if s.key == self.culprit_key), None)

    @property
    def leak(self) -> bool:
        return self.verdict == Verdict.LEAK

    @property
    def exit_code(self) -> int:
        """1 a leak (found before an interrupt too), 130 interrupted, else 0."""
        if self.leak:
            return 1
        return 130 if self.interrupted else 0

    def series_of(self, layer: str, pid: int | None = None) -> list[SeriesVerdict]:
        return [s for s in self.series if s.layer == layer and (pid is None or s.pid == pid)]

    def to_dict(self) -> dict[str, Any]:
        c = self.culprit
        return finite(  # type: ignore[no-any-return]
            {
                "schema": SCHEMA,
                "wall": self.wall,
                "window_s": self.window_s,
                "verdict": self.verdict,
                "exit_code": self.exit_code,
                "interrupted": self.interrupted,
                "mode": self.mode,
                "rounds": self.rounds,
                "idle_windows": self.idle_windows,
                "culprit": c.to_dict() if c else None,
                "culprit_layer": self.culprit_layer,
                "requests_per_hour": self.requests_per_hour,
                "layers": {k: v.to_dict() for k, v in self.layers.items()},
                "series": [s.to_dict() for s in self.series],
                "gpus": self.gpus,
                "kv_idle_used_tokens": self.kv_idle_used_tokens,
                "stray_contexts": self.strays,
                "events": self.events,
                "sources": self.sources,
                "notes": self.notes,
            }
        )
