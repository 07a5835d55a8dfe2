"""vramdoctor: is it a GPU-memory leak or only caching, what causes it, does the fix work.

The library is usable without the CLI. The root re-exports the shared vocabulary; each
subpackage holds one job and declares its own public names in ``__all__``:

- ``vramdoctor.soak``: run a soak from a config object, analyse a recorded run.
- ``vramdoctor.diagnose``: diagnose SGLang/vLLM logs (``vramdoctor.diagnose.diagnose(paths)``).
- ``vramdoctor.fixes``: memory fixes to import into a server (request-scoped CUDA pools, CUDA
  IPC device redirect); torch is imported on first use only.
- ``vramdoctor.watch``, ``vramdoctor.fleet``, ``vramdoctor.attribution``, ``vramdoctor.agent``:
  continuous watch, many hosts, attribution of growth to requests, the in-server agent.
- ``vramdoctor.sources`` (NVML, exporters, server metrics), ``vramdoctor.record`` (run files),
  ``vramdoctor.units`` (MiB/GiB/bytes and durations, parsing and formatting).

Everything is imported on first use (``vramdoctor.soak`` after ``import vramdoctor`` works),
so ``import vramdoctor`` stays cheap: no numpy, scipy, requests, psutil or torch.

    import vramdoctor
    run = vramdoctor.read_run("runs/soak-20261130-061200.jsonl")
    gpu = run.of(vramdoctor.GpuSample)[-1]          # GpuSample: .gpus (GpuMemory, MiB), .processes
"""

from __future__ import annotations

import os as _os
import sys as _sys


def _interrupted_while_starting(_signum: int, _frame: object) -> None:
    """Ctrl-C while the command line is still being imported: one line, exit 130."""
    _sys.stderr.write("vramdoctor: interrupted\n")
    _sys.stderr.flush()
    _os._exit(130)


def _program_is_vramdoctor() -> bool:
    """True while `python -m vramdoctor` (runpy sets argv[0] to "-m" while it finds the
    module) or the `vramdoctor` script starts; never for a program importing the library."""
    first = _sys.argv[0] if _sys.argv else ""
    return first == "-m" or first.rsplit("/", 1)[-1] in ("vramdoctor", "vramdoctor.exe")


# The command line takes a few tenths of a second to import (typing, typer, rich): a Ctrl-C in
# that time must not print a traceback. Installed before any other import, only when the
# program is vramdoctor itself; vramdoctor.cli.main() puts Python's handler back. `_signal` is
# the C module `signal` wraps: importing it costs nothing (it is loaded at start-up), so there
# is no window in which the import itself could be interrupted.
if _program_is_vramdoctor():
    try:
        import _signal

        if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
            _signal.signal(_signal.SIGINT, _interrupted_while_starting)
    except (ImportError, AttributeError, ValueError):  # another Python, or not the main thread
        pass

from typing import TYPE_CHECKING, Any  # noqa: E402

from vramdoctor import _lazy  # noqa: E402
from vramdoctor._version import __version__  # noqa: E402

if TYPE_CHECKING:  # the lazy names below, for type checkers and IDEs
    from vramdoctor.errors import (
        ExitCode,
        InputError,
        MissingExtra,
        SourceUnavailable,
        VramdoctorError,
    )
    from vramdoctor.record import Run, RunWriter, read_run
    from vramdoctor.samples import (
        Event,
        GpuMemory,
        GpuSample,
        HostProcessMemory,
        HostSample,
        KvPoolSample,
        MetricsSample,
        ProcessGpuMemory,
    )

# Public name -> the module that defines it (imported on first access).
_LAZY: dict[str, str] = {
    "ExitCode": "errors",
    "InputError": "errors",
    "MissingExtra": "errors",
    "SourceUnavailable": "errors",
    "VramdoctorError": "errors",
    "Event": "samples",
    "GpuMemory": "samples",
    "GpuSample": "samples",
    "HostProcessMemory": "samples",
    "HostSample": "samples",
    "KvPoolSample": "samples",
    "MetricsSample": "samples",
    "ProcessGpuMemory": "samples",
    "Run": "record",
    "RunWriter": "record",
    "read_run": "record",
}

# Subpackages and modules reachable as attributes of the root without importing them first.
_SUBMODULES = frozenset(
    {
        "abtest",
        "agent",
        "attribution",
        "census",
        "diagnose",
        "errors",
        "fixes",
        "fleet",
        "judge",
        "record",
        "redact",
        "render",
        "samples",
        "soak",
        "sources",
        "stats",
        "units",
        "watch",
    }
)

__all__ = [
    "Event",
    "ExitCode",
    "GpuMemory",
    "GpuSample",
    "HostProcessMemory",
    "HostSample",
    "InputError",
    "KvPoolSample",
    "MetricsSample",
    "MissingExtra",
    "ProcessGpuMemory",
    "Run",
    "RunWriter",
    "SourceUnavailable",
    "VramdoctorError",
    "__version__",
    "read_run",
]


def __getattr__(name: str) -> Any:
    """PEP 562: the public names and subpackages, imported on first access."""
    return _lazy.load(__name__, name, _LAZY, _SUBMODULES)


def __dir__() -> list[str]:
    return _lazy.listing(globals(), _LAZY, _SUBMODULES)
