"""The terminal: one place that decides colour, width and plain output, and what may reach it.

rich already honours NO_COLOR and drops styling when stdout is not a terminal; this module
adds the stderr console for messages and the JSON printer so stdout stays clean for --json.

Every byte a command writes goes through here, so this is the choke point for safety:
`SafeConsole` redacts secrets and escapes control characters (ESC, CSI, C1, bidi overrides:
shown as `\x1b`, never executed) in all text it renders, strings and rich renderables alike
(tables, live views); `print_json` redacts every string of the document (JSON escapes control
characters itself, so the values stay exact). Rules: `vramdoctor.redact`, docs/threat-model.md.
"""

from __future__ import annotations

import json
import os
import sys
from functools import cache
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

from vramdoctor.record import _json_default
from vramdoctor.redact import redact_obj, safe_text


class SafeConsole(Console):
    """A rich Console whose output never carries a secret or a live control sequence.

    Strings are cleaned before layout (`render_str`); every rendered segment is cleaned again
    (`render`), which covers `Text` objects and tables built by reports. Segments rich marks as
    control (cursor moves of a live view) are rich's own and kept.
    """

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(safe_text(text), **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Any:
        for segment in super().render(renderable, options):
            if segment.control or not segment.text:
                yield segment
            else:
                clean = safe_text(segment.text)
                yield segment if clean == segment.text else Segment(clean, segment.style, None)


def make_console(**kwargs: Any) -> Console:
    """A SafeConsole with the project's colour rule (NO_COLOR); for report files too
    (`make_console(record=True, width=140)` then `export_text()` / `export_html()`)."""
    kwargs.setdefault("color_system", _color_system())
    kwargs.setdefault("highlight", False)
    return SafeConsole(**kwargs)


def _color_system() -> str | None:
    if os.environ.get("NO_COLOR"):
        return None
    return "auto"


@cache
def stdout() -> Console:
    return make_console(soft_wrap=False)


@cache
def stderr() -> Console:
    return make_console(stderr=True)


def interactive() -> bool:
    """Live views and progress bars only on a real terminal."""
    return stderr().is_terminal and not os.environ.get("CI")


def print_json(obj: Any) -> None:
    """One JSON document on stdout, nothing else there; every string redacted."""
    plain = json.loads(json.dumps(obj, default=_json_default, allow_nan=False))
    sys.stdout.write(json.dumps(redact_obj(plain), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def error(message: str) -> None:
    """A one-line error on stderr (no traceback, no markup interpretation)."""
    stderr().print(f"vramdoctor: error: {message}", markup=False, style="bold red", soft_wrap=True)


def note(message: str) -> None:
    stderr().print(message, markup=False, style="dim", soft_wrap=True)
