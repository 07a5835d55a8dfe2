"""Charts of memory over time (matplotlib, Agg backend, no pyplot: no display needed, no global figure state).

One figure: one line per series (MiB on the left axis; the KV ratio on its own right axis),
load windows shaded, idle windows lightly shaded, each round's settled level marked. Returns
PNG bytes so the caller decides where they go (a .png file, or inside a self-contained HTML).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure


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


_COLOURS = {"load": "#f4a261", "idle": "#a8dadc", "baseline": "#e9ecef"}


def memory_chart(lines: Sequence[Line], spans: Sequence[Span], title: str, *,
                 width: float = 10.0, height: float = 5.0, dpi: int = 110) -> bytes:
    fig = Figure(figsize=(width, height), dpi=dpi)  # no pyplot: no global state, thread-safe
    ax = fig.subplots()
    ax2 = None
    for span in spans:
        ax.axvspan(span.start, span.end, color=_COLOURS.get(span.kind, "#eeeeee"),
                   alpha=0.45 if span.kind == "load" else 0.35, lw=0)
        if span.label:
            ax.text((span.start + span.end) / 2, 0.985, span.label, transform=ax.get_xaxis_transform(),
                    ha="center", va="top", fontsize=7, color="#555555")
    for line in lines:
        if not line.points:
            continue
        target = ax
        if line.unit != "MiB":
            ax2 = ax2 or ax.twinx()
            target = ax2
        xs = [p[0] for p in line.points]
        ys = [p[1] for p in line.points]
        (drawn,) = target.plot(xs, ys, lw=1.3, label=line.label)
        if line.settled:
            target.plot([p[0] for p in line.settled], [p[1] for p in line.settled], "o",
                        ms=4, color=drawn.get_color())
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("MiB")
    if ax2 is not None:
        ax2.set_ylabel("KV usage (0-1)")
        ax2.set_ylim(0, 1.05)
    handles, labels = ax.get_legend_handles_labels()
    if ax2 is not None:
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper left", framealpha=0.8)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
