"""The entry point: one line and an exit code for every way a command can end.

`main(argv)` runs the app (`vramdoctor.cli.app`) and turns what it raises into exit codes: 0
healthy, 1 a problem found (the command's own code), 2 usage or input error (one line on
stderr; with --json also `{"schema": "vramdoctor.error/1", ...}` on stdout), 130 interrupted
("vramdoctor: interrupted"); an internal error is one line too, its traceback only with
VRAMDOCTOR_DEBUG=1. Before the command: global options are hoisted to the front, the
invocation's secrets registered, stdout/stderr made unable to raise UnicodeEncodeError, and a
proxy that would carry a URL of the command line named. While it runs, a library's warning is
one note line.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import typer

from vramdoctor import _interrupted_while_starting
from vramdoctor.cli import COMMANDS, ERROR_SCHEMA, GLOBAL_OPTIONS, INTERRUPTED, app
from vramdoctor.cli._proxies import name_proxies, note_proxies
from vramdoctor.errors import ExitCode, VramdoctorError
from vramdoctor.render import console

__all__ = ["hoist_global_options", "main", "run", "third_party_warnings_as_one_note"]


def hoist_global_options(args: list[str]) -> list[str]:
    """`args` with the global options moved to the front, wherever they were given
    (`report RUN --no-color` -> `--no-color report RUN`; `--help --width 60` -> `--width 60
    --help`, so the help page is laid out at that width). Nothing after `--` is touched."""
    end = args.index("--") if "--" in args else len(args)
    moved: list[str] = []
    rest: list[str] = []
    j = 0
    while j < end:
        arg = args[j]
        name = arg.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            n = 0 if "=" in arg else GLOBAL_OPTIONS[name]
            moved += args[j : min(j + 1 + n, end)]
            j += 1 + n
            continue
        rest.append(arg)
        j += 1
    return [*moved, *rest, *args[end:]]


def _json_wanted(args: list[str]) -> bool:
    return "--json" in args[: args.index("--")] if "--" in args else "--json" in args


def _fail(message: str, code: int, args: list[str]) -> int:
    """One line on stderr; with --json also the error object on stdout."""
    message = name_proxies(message)
    if code == ExitCode.INTERRUPTED:
        console.interrupted(message)
    else:
        console.error(message)
    if _json_wanted(args):
        with contextlib.suppress(OSError, ValueError):
            console.print_json({"schema": ERROR_SCHEMA, "error": message, "exit_code": code})
    return code


def _kind(exc: BaseException) -> set[str]:
    """The class names in `exc`'s ancestry (click's and typer's copies share them)."""
    return {c.__name__ for c in type(exc).__mro__}


def _options_of(ctx: Any) -> list[str]:
    command = getattr(ctx, "command", None)
    names: list[str] = []
    for param in getattr(command, "params", []) or []:
        if getattr(param, "hidden", False):
            continue
        names += [o for o in [*param.opts, *param.secondary_opts] if o.startswith("--")]
    if getattr(ctx, "parent", None) is None or command is None:
        return names
    return names + [o for o in GLOBAL_OPTIONS if o not in names]


def _close(word: str, candidates: list[str]) -> list[str]:
    """The candidates that look like a typo of `word` (at most two), or that it begins."""
    bare = word.lstrip("-")
    if not bare:
        return []
    starts = [c for c in candidates if c.lstrip("-").startswith(bare) and len(bare) >= 3]
    if starts:
        return starts[:2]
    scored = sorted(
        ((difflib.SequenceMatcher(None, bare, c.lstrip("-")).ratio(), c) for c in candidates),
        reverse=True,
    )
    return [c for score, c in scored[:2] if score >= 0.7]


