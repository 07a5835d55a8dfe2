"""Help pages: written here, from click's public command model, the same on every typer release.

typer prints help through rich tables that cut an over-long word with "…" or fold it
(`--kubernetes-virt` / `ual-gpus`), and wraps an example command line in the middle
(`--gpu-metrics` / `http://gpu-host:9400/metrics`), so copy-paste breaks. The pages here are
plain text laid out by vramdoctor's own rules (`vramdoctor.render.wrap`):

- an example (a docstring line indented under its paragraph, or one starting `vramdoctor `) is
  printed whole on its own line, indented, never wrapped, one per line;
- prose paragraphs wrap at word boundaries (a number stays with its unit);
- an option's names and value name are never broken; its help wraps beside them, or under them
  when the names are too long for the column;
- value names are click's (INTEGER, NUMBER, TEXT, PATH, a metavar, or the choices), never a
  Python type (`<list[int]>`); nothing for a flag.

The width is the console's (`vramdoctor.render.console.width`: --width, COLUMNS, the terminal),
or 80 for prose when piped (examples and option names are never wrapped at any width).
Reads only public click attributes (`params`, `opts`, `help`, `get_help_record`,
`collect_usage_pieces`, `list_commands`, `get_command`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rich.cells import cell_len
from rich.text import Text

from vramdoctor.render.wrap import wrap

__all__ = ["help_page", "value_name"]

PIPED_WIDTH = 80
"""Prose help wraps here when the output has no width of its own (piped)."""
_NAMES_MAX = 30  # the option-names column is at most this wide; longer names get their own line
_INDENT = "  "


_TYPE_NAMES: dict[str, str | None] = {
    "int": "INTEGER",
    "integer": "INTEGER",
    "float": "NUMBER",
    "number": "NUMBER",
    "str": "TEXT",
    "text": "TEXT",
    "path": "PATH",
    "filename": "PATH",
    "file": "PATH",
    "bool": None,
    "boolean": None,
}


def value_name(param: Any, ctx: Any = None) -> str | None:
    """click's name for an option's values: its metavar, else INTEGER, NUMBER, TEXT, PATH or
    the choices, from the help record click or typer gives (typer >= 0.2x writes a Python
    type there, `<list[int]>`: mapped back); None for a flag or an argument."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    if getattr(param, "param_type_name", "") == "argument":
        return None  # its name (LOG, RUN_FILE) says it
    if getattr(param, "metavar", None) is not None:
        return str(param.metavar)
    record = param.get_help_record(ctx)
    if not record:
        return None
    names = {*param.opts, *param.secondary_opts, "/"}
    words = [w for w in record[0].replace(",", " ").split() if w not in names]
    label = " ".join(words).strip()
    if not label:
        return None
    inner = label.removeprefix("<").removesuffix(">")
    if inner.startswith("[") and inner.endswith("]"):  # click's choices: [a|b]
        inner = inner[1:-1]
    while "[" in inner and inner.endswith("]"):  # list[int] -> int, Optional[str] -> str
        inner = inner[inner.index("[") + 1 : -1]
    if "|" in inner:
        return inner
    if inner.lower() in _TYPE_NAMES:
        return _TYPE_NAMES[inner.lower()]
    return label if not label.startswith("<") else "VALUE"


def _width() -> tuple[int, bool]:
    from vramdoctor.render import console

    columns = console.width()
    return (PIPED_WIDTH, True) if columns is None else (columns, False)


def _paragraphs(doc: str) -> Iterator[tuple[bool, list[str]]]:
    """A docstring's blocks: (verbatim, lines). Verbatim blocks are indented (examples) or
    start with `vramdoctor `; the others are prose to reflow."""
    block: list[str] = []
    for line in [*inspect.cleandoc(doc).splitlines(), ""]:
        if line.strip():
            block.append(line)
            continue
        if block:
            verbatim = all(ln.startswith((" ", "\t")) for ln in block) or block[0].startswith(
                ("vramdoctor ", "$ ")
            )
            yield verbatim, block
            block = []


