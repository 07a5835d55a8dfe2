"""A run file that rotates: `watch` records for weeks without filling the disk.

Each part is an ordinary run file (`record.RunWriter`: versioned header, one flushed JSON line a
record), named `watch-YYYYmmdd-HHMMSS-N.jsonl` in one directory. When a part passes
`max_bytes` it is closed (status "complete", `rotated_to` naming the next part) and a new one
starts with the same header; only the newest `keep` parts are kept. So the disk use is bounded
by about `keep x max_bytes`, and any part re-reads with `vramdoctor report PART`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vramdoctor.errors import InputError
from vramdoctor.record import RunWriter

__all__ = ["RotatingRunWriter"]


class RotatingRunWriter:
    """Writes records into rotating parts. Thread-safe per write (RunWriter's lock)."""

    def __init__(
        self,
        directory: str | Path,
        header: Callable[[], dict[str, Any]],
        *,
        max_bytes: int = 64 * 1024 * 1024,
        keep: int = 8,
        prefix: str = "watch",
    ) -> None:
        if max_bytes < 4096:
            raise InputError("--rotate-mib: a part must hold at least 4 KiB")
        if keep < 1:
            raise InputError("--keep: keep at least one run file")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise InputError(f"--out {self.directory}: exists and is not a directory")
        self._header = header
        self.max_bytes = max_bytes
        self.keep = keep
        self.prefix = prefix
        self._stamp = time.strftime("%Y%m%d-%H%M%S")
        self._part = 0
        self._bytes = 0
        self.parts: list[Path] = []
        self._writer = self._open()

    def _open(self) -> RunWriter:
        self._part += 1
        path = self.directory / f"{self.prefix}-{self._stamp}-{self._part}.jsonl"
        header = self._header()
        header.setdefault("config", {})["part"] = self._part
        writer = RunWriter(path, header)
        self._bytes = 0
        self.parts.append(path)
        return writer

    @property
    def path(self) -> Path:
        return self._writer.path

    def write(self, record: Any) -> None:
        """Append one record; rotate first when the current part is full."""
        if self._bytes >= self.max_bytes:
            self._rotate()
        self._writer.write(record)
        try:
            self._bytes = self._writer.path.stat().st_size
        except OSError:
            self._bytes = self.max_bytes  # the part vanished: start a new one

    def _rotate(self) -> None:
        old = self._writer
        self._writer = self._open()
        old.close("complete", rotated_to=self._writer.path.name)
        while len(self.parts) > self.keep:
            stale = self.parts.pop(0)
            stale.unlink(missing_ok=True)

    def close(self, status: str = "complete", **summary: Any) -> None:
        self._writer.close(status, **summary)
