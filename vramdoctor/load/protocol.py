"""The soak protocol: baseline idle, then K identical rounds each followed by an idle window.

Every phase boundary is an `Event` in the run file (baseline_start/end, round_start/end,
idle_start/end), so the analysis finds the windows offline. Bounds always hold: `--duration`
ends the current phase early (an idle window cut short still yields a level), `--max-requests`
stops sending. On Ctrl-C the open window is closed with its end event before returning, so a
partial run keeps every level it measured.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..model import Event, now
from ..record import RunWriter
from .client import LoadClient, Outcome
from .runner import Budget, RoundResult, run_round
from .workload import PlannedRequest


@dataclass
class ProtocolConfig:
    rounds: int = 4
    concurrency: int = 4
    idle_s: float = 10.0
    baseline_s: float | None = None  # default: the idle window
    max_requests: int | None = None
    duration_s: float | None = None


@dataclass
class ProtocolState:
    """What happened, for the live view and the final report."""

    phase: str = "starting"
    round: int = 0
    results: list[RoundResult] = field(default_factory=list)
    stopped_by: str | None = None  # "interrupt", "max-requests", "duration", "server-gone"
    phase_ends_at: float | None = None


Progress = Callable[[ProtocolState], None]


class Protocol:
    def __init__(self, cfg: ProtocolConfig, *, client: LoadClient, plan: list[PlannedRequest],
                 writer: RunWriter, on_result: Callable[[PlannedRequest, Outcome], None] | None = None,
                 progress: Progress | None = None) -> None:
        self.cfg = cfg
        self.client = client
        self.plan = plan
        self.writer = writer
        self.on_result = on_result
        self.progress = progress
        self.stop = threading.Event()
        self.state = ProtocolState()
        deadline = time.monotonic() + cfg.duration_s if cfg.duration_s else None
        self.budget = Budget(cfg.max_requests, deadline)
        self._open: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self.round_outcomes: Counter[str] = Counter()  # the current round, as requests finish

    def _count(self, req: PlannedRequest, outcome: Outcome) -> None:
        with self._lock:
            self.round_outcomes[outcome.kind] += 1
        if self.on_result is not None:
            self.on_result(req, outcome)

    def _event(self, name: str, **data: Any) -> None:
        t, wall = now()
        self.writer.write(Event(t=t, wall=wall, name=name, data=data))

    def _begin(self, kind: str, rnd: int, **data: Any) -> None:
        self._event(f"{kind}_start", round=rnd, **data)
        self._open = (kind, rnd)

    def _end(self, **data: Any) -> None:
        if self._open is not None:
            kind, rnd = self._open
            self._open = None
            self._event(f"{kind}_end", round=rnd, **data)

    def _notify(self) -> None:
        if self.progress is not None:
            self.progress(self.state)

    def _wait(self, seconds: float) -> None:
        """Idle for `seconds`, cut short by stop or the --duration deadline."""
        left = self.budget.seconds_left()
        if left is not None:
            seconds = min(seconds, left)
        end = time.monotonic() + max(0.0, seconds)
        self.state.phase_ends_at = end
        while not self.stop.is_set():
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            self._notify()
            self.stop.wait(min(0.25, remaining))  # short waits: Ctrl-C lands promptly

    def run(self) -> ProtocolState:
        """Run the protocol; KeyboardInterrupt propagates after the open window is closed."""
        cfg = self.cfg
        try:
            self.state.phase = "baseline"
            self._begin("baseline", 0)
            self._notify()
            self._wait(cfg.baseline_s if cfg.baseline_s is not None else cfg.idle_s)
            self._end()
            for rnd in range(1, cfg.rounds + 1):
                if self.stop.is_set():
                    break
                if self.budget.exhausted():
                    self.state.stopped_by = (
                        "duration" if self.budget.seconds_left() == 0 else "max-requests")
                    break
                self.state.phase, self.state.round = "load", rnd
                self._notify()
                with self._lock:
                    self.round_outcomes = Counter()
                self._begin("round", rnd)
                res = run_round(self.client, self.plan, concurrency=cfg.concurrency,
                                budget=self.budget, stop=self.stop, on_result=self._count)
                self.state.results.append(res)
                self._end(sent=res.sent, outcomes=dict(res.outcomes),
                          complete=res.sent == len(self.plan), errors=res.errors,
                          latency_p50_s=_p50(res.latencies))
                if self.stop.is_set():
                    break
                self.state.phase = "idle"
                self._begin("idle", rnd)
                self._notify()
                self._wait(cfg.idle_s)
                self._end()
                if res.sent and res.outcomes["connection"] == res.sent:
                    self.state.stopped_by = "server-gone"
                    self._event("server_gone", round=rnd)
                    break
            self.state.phase = "done"
            self._notify()
        except KeyboardInterrupt:
            self.stop.set()
            self.state.stopped_by = "interrupt"
            if self._open is not None and self._open[0] == "round":
                with self._lock:
                    counts = dict(self.round_outcomes)
                self._end(sent=sum(counts.values()), outcomes=counts, complete=False,
                          interrupted=True)
            self._end(interrupted=True)
            self._event("interrupted", round=self.state.round)
            raise
        finally:
            self._end()
        return self.state


def _p50(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[len(s) // 2]
