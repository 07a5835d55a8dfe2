"""The library surface: what each public package exports, and what importing it costs.

httpx's and click's habits: `__all__` is exactly the public names a module has (nothing public
left out, nothing listed that is not there), and importing the package root or the CLI does not
load the heavy libraries (numpy, scipy, matplotlib, PIL, requests, psutil, torch): a server that
imports `vramdoctor.fixes`, and `vramdoctor --help`, pay only for what they use.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import vramdoctor

ROOT = Path(__file__).resolve().parents[2]

# Not library API: the command line and the report layer are faces over the library; the agent's
# `pythonpath` directory is put on a server's PYTHONPATH, not imported as a package; rules are
# found through their registry.
NOT_PUBLIC = {
    "vramdoctor.cli",
    "vramdoctor.report",
    "vramdoctor.agent.pythonpath",
    "vramdoctor.diagnose.rules",
}

# Modules (not packages) whose names are part of the API.
PUBLIC_MODULES = ["vramdoctor.units", "vramdoctor.errors"]

HEAVY = ("numpy", "scipy", "matplotlib", "PIL", "requests", "psutil", "torch", "transformers")


def _public_packages() -> list[str]:
    found = ["vramdoctor"]
    for info in pkgutil.walk_packages(vramdoctor.__path__, "vramdoctor."):
        name = info.name
        if not info.ispkg or any(part.startswith("_") for part in name.split(".")):
            continue
        if any(name == p or name.startswith(p + ".") for p in NOT_PUBLIC):
            continue
        found.append(name)
    return sorted(found)


PUBLIC = _public_packages() + PUBLIC_MODULES


def _exported(module: types.ModuleType) -> set[str]:
    """Public names a module has: not underscored, not a submodule, not `from __future__`."""
    names = set(dir(module))
    out = set()
    for name in names:
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            continue
        if name == "annotations" and type(value).__name__ == "_Feature":
            continue
        if name == "TYPE_CHECKING":
            continue
        origin = getattr(value, "__module__", None)
        if (
            isinstance(origin, str)
            and not origin.startswith("vramdoctor")
            and (isinstance(value, type) or callable(value) or origin == "typing")
        ):
            continue  # a helper imported from elsewhere (Path, Any), not a re-export of ours
        out.add(name)
    return out


def test_the_public_packages_are_the_expected_ones() -> None:
    # A new subpackage is public unless listed in NOT_PUBLIC: then it needs an __all__ below.
    for expected in ("vramdoctor", "vramdoctor.fixes", "vramdoctor.diagnose", "vramdoctor.sources"):
        assert expected in PUBLIC


@pytest.mark.parametrize("name", PUBLIC)
def test_all_is_exactly_what_the_module_exports(name: str) -> None:
    module = importlib.import_module(name)
    declared = getattr(module, "__all__", None)
    assert declared is not None, f"{name} declares no __all__"
    assert len(declared) == len(set(declared)), f"{name}.__all__ lists a name twice"
    missing = [n for n in declared if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists names it does not have: {missing}"
    undeclared = sorted(_exported(module) - set(declared) - {"__version__"})
    assert not undeclared, (
        f"{name} exports names missing from __all__ (add them or underscore them): {undeclared}"
    )


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_documented(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    for attr in module.__all__:
        value = getattr(module, attr)
        if (
            callable(value)
            and not isinstance(value, type(ImportError))
            and getattr(value, "__module__", "").startswith("vramdoctor")
        ):
            assert value.__doc__, f"{name}.{attr} has no docstring"


def test_the_root_reaches_subpackages_lazily() -> None:
    code = (
        "import sys, vramdoctor\n"
        "assert 'vramdoctor.fixes' not in sys.modules\n"
        "assert callable(vramdoctor.fixes.request_scoped_pool)\n"
        "assert vramdoctor.GpuSample.__module__ == 'vramdoctor.samples'\n"
        "assert vramdoctor.read_run.__module__ == 'vramdoctor.record'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(AttributeError):
        vramdoctor.no_such_name  # noqa: B018


def _loaded_after(code: str) -> set[str]:
    """Top-level modules loaded by running `code` in a fresh interpreter."""
    probe = (
        code
        + "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "code",
    [
        "import vramdoctor",
        "import vramdoctor.cli",
        "import vramdoctor.fixes",
        "from vramdoctor.cli import main\nimport contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    main(['--help'])",
    ],
    ids=["root", "cli", "fixes", "help"],
)
def test_import_does_not_load_heavy_libraries(code: str) -> None:
    heavy = sorted(_loaded_after(code) & set(HEAVY))
    assert not heavy, f"{code!r} loads {heavy}: import them inside the function that needs them"
