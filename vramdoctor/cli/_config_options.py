"""Command-line options built from a config dataclass's fields, so each is written once.

A field whose metadata holds an `OptionDoc` (`vramdoctor.soak.config`) becomes a typer option
with that flag and help, the field's default and type (or `OptionDoc.cli_type`). `command`
gives a typer command the union of those options and the command's own parameters; the
function then receives every value as keywords and builds its config in one call
(`SoakConfig.from_options(options)`).

    @app.command("soak")
    @config_command(SoakConfig, extra=[param("json_out", bool, typer.Option(False, "--json"))])
    def soak_cmd(**options: Any) -> None: ...
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar, get_type_hints

import typer

__all__ = ["config_command", "config_params", "param"]

F = TypeVar("F", bound=Callable[..., Any])


def param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    """One command parameter (keyword), e.g. param("json_out", bool, typer.Option(False, "--json"))."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def config_params(
    cls: type[Any],
    *,
    only: Collection[str] | None = None,
    skip: Collection[str] = (),
    defaults: dict[str, Any] | None = None,
) -> list[inspect.Parameter]:
    """The typer options of `cls`'s fields that carry an `OptionDoc` (in field order), limited
    to `only`, without `skip`; `defaults` replaces a field's default on the command line."""
    hints = get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        doc = f.metadata.get("option")
        if doc is None or f.name in skip or (only is not None and f.name not in only):
            continue
        if doc.negate:
            annotation: Any = bool
            default: Any = False
        else:
            annotation = doc.cli_type if doc.cli_type is not None else hints[f.name]
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = ...
            if doc.cli_type is not None and isinstance(default, tuple):
                default = None  # a repeatable option: its parse supplies the default
        if defaults and f.name in defaults:
            default = defaults[f.name]
        if default == "":
            default = None  # typer shows no default for an unset string
            annotation = str | None
        option = typer.Option(
            default, doc.flag, help=doc.help, hidden=doc.hidden, metavar=doc.metavar
        )
        out.append(param(f.name, annotation, option))
    return out


def config_command(
    cls: type[Any],
    *,
    extra: Sequence[inspect.Parameter] = (),
    only: Collection[str] | None = None,
    skip: Collection[str] = (),
    defaults: dict[str, Any] | None = None,
) -> Callable[[F], F]:
    """Give a `def cmd(**options)` the options of `cls` (see `config_params`) and `extra`, for
    typer to read; `cmd` then gets every value as a keyword."""
    params = [*config_params(cls, only=only, skip=skip, defaults=defaults), *extra]

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def command(**options: Any) -> Any:
            return fn(**options)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return wrap
