"""A run file that rotates: `watch` records for weeks without filling the disk or the memory.

Each part is an ordinary run file (versioned header, one flushed JSON line a record, the same
encoding and redaction as `vramdoctor.record.RunWriter`), named
`watch-YYYYmmdd-HHMMSS-N.jsonl` in one directory, so any part re-reads with
`vramdoctor report PART`. The promises, each tested against a real filesystem:

- **Bounded disk, across restarts.** `keep` counts every part of this naming in the
  directory, those of earlier runs too (a watch restarted daily by systemd or Kubernetes
  does not grow it without bound): past `keep`, the oldest are deleted. A part another live
  watch is still writing (its header names a live pid other than ours and it has no end mark)
  is never deleted; a file that is not a regular file (a planted link) is never touched.
  Disk use: about `keep x max_bytes`.
- **Bounded memory on a full disk.** When a write fails (no space, a quota, a file-size
  limit, the directory removed), the part is closed where it broke and later records are
  dropped and counted (`dropped`), never kept in memory. Every `retry_s` the writer prunes
  old parts and opens a new part; the gap (records dropped, since when, why) is written into
  that part's header (`config.recording_gap`).
- **Never dies of a name.** A part is created with O_EXCL and O_NOFOLLOW; when the name is
  taken (another watch of the same second, a planted file or link) the next number is used.

`write` never raises for the filesystem's sake: `problems` holds one line per kind of
failure (and `on_problem` is called once per kind), so the watcher can say it and go on.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from vramdoctor.errors import InputError
from vramdoctor.record import drop_non_finite, dumps, to_plain
from vramdoctor.redact import redact_obj
from vramdoctor.samples import now

__all__ = ["MIN_PART_BYTES", "RotatingRunWriter", "part_names"]

MIN_PART_BYTES = 4096
_NAME_TRIES = 10_000
_HEAD_BYTES = 64 * 1024  # a part's header line is read within this many bytes
_TAIL_BYTES = 64 * 1024


def part_names(prefix: str) -> re.Pattern[str]:
    """The pattern of this writer's part names (`watch-20261201-180000-3.jsonl`)."""
    return re.compile(rf"^{re.escape(prefix)}-\d{{8}}-\d{{6}}-\d+\.jsonl$")


def _why(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on the device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
    if exc.errno == errno.EFBIG:
        return "the file-size limit was reached"
    return (exc.strerror or type(exc).__name__).lower()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _live_part_of_another(path: Path) -> bool:
    """True for a part another live process is still writing: its header's pid is alive and
    not ours, and its last line is no end mark."""
    try:
        with open(path, "rb") as fh:
            head = fh.readline(_HEAD_BYTES)
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - _TAIL_BYTES))
            tail = fh.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    except OSError:
        return False
    try:
        pid = json.loads(head).get("pid")
        ended = json.loads(tail).get("kind") == "end"
    except (ValueError, AttributeError):
        return False
    return isinstance(pid, int) and pid != os.getpid() and _alive(pid) and not ended


