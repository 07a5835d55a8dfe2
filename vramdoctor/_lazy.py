"""PEP 562 lazy attributes for the public packages: one implementation for every `__getattr__`.

A package lists its public names with the module that defines each (``{"SoakConfig": ".config"}``)
and forwards its module-level ``__getattr__``/``__dir__`` here, so ``import vramdoctor`` (and the
CLI's ``--help``) loads no numpy, requests or psutil until a name that needs them is used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Mapping
from typing import Any


def load(package: str, name: str, names: Mapping[str, str], submodules: Iterable[str] = ()) -> Any:
    """The value of `package.name`, imported on first use and cached in the package.

    `names` maps a public name to its module, relative to `package` (a leading dot is optional);
    `submodules` are subpackages returned as modules. Raises AttributeError for anything else.
    """
    if name in names:
        module = names[name]
        value = getattr(
            importlib.import_module(module if module.startswith(".") else f".{module}", package),
            name,
        )
        setattr(sys.modules[package], name, value)
        return value
    if name in submodules:
        return importlib.import_module(f".{name}", package)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


def listing(namespace: Mapping[str, Any], *groups: Iterable[str]) -> list[str]:
    """`dir()` of a lazy package: what is already loaded plus every lazy name."""
    out = set(namespace)
    for group in groups:
        out.update(group)
    return sorted(out)