def _usage_message(exc: BaseException) -> str:
    """click's usage error as one line, with sensible suggestions and where to find help."""
    ctx = getattr(exc, "ctx", None)
    kind = _kind(exc)
    if "NoSuchOption" in kind:
        option = str(getattr(exc, "option_name", "") or "")
        near = _close(option, _options_of(ctx))
        message = f"no such option: {option}"
        if near:
            message += f"; did you mean {' or '.join(near)}?"
    elif "UsageError" in kind and str(exc).startswith("No such command"):
        word = str(exc).split("'")[1] if "'" in str(exc) else ""
        near = _close(word, list(COMMANDS))
        message = f"no such command: {word}" + (
            f"; did you mean {' or '.join(near)}?" if near else ""
        )
    else:
        message = " ".join(str(getattr(exc, "format_message", lambda: str(exc))()).split())
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


@contextlib.contextmanager
def third_party_warnings_as_one_note() -> Iterator[None]:
    """Warnings a library prints while a command runs (matplotlib's font cache, a deprecation)
    become one note line each on stderr, not their multi-line source excerpts."""
    seen: set[str] = set()

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        text = " ".join(str(message).split())
        module = os.path.basename(filename).removesuffix(".py")
        line = f"note: {module}: {text}"
        if line not in seen:
            seen.add(line)
            console.note(line)

    previous = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns expected errors into one line and an exit code.

    Usage errors are one line (not click's box); with `--json` every exit-2 error also prints
    `{"schema": "vramdoctor.error/1", "error": ..., "exit_code": 2}` on stdout. Ctrl-C is the
    line "vramdoctor: error: interrupted" and exit 130.
    """
    try:
        _restore_interrupt()
        args = hoist_global_options(list(sys.argv[1:] if argv is None else argv))
        _learn_secrets(args)
        _tolerant_streams()
        note_proxies(args)
        with third_party_warnings_as_one_note():
            code = app(args=args, prog_name="vramdoctor", standalone_mode=False)
    except KeyboardInterrupt:
        console.interrupted(INTERRUPTED)
        return int(ExitCode.INTERRUPTED)
    except VramdoctorError as exc:
        return _fail(str(exc), int(exc.exit_code), sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # a command calling sys.exit
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else int(ExitCode.USAGE))
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except OSError as exc:  # the output cannot be written (stdout on a full disk): one line
        _quiet_stdout()
        where = f"{exc.filename}" if exc.filename else "cannot write the output"
        console.error(f"{where}: {exc.strerror or exc}")
        return int(ExitCode.USAGE)
    except Exception as exc:
        kind = _kind(exc)
        args = list(sys.argv[1:] if argv is None else argv)
        if "NoArgsIsHelpError" in kind:
            ctx = getattr(exc, "ctx", None)
            typer.echo(ctx.get_help() if ctx is not None else str(exc), err=True)
            return int(ExitCode.USAGE)
        if "Abort" in kind:  # click's own Ctrl-C (older typer, or a prompt)
            console.interrupted(INTERRUPTED)
            return int(ExitCode.INTERRUPTED)
        if "ClickException" in kind:  # usage errors: bad option, missing argument, bad value
            return _fail(_usage_message(exc), int(ExitCode.USAGE), args)
        if os.environ.get("VRAMDOCTOR_DEBUG"):  # a bug of ours: the traceback on request
            raise
        return _fail(
            f"internal error: {type(exc).__name__}: {exc} "
            "(run again with VRAMDOCTOR_DEBUG=1 for the traceback, and please report it)",
            int(ExitCode.USAGE),
            args,
        )
    return code if isinstance(code, int) else 0


def _quiet_stdout() -> None:
    with contextlib.suppress(OSError):  # no second error when Python flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _tolerant_streams() -> None:
    """stdout and stderr never raise UnicodeEncodeError (a Latin-1 locale): what they cannot
    encode is escaped. The consoles print ASCII stand-ins first (vramdoctor.render.console)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        encoding = str(getattr(stream, "encoding", "") or "").lower().replace("-", "")
        if reconfigure is not None and not encoding.startswith("utf"):
            with contextlib.suppress(Exception):
                reconfigure(errors="backslashreplace")


def run() -> None:
    sys.exit(main())


def _restore_interrupt() -> None:
    """Python's own Ctrl-C handler back, once main() can turn it into one line."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            signal.signal(signal.SIGINT, signal.default_int_handler)
