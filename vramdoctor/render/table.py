"""The one table renderer every command uses: nothing is ever cut, at any width or in a pipe.

A rich `Table` ends an over-long word with "…" or folds it mid-word (`INCONCL` / `USIVE`), and
splits a number from its unit (`0.0` / `MiB`). This table never does either:

- cells wrap only at spaces, and a number stays with its unit (`+2,100.1 MiB`, `3 days`,
  `12.5 %`, `1,920 tokens`): a column is never narrower than its longest such word;
- when the columns do not fit, the columns of lowest priority are left out (priority 0 is
  always shown; higher numbers go first) and one line under the table names them and the width
  that shows them all; when even the priority-0 columns do not fit, each row is printed as a
  block of `header: value` lines instead (a word longer than the line overflows it, whole);
- when the console is unbounded (stdout piped, no `--width`, no COLUMNS: see
  `vramdoctor.render.console.unbounded`) every column takes its full content width: one line
  per row, nothing wrapped, nothing left out (grep and awk see whole rows);
- cells are one line of text by contract: a newline inside a value from outside (a model id, a
  Prometheus label) is shown escaped (`\\n`, `vramdoctor.redact.one_line`), never as a new row.

Columns are separated by two spaces; the header is bold on a terminal, the last column has no
trailing padding. Plain ASCII only (no box glyphs), so any locale can print it.

    from vramdoctor.render.table import Table
    t = Table(title="watch: 6 hours window")
    t.add_column("where")                        # priority 0: never left out
    t.add_column("growth/hour", justify="right")
    t.add_column("basis", priority=2)           # left out first when narrow
    t.add_row("PID 488 (python) on GPU 0", "+2,100.1 MiB", "time, 14 points")
    t.add_row(Text("INCONCLUSIVE", style="dim"), "-", "too few points", style="dim")
    console.print(t)                             # or t.lines(width) / t.plain(width)

Cells are `str` (plain text: no rich markup is read) or `rich.text.Text` (styled), or None
(empty). `lines(width)` returns the rendered rows as `Text` (width None = unbounded);
`plain(width)` one string. Raises ValueError for a row with more cells than columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from vramdoctor.redact import one_line
from vramdoctor.render.wrap import unit_words, wrap

__all__ = ["GAP", "SHORT", "Column", "Table", "rows_of"]

GAP = 2
"""Spaces between two columns."""

Justify = Literal["left", "right"]

SHORT = 18
"""A column whose longest cell is at most this wide (a status, a verdict, a size) is given its
whole width first when the table must wrap: its words are never split over lines if room allows."""


def _cell_text(value: str | Text | None) -> Text:
    if value is None:
        return Text("")
    if isinstance(value, Text):
        text = value.copy()
        flat = one_line(text.plain)
        if flat != text.plain:  # escaping lengthens the text: styles are kept for the whole cell
            text = Text(flat, style=value.style)
            for span in value.spans:
                if span.start == 0 and span.end >= len(value.plain):
                    text.stylize(span.style)
        return text
    return Text(one_line(str(value)))


def _min_width(text: Text) -> int:
    plain = text.plain
    return max((cell_len(plain[s:e]) for s, e in unit_words(plain)), default=0)


@dataclass
class Column:
    """One column: its header, alignment, priority (0 = always shown; the highest number is
    left out first when the table is too wide) and a base style for its cells."""

    header: str
    justify: Justify = "left"
    priority: int = 0
    style: str | Style | None = None
    cells: list[Text] = field(default_factory=list, repr=False)


@dataclass
class _Layout:
    columns: list[int]  # indices of the columns shown
    widths: list[int]  # their widths, in cells
    left_out: list[int]  # indices of the columns left out
    stacked: bool  # each row as a block of `header: value` lines


class Table:
    """A table whose cells wrap at word boundaries and never lose a character (module
    docstring). Build with `add_column` then `add_row`; print with a rich console, or take
    `lines(width)` / `plain(width)`."""

    def __init__(
        self,
        title: str | Text | None = None,
        *,
        header_style: str | Style = "bold",
        title_style: str | Style = "bold",
        show_header: bool = True,
        gap: int = GAP,
    ) -> None:
        self.title = title
        self.header_style = header_style
        self.title_style = title_style
        self.show_header = show_header
        self.gap = gap
        self.columns: list[Column] = []
        self._row_styles: list[str | Style | None] = []

    def add_column(
        self,
        header: str,
        *,
        justify: Justify = "left",
        priority: int = 0,
        style: str | Style | None = None,
    ) -> Column:
        """A column at the right end. `priority` 0 is never left out; among the others the
        highest is left out first (ties: the rightmost first)."""
        if self._row_styles:
            raise ValueError("add every column before the first row")
        column = Column(header, justify=justify, priority=priority, style=style)
        self.columns.append(column)
        return column

    def add_row(self, *cells: str | Text | None, style: str | Style | None = None) -> None:
        """One row: a value per column (missing trailing cells are empty). `style` is the
        row's base style (a cell's own style wins)."""
        if len(cells) > len(self.columns):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.columns)}")
        for i, column in enumerate(self.columns):
            column.cells.append(_cell_text(cells[i] if i < len(cells) else None))
        self._row_styles.append(style)

    @property
    def row_count(self) -> int:
        return len(self._row_styles)

    # --- layout -------------------------------------------------------------------------

    def _header(self, i: int) -> Text:
        return Text(self.columns[i].header, style=self.header_style)

    def _min(self, i: int) -> int:
        col = self.columns[i]
        cells = [*col.cells, *([self._header(i)] if self.show_header else [])]
        return max((_min_width(c) for c in cells), default=0)

    def _natural(self, i: int) -> int:
        col = self.columns[i]
        cells = [*col.cells, *([self._header(i)] if self.show_header else [])]
        return max((cell_len(c.plain.strip()) for c in cells), default=0)

    def _needed(self, shown: Sequence[int], sizes: Sequence[int]) -> int:
        return sum(sizes[i] for i in shown) + self.gap * max(0, len(shown) - 1)

    def full_width(self) -> int:
        """The width at which every column is shown with no cell wrapped (its content width)."""
        natural = [self._natural(i) for i in range(len(self.columns))]
        return self._needed(range(len(self.columns)), natural)

    def min_width(self) -> int:
        """The narrowest width at which every column is shown (each at its longest word)."""
        mins = [self._min(i) for i in range(len(self.columns))]
        return self._needed(range(len(self.columns)), mins)

    def layout(self, width: int | None) -> _Layout:
        """Which columns are shown at `width` cells (None: unbounded) and how wide each is."""
        n = len(self.columns)
        natural = [self._natural(i) for i in range(n)]
        if width is None or self._needed(range(n), natural) <= width:
            return _Layout(list(range(n)), [natural[i] for i in range(n)], [], False)
        by_drop = sorted(
            (i for i in range(n) if self.columns[i].priority > 0),
            key=lambda i: (-self.columns[i].priority, -i),
        )

        def fit(mins: list[int]) -> tuple[list[int], list[int]]:
            shown, left_out = list(range(n)), []
            for i in by_drop:
                if self._needed(shown, mins) <= width:
                    break
                shown.remove(i)
                left_out.append(i)
            return shown, left_out

        # Short columns (a status, a verdict, a size) whole, leaving out low-priority columns
        # for them if need be; only when that cannot fit do their words wrap.
        mins = [natural[i] if natural[i] <= SHORT else self._min(i) for i in range(n)]
        shown, left_out = fit(mins)
        if self._needed(shown, mins) > width:
            mins = [self._min(i) for i in range(n)]
            shown, left_out = fit(mins)
        if self._needed(shown, mins) > width:  # even the columns always shown do not fit
            return _Layout(list(range(n)), [], [], True)
        widths = {i: mins[i] for i in shown}
        spare = width - self._needed(shown, mins)
        if self._needed(shown, natural) <= width:
            widths = {i: natural[i] for i in shown}
        else:  # share the spare width fairly: a column that wants little gets all of it (a
            # verdict, a layer name stays whole), the rest is split evenly among the others
            want = {i: natural[i] - mins[i] for i in shown}
            waiting = sorted(shown, key=lambda i: want[i])
            for i in list(waiting):  # short cells first, whole (a status, a verdict, a size)
                if natural[i] <= SHORT and want[i] <= spare:
                    widths[i] += want[i]
                    spare -= want[i]
                    waiting.remove(i)
            while waiting and spare > 0:
                fair = spare // len(waiting)
                i = waiting.pop(0)
                add = min(want[i], fair)
                widths[i] += add
                spare -= add
            rest = width - self._needed(shown, [widths.get(i, 0) for i in range(n)])
            for i in sorted(shown, key=lambda i: -(natural[i] - widths[i])):
                if rest <= 0:
                    break
                if widths[i] < natural[i]:
                    widths[i] += 1
                    rest -= 1
        return _Layout(shown, [widths[i] for i in shown], sorted(left_out), False)

    # --- rendering ----------------------------------------------------------------------

    def _row_cell(self, col: int, row: int) -> Text:
        """A cell with its base styles: the row's, then the column's, then its own (wins)."""
        inner = Text(style=self.columns[col].style or "")
        inner.append_text(self.columns[col].cells[row])
        out = Text(style=self._row_styles[row] or "")
        out.append_text(inner)
        return out

    def _grid_rows(self, layout: _Layout) -> Iterator[list[Text]]:
        """The header's lines, then each row's; a blank line between rows when one wraps."""
        if self.show_header:
            yield self._grid_line([self._header(i) for i in layout.columns], layout)
        rows = [
            self._grid_line([self._row_cell(i, r) for i in layout.columns], layout)
            for r in range(self.row_count)
        ]
        spaced = any(len(lines) > 1 for lines in rows)
        for n, lines in enumerate(rows):
            if spaced and n:
                yield [Text("")]
            yield lines

    def _grid_line(self, cells: list[Text], layout: _Layout) -> list[Text]:
        wrapped = [wrap(cell, width) for cell, width in zip(cells, layout.widths, strict=True)]
        height = max(len(w) for w in wrapped)
        out: list[Text] = []
        last = len(cells) - 1
        for y in range(height):
            line = Text()
            for x, (lines, width) in enumerate(zip(wrapped, layout.widths, strict=True)):
                piece = lines[y] if y < len(lines) else Text("")
                pad = max(0, width - piece.cell_len)
                justify = self.columns[layout.columns[x]].justify
                if justify == "right":
                    line.append(" " * pad)
                    line.append_text(piece)
                else:
                    line.append_text(piece)
                    if x < last:
                        line.append(" " * pad)
                if x < last:
                    line.append(" " * self.gap)
            line.rstrip()
            out.append(line)
        return out

    def _stacked(self, width: int) -> Iterator[Text]:
        """Each row as a block: its first cell, then `header: value` lines, indented."""
        indent = "  "
        for r in range(self.row_count):
            if r:
                yield Text("")
            first = self._row_cell(0, r)
            yield from wrap(first, width)
            for i in range(1, len(self.columns)):
                cell = self._row_cell(i, r)
                if not cell.plain.strip():
                    continue
                head = Text(f"{indent}{self.columns[i].header}: ", style=self.header_style)
                room = max(1, width - head.cell_len)
                for n, piece in enumerate(wrap(cell, room)):
                    line = Text()
                    line.append_text(head if n == 0 else Text(" " * head.cell_len))
                    line.append_text(piece)
                    yield line

    def lines(self, width: int | None) -> list[Text]:
        """The table as lines of text at `width` cells (None: unbounded, each row on one line).
        The title comes first, and a note naming the left-out columns last."""
        out: list[Text] = []
        if self.title:
            title = self.title if isinstance(self.title, Text) else Text(str(self.title))
            title = title.copy()
            title.stylize(self.title_style)
            out.extend(wrap(title, width))
        if not self.columns:
            return out
        layout = self.layout(width)
        if layout.stacked:
            assert width is not None
            out.extend(self._stacked(width))
            return out
        for lines in self._grid_rows(layout):
            out.extend(lines)
        if layout.left_out:
            names = ", ".join(self.columns[i].header for i in layout.left_out)
            note = Text(
                f"(not shown at {width} columns: {names}; --width {self.min_width()} shows them)",
                style="dim",
            )
            out.extend(wrap(note, width))
        return out

    def plain(self, width: int | None = None) -> str:
        """The table as plain text (no styles), lines joined with newlines."""
        return "\n".join(line.plain for line in self.lines(width))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from vramdoctor.render.console import unbounded

        width = None if unbounded(console) else options.max_width
        for line in self.lines(width):
            flat = Text()  # the line's own style as its first span: Text.render drops it
            flat.append_text(line)
            yield from flat.render(console)
            yield Segment.line()

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(
            min(self.min_width(), options.max_width), min(self.full_width(), options.max_width)
        )


def rows_of(table: Table) -> Iterable[list[str]]:
    """The cells of `table` as plain strings, row by row (for tests and JSON of a table)."""
    for r in range(table.row_count):
        yield [c.cells[r].plain for c in table.columns]
