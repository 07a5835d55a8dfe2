"""The terminal: one place that decides colour, width and plain output.

rich already honours NO_COLOR and drops styling when stdout is not a terminal; this module
adds the stderr console for messages and the JSON printer so stdout stays clean for --json.
"""

from __future__ import annotations

import json
import os
import sys
from functools import cache
from typing import Any

from rich.console import Console

from ..record import _json_default


def _color_system() -> str | None:
    if os.environ.get("NO_COLOR"):
        return None
    return "auto"


@cache
def stdout() -> Console:
    return Console(color_system=_color_system(), highlight=False, soft_wrap=False)  # type: ignore[arg-type]


@cache
def stderr() -> Console:
    return Console(stderr=True, color_system=_color_system(), highlight=False)  # type: ignore[arg-type]


def interactive() -> bool:
    """Live views and progress bars only on a real terminal."""
    return stderr().is_terminal and not os.environ.get("CI")


def print_json(obj: Any) -> None:
    """One JSON document on stdout, nothing else there."""
    sys.stdout.write(json.dumps(obj, default=_json_default, indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def error(message: str) -> None:
    """A one-line error on stderr (no traceback, no markup interpretation)."""
    stderr().print(f"vramdoctor: error: {message}", markup=False, style="bold red", soft_wrap=True)


def note(message: str) -> None:
    stderr().print(message, markup=False, style="dim", soft_wrap=True)