def _prose(text: str, width: int, indent: str = _INDENT) -> list[str]:
    room = max(10, width - cell_len(indent))
    return [indent + line.plain for line in wrap(Text(" ".join(text.split())), room)]


def _doc_lines(doc: str, width: int) -> list[str]:
    """A command's help text: prose wrapped, examples whole, one per line (no blank line
    between two examples)."""
    out: list[str] = []
    last_verbatim = False
    for verbatim, block in _paragraphs(doc):
        if verbatim:
            if out and not last_verbatim:
                out.append("")
            out.extend(_INDENT + ln.rstrip() for ln in block)
        else:
            if out:
                out.append("")
            out.extend(_prose(" ".join(block), width))
        last_verbatim = verbatim
    return out


def _records(rows: Iterable[tuple[str, str]], width: int) -> list[str]:
    """Two columns (names, help): names never broken; help wrapped beside them, or on the
    lines under them (indented) when the names are longer than the column."""
    items = list(rows)
    if not items:
        return []
    fitting = [cell_len(n) for n, _ in items if cell_len(n) <= _NAMES_MAX]
    names_width = max(fitting, default=_NAMES_MAX)
    lead = cell_len(_INDENT) + names_width + 2
    room = width - lead
    if room < 24:  # too narrow for two columns: help under the names
        lead, room = cell_len(_INDENT) * 3, max(10, width - cell_len(_INDENT) * 3)
        names_width = 0
    out: list[str] = []
    for names, text in items:
        help_lines = [ln.plain for ln in wrap(Text(" ".join(text.split())), room)] if text else []
        if names_width and cell_len(names) <= names_width:
            first = f"{_INDENT}{names}".ljust(lead) + (help_lines[0] if help_lines else "")
            out.append(first.rstrip())
            help_lines = help_lines[1:]
        else:
            out.append(f"{_INDENT}{names}")
        out.extend(" " * lead + ln for ln in help_lines)
    return out


def _option_rows(command: Any, ctx: Any, *, arguments: bool) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        is_argument = getattr(param, "param_type_name", "") == "argument"
        if is_argument != arguments:
            continue
        record = param.get_help_record(ctx)
        text = record[1] if record else ""
        if is_argument:
            names = str(record[0] if record else param.name or "").split(" ", 1)[0]
            names = names.upper() if names.islower() else names
        else:
            names = ", ".join([*param.opts, *param.secondary_opts])
            label = value_name(param, ctx)
            if label:
                names += f" {label}"
        rows.append((names, text or ""))
    return rows


def _short_help(command: Any) -> str:
    """A command's first help paragraph, whole (click's short help cuts it with "...")."""
    if getattr(command, "short_help", None):
        return str(command.short_help)
    for verbatim, block in _paragraphs(command.help or ""):
        if not verbatim:
            return " ".join(" ".join(block).split())
    return ""


def help_page(command: Any, ctx: Any, *, extra: Callable[[int], list[str]] | None = None) -> str:
    """The help page of `command` (a click command or group) in `ctx`, as plain text."""
    width, _piped = _width()
    pieces = " ".join(command.collect_usage_pieces(ctx))
    lines = [f"Usage: {ctx.command_path} {pieces}".rstrip(), ""]
    if command.help:
        lines += _doc_lines(command.help, width)
        lines.append("")
    arguments = _option_rows(command, ctx, arguments=True)
    if arguments:
        lines += ["Arguments:", *_records(arguments, width), ""]
    if hasattr(command, "list_commands"):
        rows = []
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                rows.append((name, _short_help(sub)))
        if rows:
            lines += ["Commands:", *_records(rows, width), ""]
    options = _option_rows(command, ctx, arguments=False)
    if options:
        lines += ["Options:", *_records(options, width), ""]
    if extra is not None:
        lines += extra(width)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def install(command: Any, *, extra: Callable[[int], list[str]] | None = None) -> Any:
    """Make `command` print `help_page` for --help (in place, once; returns it)."""
    if getattr(command, "_vramdoctor_help", False):
        return command

    def format_help(ctx: Any, formatter: Any) -> None:
        formatter.write(help_page(command, ctx, extra=extra))

    command.format_help = format_help
    command._vramdoctor_help = True
    return command
