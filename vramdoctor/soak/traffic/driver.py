"""One round of traffic at a fixed concurrency, under bounds that always hold.

`Budget` is shared by all rounds: `--max-requests` caps the requests sent, `--duration` caps
the wall time; `stop` (set on Ctrl-C) stops sending at once. Workers are plain threads taking
the next request index from a shared counter, so at most `concurrency` are in flight.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vramdoctor.samples import REACHED_SERVER
from vramdoctor.soak.traffic.client import LoadClient, Outcome
from vramdoctor.soak.traffic.workload import PlannedRequest


class Budget:
    """Requests and time left for the whole soak; thread-safe."""

    def __init__(self, max_requests: int | None = None, deadline: float | None = None) -> None:
        self.max_requests = max_requests
        self.deadline = deadline  # time.monotonic() value
        self.sent = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Reserve one request; False when a bound is reached."""
        with self._lock:
            if self.max_requests is not None and self.sent >= self.max_requests:
                return False
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return False
            self.sent += 1
            return True

    def exhausted(self) -> bool:
        with self._lock:
            if self.max_requests is not None and self.sent >= self.max_requests:
                return True
            return self.deadline is not None and time.monotonic() >= self.deadline

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@dataclass
class RoundResult:
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # a few distinct messages
    streamed: int = 0  # requests sent as streams (aborted ones included)

    @property
    def ok(self) -> int:
        return self.outcomes["ok"]

    @property
    def reached(self) -> int:
        return sum(self.outcomes[k] for k in REACHED_SERVER)


def run_round(
    client: LoadClient,
    requests: Sequence[PlannedRequest],
    *,
    concurrency: int,
    budget: Budget,
    stop: threading.Event,
    on_result: Callable[[PlannedRequest, Outcome], None] | None = None,
) -> RoundResult:
    """Send the round's requests (in order, `concurrency` at a time) until done or bounded."""
    result = RoundResult()
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
        while not stop.is_set():
            with lock:
                i = next_index[0]
                if i >= len(requests):
                    return
                next_index[0] += 1
            if not budget.take():
                stop_round.set()
                return
            req = requests[i]
            # --duration is a hard bound: a request never waits past the deadline.
            left = budget.seconds_left()
            outcome = client.send(req, timeout=None if left is None else max(0.05, left))
            with lock:
                result.sent += 1
                result.streamed += int(req.stream)
                result.outcomes[outcome.kind] += 1
                result.latencies.append(outcome.latency_s)
                if (
                    outcome.detail
                    and len(result.errors) < 5
                    and outcome.detail not in result.errors
                ):
                    result.errors.append(outcome.detail)
            if on_result is not None:
                with contextlib.suppress(Exception):
                    on_result(req, outcome)
            if stop_round.is_set():
                return

    stop_round = threading.Event()
    threads = [
        threading.Thread(target=worker, name=f"soak-load-{k}", daemon=True)
        for k in range(max(1, concurrency))
    ]
    for t in threads:
        t.start()
    # Join with a timeout loop so Ctrl-C reaches the main thread at once.
    for t in threads:
        while t.is_alive():
            t.join(0.1)
    return result
