"""The soak protocol: baseline idle, then rounds of identical traffic each followed by an idle
window; more rounds while a memory layer is undecided.

Every phase boundary is an `Event` in the run file (baseline_start/end, round_start/end,
idle_start/end), so the analysis finds the windows offline. Bounds always hold: `--duration`
ends the current phase early (an idle window cut short still yields a level), `--max-requests`
stops sending. After the first `rounds`, `more_rounds` (the adaptive rule) is asked at the end
of each idle window which layers are still undecided; while any is and `max_rounds` is not
reached, another round runs (an `extra_round` event says why). Round hooks run at the end of
every idle window (the baseline is round 0). `server_died` stops sending at once. On Ctrl-C
the open window is closed with its end event before returning, so a partial run keeps every
level it measured.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.record import RunWriter
from vramdoctor.samples import SERVER_DIED, Event, now
from vramdoctor.soak.traffic.client import LoadClient, Outcome
from vramdoctor.soak.traffic.driver import Budget, RoundResult, run_round
from vramdoctor.soak.traffic.workload import PlannedRequest

# (layer, reason) pairs: what is still undecided after a round, for more rounds and the live view.
Undecided = list[tuple[str, str]]


@dataclass
class ProtocolConfig:
    rounds: int = 4
    concurrency: int = 4
    idle_s: float = 10.0
    baseline_s: float | None = None  # default: the idle window
    max_requests: int | None = None
    duration_s: float | None = None
    max_rounds: int | None = None  # adaptive rounds stop here (None: no extra rounds)
    abort_fraction: float = 0.0  # recorded per round


@dataclass
class ProtocolState:
    """What happened, for the live view and the final report."""

    phase: str = "starting"
    round: int = 0
    results: list[RoundResult] = field(default_factory=list)
    # "interrupt", "max-requests", "duration", "server-gone", "server-died", "max-rounds"
    stopped_by: str | None = None
    phase_ends_at: float | None = None
    undecided: Undecided = field(default_factory=list)  # after the last idle window
    server_died: dict[str, Any] | None = None  # the SERVER_DIED event's data


Progress = Callable[[ProtocolState], None]
MoreRounds = Callable[[ProtocolState], Undecided]
IdleEnd = Callable[[int], None]


class Protocol:
    def __init__(
        self,
        cfg: ProtocolConfig,
        *,
        client: LoadClient,
        plan: Sequence[PlannedRequest],
        writer: RunWriter,
        on_result: Callable[[PlannedRequest, Outcome], None] | None = None,
        progress: Progress | None = None,
        more_rounds: MoreRounds | None = None,
        on_idle_end: IdleEnd | None = None,
    ) -> None:
        self.cfg = cfg
        self.client = client
        self.plan = plan
        self.writer = writer
        self.on_result = on_result
        self.progress = progress
        self.more_rounds = more_rounds
        self.on_idle_end = on_idle_end
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

    def server_died(self, reason: str, **data: Any) -> None:
        """The server is gone (connection refused, its process exited): record it once, stop
        sending; the rest of the run carries no verdict. Thread-safe (the watcher calls it)."""
        with self._lock:
            if self.state.server_died is not None:
                return
            self.state.server_died = {"reason": reason, **data}
            self.state.stopped_by = "server-died"
        self._event(
            SERVER_DIED, reason=reason, round=self.state.round, phase=self.state.phase, **data
        )
        self.stop.set()

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

    def _idle_end(self, rnd: int) -> None:
        if self.on_idle_end is not None and not self.stop.is_set():
            self.on_idle_end(rnd)

    def _another_round(self, rnd: int) -> bool:
        """Before round `rnd` beyond the planned ones: is any layer still undecided?"""
        cfg = self.cfg
        if cfg.max_rounds is None or self.more_rounds is None:
            return False
        if rnd > cfg.max_rounds:
            if self.state.undecided:
                self.state.stopped_by = "max-rounds"
            return False
        if not self.state.undecided:
            return False
        self._event(
            "extra_round",
            round=rnd,
            undecided=[{"layer": layer, "reason": why} for layer, why in self.state.undecided],
        )
        return True

    def _ask_undecided(self, rnd: int) -> None:
        if self.more_rounds is None or self.cfg.max_rounds is None or rnd < self.cfg.rounds:
            return
        try:
            self.state.undecided = list(self.more_rounds(self.state))
        except Exception as exc:  # the analysis must not end the measurement
            self.state.undecided = []
            self._event(
                "source_error", source="adaptive-rounds", error=f"{type(exc).__name__}: {exc}"[:300]
            )

    def run(self) -> ProtocolState:
        """Run the protocol; KeyboardInterrupt propagates after the open window is closed."""
        cfg = self.cfg
        try:
            self.state.phase = "baseline"
            self._begin("baseline", 0)
            self._notify()
            self._wait(cfg.baseline_s if cfg.baseline_s is not None else cfg.idle_s)
            self._end()
            self._idle_end(0)
            rnd = 0
            while not self.stop.is_set():
                rnd += 1
                if rnd > cfg.rounds and not self._another_round(rnd):
                    break
                if self.budget.exhausted():
                    self.state.stopped_by = (
                        "duration" if self.budget.seconds_left() == 0 else "max-requests"
                    )
                    break
                self.state.phase, self.state.round = "load", rnd
                self._notify()
                with self._lock:
                    self.round_outcomes = Counter()
                self._begin("round", rnd)
                res = run_round(
                    self.client,
                    self.plan,
                    concurrency=cfg.concurrency,
                    budget=self.budget,
                    stop=self.stop,
                    on_result=self._count,
                )
                self.state.results.append(res)
                self._end(
                    sent=res.sent,
                    outcomes=dict(res.outcomes),
                    complete=res.sent == len(self.plan),
                    errors=res.errors,
                    latency_p50_s=_p50(res.latencies),
                    streamed=res.streamed,
                    aborted=res.outcomes["aborted"],
                    abort_fraction=cfg.abort_fraction,
                )
                if self.stop.is_set():
                    break
                self.state.phase = "idle"
                self._begin("idle", rnd)
                self._notify()
                self._wait(cfg.idle_s)
                self._end()
                if res.sent and res.outcomes["connection"] == res.sent:
                    self.server_died("connection refused", requests=res.sent)
                    break
                self._idle_end(rnd)
                self._ask_undecided(rnd)
            self.state.phase = "done"
            self._notify()
        except KeyboardInterrupt:
            self.stop.set()
            if self.state.stopped_by != "server-died":
                self.state.stopped_by = "interrupt"
            if self._open is not None and self._open[0] == "round":
                with self._lock:
                    counts = dict(self.round_outcomes)
                self._end(
                    sent=sum(counts.values()), outcomes=counts, complete=False, interrupted=True
                )
            self._end(interrupted=True)
            self._event("interrupted", round=self.state.round)
            raise
        finally:
            with contextlib.suppress(Exception):
                self._end()
        return self.state


def _p50(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[len(s) // 2]
