"""Help pages that read the same on every typer release: value names, not Python types.

typer >= 0.2x prints an option's Python annotation in --help (``<list[int]>``, ``<bool>`` for a
flag); older releases print click's names (INTEGER, TEXT). The root group here shows click's
names everywhere and nothing for flags, whatever typer is installed.
"""

from __future__ import annotations

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


def plain_types(command: Any) -> Any:
    """Make `command`'s help show click's value names instead of Python types (in place)."""
    if getattr(command, "_vramdoctor_plain", False):
        return command
    for param in getattr(command, "params", []):
        _fix(param)
    original = command.get_params

    def get_params(ctx: Any) -> list[Any]:
        return [_fix(p) for p in original(ctx)]  # the --help option is made here

    command.get_params = get_params
    command._vramdoctor_plain = True
    return command


class PlainTypesGroup(TyperGroup):
    """The root command group: its subcommands' help pages use `plain_types`."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        return None if command is None else plain_types(command)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        plain_types(self)
        super().format_help(ctx, formatter)
