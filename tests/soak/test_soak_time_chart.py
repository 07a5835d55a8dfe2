"""soak's text time chart: every cell of the strip and of a sparkline means what its legend says.

The review's fault: blank cells the legend did not explain, in the strip (time between an idle
window and the next round, after the last window) and in a sparkline (a process that appeared
later), and a round past 9 drawn as `0` with no word of it. The report-level check over every
recorded run is `tests/core/test_render_widths.py::test_soak_time_chart_legend_names_every_glyph_and_blank_and_no_line_ends_in_a_space`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from vramdoctor.judge.results import SoakAnalysis, Window
from vramdoctor.soak.report.sparklines import (
    OUTSIDE,
    chart_legend,
    legend_lines,
    phase_strip,
    time_sparkline,
)


@dataclass
class _Run:
    """The part of a SoakAnalysis the strip reads."""

    windows: list[Window] = field(default_factory=list)


def _protocol(rounds: int, *, pause: float = 0.0) -> SoakAnalysis:
    """A baseline of 4 s, then rounds of 2 s load and 4 s idle, `pause` seconds between an idle
    window and the next round (the soak's own steps there)."""
    ws = [Window("baseline", 0, 0.0, 4.0)]
    t = 4.0 + pause
    for k in range(1, rounds + 1):
        ws += [Window("load", k, t, t + 2.0), Window("idle", k, t + 2.0, t + 6.0)]
        t += 6.0 + pause
    return cast(SoakAnalysis, _Run(ws))


def test_time_between_windows_is_drawn_and_named_never_blank() -> None:
    run = _protocol(3, pause=1.0)  # 0..4 baseline, 1 s gap, 5..7 load, 7..11 idle, ...
    t1 = run.windows[-1].end
    assert t1 is not None
    strip = phase_strip(run, 0.0, t1 + 1.0, 26)  # 1 s a cell; the last samples 1 s after
    assert " " not in strip
    assert strip == "bbbb-11....-22....-33....-".replace("-", OUTSIDE)
    legend = chart_legend(strip, [], rounds=3)
    assert f"{OUTSIDE} between windows" in legend
    assert "b baseline, 1-9 load round, . idle" in legend


def test_a_strip_with_no_gap_does_not_name_one() -> None:
    run = _protocol(2)
    strip = phase_strip(run, 0.0, 16.0, 16)
    assert strip == "bbbb11....22...."
    assert "between windows" not in chart_legend(strip, [], rounds=2)


def test_rounds_past_9_are_their_last_digit_and_the_legend_says_so() -> None:
    run = _protocol(11)
    end = run.windows[-1].end
    assert end is not None
    strip = phase_strip(run, 0.0, end, 70)  # 1 s a cell
    assert "0" in strip and strip.count("1") > strip.count("2")  # rounds 1 and 11
    assert "0 is round 10" in chart_legend(strip, [], rounds=11)
    assert "0 is round 10" not in chart_legend(strip, [], rounds=9)


def test_a_sparkline_is_blank_only_where_its_series_was_not_sampled() -> None:
    every = [(t * 0.5, 100.0 + t) for t in range(41)]  # 0..20 s, every 0.5 s
    full = time_sparkline(every, 0.0, 20.0, 40)
    assert " " not in full and len(full) == 40  # between samples: the last sample, not blank
    late = [(t, v) for t, v in every if t >= 10.0]  # a process that appeared half way
    line = time_sparkline(late, 0.0, 20.0, 40)
    assert line[:16] == " " * 16 and " " not in line[17:]  # drawn from 1.5 s before it
    gone = [(t, v) for t, v in every if t <= 5.0]  # one that exited after 5 s
    line = time_sparkline(gone, 0.0, 20.0, 40)
    assert " " not in line[:10] and line[14:] == " " * 26
    gap = [(t, v) for t, v in every if not 8.0 < t < 14.0]  # sampling stalled for 6 s
    line = time_sparkline(gap, 0.0, 20.0, 40)
    assert line[18:27].strip() == "" and " " not in line[:16] + line[28:]
    legend = chart_legend("bbbb", [full, line])
    assert "blank where that series has no sample" in legend
    assert "blank" not in chart_legend("bbbb", [full])


def test_the_legend_never_ends_a_line_on_a_glyph() -> None:
    legend = "time: 18 seconds; " + chart_legend("bb11..-", [" ▁"], rounds=12)
    for width in range(20, 90):
        lines = legend_lines(legend, width)
        assert " ".join(lines) == legend
        for line in lines:
            assert line.split(" ")[-1] not in ("b", "1-9", ".", OUTSIDE, "0"), (width, line)
            assert len(line) <= width or " " not in line
    assert legend_lines(legend, None) == [legend]
