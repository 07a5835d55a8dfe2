"""The live view while a soak runs: phase, request errors, progress, the memory series now.

Fed by the collector (`on_sample`: GPU, host and KV records), the traffic (`on_result`), the
protocol (`on_state`) and the adaptive rounds (`on_analysis`); rich redraws it 4 times a
second on its own thread, so feeding it never rebuilds the display.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from vramdoctor.judge.results import SoakAnalysis
from vramdoctor.judge.series import kv_usage
from vramdoctor.samples import GpuSample, HostSample, MetricsSample
from vramdoctor.soak.report.sentences import undecided_text
from vramdoctor.soak.report.sparklines import sparkline
from vramdoctor.soak.report.text import known, value
from vramdoctor.units import format_duration

__all__ = ["LiveView", "SoakFeed"]


class LiveView:
    """Rich live display fed by the collector (samples) and the load (request outcomes)."""

    def __init__(self, console: Console, rounds: int, per_round: int, history: int = 120) -> None:
        self.console = console
        self.rounds = rounds
        self.per_round = per_round
        self._series: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=history))
        self._units: dict[str, str] = {}
        self._lock = threading.Lock()
        self.errors: dict[str, int] = defaultdict(int)
        self.phase = "starting"
        self.undecided: list[str] = []
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._t_rounds = self.progress.add_task("rounds", total=rounds)
        self._t_reqs = self.progress.add_task("requests (round)", total=per_round)
        # Live redraws from _render 4 times a second (and once at exit); feeding it data does
        # not rebuild the display for every sample.
        self._live = Live(
            get_renderable=self._render, console=console, refresh_per_second=4, transient=False
        )

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.__exit__(*exc)

    def _add(self, key: str, v: float | None, unit: str) -> None:
        if known(v):
            assert v is not None
            self._series[key].append(float(v))
            self._units[key] = unit

    def on_sample(self, source: str, record: Any) -> None:
        with self._lock:
            if isinstance(record, GpuSample):
                for g in record.gpus:
                    self._add(f"GPU {g.index} used", g.used_mib, "MiB")
                for p in record.processes:
                    self._add(f"GPU {p.gpu} pid {p.pid} {p.name or ''}".strip(), p.used_mib, "MiB")
            elif isinstance(record, HostSample):
                for hp in record.processes:
                    self._add(f"RSS pid {hp.pid} {hp.name or ''}".strip(), hp.rss_mib, "MiB")
            elif isinstance(record, MetricsSample):
                if record.kv:
                    for pool in record.kv:
                        self._add(f"KV pool {pool.pool}", pool.used_tokens, "tokens")
                elif (kv := kv_usage(record)) is not None:
                    self._add("KV usage", kv, "ratio")

    def on_result(self, _req: Any, outcome: Any) -> None:
        with self._lock:
            if not outcome.ok:
                self.errors[outcome.kind] += 1
        self.progress.advance(self._t_reqs)

    def on_state(self, state: Any) -> None:
        self.phase = state.phase
        if state.phase == "load" and len(state.results) < state.round:
            self.progress.update(
                self._t_reqs, completed=0, description=f"requests (round {state.round})"
            )
        self.progress.update(self._t_rounds, completed=len(state.results))
        if state.phase_ends_at and state.phase in ("idle", "baseline"):
            left = max(0.0, state.phase_ends_at - time.monotonic())
            self.phase = f"{state.phase} ({format_duration(left)} left)"

    def on_analysis(self, analysis: SoakAnalysis) -> None:
        """After each round (adaptive soak): which layers are still undecided and why."""
        self.undecided = [undecided_text(u) for u in analysis.undecided]

    def _render(self) -> Group:
        table = Table(box=None, show_header=True, pad_edge=False)
        table.add_column("series", overflow="fold")
        table.add_column("now", justify="right", no_wrap=True)
        table.add_column("history", no_wrap=True)
        with self._lock:
            items = [(k, list(v), self._units.get(k, "MiB")) for k, v in self._series.items() if v]
        gpus = [i for i in items if i[0].endswith(" used")]
        procs = sorted((i for i in items if " pid " in i[0]), key=lambda i: -i[1][-1])[:4]
        kv = [i for i in items if i[0].startswith("KV")]
        for key, vals, unit in gpus + procs + kv:
            table.add_row(
                key,
                value(vals[-1], unit),
                sparkline(vals, width=24, min_span=2.0 if unit == "MiB" else 0.0),
            )
        errs = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        parts: list[Any] = [Text(f"phase: {self.phase}   errors: {errs}"), self.progress, table]
        for u in self.undecided:
            parts.append(Text(f"undecided: {u}", style="magenta"))
        return Group(*parts)


class SoakFeed:
    """What a running soak shows: the live view on an interactive terminal, else one line per
    phase through `say`. Its methods are `SoakSession`'s callbacks (`before_run`, `progress`,
    `on_sample`); `rounds` and `per_round` size the progress bars and lines."""

    def __init__(
        self,
        console: Console,
        *,
        live: bool,
        rounds: int,
        per_round: int,
        say: Callable[[str], None],
    ) -> None:
        self.console = console
        self.live_wanted = live
        self.rounds = rounds
        self.per_round = per_round
        self.say = say
        self.view: LiveView | None = None
        self._seen: set[tuple[str, int]] = set()

    def before_run(self, protocol: Any) -> LiveView | None:
        """The live view around the protocol (None when not interactive): it also counts the
        protocol's request outcomes."""
        if not self.live_wanted:
            return None
        view = self.view = LiveView(self.console, self.rounds, len(protocol.plan))
        previous = protocol.on_result

        def on_result(req: Any, outcome: Any) -> None:
            if previous is not None:
                previous(req, outcome)
            view.on_result(req, outcome)

        protocol.on_result = on_result
        return view

    def on_sample(self, name: str, record: Any) -> None:
        if self.view is not None:
            self.view.on_sample(name, record)

    def progress(self, state: Any) -> None:
        """A protocol state: into the live view, or a line when the phase changed."""
        if self.view is not None:
            self.view.on_state(state)
            if state.undecided and state.round >= self.rounds:
                self.view.phase += "; undecided: " + ", ".join(
                    f"{layer} ({why})" for layer, why in state.undecided
                )
            return
        key = (state.phase, state.round)
        if key in self._seen:
            return
        self._seen.add(key)
        if state.phase == "load":
            extra = ""
            if state.round > self.rounds and state.undecided:
                extra = (
                    " (extra round: undecided "
                    + ", ".join(f"{layer}: {why}" for layer, why in state.undecided)
                    + ")"
                )
            self.say(
                f"round {state.round}/{max(self.rounds, state.round)}: sending "
                f"{self.per_round} requests{extra}"
            )
        elif state.phase == "idle" and state.results:
            r = state.results[-1]
            errs = r.sent - r.ok - r.outcomes["aborted"]
            aborted = (
                f", {r.outcomes['aborted']} aborted by the client" if r.outcomes["aborted"] else ""
            )
            self.say(f"round {state.round}: {r.sent} sent, {errs} failed{aborted}; idle")
        elif state.phase == "baseline":
            self.say("baseline: idle")
