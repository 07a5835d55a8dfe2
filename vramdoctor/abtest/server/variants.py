"""The variants of `ab-test --server CMD`: the same launch, each with one change.

    --variant NAME=CHANGE     (repeat a NAME to give it several changes)

CHANGE is one of:

- `--flag [VALUE ...]` (shell words that start with "-"): arguments added; a `--flag` the command
  already has gets the new value instead (`--mem-fraction-static 0.8` replaces 0.88);
- `ENV=VALUE` (an upper-case name): an environment variable set, e.g. `MALLOC_ARENA_MAX=2`,
  `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`;
- `drop:--flag`: the argument removed, with its value when one follows;
- `unset:ENV`: the environment variable removed;
- `args:WORDS` / `env:NAME=VALUE`: the explicit spellings of the first two.

`--preset NAME` adds a named variant of the server's kind (`vramdoctor.servers.presets`, found
from the command line: SGLang, vLLM, or any OpenAI-compatible server). The baseline (the command
as given) always runs first and again last (`baseline-again`), to see drift.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vramdoctor.errors import InputError
from vramdoctor.servers.presets import Preset

__all__ = [
    "BASELINE",
    "BASELINE_AGAIN",
    "Change",
    "ServerVariant",
    "apply_args",
    "build_variants",
    "kind_of_command",
    "parse_variant",
    "presets_for",
]

BASELINE = "baseline"
BASELINE_AGAIN = "baseline-again"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


@dataclass(frozen=True)
class Change:
    """What a variant changes in the launch: arguments added (or their value replaced),
    arguments removed, environment variables set and removed."""

    add_args: tuple[str, ...] = ()
    remove_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    unset_env: tuple[str, ...] = ()

    def __add__(self, other: Change) -> Change:
        return Change(
            self.add_args + other.add_args,
            self.remove_args + other.remove_args,
            MappingProxyType({**self.env, **other.env}),
            self.unset_env + other.unset_env,
        )

    @property
    def empty(self) -> bool:
        return not (self.add_args or self.remove_args or self.env or self.unset_env)

    def describe(self) -> str:
        """The change in one line ("--disable-fast-image-processor; MALLOC_ARENA_MAX=2")."""
        parts = [shlex.join(self.add_args)] if self.add_args else []
        parts += [f"without {a}" for a in self.remove_args]
        parts += [f"{k}={v}" for k, v in self.env.items()]
        parts += [f"unset {k}" for k in self.unset_env]
        return "; ".join(parts) or "the command as given"

    def to_dict(self) -> dict[str, Any]:
        return {
            "add_args": list(self.add_args),
            "remove_args": list(self.remove_args),
            "env": dict(self.env),
            "unset_env": list(self.unset_env),
        }


@dataclass(frozen=True)
class ServerVariant:
    """One launch of the experiment: its `name`, its `change` to the base command, what it is
    (`description`) and costs (`trades`, from a preset), and the `preset` it came from."""

    name: str
    change: Change
    description: str = ""
    trades: str = ""
    preset: str | None = None

    @property
    def is_baseline(self) -> bool:
        return self.name in (BASELINE, BASELINE_AGAIN)

    def argv(self, base: Sequence[str]) -> tuple[str, ...]:
        """The variant's command line."""
        return apply_args(base, self.change)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "change": self.change.describe(),
            "changes": self.change.to_dict(),
            "description": self.description,
            "trades": self.trades,
            "preset": self.preset,
        }


def parse_variant(text: str) -> tuple[str, Change]:
    """`NAME=CHANGE` -> (name, change). Raises InputError (one line) for anything else."""
    name, sep, change = text.partition("=")
    name = name.strip()
    if not sep or not change.strip():
        raise InputError(
            f"--variant {text!r}: give NAME=CHANGE, e.g. fast-off=--disable-fast-image-processor "
            "or arena2=MALLOC_ARENA_MAX=2"
        )
    if not _NAME.match(name) or name in (BASELINE, BASELINE_AGAIN):
        raise InputError(
            f"--variant {text!r}: the name must be letters, digits, '.', '_' or '-' (and not "
            f"{BASELINE!r}, which always runs)"
        )
    return name, _parse_change(change.strip(), text)


def _words(value: str, text: str) -> tuple[str, ...]:
    try:
        words = tuple(shlex.split(value))
    except ValueError as exc:
        raise InputError(f"--variant {text!r}: {exc}") from None
    if not words:
        raise InputError(f"--variant {text!r}: nothing after the prefix")
    return words


