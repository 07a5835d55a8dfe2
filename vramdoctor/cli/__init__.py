"""The thin command line: parse, call the library, print, pick the exit code.

Each command lives in its own module here and registers itself on `app`; the work is done
by the library packages (sources, analysis, logs, fixes, abtest, report).
"""

from __future__ import annotations

import signal as _signal
import sys


def _early_interrupt(_signum: int, _frame: object) -> None:
    """Ctrl-C while the command line is still being imported: a line, no traceback."""
    sys.stderr.write("vramdoctor: interrupted\n")
    sys.stderr.flush()
    import os as _os

    _os._exit(130)


# Installed before the imports below (typer, rich and the command modules take a few tenths
# of a second): a Ctrl-C in that time must not print a traceback. Python's handler is back
# at the end of this module (a program importing vramdoctor.cli keeps its own Ctrl-C), so
# commands see KeyboardInterrupt as usual.
if __name__ != "__main__" and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, _early_interrupt)

import contextlib  # noqa: E402
import os  # noqa: E402

import click  # noqa: E402
import typer  # noqa: E402

from vramdoctor._version import __version__  # noqa: E402
from vramdoctor.errors import ExitCode, VramdoctorError  # noqa: E402
from vramdoctor.render import console  # noqa: E402

# With --json, an exit-2 error also prints this object on stdout, so scripts always get JSON.
ERROR_SCHEMA = "vramdoctor.error/1"


def _click_modules() -> list[object]:
    """click itself and, from typer 0.22 on, typer's own copy of it (typer._click)."""
    mods: list[object] = [click]
    try:
        from typer import _click as vendored

        mods.append(vendored)
    except ImportError:
        pass
    return mods


def _errors(name: str) -> tuple[type[BaseException], ...]:
    found = (getattr(getattr(m, "exceptions", None), name, None) for m in _click_modules())
    return tuple(dict.fromkeys(e for e in found if isinstance(e, type)))


_CLICK_ERRORS = _errors("ClickException")
_NO_ARGS = _errors("NoArgsIsHelpError")
_ABORT = _errors("Abort")

from vramdoctor.cli._help import PlainTypesGroup  # noqa: E402

app = typer.Typer(
    name="vramdoctor",
    cls=PlainTypesGroup,  # help shows INTEGER/TEXT/PATH, not Python types like <list[int]>
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
        False,
        "--version",
        "-V",
        callback=_version,
        is_eager=True,
        help="Print the version and exit.",
    ),
    no_color: bool = typer.Option(
        False,
        "--no-color",
        help="No colour in any command's output (same as NO_COLOR=1; output is plain when piped).",
    ),
) -> None:
    """vramdoctor: is it a leak or only caching, what causes it, does the fix work."""
    if no_color:  # the one colour switch: every console reads NO_COLOR (vramdoctor.render.console)
        os.environ["NO_COLOR"] = "1"


# Register the commands (each module adds itself to `app`).
from vramdoctor.cli import abtest as _abtest  # noqa: E402,F401
from vramdoctor.cli import agent as _agent  # noqa: E402,F401
from vramdoctor.cli import attribute as _attribute  # noqa: E402,F401
from vramdoctor.cli import census as _census  # noqa: E402,F401
from vramdoctor.cli import diagnose as _diagnose  # noqa: E402,F401
from vramdoctor.cli import fleet as _fleet  # noqa: E402,F401
from vramdoctor.cli import report as _report  # noqa: E402,F401
from vramdoctor.cli import soak as _soak  # noqa: E402,F401
from vramdoctor.cli import watch as _watch  # noqa: E402,F401


def _json_wanted(args: list[str]) -> bool:
    return "--json" in args[: args.index("--")] if "--" in args else "--json" in args


def _fail(message: str, code: int, args: list[str]) -> int:
    """One line on stderr; with --json also the error object on stdout."""
    console.error(message)
    if _json_wanted(args):
        with contextlib.suppress(OSError, ValueError):
            console.print_json({"schema": ERROR_SCHEMA, "error": message, "exit_code": code})
    return code


def _usage_message(exc: BaseException) -> str:
    """click's usage error as one line, with where to find help."""
    message = " ".join(str(getattr(exc, "format_message", lambda: str(exc))()).split())
    ctx = getattr(exc, "ctx", None)
    where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
    return message + where


def _learn_secrets(args: list[str]) -> None:
    """Register the secrets of this invocation before anything is printed: values of secret
    flags and URL credentials on the command line, and values of secret-named environment
    variables (OPENAI_API_KEY, HF_TOKEN, ...) long enough to be keys. A server that echoes one
    back (a model id, an error body) then shows it masked."""
    from vramdoctor.redact import redact_argv, register_secret, secret_name

    redact_argv(args)
    for name, value in os.environ.items():
        if secret_name(name) and len(value) >= 8 and not value.isdigit() and "/" not in value:
            register_secret(value)


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns expected errors into one line and exit code 2.

    Usage errors are one line (not click's box); with `--json` every exit-2 error also prints
    `{"schema": "vramdoctor.error/1", "error": ..., "exit_code": 2}` on stdout.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    _learn_secrets(args)
    _restore_interrupt()
    try:
        code = app(args=args, prog_name="vramdoctor", standalone_mode=False)
    except _NO_ARGS as exc:
        ctx = getattr(exc, "ctx", None)
        typer.echo(ctx.get_help() if ctx is not None else str(exc), err=True)
        return int(ExitCode.USAGE)
    except _ABORT:
        console.error("interrupted")
        return 130
    except _CLICK_ERRORS as exc:  # usage errors: bad option, missing argument, bad value
        return _fail(_usage_message(exc), int(ExitCode.USAGE), args)
    except SystemExit as exc:  # a command calling sys.exit
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else int(ExitCode.USAGE))
    except VramdoctorError as exc:
        return _fail(str(exc), int(exc.exit_code), args)
    except KeyboardInterrupt:
        console.error("interrupted")
        return 130
    except BrokenPipeError:
        with contextlib.suppress(OSError):  # no second error when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (
        OSError
    ) as exc:  # the output cannot be written (stdout on a full disk): one line, not a traceback
        with contextlib.suppress(OSError):  # and no second error when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        where = f"{exc.filename}" if exc.filename else "cannot write the output"
        console.error(f"{where}: {exc.strerror or exc}")
        return int(ExitCode.USAGE)
    except Exception as exc:  # a bug of ours: one line for users, the traceback on request
        if os.environ.get("VRAMDOCTOR_DEBUG"):
            raise
        return _fail(
            f"internal error: {type(exc).__name__}: {exc} "
            "(run again with VRAMDOCTOR_DEBUG=1 for the traceback, and please report it)",
            int(ExitCode.USAGE),
            args,
        )
    return code if isinstance(code, int) else 0


def run() -> None:
    sys.exit(main())


def _restore_interrupt() -> None:
    if _signal.getsignal(_signal.SIGINT) is _early_interrupt:
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)


_restore_interrupt()
