"""Charts of memory over time (matplotlib, Agg backend, no pyplot: no display, no global state).

One figure, one panel per memory layer on a shared time axis (VRAM in MiB, KV pool in tokens,
host RAM in MiB on its own axis: a host-RAM climb never squashes the GPU lines), load windows
shaded, idle windows lightly shaded, each round's settled level marked. A layer that leaks
gets one more panel with its settled levels against the requests that reached the server,
the fitted leak line, and its projection out to the layer's capacity (in requests: the soak's
own burst load says nothing about time in production). Returns PNG bytes; the caller decides
where they go (a .png file, or inside a self-contained HTML page).
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from vramdoctor._optional import require

if TYPE_CHECKING:  # matplotlib is the `charts` extra: imported when a chart is drawn
    from matplotlib.axes import Axes


@dataclass
class Line:
    label: str
    points: Sequence[tuple[float, float]]  # (seconds since start, value)
    unit: str = "MiB"
    settled: Sequence[tuple[float, float]] = ()  # (time, level) markers


@dataclass
class Span:
    kind: str  # "load", "idle", "baseline"
    start: float
    end: float
    label: str = ""


@dataclass
class Panel:
    """One layer's lines on their own y axis."""

    title: str
    ylabel: str
    lines: Sequence[Line] = field(default_factory=list)


@dataclass
class LeakFit:
    """A leaking series' settled levels against cumulative requests, its fit and capacity."""

    label: str
    unit: str
    levels: Sequence[tuple[float, float]]  # (cumulative requests, settled level)
    slope: float  # unit per request
    intercept: float
    capacity_level: float | None  # the level at which the layer is full (None: unknown)


_COLOURS = {"load": "#f4a261", "idle": "#a8dadc", "baseline": "#e9ecef"}


# Larger values are not memory but a broken source (a MiB or token count of 1e15 is an
# exabyte): they are left out of the picture rather than squashing every real line.
_PLAUSIBLE = 1e15


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [
        (x, y)
        for x, y in points
        if math.isfinite(x) and math.isfinite(y) and abs(x) < _PLAUSIBLE and abs(y) < _PLAUSIBLE
    ]


def memory_chart(
    panels: Sequence[Panel],
    spans: Sequence[Span],
    title: str,
    *,
    fits: Sequence[LeakFit] = (),
    width: float = 10.0,
    dpi: int = 110,
) -> bytes:
    """The figure described in the module docstring, as PNG bytes."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _chart(panels, spans, title, fits, width, dpi)


def _chart(
    panels: Sequence[Panel],
    spans: Sequence[Span],
    title: str,
    fits: Sequence[LeakFit],
    width: float,
    dpi: int,
) -> bytes:
    panels = [p for p in panels if any(_finite(line.points) for line in p.lines)] or [
        Panel("memory", "MiB")
    ]
    n = len(panels) + len(fits)
    Figure = require(
        "matplotlib.figure", what="a chart (--report .png/.html)", extra="charts"
    ).Figure
    fig = Figure(figsize=(width, 2.6 * n + 0.8), dpi=dpi)
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    time_axes = axes[: len(panels)]
    for ax, panel in zip(time_axes, panels, strict=True):
        for span in spans:
            ax.axvspan(
                span.start,
                span.end,
                color=_COLOURS.get(span.kind, "#eeeeee"),
                alpha=0.45 if span.kind == "load" else 0.35,
                lw=0,
            )
            if span.label and ax is time_axes[0]:
                ax.text(
                    (span.start + span.end) / 2,
                    0.985,
                    span.label,
                    transform=ax.get_xaxis_transform(),
                    ha="center",
                    va="top",
                    fontsize=7,
                    color="#555555",
                )
        for line in panel.lines:
            pts = _finite(line.points)
            if not pts:
                continue
            (drawn,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.3, label=line.label)
            settled = _finite(line.settled)
            if settled:
                ax.plot(
                    [p[0] for p in settled],
                    [p[1] for p in settled],
                    "o",
                    ms=4,
                    color=drawn.get_color(),
                )
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best", framealpha=0.8)
    if len(time_axes) > 1:
        for ax in time_axes[1:]:
            ax.sharex(time_axes[0])
    time_axes[-1].set_xlabel("seconds since start")
    for ax, fit in zip(axes[len(panels) :], fits, strict=True):
        _fit_panel(ax, fit)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _fit_panel(ax: Axes, fit: LeakFit) -> None:
    """Settled levels vs requests, the fitted line, and where it reaches the capacity."""
    pts = _finite(fit.levels)
    xs = [p[0] for p in pts]
    ax.plot(xs, [p[1] for p in pts], "o", ms=5, label="settled level after each round")
    x_end = max(xs, default=0.0)
    full_at = None
    if not pts or not all(
        math.isfinite(v) and abs(v) < _PLAUSIBLE for v in (fit.slope, fit.intercept)
    ):
        ax.set_axis_off()
        return
    if (
        fit.capacity_level is not None
        and fit.slope > 0
        and math.isfinite(fit.capacity_level)
        and abs(fit.capacity_level) < _PLAUSIBLE
    ):
        full_at = (fit.capacity_level - fit.intercept) / fit.slope
    x_max = full_at if full_at is not None and math.isfinite(full_at) and full_at > x_end else x_end
    ax.plot(
        [0.0, x_end],
        [fit.intercept, fit.intercept + fit.slope * x_end],
        "-",
        color="#b00020",
        label=f"fit: {fit.slope:.4g} {fit.unit} per request",
    )
    if full_at is not None and x_max > x_end:
        ax.plot(
            [x_end, x_max],
            [fit.intercept + fit.slope * x_end, fit.intercept + fit.slope * x_max],
            "--",
            color="#b00020",
            label="projection at this rate",
        )
    if full_at is not None and fit.capacity_level is not None:
        ax.axhline(fit.capacity_level, color="#555555", ls=":", label=f"capacity ({fit.unit})")
    ax.set_xlim(0.0, max(1.0, x_max) * 1.03)
    ax.set_xlabel("requests that reached the server")
    ax.set_ylabel(fit.unit)
    ax.set_title(f"{fit.label}: settled level against requests", fontsize=9, loc="left")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
