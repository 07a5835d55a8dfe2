"""The modes, one module per mode family; a module lists its classes in `MODES`.

Adding a mode is adding a file here and its name to `BUILTIN` (the order is the order of
`--mode`'s choices and of the README's table). `register(cls)` adds one from outside.
"""

from __future__ import annotations

import importlib

from refserver.modes.base import Mode

BUILTIN = (
    "plain",
    "leaking",
    "fixed",
    "stable",
    "kv_leaking",
    "arena",
    "pinned",
    "worker_churn",
    "retention",
    "converging",
    "background",
    "vram_leaking",
    "tenant",
    "restart",
    "lifecycle_leaks",
    "feature_leaks",
)

_extra: list[type[Mode]] = []


def register(cls: type[Mode]) -> None:
    """Add a mode class (its `name` must be new)."""
    if cls.name in modes():
        raise ValueError(f"mode {cls.name!r} exists")
    _extra.append(cls)


def modes() -> dict[str, type[Mode]]:
    """name -> Mode class, built-in modes first in `BUILTIN` order, then registered ones."""
    out: dict[str, type[Mode]] = {}
    for module in BUILTIN:
        for cls in importlib.import_module(f"refserver.modes.{module}").MODES:
            out[cls.name] = cls
    for cls in _extra:
        out[cls.name] = cls
    return out


__all__ = ["BUILTIN", "Mode", "modes", "register"]
