"""The shared table renderer and the wrapping rules, on their own (no command around them)."""

from __future__ import annotations

import io

from rich.panel import Panel
from rich.text import Text

from vramdoctor.render import console
from vramdoctor.render.table import Table
from vramdoctor.render.wrap import Paragraph, unit_words, wrap


def _table() -> Table:
    t = Table(title="fleet: 7 days")
    t.add_column("where")
    t.add_column("growth/hour", justify="right")
    t.add_column("verdict")
    t.add_column("why", priority=1)
    t.add_column("source", priority=2)
    t.add_row("gpu-a GPU 0", "+40.0 MiB", Text("LEAK", style="bold red"), "steady growth", "dcgm")
    t.add_row("gpu-b GPU 1", "0.0 MiB", "INCONCLUSIVE", "4 minutes of history", "nvitop")
    return t


def test_numbers_keep_their_units_and_words_stay_whole() -> None:
    text = "+2,100.1 MiB per hour, 3 days and 4 hours at 12.5 % (1,920 tokens/request)."
    words = [text[a:b] for a, b in unit_words(text)]
    assert "+2,100.1 MiB" in words and "3 days" in words and "12.5 %" in words
    assert "(1,920 tokens/request)." in words
    lines = [line.plain for line in wrap(Text(text), 14)]
    assert "+2,100.1 MiB" in lines and all(line != "MiB" for line in lines)


def test_piped_a_table_is_its_full_width_one_line_per_row() -> None:
    lines = _table().plain(None).splitlines()
    assert len(lines) == 4  # title, header, two rows
    assert "4 minutes of history" in lines[3] and "nvitop" in lines[3]


def test_narrow_the_lowest_priority_columns_go_first_and_are_named() -> None:
    t = _table()
    width = t.min_width() - 1  # one column short of showing them all
    text = t.plain(width)
    assert "nvitop" not in text and "history" in text  # source (priority 2) goes before why
    said = " ".join(text.split())
    assert f"(not shown at {width} columns: source; --width {t.min_width()} shows them)" in said
    assert "INCONCLUSIVE" in text and "4 minutes" in text


def test_too_narrow_for_the_key_columns_rows_become_blocks() -> None:
    text = _table().plain(24)
    assert "  verdict: INCONCLUSIVE" in text and "  growth/hour: +40.0 MiB" in text
    assert all(len(line) <= 24 for line in text.splitlines() if "growth/hour" not in line)


def test_right_justified_numbers_line_up() -> None:
    lines = _table().plain(None).splitlines()[1:]
    ends = {line.index("MiB") + 3 for line in lines[1:]}
    assert len(ends) == 1, lines


def test_a_cells_style_survives_and_the_row_style_is_underneath() -> None:
    con = console.make_console(width=100, file=io.StringIO(), color_system="truecolor")
    t = Table()
    t.add_column("a")
    t.add_column("b")
    t.add_row("x", Text("LEAK", style="red"), style="dim")
    con.print(t)
    out = con.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[" in out and "LEAK" in out


def test_an_empty_table_shows_its_header_and_a_row_longer_than_the_table_is_refused() -> None:
    t = Table(title="nothing yet")
    t.add_column("where")
    t.add_column("verdict")
    assert t.plain(80).splitlines() == ["nothing yet", "where  verdict"]
    try:
        t.add_row("a", "b", "c")
    except ValueError as exc:
        assert "3 cells" in str(exc)
    else:
        raise AssertionError("a row of 3 cells in a table of 2 was accepted")


def test_inside_a_panel_a_paragraph_wraps_between_words() -> None:
    con = console.make_console(width=40, file=io.StringIO(), color_system=None)
    con.print(Panel(Paragraph("GPU 0 has 1.10 GiB free of 79.10 GiB; --kubernetes-virtual-gpus")))
    out = con.file.getvalue()  # type: ignore[attr-defined]
    assert "1.10 GiB" in out and "79.10 GiB" in out and "--kubernetes-virtual-gpus" in out
