"""Saved reports: written whole or not at all, never through a planted link, always labelled.

`write_report(path, data)` is the one way a command writes a report file (`--report FILE`,
`--charts DIR`): the data goes to a new temporary file in the same folder (created with
O_EXCL, so nothing planted there is opened), is flushed to disk, and is then renamed over
`path`. A rename replaces a symlink standing at `path`; it never writes through it, so a link
planted at the report's name (`report.html -> ~/.bashrc`) is replaced by the report and its
target is untouched. A reader never sees half a report; a failure (full disk) leaves the old
file as it was and raises `InputError` (exit 2) naming the file.

`ReportMeta` is what every saved report says about itself, in its text and its HTML: the tool
and its version, the command, the run file it was made from, and when it was made (UTC).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import html
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from vramdoctor._version import __version__
from vramdoctor.errors import InputError

__all__ = ["ReportMeta", "write_report"]


def write_report(path: Path | str, data: str | bytes, *, mode: int = 0o644) -> Path:
    """Write `data` (text is UTF-8) to `path` atomically (module docstring); returns `path`.

    Raises InputError (one line, naming the file) when `path` is a directory or the folder
    cannot be written (missing, read-only, full disk). The folder is not created here.
    """
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir() and not target.is_symlink():
        raise InputError(f"cannot write report {target}: it is a directory")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(f"cannot write report {target}: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode & ~_umask())
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise InputError(f"cannot write report {target}: {exc.strerror or exc}") from None
    return target


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


@dataclass(frozen=True)
class ReportMeta:
    """What a saved report says about itself. `run_file` is the run file it was made from
    (None: made live, with no run file); `made` is when (UTC, default now)."""

    command: str
    run_file: str | None = None
    made: _dt.datetime = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc))
    version: str = __version__

    def when(self) -> str:
        return self.made.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

    def line(self) -> str:
        """One line for a text report: `vramdoctor 0.1.0 soak report, run file X, made T`."""
        run = f", run file {self.run_file}" if self.run_file else ", no run file"
        return f"vramdoctor {self.version} {self.command} report{run}, made {self.when()}"

    def html(self) -> str:
        """The same as a small HTML block (escaped), for the top of an HTML report."""
        e = html.escape
        run = e(self.run_file) if self.run_file else "none (made live)"
        return (
            "<p class='meta' style='color:#555;font-size:0.9em'>"
            f"vramdoctor {e(self.version)} &middot; {e(self.command)} report &middot; "
            f"run file: <code>{run}</code> &middot; made {e(self.when())}</p>"
        )

    def to_dict(self) -> dict[str, str | None]:
        return {
            "tool": "vramdoctor",
            "version": self.version,
            "command": self.command,
            "run_file": self.run_file,
            "made_utc": self.when(),
        }
