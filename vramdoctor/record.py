"""The run file: one JSON object per line, a versioned header first, flushed per sample.

Every command that measures writes this format and `vramdoctor report RUN.jsonl` reads it,
so any run can be analysed again offline. Writing is append-and-flush per record: a crash or
Ctrl-C loses at most the record being written, and the reader accepts a torn last line.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ._version import __version__
from .errors import InputError
from .model import SAMPLE_TYPES, now
from .redact import redact_argv, redact_url

SCHEMA = "vramdoctor.run/1"
_SUPPORTED_MAJOR = SCHEMA.rsplit("/", 1)[1]


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


class RunWriter:
    """Appends records to a run file, one flushed line each; safe from several threads."""

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # FileExistsError here: a part of the directory is a file
            raise InputError(f"cannot create run file {self.path}: its directory {self.path.parent} "
                             f"cannot be created ({exc.strerror})") from None
        try:
            self._fh: IO[str] | None = open(self.path, "x", encoding="utf-8")  # noqa: SIM115
        except FileExistsError:
            raise InputError(f"run file {self.path} already exists; choose another --out") from None
        except OSError as exc:
            raise InputError(f"cannot create run file {self.path}: {exc.strerror}") from None
        self._lock = threading.Lock()
        self.count = 0
        self.write(header)

    def write(self, record: Any) -> None:
        line = dumps(record) + "\n"
        with self._lock:
            if self._fh is None:
                return
            self._fh.write(line)
            self._fh.flush()
            self.count += 1

    def close(self, status: str = "complete", **summary: Any) -> None:
        """Write the end mark (status: complete, interrupted, failed) and close."""
        if self._fh is None:
            return
        mono, wall = now()
        self.write({"kind": "end", "t": mono, "wall": wall, "status": status, **summary})
        with self._lock:
            self._fh.close()
            self._fh = None

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
    """A run file read back: header, typed records in order, and what was damaged."""

    path: Path
    header: dict[str, Any]
    records: list[Any] = field(default_factory=list)
    end: dict[str, Any] | None = None
    torn_tail: bool = False
    bad_lines: list[int] = field(default_factory=list)

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


def read_run(path: str | Path) -> Run:
    """Read a run file. A torn last line is dropped and noted; a foreign file is an InputError."""
    path = Path(path)
    try:
        fh = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except FileNotFoundError:
        raise InputError(f"no such run file: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a run file") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    with fh:
        lines = list(enumerate(fh, 1))
    if not lines:
        raise InputError(f"{path} is empty: not a vramdoctor run file")
    try:
        header = json.loads(lines[0][1])
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("kind") != "header":
        raise InputError(f"{path} is not a vramdoctor run file (no header line)")
    schema = str(header.get("schema", ""))
    if not schema.startswith("vramdoctor.run/"):
        raise InputError(f"{path} is not a vramdoctor run file (schema {schema!r})")
    if schema.rsplit("/", 1)[1] != _SUPPORTED_MAJOR:
        raise InputError(
            f"{path} has run-file schema {schema}; this vramdoctor reads {SCHEMA}: upgrade vramdoctor"
        )
    run = Run(path=path, header=header)
    last = len(lines)
    for number, line in lines[1:]:
        text = line.strip()
        if not text:
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            if number == last and not line.endswith("\n"):
                run.torn_tail = True
            else:
                run.bad_lines.append(number)
            continue
        if not isinstance(data, dict):
            run.bad_lines.append(number)
            continue
        kind = data.get("kind")
        if kind == "end":
            run.end = data
            continue
        cls = SAMPLE_TYPES.get(kind)
        try:
            run.records.append(cls.from_dict(data) if cls else data)
        except (KeyError, TypeError):
            run.bad_lines.append(number)
    return run
