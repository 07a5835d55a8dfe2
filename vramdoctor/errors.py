"""Exit codes and the one error type the CLI turns into a one-line message.

Every command exits 0 when healthy, 1 when it found a problem (LEAK, a warning finding, a
flagged process) and 2 on a usage or input error. Library code raises `VramdoctorError`
subclasses with a message that names the fix; the CLI prints it on one line, never a traceback.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "ExitCode",
    "InputError",
    "Interrupted",
    "MissingExtra",
    "SourceUnavailable",
    "VramdoctorError",
]


class ExitCode(IntEnum):
    """The exit codes every command uses: 0 healthy, 1 a problem found, 2 usage or input error."""

    OK = 0
    PROBLEM = 1
    USAGE = 2
    INTERRUPTED = 130  # Ctrl-C or SIGTERM before a problem was found (the Unix 128 + SIGINT)


class VramdoctorError(Exception):
    """An expected failure with a user-facing one-line message."""

    exit_code: ExitCode = ExitCode.USAGE


class InputError(VramdoctorError):
    """Bad or unreadable input: a missing file, a run file that is not ours, a bad URL."""


class Interrupted(VramdoctorError):
    """Ctrl-C or SIGTERM where no partial report can be given (before anything was measured);
    the message says what was kept. Exit 130."""

    exit_code = ExitCode.INTERRUPTED


class SourceUnavailable(VramdoctorError):
    """A measurement source cannot be used here (no NVML, server not answering, no torch)."""


class MissingExtra(SourceUnavailable):
    """A feature needs an optional extra: `gpu` (torch, transformers) or `charts` (matplotlib).

    The message names the install line: "vramdoctor ab-test needs torch: pip install
    'vramdoctor[gpu]' (and a CUDA GPU)".
    """

    def __init__(self, what: str, missing: str, extra: str = "gpu") -> None:
        self.missing = missing
        self.extra = extra
        hint = " (and a CUDA GPU)" if extra == "gpu" else ""
        super().__init__(f"{what} needs {missing}: pip install 'vramdoctor[{extra}]'{hint}")