class RotatingRunWriter:
    """Writes records into rotating parts (see the module doc). Thread-safe.

    `header()` gives a fresh header dict for each part (its `config` gets `part` and, after
    a gap, `recording_gap`); `max_bytes` the size past which a part is closed (at least
    MIN_PART_BYTES); `keep` how many parts of this naming the directory keeps (>= 1);
    `retry_s` how long a failed disk is left alone before a new part is tried. InputError
    when the directory cannot be used at all (exists as a file, cannot be created).
    """

    def __init__(
        self,
        directory: str | Path,
        header: Callable[[], dict[str, Any]],
        *,
        max_bytes: int = 64 * 1024 * 1024,
        keep: int = 8,
        prefix: str = "watch",
        retry_s: float = 60.0,
        on_problem: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_bytes < MIN_PART_BYTES:
            raise InputError("--rotate-mib: a part must hold at least 4 KiB")
        if keep < 1:
            raise InputError("--keep: keep at least one run file")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise InputError(f"--out {self.directory}: exists and is not a directory")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--out {self.directory}: cannot be created ({_why(exc)})") from None
        self._header = header
        self.max_bytes = int(max_bytes)
        self.keep = int(keep)
        self.prefix = prefix
        self.retry_s = float(retry_s)
        self._on_problem = on_problem
        self._clock = clock
        self._pattern = part_names(prefix)
        self._lock = threading.Lock()
        self._fh: IO[str] | None = None
        self._path: Path | None = None
        self._bytes = 0
        self._part = 0
        self._retry_at = -float("inf")
        self._gap: dict[str, Any] | None = None
        self.parts: list[Path] = []  # every part this writer created, oldest first
        self.deleted: list[Path] = []  # parts pruned (any run's)
        self.dropped = 0  # records not written because the disk refused them
        self.written = 0
        self.write_error: str | None = None  # the failure in force now (None: writing)
        self.problems: list[str] = []
        self._said: set[str] = set()
        self.closed = False
        with self._lock:
            self._open_part()

    # -- the parts ----------------------------------------------------------------------
    @property
    def path(self) -> Path | None:
        """The part being written (None while the disk refuses)."""
        return self._path

    def _say(self, kind: str, message: str) -> None:
        if kind in self._said:
            return
        self._said.add(kind)
        self.problems.append(message)
        if self._on_problem is not None:
            with contextlib.suppress(Exception):
                self._on_problem(message)

    def _create(self) -> tuple[Path, IO[str]]:
        """A new part file, created exclusively, never through a link; FileExistsError-proof."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        flags |= getattr(os, "O_CLOEXEC", 0)
        for _ in range(_NAME_TRIES):
            self._part += 1
            path = self.directory / f"{self.prefix}-{stamp}-{self._part}.jsonl"
            try:
                fd = os.open(path, flags, 0o644)
            except FileExistsError:
                continue  # another watch's part, or something planted: the next number
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # a link planted at the name
                    continue
                raise
            return path, os.fdopen(fd, "w", encoding="utf-8")
        raise OSError(errno.EEXIST, f"{_NAME_TRIES} part names in a row are taken")

    def _open_part(self) -> bool:
        """Prune, then start a new part with its header; False (and stuck) when that fails."""
        self._prune(extra=1)
        try:
            path, fh = self._create()
        except OSError as exc:
            self._stuck(f"cannot start a new run file in {self.directory}: {_why(exc)}")
            return False
        header = self._header()
        config = header.setdefault("config", {})
        config["part"] = self._part
        if self._gap is not None:
            config["recording_gap"] = dict(self._gap)
        self._fh, self._path, self._bytes = fh, path, 0
        self.parts.append(path)
        if not self._put(header, counted=False):
            return False
        if self._gap is not None:
            self._say(
                "recovered",
                f"recording again in {path.name}: {self._gap['dropped_records']} records "
                "were dropped while the disk refused them",
            )
            self._gap = None
        self.write_error = None
        return True

    def _prune(self, extra: int = 0) -> None:
        """Delete the oldest parts of this naming beyond `keep` (counting `extra` new ones)."""
        try:
            names = [e for e in os.scandir(self.directory) if self._pattern.match(e.name)]
        except OSError:
            return
        entries = []
        for e in names:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if e.is_file(follow_symlinks=False):
                entries.append((st.st_mtime, e.name, Path(e.path)))
        entries.sort()
        current = self._path
        candidates = [p for _, _, p in entries if p != current]
        excess = len(candidates) + (1 if current is not None else 0) + extra - self.keep
        for p in candidates:
            if excess <= 0:
                break
            if _live_part_of_another(p):
                continue
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._say("prune", f"cannot delete the old run file {p.name}: {_why(exc)}")
                continue
            self.deleted.append(p)
            excess -= 1

    def _stuck(self, message: str) -> None:
        """The disk refused: close the part where it broke, drop records until `retry_s`."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
        self._fh, self._path = None, None
        self.write_error = message
        self._retry_at = self._clock() + self.retry_s
        if self._gap is None:
            self._gap = {"dropped_records": 0, "since_wall": time.time(), "why": message}
        self._say(
            "stuck",
            f"{message}; later records are dropped (counted, not kept in memory) and a new run "
            f"file is tried every {self.retry_s:g} s",
        )

    def _put(self, record: Any, *, counted: bool = True) -> bool:
        """Encode and append one record to the open part; False when the disk refused it
        (`counted`: a record of the run, not a header, is then counted as dropped)."""
        assert self._fh is not None
        plain = redact_obj(to_plain(record))
        try:
            line = dumps(plain)
        except ValueError:  # NaN/Inf: left out, as RunWriter does
            line = dumps(drop_non_finite(plain)[0])
        try:
            self._fh.write(line + "\n")
            self._fh.flush()
        except OSError as exc:
            name = self._path.name if self._path else "?"
            self._stuck(f"the run file {name} stopped taking records: {_why(exc)}")
            if counted:
                self._drop()
            return False
        self._bytes += len(line.encode("utf-8")) + 1
        self.written += 1
        return True

    def _drop(self) -> None:
        self.dropped += 1
        if self._gap is not None:
            self._gap["dropped_records"] += 1

    # -- the writer's API ---------------------------------------------------------------
    def write(self, record: Any) -> None:
        """Append one record (rotating first when the part is full). Never raises OSError:
        a record the disk refuses is dropped and counted. TypeError for a record that cannot
        be JSON at all (a programming error)."""
        with self._lock:
            if self.closed:
                return
            if self._fh is None:
                if self._clock() < self._retry_at or not self._open_part():
                    self._drop()
                    return
            elif self._bytes >= self.max_bytes:
                self._rotate()
                if self._fh is None:
                    self._drop()
                    return
            self._put(record)

    def _rotate(self) -> None:
        """Close the full part with an end mark naming the next; when no next part can be
        started, the writer is stuck (the full part is closed all the same: disk stays
        bounded by `keep` x `max_bytes`)."""
        old_fh = self._fh
        self._fh = self._path = None
        opened = self._open_part()
        if old_fh is not None:
            self._end(
                old_fh, "complete", rotated_to=self._path.name if opened and self._path else None
            )

    @staticmethod
    def _end(fh: IO[str], status: str, **summary: Any) -> None:
        mono, wall = now()
        end = {"kind": "end", "t": mono, "wall": wall, "status": status, **summary}
        with contextlib.suppress(OSError, ValueError):
            fh.write(dumps(redact_obj(end)) + "\n")
            fh.flush()
        with contextlib.suppress(OSError):
            fh.close()

    def close(self, status: str = "complete", **summary: Any) -> None:
        """Write the end mark (status complete, interrupted or failed) and close."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.dropped:
                summary.setdefault("records_dropped", self.dropped)
            if self._fh is not None:
                self._end(self._fh, status, **summary)
            self._fh = None