def _parse_change(change: str, text: str) -> Change:
    if change.startswith("args:"):
        return Change(add_args=_words(change[5:], text))
    if change.startswith("drop:"):
        return Change(remove_args=_words(change[5:], text))
    if change.startswith("unset:"):
        names = _words(change[6:], text)
        for n in names:
            if not _ENV_NAME.match(n):
                raise InputError(f"--variant {text!r}: {n!r} is not an environment variable name")
        return Change(unset_env=names)
    if change.startswith("env:"):
        change = change[4:]
    elif change.startswith("-"):
        return Change(add_args=_words(change, text))
    key, sep, value = change.partition("=")
    if sep and _ENV_NAME.match(key):
        return Change(env=MappingProxyType({key: value}))
    raise InputError(
        f"--variant {text!r}: CHANGE is arguments (--flag VALUE), ENV=VALUE, drop:--flag or "
        "unset:ENV"
    )


def _flag_name(word: str) -> str | None:
    """`--flag` of `--flag` or `--flag=value`; None for a value."""
    if word.startswith("--") and len(word) > 2:
        return word.split("=", 1)[0]
    return None


def _takes_value(argv: Sequence[str], i: int) -> bool:
    """Whether the word after the flag at `i` is its value (it does not start with '-')."""
    return "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("-")


def _remove(argv: list[str], flag: str) -> tuple[list[str], bool]:
    out: list[str] = []
    found = False
    i = 0
    while i < len(argv):
        if _flag_name(argv[i]) == flag or argv[i] == flag:
            found = True
            i += 2 if _takes_value(argv, i) else 1
            continue
        out.append(argv[i])
        i += 1
    return out, found


def apply_args(base: Sequence[str], change: Change) -> tuple[str, ...]:
    """`base` with `change`'s arguments: removed ones dropped (with their value), added ones
    appended, or replacing the same `--flag` (and its value) where the command has it already.
    Raises InputError when an argument to remove is not in the command."""
    argv = list(base)
    for flag in change.remove_args:
        argv, found = _remove(argv, flag)
        if not found:
            raise InputError(f"drop:{flag}: the server's command has no {flag}")
    add = list(change.add_args)
    i = 0
    while i < len(add):
        name = _flag_name(add[i])
        n = 2 if name is not None and _takes_value(add, i) else 1
        group = add[i : i + n]
        if name is not None:
            argv, found = _remove(argv, name)
        argv += group
        i += n
    return tuple(argv)


def kind_of_command(argv: Sequence[str]) -> str:
    """The server kind a command line starts ("sglang", "vllm", or "openai": any other)."""
    from vramdoctor import servers

    found = servers.title_of(None, list(argv))
    return found.kind if found is not None else "openai"


def presets_for(kind: str) -> tuple[Preset, ...]:
    """The named presets of a server kind (`ServerKind.presets`)."""
    from vramdoctor import servers

    try:
        return servers.get(kind).presets
    except KeyError:
        return ()


def _from_preset(p: Preset) -> ServerVariant:
    return ServerVariant(
        p.name,
        Change(p.add_args, p.remove_args, p.env, p.unset_env),
        p.description,
        p.trades,
        p.name,
    )


def build_variants(
    base: Sequence[str], variants: Sequence[str] = (), preset_names: Sequence[str] = ()
) -> tuple[list[ServerVariant], str]:
    """The experiment's launches in order: baseline, the presets asked for, the --variant ones
    (in the order first given), baseline-again; and the server kind. Raises InputError for an
    unknown preset (naming the kind's presets), a name given twice, or a change that does not
    apply to the command (a drop: of a flag it does not have)."""
    kind = kind_of_command(base)
    known = {p.name: p for p in presets_for(kind)}
    out: list[ServerVariant] = [ServerVariant(BASELINE, Change(), "the command as given")]
    seen: set[str] = {BASELINE, BASELINE_AGAIN}
    for name in preset_names:
        preset = known.get(name)
        if preset is None:
            names = ", ".join(known) or "none"
            raise InputError(f"--preset {name!r}: the {kind} presets are {names}")
        if name in seen:
            raise InputError(f"--preset {name!r} given twice")
        seen.add(name)
        out.append(_from_preset(preset))
    own: dict[str, Change] = {}
    for text in variants:
        name, change = parse_variant(text)
        if name in seen and name not in own:
            raise InputError(f"--variant {name!r}: a preset of that name is already in the run")
        own[name] = own.get(name, Change()) + change
    for name, change in own.items():
        seen.add(name)
        out.append(ServerVariant(name, change, change.describe()))
    if len(out) == 1:
        raise InputError(
            "ab-test --server: give at least one --variant NAME=CHANGE or --preset NAME "
            f"({kind} presets: {', '.join(known) or 'none'})"
        )
    for v in out:
        apply_args(base, v.change)  # a drop: that does not apply is an error now, not later
    out.append(ServerVariant(BASELINE_AGAIN, Change(), "the baseline again, last: drift"))
    return out, kind
