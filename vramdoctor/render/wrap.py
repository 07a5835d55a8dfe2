"""Where a line may break: between words, never inside one, never between a number and its unit.

rich wraps at spaces but folds a word longer than the line in the middle (`INCONCL` / `USIVE`,
`--kubernetes-virt` / `ual-gpus`) and happily ends a line after `0.0` with `MiB` on the next.
Every text vramdoctor wraps (table cells, sentences, help pages) uses these rules instead:

- `unit_words(text)`: the unbreakable words, a number and its unit joined ("412.0 MiB",
  "+3.1 MiB/hour", "6 minutes", "12.5 %", "1,920 tokens");
- `wrap(text, width)`: greedy lines of at most `width` cells, broken only between those words;
  a word wider than the line stands alone on its line, whole (it overflows; nothing is cut);
- `Paragraph(text)`: a rich renderable that wraps with these rules at the width it is given
  (inside a Panel or a Group), and not at all on an unbounded console (stdout piped).
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.text import Text

__all__ = ["Paragraph", "unit_words", "wrap"]

# The words that are a number's unit: a number followed by one of these (and a space) is one
# unbreakable word. Sizes, counts, times, rates (`MiB/hour`, `tokens/request`), percent.
_UNITS = (
    r"(?:[KMGTP]i?B|B|bytes?|tokens?|requests?|rounds?|errors?|points?|series|samples?|"
    r"GPUs?|processes|process|procs|pids?|files?|lines?|cycles?|variants?|entries|"
    r"ms|µs|us|ns|s|sec|seconds?|minutes?|min|hours?|h|days?|d|weeks?|months?|years?|"
    r"x|%|°C|W|MHz|GHz|req/s|rps|columns?)"
)
_NUMBER = r"[+\-−~≈<>]?\d[\d,]*(?:\.\d+)?(?:e[+\-]?\d+)?"
# A number, one space, a unit word (optionally /something), and any closing punctuation.
GLUED = re.compile(rf"(?<![\w.]){_NUMBER} {_UNITS}(?:/[\w-]+)*(?![\w/])[)\].,;:!?]*")
_WORD = re.compile(r"\S+")
_INDENT = re.compile(r"[ \t]*")


def unit_words(text: str) -> list[tuple[int, int]]:
    """The unbreakable words of `text` as (start, end) offsets: runs of non-space characters,
    with a number and its unit joined into one ("412.0 MiB", "+3.1 MiB/hour", "6 minutes").

    The only places a line may break are the spaces between two such words.
    """
    glued = [(m.start(), m.end()) for m in GLUED.finditer(text)] if _has_digit(text) else []
    out: list[tuple[int, int]] = []
    gi = 0
    for m in _WORD.finditer(text):
        start, end = m.start(), m.end()
        while gi < len(glued) and glued[gi][1] <= start:
            gi += 1
        if out and gi < len(glued) and glued[gi][0] < start < glued[gi][1]:
            prev_start, _ = out.pop()  # this word ends a pair that began in the previous one
            out.append((prev_start, max(end, glued[gi][1])))
            continue
        out.append((start, end))
    return out


def _has_digit(text: str) -> bool:
    return any(c.isdigit() for c in text)


def wrap(text: Text, width: int | None, *, keep_indent: bool = False) -> list[Text]:
    """`text` (one line: no newline) as lines of at most `width` cells (None: one line),
    broken only between `unit_words`; a word wider than `width` stands alone on its line,
    whole. Leading and trailing spaces are dropped, unless `keep_indent`: then the first line
    keeps its leading spaces and the lines after it start with the same indent."""
    plain = text.plain
    words = unit_words(plain)
    if not words:
        return [Text("")]
    indent = _INDENT.match(plain).group(0) if keep_indent else ""  # type: ignore[union-attr]
    first_start = 0 if keep_indent else words[0][0]
    if width is None or cell_len(plain[first_start : words[-1][1]]) <= width:
        return [text[first_start : words[-1][1]]]
    lines: list[Text] = []
    line_start, line_end = first_start, words[0][1]
    lead = 0  # cells of indent in front of the current line's slice
    for start, end in words[1:]:
        if lead + cell_len(plain[line_start:end]) <= width:
            line_end = end
            continue
        lines.append(text[line_start:line_end])
        line_start, line_end, lead = start, end, cell_len(indent)
    lines.append(text[line_start:line_end])
    if indent:
        lines[1:] = [Text(indent) + line for line in lines[1:]]
    return lines


class Paragraph:
    """Text that wraps by `wrap`'s rules at the width rich gives it (each of its lines with
    its own indent kept), and not at all on an unbounded console (stdout piped)."""

    def __init__(self, text: str | Text) -> None:
        self.text = text if isinstance(text, Text) else Text(text)

    def lines(self, width: int | None) -> list[Text]:
        out: list[Text] = []
        for line in self.text.split("\n", allow_blank=True):
            out.extend(wrap(line, width, keep_indent=True))
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from vramdoctor.render.console import unbounded

        width = None if unbounded(console) else options.max_width
        for line in self.lines(width):
            flat = Text()  # the line's base style as its first span: Text.render drops it
            flat.append_text(line)
            yield from flat.render(console)
            yield Segment.line()

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        plain = self.text.plain
        longest_word = max((cell_len(plain[s:e]) for s, e in unit_words(plain)), default=0)
        longest_line = max((cell_len(line) for line in plain.split("\n")), default=0)
        return Measurement(
            min(longest_word, options.max_width), min(longest_line, options.max_width)
        )
