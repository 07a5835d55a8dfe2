"""Small helpers shared by rules: version comparison, MiB formatting, evidence picking."""

from __future__ import annotations

import re

from ..model import Event, Evidence


def version_tuple(v: str | None) -> tuple[int, ...] | None:
    """'0.5.9.post2' -> (0, 5, 9); None when absent or unparsable."""
    if not v:
        return None
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", v)
    if not m:
        return None
    return tuple(int(x) for x in m.groups(default="0"))


def mib(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v / 1024:.2f} GiB" if v >= 1024 else f"{v:.0f} MiB"


def first_evidence(events: list[Event], n: int = 3) -> list[Evidence]:
    return [e.evidence for e in events[:n]]
