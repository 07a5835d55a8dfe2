"""The thin command line: parse, call the library, print, pick the exit code.

Each command lives in its own module here and registers itself on `app`; the work is done
by the library packages (sources, analysis, logs, fixes, abtest, report).
"""

from __future__ import annotations

import contextlib
import os
import sys

import typer

from .._version import __version__
from ..errors import ExitCode, VramdoctorError
from ..report import console

app = typer.Typer(
    name="vramdoctor",
    help=(
        "Tell a real GPU-memory leak in an LLM/VLM inference server (SGLang, vLLM) from "
        "allocator caching, find its cause in the logs, and measure the fix on your GPU.\n\n"
        "Exit codes: 0 healthy, 1 problem found, 2 usage or input error."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vramdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """vramdoctor: is it a leak or only caching, what causes it, does the fix work."""


# Register the commands (each module adds itself to `app`).
from . import abtest as _abtest  # noqa: E402,F401
from . import census as _census  # noqa: E402,F401
from . import diagnose as _diagnose  # noqa: E402,F401
from . import report as _report  # noqa: E402,F401
from . import soak as _soak  # noqa: E402,F401


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns expected errors into one line and exit code 2."""
    try:
        app(args=argv, prog_name="vramdoctor")
    except SystemExit as exc:  # typer/click exit (usage errors exit 2 with their message)
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else int(ExitCode.USAGE))
    except VramdoctorError as exc:
        console.error(str(exc))
        return int(exc.exit_code)
    except KeyboardInterrupt:
        console.error("interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the output cannot be written (stdout on a full disk): one line, not a traceback
        with contextlib.suppress(OSError):  # and no second error when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        where = f"{exc.filename}" if exc.filename else "cannot write the output"
        console.error(f"{where}: {exc.strerror or exc}")
        return int(ExitCode.USAGE)
    except Exception as exc:  # a bug of ours: one line for users, the traceback on request
        if os.environ.get("VRAMDOCTOR_DEBUG"):
            raise
        console.error(
            f"internal error: {type(exc).__name__}: {exc} "
            "(run again with VRAMDOCTOR_DEBUG=1 for the traceback, and please report it)"
        )
        return int(ExitCode.USAGE)
    return 0


def run() -> None:
    sys.exit(main())
