"""Help pages that read the same on every typer release: value names, not Python types.

typer >= 0.2x prints an option's Python annotation in --help (``<list[int]>``, ``<bool>`` for a
flag); older releases print click's names (INTEGER, TEXT). The root group here shows click's
names everywhere and nothing for flags, whatever typer is installed.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

def _label(param: Any) -> str | None:
    """click's name for a parameter's values (None for a flag)."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    if param.metavar is not None:
        return None if param.param_type_name == "argument" else str(param.metavar)
    name = str(getattr(param.type, "name", "") or "").lower()
    if name == "choice":
        return "|".join(str(c) for c in getattr(param.type, "choices", ()))
    return {"integer": "INTEGER", "float": "NUMBER", "text": "TEXT", "path": "PATH",
            "boolean": None}.get(name, name.upper() or None)


def plain_types(command: Any) -> Any:
    """Make `command`'s help show click's value names instead of Python types (in place)."""
    for param in getattr(command, "params", []):
        if hasattr(param, "display_type_rich"):
            label = _label(param)
            param.display_type_rich = lambda ctx, label=label: label
    return command


class PlainTypesGroup(TyperGroup):
    """The root command group: its subcommands' help pages use `plain_types`."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        return None if command is None else plain_types(command)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        plain_types(self)
        super().format_help(ctx, formatter)
