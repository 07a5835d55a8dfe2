"""The terminal: one place that decides colour, width and plain output, and what may reach it.

rich already honours NO_COLOR and drops styling when stdout is not a terminal; this module
adds the stderr console for messages and the JSON printer so stdout stays clean for --json.

Width (one rule for every command, `width()`): `vramdoctor --width N` (any position on the
command line), else COLUMNS, else the terminal's own width; with none of these (stdout piped)
the console is *unbounded*: tables (`vramdoctor.render.table`) take their full content width
and sentences are not wrapped at all, so nothing is cut at rich's 80-column default for a pipe.

Nothing is ever cut: `SafeConsole.print` never crops a line at the console's width, and wraps
sentences by `vramdoctor.render.wrap`'s rules: never inside a word (a word longer than the line
overflows it, whole), never between a number and its unit ("0.0 MiB", not "0.0" / "MiB").

Every byte a command writes goes through here, so this is the choke point for safety:
`SafeConsole` redacts secrets and escapes control characters (ESC, CSI, C1, bidi overrides:
shown as `\\x1b`, never executed) in all text it renders, strings and rich renderables alike
(tables, live views); `print_json` redacts every string of the document (JSON escapes control
characters itself, so the values stay exact). One-line messages (`error`, `note`) show a
newline inside a value as `\\n` (`vramdoctor.redact.one_line`). On a terminal or file whose
encoding is not UTF-8 (a Latin-1 locale) every glyph that encoding cannot carry gets an ASCII
stand-in (sparkline blocks, arrows, ellipsis, box lines), never a UnicodeEncodeError. Rules:
`vramdoctor.redact`, docs/threat-model.md.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
import unicodedata
from collections.abc import Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

from vramdoctor.record import _json_default
from vramdoctor.redact import one_line, redact_obj, safe_text
from vramdoctor.render.wrap import Paragraph

__all__ = [
    "MAX_WIDTH",
    "MIN_WIDTH",
    "SafeConsole",
    "ascii_fallback",
    "error",
    "interactive",
    "interrupted",
    "make_console",
    "note",
    "print_json",
    "set_width",
    "stderr",
    "stdout",
    "unbounded",
    "width",
]

MIN_WIDTH = 20
"""The narrowest `--width` accepted, in columns."""
MAX_WIDTH = 10_000
"""The widest `--width` accepted, in columns."""

_explicit_width: int | None = None

# Glyphs the project (and rich's live views) print, with an ASCII stand-in for a console whose
# encoding cannot carry them. Anything else unencodable: its ASCII decomposition, else "?".
_ASCII = {
    **dict.fromkeys("▁▂", "_"),
    **dict.fromkeys("▃▄", "-"),
    **dict.fromkeys("▅▆", "="),
    **dict.fromkeys("▇█", "#"),
    "…": "...",
    "→": "->",
    "←": "<-",
    "⇒": "=>",
    "↑": "^",
    "↓": "v",
    "−": "-",
    "–": "-",
    "—": "--",
    "≈": "~",
    "≤": "<=",
    "≥": ">=",
    "×": "x",
    "±": "+/-",
    "µ": "u",
    "·": ".",
    "•": "*",
    "✓": "ok",
    "✗": "x",
    "‘": "'",
    "’": "'",
    "“": '"',
    "”": '"',
    "━": "-",
    "─": "-",
    "═": "=",
    "│": "|",
    "┃": "|",
    "╸": "-",
    "╺": "-",
}


def ascii_fallback(text: str, encoding: str) -> str:
    """`text` with every character `encoding` cannot carry replaced by an ASCII stand-in
    ("▁▃▅▇" -> "_-=#", "…" -> "...", "→" -> "->"); unchanged when it can carry them all."""
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        pass
    out: list[str] = []
    for ch in text:
        try:
            ch.encode(encoding)
            out.append(ch)
        except (UnicodeEncodeError, LookupError):
            stand_in = _ASCII.get(ch)
            if stand_in is None:
                decomposed = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore")
                stand_in = decomposed.decode() or "?"
            out.append(stand_in)
    return "".join(out)


def _utf(encoding: str) -> bool:
    try:
        return codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return False


class SafeConsole(Console):
    """A rich Console whose output never carries a secret or a live control sequence, and
    never loses a character (module docstring).

    Strings are cleaned before layout (`render_str`); every rendered segment is cleaned again
    (`render`), which covers `Text` objects and tables built by reports. Segments rich marks as
    control (cursor moves of a live view) are rich's own and kept.

    `unbounded` is True for a console with no width of its own to keep (stdout piped, no
    --width, no COLUMNS): tables lay out at their content width and sentences do not wrap.
    """

    unbounded: bool = False

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(safe_text(text), **kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterator[Segment]:
        encoding = self.encoding
        plain_ascii = not _utf(encoding)
        for segment in super().render(renderable, options):
            if segment.control or not segment.text:
                yield segment
                continue
            clean = safe_text(segment.text)
            if plain_ascii and not clean.isascii():
                clean = ascii_fallback(clean, encoding)
            yield segment if clean == segment.text else Segment(clean, segment.style, None)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """rich's print, except that nothing is lost: lines are never cropped at the width,
        and sentences (str and Text arguments) wrap by `vramdoctor.render.wrap`'s rules (a
        number stays with its unit, a word is never folded), or not at all when unbounded."""
        kwargs.setdefault("crop", False)
        if (
            not objects
            or kwargs.get("soft_wrap")
            or not all(isinstance(o, (str, Text)) for o in objects)
        ):
            super().print(*objects, **kwargs)
            return
        texts = [
            self.render_str(
                o,
                markup=kwargs.get("markup"),
                highlight=kwargs.get("highlight"),
                emoji=kwargs.get("emoji"),
            )
            if isinstance(o, str)
            else o
            for o in objects
        ]
        joined = Text(kwargs.pop("sep", " ")).join(texts)
        if not self.unbounded:
            wide = kwargs.pop("width", None)
            columns = self.width if wide is None else min(wide, self.width)
            joined = Text("\n").join(Paragraph(joined).lines(columns))
        kwargs["soft_wrap"] = True
        kwargs["markup"] = False
        super().print(joined, **kwargs)


def set_width(columns: int | None) -> None:
    """The width every console keeps from now on (`vramdoctor --width N`), in columns; None
    returns to the default rule (COLUMNS, the terminal, unbounded when piped). Also sets
    COLUMNS, so child processes and help pages use the same width."""
    global _explicit_width
    _explicit_width = columns
    if columns is None:
        return
    os.environ["COLUMNS"] = str(columns)
    for con in _consoles.values():
        con.width = columns
        con.unbounded = False


def width() -> int | None:
    """The width output keeps, in columns: --width, else COLUMNS, else stdout's terminal
    width; None when stdout is piped with neither (unbounded)."""
    if _explicit_width is not None:
        return _explicit_width
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    con = stdout()
    return None if con.unbounded else con.width


def unbounded(con: Console) -> bool:
    """True when `con` has no width to keep (see `SafeConsole.unbounded`)."""
    return bool(getattr(con, "unbounded", False))


def make_console(**kwargs: Any) -> SafeConsole:
    """A SafeConsole with the project's colour and width rules (NO_COLOR, --width); for report
    files too (`make_console(record=True, width=140)` then `export_text()` / `export_html()`).
    Without a `width` and not on a terminal (piped), it is unbounded."""
    kwargs.setdefault("color_system", _color_system())
    kwargs.setdefault("highlight", False)
    given_width = kwargs.get("width") is not None
    if not given_width and _explicit_width is not None:
        kwargs["width"] = _explicit_width
        given_width = True
    con = SafeConsole(**kwargs)
    columns = os.environ.get("COLUMNS", "")
    con.unbounded = not (given_width or con.is_terminal or (columns.isdigit() and int(columns) > 0))
    return con


def _color_system() -> str | None:
    if os.environ.get("NO_COLOR"):
        return None
    return "auto"


_consoles: dict[str, SafeConsole] = {}


def stdout() -> SafeConsole:
    """The console for a command's output (stdout)."""
    con = _consoles.get("stdout")
    if con is None:
        con = _consoles["stdout"] = make_console(soft_wrap=False)
    return con


