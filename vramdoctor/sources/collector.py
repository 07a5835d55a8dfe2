"""The background sampler: several sources at one interval, every sample to the run file at once.

Life cycle (as nvitop's collector): `start()` spawns one thread, `stop()` ends it and joins.
Each tick calls every source's `.sample()`; a record is appended and flushed to the RunWriter
as it comes (nothing measured is lost on Ctrl-C), then handed to listeners (the live view).
A failing source is recorded once as an event per distinct message and retried next tick.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..model import Event, now
from ..record import RunWriter


class Source(Protocol):
    def sample(self) -> Any: ...


Listener = Callable[[str, Any], None]


class Collector:
    """Samples `sources` (name -> source) every `interval` seconds into `writer`."""

    def __init__(self, writer: RunWriter, sources: dict[str, Source], interval: float = 0.5,
                 extra: Callable[[], list[Any]] | None = None) -> None:
        self.writer = writer
        self.sources = dict(sources)
        self.interval = interval
        self.extra = extra
        self.samples = 0
        self.failures: dict[str, str] = {}
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def tick(self) -> None:
        """Sample every source once (also usable without the thread, e.g. one final sample)."""
        for name, source in self.sources.items():
            try:
                record = source.sample()
            except Exception as exc:
                msg = f"{type(exc).__name__}: {exc}"[:300]
                if self.failures.get(name) != msg:
                    self.failures[name] = msg
                    t, wall = now()
                    self.writer.write(Event(t=t, wall=wall, name="source_error",
                                            data={"source": name, "error": msg}))
                continue
            if name in self.failures:
                del self.failures[name]
            if record is None:
                continue
            self.writer.write(record)
            self.samples += 1
            for listener in self._listeners:
                with contextlib.suppress(Exception):
                    listener(name, record)
        if self.extra is not None:
            try:
                for record in self.extra():
                    self.writer.write(record)
            except Exception:
                pass

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.tick()
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (slow source): do not burst to catch up
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def start(self) -> Collector:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="vramdoctor-collector", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
