"""The run file: one JSON object per line, a versioned header first, flushed per sample.

Every command that measures writes this format and `vramdoctor report RUN.jsonl` reads it,
so any run can be analysed again offline. Writing is append-and-flush per record: a crash or
Ctrl-C loses at most the record being written, and the reader accepts a torn last line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import signal
import socket
import sys
import threading
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from vramdoctor._version import __version__
from vramdoctor.errors import InputError
from vramdoctor.redact import redact_argv, redact_obj, redact_url
from vramdoctor.samples import SAMPLE_TYPES, now

__all__ = [
    "HEADER_LIMIT_BYTES",
    "LINE_LIMIT_BYTES",
    "OUT_OF_ORDER_NOTE_S",
    "SCHEMA",
    "BadRecord",
    "Run",
    "RunWriter",
    "drop_non_finite",
    "dumps",
    "make_header",
    "read_run",
    "to_plain",
    "upgrade_v1",
]

SCHEMA = "vramdoctor.run/2"
_SUPPORTED_MAJOR = SCHEMA.rsplit("/", 1)[1]
# Older run files this reader still reads; each record of one is upgraded on the way in.
_OLDER_MAJORS = frozenset({"1"})
# Schema 1 -> 2: `reserved_mib` meant two things. In a GPU's memory it is NVML's driver
# reserve; in ab-test records it is PyTorch's reserved memory (torch.cuda.memory_reserved).
_V1_GPU_RENAMES = {"reserved_mib": "driver_reserved_mib"}
_V1_ABTEST_RENAMES = {
    "reserved_mib": "torch_reserved_mib",
    "peak_reserved_mib": "torch_peak_reserved_mib",
    "allocated_mib": "torch_allocated_mib",
}


def upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A record of a schema-1 run file with schema 2's field names (a new dict; others kept)."""
    kind = str(data.get("kind", ""))
    if kind == "gpu" and isinstance(data.get("gpus"), list):
        gpus = [
            {_V1_GPU_RENAMES.get(k, k): v for k, v in g.items()} if isinstance(g, dict) else g
            for g in data["gpus"]
        ]
        return {**data, "gpus": gpus}
    if kind.startswith("abtest."):
        return {_V1_ABTEST_RENAMES.get(k, k): v for k, v in data.items()}
    return data


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps(record: Any) -> str:
    return json.dumps(record, default=_json_default, separators=(",", ":"), allow_nan=False)


def to_plain(record: Any) -> Any:
    """A record as a dict/list tree (dataclasses converted; other values left to `dumps`)."""
    return record.to_dict() if hasattr(record, "to_dict") else record


