"""Optional dependencies: import them where they are used, with the install line when missing.

The base install (`pip install vramdoctor`) runs soak, diagnose, census and report. Charts need
the `charts` extra (matplotlib, ~75 MB); ab-test and `vramdoctor.fixes` need the `gpu` extra
(torch, transformers). Code that needs one calls `require` at the point of use:

    plt_module = require("matplotlib", extra="charts", what="the --report chart")

and a user without it gets one line and exit code 2 (`MissingExtra`), not a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from vramdoctor.errors import MissingExtra

# The import name of each optional module -> the extra that installs it.
EXTRA_OF = {"matplotlib": "charts", "torch": "gpu", "torchvision": "gpu", "transformers": "gpu"}


def available(module: str) -> bool:
    """True when `module` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, *, what: str, extra: str | None = None) -> ModuleType:
    """Import `module`, or raise `MissingExtra` naming the extra that installs it.

    `what` says what needed it ("the --report chart"); `extra` defaults to the module's
    extra in `EXTRA_OF`. Raises MissingExtra (exit code 2) when the import fails.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            what, module.split(".")[0], extra or EXTRA_OF.get(module.split(".")[0], "gpu")
        ) from None
