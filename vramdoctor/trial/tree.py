"""Where a trial finds what it runs: files of the source tree (a clone), never downloaded."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path
from types import ModuleType

from vramdoctor.errors import SourceUnavailable

__all__ = ["ROOT", "TrialUnavailable", "free_port", "load_module", "source_file"]

ROOT = Path(__file__).resolve().parents[2]
"""The tree holding this package: the clone for an editable install, site-packages' parent
for a copy (`pip install .`), where examples/ and tests/ are not."""

CLONE_HINT = (
    "git clone https://github.com/vramdoctor/vramdoctor && cd vramdoctor && "
    "python3 -m pip install -e . && vramdoctor try watch"
)


class TrialUnavailable(SourceUnavailable):
    """A trial cannot run here: a file of the source tree or a tool it needs is missing.
    Exit 2; the message names what is missing and how to get it."""


def source_file(relative: str) -> Path:
    """`relative` inside the source tree: the tree this package was installed from (an
    editable install), else the clone you are in (the current folder or one above it: `pip
    install .` copies the package, not examples/ or tests/). TrialUnavailable when neither
    has it (installed from a wheel, run elsewhere): the trials run from a clone."""
    cwd = Path.cwd()
    for base in (ROOT, cwd, *cwd.parents):
        path = base / relative
        if path.is_file():
            return path
    raise TrialUnavailable(
        f"vramdoctor try runs from a clone of the source ({relative} is neither under {ROOT} "
        f"nor under {cwd}): {CLONE_HINT}"
    )


def load_module(relative: str, name: str) -> ModuleType:
    """A Python file of the source tree (a fixture generator) as a module."""
    path = source_file(relative)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TrialUnavailable(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