def stderr() -> SafeConsole:
    """The console for messages, progress and live views (stderr)."""
    con = _consoles.get("stderr")
    if con is None:
        con = _consoles["stderr"] = make_console(stderr=True)
    return con


def _reset() -> None:
    """Forget the consoles made so far (a changed NO_COLOR, width or stream is read again)."""
    global _explicit_width
    _consoles.clear()
    _explicit_width = None


def interactive() -> bool:
    """Live views and progress bars only on a real terminal."""
    return stderr().is_terminal and not os.environ.get("CI")


def print_json(obj: Any) -> None:
    """One JSON document on stdout, nothing else there; every string redacted."""
    plain = json.loads(json.dumps(obj, default=_json_default, allow_nan=False))
    sys.stdout.write(json.dumps(redact_obj(plain), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def error(message: str) -> None:
    """A one-line error on stderr (no traceback, no markup interpretation; a newline inside
    the message is shown as `\\n`)."""
    stderr().print(
        f"vramdoctor: error: {one_line(message)}", markup=False, style="bold red", soft_wrap=True
    )


def note(message: str) -> None:
    """A one-line note on stderr, dim (a newline inside the message is shown as `\\n`)."""
    stderr().print(one_line(message), markup=False, style="dim", soft_wrap=True)


def interrupted(message: str = "interrupted") -> None:
    """The one line of a Ctrl-C, in every command: `vramdoctor: interrupted` (or a message
    that starts so and says what was kept)."""
    stderr().print(f"vramdoctor: {one_line(message)}", markup=False, style="bold", soft_wrap=True)