def drop_non_finite(obj: Any, path: str = "") -> tuple[Any, list[str]]:
    """(copy without NaN/Inf, the paths dropped): a dict entry with a non-finite value is
    left out, a non-finite list item or bare value becomes None. JSON cannot carry them."""
    dropped: list[str] = []

    def walk(value: Any, where: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            dropped.append(where or "value")
            return None
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if isinstance(v, float) and not math.isfinite(v):
                    dropped.append(f"{where}.{k}" if where else str(k))
                    continue
                out[k] = walk(v, f"{where}.{k}" if where else str(k))
            return out
        if isinstance(value, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    return walk(obj, path), dropped


def make_header(
    command: str,
    *,
    argv: Iterable[str] | None = None,
    target: str | None = None,
    gpus: list[dict[str, Any]] | None = None,
    config: dict[str, Any] | None = None,
    secrets: Iterable[str] = (),
) -> dict[str, Any]:
    """The first line of a run file: what ran, where, against what (credentials removed)."""
    mono, wall = now()
    return {
        "kind": "header",
        "schema": SCHEMA,
        "tool": "vramdoctor",
        "tool_version": __version__,
        "command": command,
        "argv": redact_argv(list(sys.argv if argv is None else argv), secrets),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pid": os.getpid(),
        "t": mono,
        "wall": wall,
        "target": redact_url(target) if target else None,
        "gpus": gpus or [],
        "config": config or {},
    }


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back (main thread) for a few statements: a run file's creation
    and its registration with the code that reports an interrupt are then one step, and a heavy
    import (numpy's C code turns an interrupt into a printed traceback and an ImportError) ends
    before the interrupt is raised. A signal
    that arrives meanwhile is recorded and raised again, to the handler in force before, when the
    block ends. (Blocking the signal would not do: the kernel hands a process-wide signal to
    any thread that does not block it, and Python then interrupts the main thread anyway.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: pending.append(signum)) for sig in held
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])


class RunWriter:
    """Appends records to a run file, one flushed line each; safe from several threads.

    Every record goes through the one redaction pass (`vramdoctor.redact.redact_obj`) before
    it is written. `write` raises `ValueError` for a record it cannot encode; a record with
    NaN/Inf values is written without them and `write` returns the paths it dropped (the
    caller says so once, see `vramdoctor.sources.collector`). When the file cannot be written
    any more (a full disk, a file-size limit), the writer stops touching it, keeps every later
    record in memory and sets `write_error`; `read_back()` then gives the whole run anyway.
    """

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # FileExistsError here: a part of the directory is a file
            raise InputError(
                f"cannot create run file {self.path}: its directory {self.path.parent} "
                f"cannot be created ({exc.strerror})"
            ) from None
        try:
            self._fh: IO[str] | None = open(self.path, "x", encoding="utf-8")  # noqa: SIM115
        except FileExistsError:
            raise InputError(f"run file {self.path} already exists; choose another --out") from None
        except OSError as exc:
            raise InputError(f"cannot create run file {self.path}: {exc.strerror}") from None
        self._lock = threading.Lock()
        self.count = 0
        self.closed = False
        # Set when the file could not be written: "No space left on device after 1234 records".
        self.write_error: str | None = None
        self.written_records = 0
        self._unwritten: list[dict[str, Any]] = []
        self._end: dict[str, Any] | None = None
        self.write(header)

    def encode(self, record: Any) -> tuple[str, list[str]]:
        """(the JSON line, paths of non-finite values dropped). Raises ValueError/TypeError
        for a record that cannot be a JSON line at all."""
        plain = redact_obj(to_plain(record))
        try:
            return dumps(plain), []
        except ValueError:  # NaN/Inf somewhere: leave them out, say which
            plain, dropped = drop_non_finite(plain)
            return dumps(plain), dropped

    def write(self, record: Any) -> list[str]:
        line, dropped = self.encode(record)
        with self._lock:
            if self.closed:
                return dropped
            self.count += 1
            if self._fh is None:  # the file failed earlier: keep it in memory
                self._unwritten.append(json.loads(line))
                return dropped
            try:
                self._fh.write(line + "\n")
                self._fh.flush()
                self.written_records += 1
            except OSError as exc:
                self.write_error = (
                    f"{exc.strerror or exc} after {self.written_records} records were written"
                )
                self._unwritten.append(json.loads(line))
                with contextlib.suppress(OSError):
                    self._fh.close()
                self._fh = None
        return dropped

    def close(self, status: str = "complete", **summary: Any) -> None:
        """Write the end mark (status: complete, interrupted, failed) and close."""
        if self.closed:
            return
        mono, wall = now()
        end = {"kind": "end", "t": mono, "wall": wall, "status": status, **summary}
        if self.write_error:
            end["run_file_incomplete"] = self.write_error
        self.write(end)
        with self._lock:
            self.closed = True
            self._end = end
            if self._fh is not None:
                with contextlib.suppress(OSError):
                    self._fh.close()
                self._fh = None

    def read_back(self) -> Run:
        """The run as written: read from the file, plus what only memory holds when the file
        failed (then `Run.problems` says the file is incomplete)."""
        if self.write_error is None:
            return read_run(self.path)
        try:
            run = read_run(self.path)
        except InputError:  # not even the header reached the disk
            run = Run(path=self.path, header={})
        with self._lock:
            pending = list(self._unwritten)
        if not run.header and pending and pending[0].get("kind") == "header":
            run.header = pending.pop(0)
        for data in pending:
            if data.get("kind") == "end":
                run.end = data
                continue
            record = _typed(data)
            if record is not None:
                run.records.append(record)
        run.records.sort(key=_time_of)
        run.problems.append(
            f"the run file {self.path} is incomplete ({self.write_error}); "
            f"the analysis used all {len(pending)} later records from memory"
        )
        return run

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is KeyboardInterrupt:
            self.close("interrupted")
        elif exc_type is not None:
            self.close("failed", error=type(exc).__name__)
        else:
            self.close()


@dataclass
class Run:
    """A run file read back: header, typed records in time order, and what was damaged."""

    path: Path
    header: dict[str, Any]
    records: list[Any] = field(default_factory=list)
    end: dict[str, Any] | None = None
    torn_tail: bool = False
    bad_lines: list[int] = field(default_factory=list)
    # One sentence per kind of damage (the first bad line and why, lines sorted back into
    # time order, a run file the writer could not finish): reports print them as notes.
    problems: list[str] = field(default_factory=list)

    @property
    def command(self) -> str:
        return str(self.header.get("command", "?"))

    @property
    def status(self) -> str:
        """complete, interrupted, failed, or 'truncated' when the writer never finished."""
        return str(self.end.get("status")) if self.end else "truncated"

    def of(self, cls: type) -> list[Any]:
        return [r for r in self.records if isinstance(r, cls)]

    def raw(self, kind: str) -> list[dict[str, Any]]:
        """Records of a kind this module has no type for (e.g. 'result', 'request')."""
        return [r for r in self.records if isinstance(r, dict) and r.get("kind") == kind]

    def dropped(self, limit: int = 8) -> list[str]:
        """What the sampler left out and why, one sentence per kind of source error (from the
        SOURCE_ERROR and SOURCE_ERROR_COUNT events), with how often it happened."""
        from vramdoctor.samples import SOURCE_ERROR, SOURCE_ERROR_COUNT, Event

        counts: dict[tuple[str, str], int] = {}
        for rec in self.records:
            if not isinstance(rec, Event) or not isinstance(rec.data, dict):
                continue
            if rec.name in (SOURCE_ERROR, SOURCE_ERROR_COUNT):
                key = (str(rec.data.get("source", "?")), str(rec.data.get("error", "?")))
                count = rec.data.get("count")
                if rec.name == SOURCE_ERROR_COUNT and isinstance(count, int):
                    counts[key] = max(counts.get(key, 1), count)
                else:
                    counts.setdefault(key, 1)
        out = [
            f"{source}: {error}" + (f" ({count} times)" if count > 1 else "")
            for (source, error), count in counts.items()
        ]
        if len(out) > limit:
            out = [
                *out[:limit],
                f"and {len(out) - limit} more kinds of source errors (see the run file)",
            ]
        return out


# Reading is bounded: the header must be in the first HEADER_LIMIT_BYTES (so /dev/zero or a
# binary file is refused at once), and a line longer than LINE_LIMIT_BYTES is damage.
HEADER_LIMIT_BYTES = 64 * 1024
LINE_LIMIT_BYTES = 64 * 1024 * 1024
# A record this many seconds older than one before it is reported as disorder (then sorted);
# parallel samplers write a record up to one scrape deadline (5 s) after its time.
OUT_OF_ORDER_NOTE_S = 10.0
# Numbers beyond this are not measurements (MiB, seconds, tokens): the record is damaged.
_MAX_ABS = 1e15


class BadRecord(ValueError):
    """A line that is JSON but not a valid record: the message says which field and why."""


def _json_line(text: str) -> Any:
    """JSON with NaN/Infinity (Python's json accepts them) and overflowing numbers as None."""

    def number(token: str) -> float | None:
        value = float(token)
        return value if math.isfinite(value) else None

    return json.loads(text, parse_constant=lambda _c: None, parse_float=number)


def _type_name(value: Any) -> str:
    return (
        "null"
        if value is None
        else {str: "a string", bool: "a boolean", list: "a list", dict: "an object"}.get(
            type(value), type(value).__name__
        )
    )


def _check(value: Any, hint: Any, where: str) -> Any:
    """`value` checked (and lightly coerced: int -> float, whole float -> int) against a type
    hint of the model; raises BadRecord naming `where`."""
    if hint is Any or hint is object:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check(value, arg, where)
            except BadRecord as exc:
                errors.append(exc)
        raise errors[0] if errors else BadRecord(f"{where} is {_type_name(value)}")
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRecord(f"{where} is {_type_name(value)}, not a number")
        if abs(value) > _MAX_ABS:
            raise BadRecord(f"{where} is {_shown(value)}, beyond any measurement")
        return float(value)
    if hint is int:
        if isinstance(value, float) and value.is_integer() and abs(value) <= _MAX_ABS:
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRecord(f"{where} is {_type_name(value)}, not a whole number")
        if abs(value) > 2**63:
            raise BadRecord(f"{where} is too large")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise BadRecord(f"{where} is {_type_name(value)}, not a string")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise BadRecord(f"{where} is {_type_name(value)}, not true/false")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise BadRecord(f"{where} is {_type_name(value)}, not a list")
        (item,) = typing.get_args(hint) or (Any,)
        return [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise BadRecord(f"{where} is {_type_name(value)}, not an object")
        _key, item = typing.get_args(hint) or (str, Any)
        if item is float:  # series of numbers: a null (was NaN) or junk entry is left out
            return {
                k: float(v)
                for k, v in value.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= _MAX_ABS
            }
        return {k: _check(v, item, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, dict):
            raise BadRecord(f"{where} is {_type_name(value)}, not an object")
        return _check_fields(hint, value, where)
    return value


def _check_fields(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    hints = _hints(cls)
    out = dict(data)
    for name, hint in hints.items():
        if name in data and name != "kind":
            out[name] = _check(data[name], hint, f"{where}.{name}" if where else name)
    return out


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def _shown(value: int | float) -> str:
    """A number for a message: a 401-digit integer cannot be formatted as a float."""
    if isinstance(value, int) and abs(value) > 10**30:
        return f"a number of {len(str(abs(value)))} digits"
    return f"{value:.3g}"


def _typed(data: dict[str, Any]) -> Any:
    """A record dict -> its model type (validated), or the dict for kinds without a type.
    Raises BadRecord for a record whose fields have the wrong type."""
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise BadRecord('it has no "kind"')
    for key in ("t", "wall"):
        if key in data:
            data[key] = _check(data[key], float, key)
            if not math.isfinite(data[key]):  # NaN (or inf) as a time: no moment at all
                raise BadRecord(f"{key} is {data[key]}, not a time")
    cls = SAMPLE_TYPES.get(kind)
    if cls is None:
        return data
    checked = _check_fields(cls, data, "")
    try:
        return cls.from_dict(checked)
    except KeyError as exc:
        raise BadRecord(f"it lacks the field {exc.args[0]!r} of a {kind} record") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise BadRecord(f"its {kind} record does not fit ({type(exc).__name__})") from None


def _time_of(record: Any) -> float:
    t = record.get("t") if isinstance(record, dict) else getattr(record, "t", None)
    return float(t) if isinstance(t, (int, float)) else -math.inf


def _open_binary(path: Path) -> IO[bytes]:
    try:
        if path.is_dir():
            raise InputError(f"{path} is a directory, not a run file")
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"no such run file: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a run file") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None


def read_run(path: str | Path) -> Run:
    """Read a run file, streaming and bounded.

    The header must be a JSON line in the first 64 KiB (anything else, /dev/zero included, is
    an `InputError` at once). Later lines: a torn last line is dropped and noted; a line that
    is not JSON, or a record with a wrong-typed field (checked against `vramdoctor.samples`), is
    skipped, and `Run.problems` names the first one and why; NaN/Infinity become null (an
    entry of a number series is left out); records are put back in time order (`t`).
    Raises InputError for a missing, unreadable or foreign file.
    """
    path = Path(path)
    with _open_binary(path) as fh:
        header, legacy = _read_header(fh, path)
        run = Run(path=path, header=header)
        first_bad, out_of_order, disordered = _read_records(fh, run, legacy)
    _note_damage(run, path, first_bad, out_of_order, disordered)
    return run


def _read_header(fh: IO[bytes], path: Path) -> tuple[dict[str, Any], bool]:
    """The run file's header (its first line) and whether the file is of an older schema
    whose records are upgraded on the way in. Raises InputError for anything else."""
    try:
        first = fh.readline(HEADER_LIMIT_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    if not first:
        raise InputError(f"{path} is empty: not a vramdoctor run file")
    if not first.endswith(b"\n") and len(first) >= HEADER_LIMIT_BYTES:
        raise InputError(
            f"{path} is not a vramdoctor run file (no header line in its first "
            f"{HEADER_LIMIT_BYTES // 1024} KiB)"
        )
    try:
        header = _json_line(first.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        header = None
    if not isinstance(header, dict) or header.get("kind") != "header":
        raise InputError(f"{path} is not a vramdoctor run file (no header line)")
    schema = str(header.get("schema", ""))
    if not schema.startswith("vramdoctor.run/"):
        raise InputError(f"{path} is not a vramdoctor run file (schema {schema!r})")
    major = schema.rsplit("/", 1)[1]
    legacy = major in _OLDER_MAJORS
    if major != _SUPPORTED_MAJOR and not legacy:
        raise InputError(
            f"{path} has run-file schema {schema}; this vramdoctor reads {SCHEMA}: upgrade vramdoctor"
        )
    return header, legacy


def _read_records(fh: IO[bytes], run: Run, legacy: bool) -> tuple[str | None, int, bool]:
    """Reads every line after the header into `run` (records, end, torn tail, bad lines, a
    read error's problem); returns the first damaged line's description (None: none), how
    many records were out of time order beyond OUT_OF_ORDER_NOTE_S, and whether any record
    came before an earlier one at all."""
    first_bad: str | None = None
    number = 1
    previous_t = -math.inf
    out_of_order = 0
    disordered = False
    while True:
        try:
            raw = fh.readline(LINE_LIMIT_BYTES)
        except OSError as exc:
            run.problems.append(f"reading stopped at line {number + 1}: {exc.strerror}")
            break
        if not raw:
            break
        number += 1
        complete = raw.endswith(b"\n")
        if not complete and len(raw) >= LINE_LIMIT_BYTES:
            while raw and not raw.endswith(b"\n"):  # skip the rest of an endless line
                raw = fh.readline(LINE_LIMIT_BYTES)
            run.bad_lines.append(number)
            first_bad = first_bad or f"line {number} is longer than {LINE_LIMIT_BYTES // 2**20} MiB"
            continue
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            continue
        record, bad = _line_record(run, text, number, complete, legacy)
        if bad is not None:
            run.bad_lines.append(number)
            first_bad = first_bad or bad
            continue
        if record is _NO_RECORD:
            continue
        t = _time_of(record)
        if t < previous_t:
            disordered = True
            # Samplers run in parallel and a slow scrape is written after a fast one that
            # started later: small steps back are normal; only real disorder is noted.
            if t < previous_t - OUT_OF_ORDER_NOTE_S:
                out_of_order += 1
        previous_t = max(previous_t, t)
        run.records.append(record)
    return first_bad, out_of_order, disordered


# What `_line_record` gives for a line that holds no record (a torn last line, the end record).
_NO_RECORD: Any = object()


def _line_record(
    run: Run, text: str, number: int, complete: bool, legacy: bool
) -> tuple[Any, str | None]:
    """A line's typed record and None; or `_NO_RECORD` and why the line is damaged; or
    `_NO_RECORD` and None for a torn last line or the end record (noted in `run`)."""
    try:
        data = _json_line(text)
    except (ValueError, RecursionError):
        if not complete:  # only the last line can lack its newline: torn by a kill
            run.torn_tail = True
            return _NO_RECORD, None
        return _NO_RECORD, f"line {number} is not JSON"
    if not isinstance(data, dict):
        return _NO_RECORD, f"line {number} is {_type_name(data)}, not a record"
    if data.get("kind") == "end":
        run.end = data
        return _NO_RECORD, None
    if legacy:
        data = upgrade_v1(data)
    try:
        return _typed(data), None
    except BadRecord as exc:
        return _NO_RECORD, f"line {number}: {exc}"


def _note_damage(
    run: Run, path: Path, first_bad: str | None, out_of_order: int, disordered: bool
) -> None:
    """Adds to `run.problems` the first damaged line (with how many more) and the records
    out of time order, and sorts the records back into time order; returns nothing."""
    if first_bad:
        more = len(run.bad_lines) - 1
        run.problems.append(
            f"{path}: {first_bad}; skipped"
            + (f" (and {more} more damaged line{'s' if more != 1 else ''})" if more > 0 else "")
        )
    if disordered:
        run.records.sort(key=_time_of)  # stable: records of one instant keep their order
    if out_of_order:
        run.problems.append(
            f"{path}: {out_of_order} record{'s were' if out_of_order != 1 else ' was'} "
            "out of time order; sorted by time before the analysis"
        )
