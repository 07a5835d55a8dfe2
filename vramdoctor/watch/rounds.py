"""Passive rounds: the idle moments of a server that serves production traffic. Pure.

soak makes its own rounds: identical traffic, then an idle window, again and again. `watch`
sends nothing, but a server that idles now and then makes rounds by itself: an *idle window*
is a stretch where its /metrics say no request runs and none waits (`running + queued == 0`)
for at least `min_idle_s`, and a *round* is the traffic between two idle windows, counted by
the server's own request counter (`requests_total`). The memory settled in each idle window,
against the requests served up to it, is what soak's judge reads after each of its rounds,
so watch hands these rounds to the same judge (`vramdoctor.soak.analysis.analyse_soak`:
the same growth model, lives, scope rules and inside evidence; see `watch.judging`).

Bounded for weeks: each idle window keeps at most `window_samples` samples of each kind (GPU,
host, metrics: decimated to every other one when full, so a long idle stretch stays
represented end to end) and the agent's inside evidence (one record per process); at most
`max_rounds + 1` windows are kept (past that, the round with the fewest requests is merged into
the next: its idle window is dropped), and windows older than the rolling window are
forgotten (the oldest kept one becomes the baseline).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.samples import GpuSample, HostSample, InsideSample, MetricsSample

__all__ = ["IdleWindow", "PassiveRounds", "inflight_of"]


def inflight_of(sample: MetricsSample) -> float | None:
    """Requests running + queued by the server's own gauges (None when it exports neither)."""
    running = sample.values.get("running_requests")
    queued = sample.values.get("queued_requests")
    if running is None and queued is None:
        return None
    return float(running or 0.0) + float(queued or 0.0)


def _decimate(items: list[Any], cap: int) -> None:
    """Keep every other item (the last one always) once `items` reaches 2 x `cap`."""
    if len(items) >= 2 * cap:
        last = items[-1]
        del items[1::2]
        if items[-1] is not last:
            items.append(last)


@dataclass
class IdleWindow:
    """One idle stretch: its first and last idle metrics sample (monotonic `t` and `wall`),
    the requests served up to it (cumulative, resets folded in) and the samples taken in it."""

    start_t: float
    start_wall: float
    end_t: float
    end_wall: float
    served: float
    records: dict[str, list[Any]] = field(default_factory=dict)
    inside: dict[int, InsideSample] = field(default_factory=dict)
    inside_asked: bool = False

    @property
    def duration_s(self) -> float:
        return self.end_t - self.start_t

    def add(self, kind: str, record: Any, cap: int) -> None:
        items = self.records.setdefault(kind, [])
        items.append(record)
        _decimate(items, cap)

    def all_records(self) -> list[Any]:
        return [r for items in self.records.values() for r in items]


class PassiveRounds:
    """Finds idle windows in a stream of samples (see the module doc).

    `metrics(sample, served)` with each /metrics sample (`served`: the cumulative request
    count, None when the server exports none: no rounds then), `sample(record)` with every
    GPU and host sample, `inside(record)` with the agent's InsideSamples. `windows(wall)`
    gives the idle windows of the rolling window (the open one too, once it lasts
    `min_idle_s`), oldest first."""

    def __init__(
        self,
        *,
        min_idle_s: float,
        max_rounds: int,
        window_samples: int,
        window_s: float,
    ) -> None:
        self.min_idle_s = float(min_idle_s)
        self.max_rounds = int(max_rounds)
        self.cap = int(window_samples)
        self.window_s = float(window_s)
        self.closed: list[IdleWindow] = []
        self.open: IdleWindow | None = None
        self.merged = 0  # rounds merged into the next (bounded state)
        self.busy_since_wall: float | None = None  # a stretch of traffic without an idle window
        self.last_idle_wall: float | None = None

    # -- ingest --------------------------------------------------------------------------
    def metrics(self, s: MetricsSample, served: float | None) -> None:
        inflight = inflight_of(s)
        if inflight is None or served is None:
            self._close()
            return
        if inflight == 0:
            self.last_idle_wall = s.wall
            if self.open is None:
                self.open = IdleWindow(s.t, s.wall, s.t, s.wall, served)
            w = self.open
            if served != w.served:  # a request finished within the stretch: a new one starts
                self._close()
                self.open = w = IdleWindow(s.t, s.wall, s.t, s.wall, served)
            w.end_t, w.end_wall = s.t, s.wall
            w.add("metrics", s, self.cap)
            self.busy_since_wall = None
        else:
            self._close()
            if self.busy_since_wall is None:
                self.busy_since_wall = s.wall

    def sample(self, record: GpuSample | HostSample | dict[str, Any]) -> None:
        w = self.open
        if w is None:
            return
        if isinstance(record, GpuSample):
            w.add("gpu", record, self.cap)
        elif isinstance(record, HostSample):
            w.add("host", record, self.cap)
        elif isinstance(record, dict) and record.get("kind") == "host_memory":
            w.add("host_memory", record, 2)

    def inside(self, record: InsideSample) -> bool:
        """Attach the agent's record to the idle window it was measured in (False when it was
        measured outside every idle window: traffic had resumed; it is then not comparable)."""
        for w in ([self.open] if self.open is not None else []) + self.closed[-1:][::-1]:
            if w.start_wall - 1.0 <= record.wall <= w.end_wall + 0.5:
                w.inside[record.pid] = record
                return True
        return False

    def _close(self) -> None:
        w, self.open = self.open, None
        if w is None or w.duration_s < self.min_idle_s or not w.records.get("metrics"):
            return
        prev = self.closed[-1] if self.closed else None
        if prev is not None and prev.served == w.served:
            self.closed[-1] = w  # no request finished in between: the later stretch stands
            return
        self.closed.append(w)
        self._bound()

    def _bound(self) -> None:
        """At most max_rounds + 1 windows: merge the smallest round (drop its idle window)."""
        while len(self.closed) > self.max_rounds + 1:
            c = self.closed
            i = min(range(1, len(c) - 1), key=lambda k: (c[k + 1].served - c[k - 1].served, k))
            del c[i]
            self.merged += 1

    # -- read ----------------------------------------------------------------------------
    def prune(self, wall: float) -> None:
        """Forget windows that ended before the rolling window (`wall` - window_s)."""
        start = wall - self.window_s
        self.closed = [w for w in self.closed if w.end_wall >= start]

    def current(self) -> IdleWindow | None:
        """The open idle window once it lasts `min_idle_s` (the server idles now)."""
        w = self.open
        return w if w is not None and w.duration_s >= self.min_idle_s else None

    def windows(self, wall: float) -> list[IdleWindow]:
        """The idle windows of the rolling window ending at `wall`, oldest first."""
        self.prune(wall)
        out = list(self.closed)
        cur = self.current()
        if cur is not None and cur.records.get("metrics"):
            if out and out[-1].served == cur.served:
                out[-1] = cur
            else:
                out.append(cur)
        return out

    def drop_before(self, wall: float) -> None:
        """Leave out windows that started before `wall` (a warm-up after a start)."""
        self.closed = [w for w in self.closed if w.start_wall >= wall]

    @staticmethod
    def rounds_of(windows: Iterable[IdleWindow]) -> int:
        return max(len(list(windows)) - 1, 0)
