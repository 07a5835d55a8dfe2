"""Help pages that read the same on every typer release: value names, not Python types.

typer >= 0.2x prints an option's Python annotation in --help (``<list[int]>``, ``<bool>`` for a
flag); older releases print click's names (INTEGER, TEXT). The root group here shows click's
names everywhere and nothing for flags, whatever typer is installed.

Nothing is cut off at 80 columns: typer's option tables are rich tables whose columns end an
over-long word (an option name, a file name in a help text) with "…"; every help page here is
rendered with columns that fold such a word onto the next line instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from typer.core import TyperGroup


def _label(param: Any) -> str | None:
    """click's name for a parameter's values (None for a flag or an argument)."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    if getattr(param, "param_type_name", "") == "argument":
        return None  # its name (LOG, RUN_FILE) says it
    if param.metavar is not None:
        return str(param.metavar)
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and getattr(desc, "is_choice", False):
        return "|".join(str(c) for c in getattr(desc, "choices", None) or ())
    annotation = getattr(desc, "annotation", None)
    args = getattr(annotation, "__args__", None)
    if getattr(desc, "is_list", False) and args:
        annotation = args[0]
    if getattr(desc, "is_path", False):
        return "PATH"
    names: dict[Any, str | None] = {int: "INTEGER", float: "NUMBER", str: "TEXT", bool: None}
    return names.get(annotation, "VALUE")


def _fix(param: Any) -> Any:
    if hasattr(param, "display_type_rich"):
        label = _label(param)
        param.display_type_rich = lambda ctx, label=label: label
    return param


class _Fold:
    """A renderable drawn with overflow "fold" whatever the column around it says."""

    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield from console.render(self.renderable, options.update(overflow="fold"))

    def __rich_measure__(self, console: Any, options: Any) -> Any:
        from rich.measure import Measurement

        return Measurement.get(console, options, self.renderable)


@contextlib.contextmanager
def folding_tables() -> Iterator[None]:
    """While a help page renders: typer's tables fold over-long words instead of cutting
    them with "…" (rich's default overflow for a table column). No-op on a typer without
    rich help."""
    try:
        from typer import rich_utils
    except ImportError:  # typer without rich: click's plain help wraps on its own
        yield
        return
    original = getattr(rich_utils, "Table", None)
    if original is None or getattr(original, "_vramdoctor_folding", False):
        yield
        return

    class FoldingTable(original):  # type: ignore[misc, valid-type]
        _vramdoctor_folding = True

        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            for cell in renderables:  # an option's help is a rich Columns of help and default
                items = getattr(cell, "renderables", None)
                if isinstance(items, list):
                    items[:] = [_Fold(item) for item in items]
            super().add_row(*renderables, **kwargs)
            for column in self.columns:  # columns are made by the first row
                column.overflow = "fold"

    rich_utils.Table = FoldingTable  # type: ignore[misc,attr-defined]
    try:
        yield
    finally:
        rich_utils.Table = original  # type: ignore[misc,attr-defined]


def plain_types(command: Any) -> Any:
    """Make `command`'s help show click's value names instead of Python types, and fold
    over-long words instead of cutting them (in place)."""
    if getattr(command, "_vramdoctor_plain", False):
        return command
    for param in getattr(command, "params", []):
        _fix(param)
    original = command.get_params

    def get_params(ctx: Any) -> list[Any]:
        return [_fix(p) for p in original(ctx)]  # the --help option is made here

    command.get_params = get_params
    format_help = command.format_help

    def folded_help(ctx: Any, formatter: Any) -> None:
        with folding_tables():
            format_help(ctx, formatter)

    command.format_help = folded_help
    command._vramdoctor_plain = True
    return command


class PlainTypesGroup(TyperGroup):
    """The root command group: its subcommands' help pages use `plain_types`."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        return None if command is None else plain_types(command)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        plain_types(self)
        with folding_tables():
            super().format_help(ctx, formatter)
