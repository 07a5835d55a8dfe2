"""The background sampler: one thread per source, every sample to the run file at once.

Life cycle (as nvitop's collector): `start()` spawns one sampler thread per source (NVML, an
exporter, each /metrics, host memory, the `extra` records), `stop()` ends and joins them.
Each sampler calls its source's `.sample()` every `interval` seconds; a record is written and
flushed to the RunWriter as it comes (nothing measured is lost on Ctrl-C), then handed to
the listeners (the live view), one listener call at a time.

Faults (docs/threat-model.md):

- a slow source delays only its own thread (scrapes have a total deadline, see
  `vramdoctor.sources.http`); the others keep their interval;
- a failing source, or a record that cannot be written as it is (a NaN label, an overflowing
  value: those values are left out and the rest is written), is recorded ONCE per kind of
  error as a `SOURCE_ERROR` event, counted, and sampling goes on; `stop()` adds one
  `SOURCE_ERROR_COUNT` event per kind that repeated, with its count;
- an error that stops sampling (MemoryError, RecursionError, a bug in a sampler) is recorded
  as `COLLECTOR_FAILED`; `failed` says why, every sampler stops, and the run must end as
  `failed` (`RunWriter.close("failed", ...)`): its verdict cannot be trusted;
- a run file that can no longer be written (full disk) does not stop sampling: the writer
  keeps records in memory (`RunWriter.read_back`).

The run file stays small: a /metrics sample keeps its stable values and KV pools every time,
but its `raw` series (everything the page had, for later study) only on the first sample of
each source and then once every `RAW_EVERY_S`, at most `RAW_SERIES_LIMIT` series of at most
`RAW_KEY_LIMIT` characters; what was left out is said once as a SOURCE_ERROR.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from vramdoctor.record import RunWriter
from vramdoctor.redact import redact_text
from vramdoctor.samples import COLLECTOR_FAILED, SOURCE_ERROR, SOURCE_ERROR_COUNT, Event, now

__all__ = [
    "EXTRA",
    "FATAL",
    "RAW_EVERY_S",
    "RAW_KEY_LIMIT",
    "RAW_SERIES_LIMIT",
    "Collector",
    "Listener",
    "Source",
    "SourceErrorCount",
]


class Source(Protocol):
    def sample(self) -> Any: ...


Listener = Callable[[str, Any], None]
# Errors after which a sampler cannot be trusted to go on: the run fails.
FATAL = (MemoryError, RecursionError)
EXTRA = "extra"
RAW_EVERY_S = 60.0
RAW_SERIES_LIMIT = 2000
RAW_KEY_LIMIT = 400


@dataclass
class SourceErrorCount:
    """One kind of error of one source: the first message, how often, first and last time."""

    source: str
    error: str
    count: int
    first_t: float
    last_t: float


def _kind_of(message: str) -> str:
    """Messages that differ only in numbers (bytes read, seconds) are one kind of error."""
    return re.sub(r"\d+(\.\d+)?", "#", message)


class Collector:
    """Samples `sources` (name -> source) every `interval` seconds into `writer`.

    `extra`, when given, is called on its own thread at the same interval and returns records
    to write (e.g. occasional host-wide memory). `on_failure(reason)` is called once if
    sampling stops for good (the soak runner stops its traffic then).
    """

    def __init__(
        self,
        writer: RunWriter,
        sources: dict[str, Source],
        interval: float = 0.5,
        extra: Callable[[], list[Any]] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.writer = writer
        self.sources = dict(sources)
        self.interval = interval
        self.extra = extra
        self.on_failure = on_failure
        self.samples = 0
        # source name -> the message of its latest failure (cleared when it answers again)
        self.failures: dict[str, str] = {}
        # Why sampling stopped for good (COLLECTOR_FAILED), None while it is healthy.
        self.failed: str | None = None
        self._errors: dict[tuple[str, str], SourceErrorCount] = {}
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._listen_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._raw_at: dict[str, float] = {}

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    @property
    def source_errors(self) -> list[SourceErrorCount]:
        """Every kind of source error seen so far, in order of first appearance."""
        with self._lock:
            return list(self._errors.values())

    # --- one sample ------------------------------------------------------------------------

    def _error(self, name: str, message: str, *, failing: bool = True) -> None:
        message = redact_text(message)[:300]
        t, _wall = now()
        key = (name, _kind_of(message))
        with self._lock:
            if failing:
                self.failures[name] = message
            seen = self._errors.get(key)
            if seen is not None:
                seen.count += 1
                seen.last_t = t
                return
            self._errors[key] = SourceErrorCount(name, message, 1, t, t)
        self._write_event(SOURCE_ERROR, {"source": name, "error": message})

    def _write_event(self, name: str, data: dict[str, Any]) -> None:
        t, wall = now()
        with contextlib.suppress(ValueError, TypeError):
            self.writer.write(Event(t=t, wall=wall, name=name, data=data))

    def _bound_raw(self, name: str, record: Any) -> None:
        """Keep a metrics sample's raw series only now and then, and bounded (see module doc)."""
        raw = getattr(record, "raw", None)
        if not isinstance(raw, dict) or not raw:
            return
        t = getattr(record, "t", 0.0)
        last = self._raw_at.get(name)
        if last is not None and t - last < RAW_EVERY_S:
            record.raw = {}
            return
        self._raw_at[name] = t
        kept = {k: v for k, v in raw.items() if len(k) <= RAW_KEY_LIMIT}
        if len(kept) > RAW_SERIES_LIMIT:
            kept = dict(list(kept.items())[:RAW_SERIES_LIMIT])
        if len(kept) < len(raw):
            self._error(
                name,
                f"raw series limited to {len(kept)} of {len(raw)} (at most "
                f"{RAW_SERIES_LIMIT} series of at most {RAW_KEY_LIMIT} characters are kept)",
                failing=False,
            )
        record.raw = kept

    def _write(self, name: str, record: Any) -> None:
        self._bound_raw(name, record)
        try:
            dropped = self.writer.write(record)
        except (ValueError, TypeError) as exc:  # cannot be a JSON line at all: skip it
            self._error(
                name,
                f"a sample could not be recorded and was skipped ({type(exc).__name__}: {exc})",
            )
            return
        if dropped:
            fields = ", ".join(sorted({re.sub(r"\[\d+\]", "[]", p) for p in dropped})[:5])
            self._error(
                name,
                f"non-finite value (NaN or overflow) left out of the sample: {fields}",
                failing=False,
            )
        with self._lock:
            self.samples += 1
        if self._listeners:
            with self._listen_lock:
                for listener in self._listeners:
                    try:
                        listener(name, record)
                    except Exception:  # a display problem must not stop sampling
                        continue

    def sample_source(self, name: str, source: Source) -> None:
        """Sample one source once: write its record, or record its error. Raises only FATAL."""
        try:
            record = source.sample()
        except FATAL:
            raise
        except Exception as exc:
            self._error(name, f"{type(exc).__name__}: {exc}" if not _is_ours(exc) else str(exc))
            return
        with self._lock:
            self.failures.pop(name, None)
        if record is not None:
            self._write(name, record)

    def sample_extra(self) -> None:
        if self.extra is None:
            return
        try:
            records = self.extra()
        except FATAL:
            raise
        except Exception as exc:
            self._error(EXTRA, f"{type(exc).__name__}: {exc}")
            return
        for record in records:
            self._write(EXTRA, record)

    def _steps(self) -> list[tuple[str, Callable[[], None]]]:
        steps: list[tuple[str, Callable[[], None]]] = [
            (name, (lambda n=name, s=source: self.sample_source(n, s)))  # type: ignore[misc]
            for name, source in self.sources.items()
        ]
        if self.extra is not None:
            steps.append((EXTRA, self.sample_extra))
        return steps

    def _guarded(self, name: str, step: Callable[[], None]) -> None:
        try:
            step()
        except BaseException as exc:  # FATAL and bugs: the run fails, said once
            self._fail(name, exc)

    def tick(self) -> None:
        """Sample every source once, all at the same time, and return when all are done (the
        first and the last point of a run): a slow source delays the others here neither."""
        if self.failed:
            return
        threads = [
            threading.Thread(
                target=self._guarded, args=(name, step), daemon=True, name=f"vramdoctor-tick-{name}"
            )
            for name, step in self._steps()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    # --- threads ---------------------------------------------------------------------------

    def _fail(self, name: str, exc: BaseException) -> None:
        reason = redact_text(f"sampler {name!r} stopped: {type(exc).__name__}: {exc}")[:300]
        with self._lock:
            if self.failed is not None:
                return
            self.failed = reason
        self._stop.set()
        self._write_event(COLLECTOR_FAILED, {"source": name, "error": reason})
        if self.on_failure is not None:
            with contextlib.suppress(Exception):
                self.on_failure(reason)

    def _loop(self, name: str, step: Callable[[], None]) -> None:
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                step()
                next_at += self.interval
                delay = next_at - time.monotonic()
                if delay < 0:  # fell behind (a slow scrape): do not burst to catch up
                    next_at = time.monotonic()
                    delay = 0
                self._stop.wait(delay)
        except BaseException as exc:  # whatever stops a sampler fails the run
            self._fail(name, exc)

    def start(self) -> Collector:
        if self._threads:
            return self
        self._stop.clear()
        for name, step in self._steps():
            thread = threading.Thread(
                target=self._loop, args=(name, step), name=f"vramdoctor-sampler-{name}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as exc:  # cannot start a thread (limits): sampling cannot run
                self._fail(name, exc)
                break
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every sampler; wait up to `timeout` s in all (a scrape in flight has its own
        deadline), then record how often each repeated error happened."""
        self._stop.set()
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        self._threads = []
        for err in self.source_errors:
            if err.count > 1:
                self._write_event(
                    SOURCE_ERROR_COUNT,
                    {
                        "source": err.source,
                        "error": err.error,
                        "count": err.count,
                        "first_t": err.first_t,
                        "last_t": err.last_t,
                    },
                )

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _is_ours(exc: Exception) -> bool:
    """Our own errors carry a full sentence already (no class name needed)."""
    from vramdoctor.errors import VramdoctorError

    return isinstance(exc, VramdoctorError)
