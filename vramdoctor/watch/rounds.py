"""Passive rounds: the idle moments of a server that serves production traffic. Pure.

soak makes its own rounds: identical traffic, then an idle window, again and again. `watch`
sends nothing, but a server that idles now and then makes rounds by itself: an *idle window*
is a stretch where its /metrics say no request runs and none waits (`running + queued == 0`)
for at least `min_idle_s`, and a *round* is the traffic between two idle windows, counted by
the server's own request counter (`requests_total`). The memory settled in each idle window,
against the requests served up to it, is what soak's judge reads after each of its rounds,
so watch hands these rounds to the same judge (`vramdoctor.soak.analysis.analyse_soak`:
the same growth model, lives, scope rules and inside evidence; see `watch.judging`).

A sample belongs to an idle window only when the server's /metrics said idle both before
and after it (samples are held until the next metrics sample confirms the stretch went on:
traffic that resumed between a metrics sample and a host sample must not count), and only
from `settle_s` after the stretch began (exporters publish late, RSS counters of threads that
just finished lag): the window's start is then its first settled moment. The agent's inside
evidence follows the same rule, by the moment the agent measured it (`InsideSample.wall`):
within the window's settled span, confirmed idle by a later /metrics sample of the same
stretch; a record measured after the stretch's last idle sample may hold the buffers of
requests that had begun, and is left out (counted in `inside_dropped`).

Bounded for weeks: each idle window keeps at most `window_samples` samples of each kind (GPU,
host, metrics: decimated to every other one when full, so a long idle stretch stays
represented end to end) and the agent's inside evidence (one record per process); at most
`max_rounds + 1` windows are kept (past that, the round with the fewest requests is merged into
the next: its idle window is dropped), and windows older than the rolling window are
forgotten (the oldest kept one becomes the baseline).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
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
    settled_t: float | None = None  # first sample kept (settle_s after the start)
    settled_wall: float | None = None

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
        settle_s: float = 0.0,
    ) -> None:
        self.min_idle_s = float(min_idle_s)
        self.settle_s = float(settle_s)
        self._pending: list[tuple[str, Any]] = []
        self._pending_inside: list[InsideSample] = []
        self.inside_dropped = 0  # inside records measured outside every settled idle span
        self.max_rounds = int(max_rounds)
        self.cap = int(window_samples)
        self.window_s = float(window_s)
        self.closed: list[IdleWindow] = []
        self.open: IdleWindow | None = None
        self.merged = 0  # rounds merged into the next (bounded state)
        self.busy_since_wall: float | None = None  # a stretch of traffic without an idle window
        self._samples_seen = False
        # pid -> the most threads a host sample saw since the last idle window closed (the
        # round's traffic included): a kept idle sample carries it, so that the judge's host
        # rule sees a thread-per-connection server's threads (it reads the most threads any
        # sample saw; idle samples alone show the threads left when the connections closed)
        self._threads: dict[int, int] = {}
        self.last_idle_wall: float | None = None

    # -- ingest --------------------------------------------------------------------------
    def metrics(self, s: MetricsSample, served: float | None) -> None:
        inflight = inflight_of(s)
        pending, self._pending = self._pending, []
        inside, self._pending_inside = self._pending_inside, []
        if inflight is None or served is None:
            self.inside_dropped += len(inside)
            self._close()
            return
        if inflight == 0:
            self.last_idle_wall = s.wall
            w = self.open
            if w is not None and served == w.served:
                for kind, rec in pending:  # idle before and after them: they count
                    self._keep(w, kind, rec)
                for rec in inside:
                    if not self._attach(w, rec, s.wall):
                        self.inside_dropped += 1
            else:
                self.inside_dropped += len(inside)
                self._close()  # a request finished within the stretch: a new one starts
                self.open = w = IdleWindow(s.t, s.wall, s.t, s.wall, served)
            w.end_t, w.end_wall = s.t, s.wall
            self._keep(w, "metrics", s)
            self.busy_since_wall = None
        else:
            self.inside_dropped += len(inside)
            self._close()
            for kind, rec in pending:  # taken while the round ran: its threads count
                if kind == "host":
                    self._count_threads(rec)
            if self.busy_since_wall is None:
                self.busy_since_wall = s.wall

    def _keep(self, w: IdleWindow, kind: str, record: Any) -> None:
        t = record.get("t") if isinstance(record, dict) else getattr(record, "t", None)
        wall = record.get("wall") if isinstance(record, dict) else getattr(record, "wall", None)
        if not isinstance(t, (int, float)) or t < w.start_t + self.settle_s:
            return  # still settling
        if w.settled_t is None:
            w.settled_t = float(t)
            w.settled_wall = float(wall) if isinstance(wall, (int, float)) else None
        if isinstance(record, HostSample) and self._threads:
            record = replace(
                record,
                processes=[
                    replace(p, threads=max(p.threads or 0, self._threads.get(p.pid, 0)) or None)
                    for p in record.processes
                ],
            )
        w.add(kind, record, 2 if kind == "host_memory" else self.cap)

    def sample(self, record: GpuSample | HostSample | dict[str, Any]) -> None:
        """A GPU or host sample (or a host_memory record): held until the next metrics sample
        says whether the server was still idle."""
        if isinstance(record, (GpuSample, HostSample)):
            self._samples_seen = True
        if isinstance(record, HostSample):
            self._count_threads(record)
        if self.open is None:
            return
        if isinstance(record, GpuSample):
            self._pending.append(("gpu", record))
        elif isinstance(record, HostSample):
            self._pending.append(("host", record))
        elif isinstance(record, dict) and record.get("kind") == "host_memory":
            self._pending.append(("host_memory", record))

    def _count_threads(self, record: HostSample) -> None:
        for p in record.processes:
            if isinstance(p.threads, int) and p.threads > self._threads.get(p.pid, 0):
                self._threads[p.pid] = p.threads

    def inside(self, record: InsideSample) -> bool:
        """Attach the agent's record to the idle window it was measured in: within that
        window's settled span (held until the next /metrics sample when it was measured after
        the open window's last one). False when it was measured outside every settled idle
        span (traffic had resumed, or the stretch had not settled): not comparable, counted in
        `inside_dropped`."""
        w = self.open
        if w is not None and w.settled_wall is not None and record.wall > w.end_wall:
            self._pending_inside.append(record)  # the next /metrics sample decides
            return True
        for w in ([self.open] if self.open is not None else []) + self.closed[-1:][::-1]:
            if self._attach(w, record, w.end_wall):
                return True
        self.inside_dropped += 1
        return False

    @staticmethod
    def _attach(w: IdleWindow, record: InsideSample, idle_until: float) -> bool:
        """Attach `record` to `w` when it was measured from the window's first settled
        sample to `idle_until` (a /metrics sample that still said idle)."""
        if w.settled_wall is not None and w.settled_wall <= record.wall <= idle_until:
            w.inside[record.pid] = record
            return True
        return False

    def _close(self) -> None:
        w, self.open = self.open, None
        if w is not None:
            self._threads = {}  # a round begins: its threads are counted afresh
        if w is None or w.duration_s < self.min_idle_s or not w.records.get("metrics"):
            return
        if not (w.records.get("gpu") or w.records.get("host")) and self._samples_seen:
            return  # no memory sample settled in it
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
        """The open idle window once it lasts `min_idle_s` and a sample settled in it (the
        server idles now)."""
        w = self.open
        if w is None or w.duration_s < self.min_idle_s or w.settled_t is None:
            return None
        return w

    def settled(self) -> IdleWindow | None:
        """The open idle stretch once a sample settled in it (`settle_s` after it began),
        whether or not it lasts `min_idle_s` yet: the moment to ask the agent, so that its
        reply still falls inside the stretch."""
        w = self.open
        return w if w is not None and w.settled_t is not None else None

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
