"""The thin command line: parse, call the library, print, pick the exit code.

`COMMANDS` is the command list, in the order `--help` shows it: each name and the module under
`vramdoctor.cli` that defines it (the module registers its function on `app`). A command's
module is imported only when that command runs (or for the root `--help`), so `vramdoctor
census` never pays for diagnose's patterns. The work is done by the library packages.

Global options (`--no-color`, `--width N`) are accepted before or after the command
(`vramdoctor report RUN --no-color`). Every failure is one line on stderr and an exit code:
0 healthy, 1 a problem found, 2 usage or input error, 130 interrupted (Ctrl-C: the one line
"vramdoctor: interrupted", or one that starts so and says what was kept: typer's own silent
exit 130 is never reached, `CommandGroup.invoke` turns the interrupt into `Interrupted`);
never a traceback unless VRAMDOCTOR_DEBUG=1.

Only public typer and click API is used: `typer.main.get_command`, click's command model
(`params`, `get_help_record`, ...), and click's exceptions recognised by their class names
(click itself and typer's vendored copy raise the same classes under two module paths).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import re
import signal
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import typer
from typer.core import TyperGroup

from vramdoctor import _interrupted_while_starting
from vramdoctor._version import __version__
from vramdoctor.cli import _help
from vramdoctor.errors import ExitCode, Interrupted, VramdoctorError
from vramdoctor.render import console

__all__ = ["COMMANDS", "ERROR_SCHEMA", "GLOBAL_OPTIONS", "INTERRUPTED", "app", "main", "run"]

# With --json, an exit-2 error also prints this object on stdout, so scripts always get JSON.
ERROR_SCHEMA = "vramdoctor.error/1"

INTERRUPTED = "interrupted"
"""The one message of a Ctrl-C ("vramdoctor: interrupted"), in every command."""

# The command list: name -> module in vramdoctor.cli (help shows them in this order).
COMMANDS: dict[str, str] = {
    "soak": "soak",
    "report": "report",
    "diagnose": "diagnose",
    "watch": "watch",
    "fleet": "fleet",
    "census": "census",
    "ab-test": "abtest",
    "attribute": "attribute",
    "agent-path": "agent",
    "try": "try_",
}

# Options of the root that may also come after the command: name -> how many values follow.
GLOBAL_OPTIONS: dict[str, int] = {"--no-color": 0, "--width": 1}


class CommandGroup(TyperGroup):
    """The root group: commands from `COMMANDS`, imported on first use; help by `_help`."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [name for name in COMMANDS if self.get_command(ctx, name) is not None]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in COMMANDS:
            command = _load(cmd_name)
            if command is not None:
                self.commands[cmd_name] = command
        return None if command is None else _help.install(command)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(_help.help_page(self, ctx, extra=_global_note))

    def make_context(self, *args: Any, **extra: Any) -> Any:
        """Parse the command line; a Ctrl-C meanwhile (typer imports pydantic while it parses
        the first option) becomes `Interrupted`, not typer's silent exit 130."""
        try:
            return super().make_context(*args, **extra)
        except KeyboardInterrupt:
            raise Interrupted(INTERRUPTED) from None

    def invoke(self, ctx: Any) -> Any:
        """Run the command; a Ctrl-C it does not handle itself becomes `Interrupted` (typer
        would end it with a silent exit 130)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted(INTERRUPTED) from None


def _global_note(width: int) -> list[str]:
    return [
        *_help._prose(
            "Global options go before or after the command: vramdoctor report RUN --no-color. "
            "Exit codes: 0 healthy, 1 problem found, 2 usage or input error, 130 interrupted.",
            width,
            indent="",
        ),
    ]


def _load(name: str) -> Any:
    """The click command of `name`: its module imported (it registers on `app`), then built
    by typer's public `get_command`, with the help page of `_help`."""
    module = COMMANDS[name]
    spec = f"vramdoctor.cli.{module}"
    if spec not in sys.modules:
        with _third_party_warnings_as_one_note():
            importlib.import_module(spec)
    group = typer.main.get_command(app)
    return getattr(group, "commands", {}).get(name)


app = typer.Typer(
    name="vramdoctor",
    cls=CommandGroup,
    help=(
        "Tell a real GPU-memory leak in an LLM/VLM inference server (SGLang, vLLM) from "
        "allocator caching, find its cause in the logs, and measure the fix on your GPU.\n\n"
        "New here? vramdoctor try watch (or: try fleet) shows a command working in a minute, "
        "on this machine, no GPU needed."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vramdoctor {__version__}")
        raise typer.Exit(0)


def _set_width(value: int | None) -> int | None:
    if value is not None:
        console.set_width(value)
    return value


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
    width: int | None = typer.Option(
        None,
        "--width",
        metavar="COLUMNS",
        min=console.MIN_WIDTH,
        max=console.MAX_WIDTH,
        is_eager=True,  # before --help, so the help page is laid out at this width
        callback=_set_width,
        help="Lay output out for this many columns (default: the terminal's width; when piped, "
        "tables use their full width).",
    ),
) -> None:
    """vramdoctor: is it a leak or only caching, what causes it, does the fix work."""
    if no_color:  # the one colour switch: every console reads NO_COLOR (vramdoctor.render.console)
        os.environ["NO_COLOR"] = "1"


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


_URL = re.compile(r"https?://[^\s'\"<>),;]*[^\s'\"<>),;:.]")


def proxy_of(url: str) -> tuple[str, str] | None:
    """The proxy that requests would send `url` through (http_proxy, https_proxy, all_proxy;
    no_proxy honoured), redacted, and the variable that names it; None when it goes direct."""
    if not any(k.lower().endswith("_proxy") and k.lower() != "no_proxy" for k in os.environ):
        return None
    try:
        from requests.utils import get_environ_proxies

        proxies = get_environ_proxies(url)
    except Exception:  # a malformed variable: requests would fail on its own, with its own words
        return None
    scheme = url.split(":", 1)[0].lower()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy:
        return None
    from vramdoctor.redact import redact_url

    names = [f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"]
    variable = next((n for n in names if os.environ.get(n) == proxy), names[0])
    return redact_url(proxy), variable


def _proxy_words(url: str, proxy: tuple[str, str]) -> str:
    host = url.split("//", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    return (
        f"{url} is reached through the proxy {proxy[0]} ({proxy[1]}); to reach it directly: "
        f"no_proxy={host}"
    )


def _name_proxies(message: str) -> str:
    """An error naming a URL that goes through a proxy says so (a loopback server behind
    `http_proxy` looks down when the proxy answers for it)."""
    for url in dict.fromkeys(_URL.findall(message)):
        proxy = proxy_of(url)
        if proxy is not None:
            return f"{message} ({_proxy_words(url, proxy)})"
    return message


def _note_proxies(args: list[str]) -> None:
    """Before the command: one note per URL on the command line that a proxy would carry."""
    for arg in args[: args.index("--")] if "--" in args else args:
        for url in _URL.findall(arg):
            proxy = proxy_of(url)
            if proxy is not None:
                console.note(f"note: {_proxy_words(url, proxy)}")


def _fail(message: str, code: int, args: list[str]) -> int:
    """One line on stderr; with --json also the error object on stdout."""
    message = _name_proxies(message)
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
def _third_party_warnings_as_one_note() -> Iterator[None]:
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
        _note_proxies(args)
        with _third_party_warnings_as_one_note():
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
