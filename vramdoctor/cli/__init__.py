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

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperGroup

from vramdoctor._version import __version__
from vramdoctor.cli import _help
from vramdoctor.errors import Interrupted
from vramdoctor.render import console

__all__ = [
    "COMMANDS",
    "ERROR_SCHEMA",
    "GLOBAL_OPTIONS",
    "INTERRUPTED",
    "app",
    "hoist_global_options",
    "main",
    "run",
]

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
        return None if command is None else _help.install(command, extra=_command_note)

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


def _note(text: str) -> Callable[[int], list[str]]:
    """A help page's closing paragraph, laid out at the page's width."""
    return lambda width: _help._prose(text, width, indent="")


# the root's page; every command's page (the root's options it also takes, hoisted from after it)
_global_note = _note(
    "Global options go before or after the command: vramdoctor report RUN --no-color. "
    "Exit codes: 0 healthy, 1 problem found, 2 usage or input error, 130 interrupted."
)
_command_note = _note(
    "Also: --no-color (no colour; same as NO_COLOR=1) and --width COLUMNS (lay output "
    "out for this many columns), before or after the command."
)


def _load(name: str) -> Any:
    """The click command of `name`: its module imported (it registers on `app`), then built
    by typer's public `get_command`, with the help page of `_help`."""
    module = COMMANDS[name]
    spec = f"vramdoctor.cli.{module}"
    if spec not in sys.modules:
        from vramdoctor.cli._main import third_party_warnings_as_one_note

        with third_party_warnings_as_one_note():
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


# The entry point (pyproject's `vramdoctor = "vramdoctor.cli:main"`), after `app` exists.
from vramdoctor.cli._main import hoist_global_options, main, run  # noqa: E402
