"""Numbers with their units, as the soak report writes them.

Every size the analysis gives is MiB (`*_mib`), KV amounts are tokens or a 0..1 ratio of the
pool; these helpers turn one into text through `vramdoctor.units` ("13.7 MiB", "64 tokens",
"0.20 % of the pool"). A value that is None, NaN or infinite is written "-".
"""

from __future__ import annotations

import math

from vramdoctor.units import (
    format_bytes,
    format_count,
    format_mib,
    format_percent,
    mib_to_bytes,
)

__all__ = ["count", "known", "rate", "size", "value"]


def known(v: float | None) -> bool:
    """True for a finite number (not None, NaN or infinite): a value the report can write."""
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def size(mib: float | None, *, signed: bool = False) -> str:
    """A size given in MiB in the unit that reads best ("13.7 MiB", "64.0 KiB", "1.5 GiB")."""
    if not known(mib):
        return "-"
    assert mib is not None
    return format_bytes(mib_to_bytes(mib), signed=signed)


def value(v: float | None, unit: str, *, signed: bool = False) -> str:
    """One value of a series in its unit."""
    if not known(v):
        return "-"
    assert v is not None
    if unit == "MiB":
        return format_mib(v, 0 if abs(v) >= 100 else 1, signed=signed)
    if unit == "ratio":
        return ("+" if signed and v > 0 else "") + format_percent(v, 2) + " of the pool"
    text = (
        count(round(v, 1), unit[:-1], unit)
        if unit.endswith("s")
        else format_count(round(v, 1), unit)
    )
    return ("+" + text) if signed and v > 0 else text


def count(n: float | None, singular: str, plural: str | None = None) -> str:
    """A count with its unit in the right number: "1 page", "4 pages", "0.5 pages"."""
    word = singular if n == 1 else (plural or singular + "s")
    return format_count(n, word)


def rate(v: float | None, unit: str) -> str:
    """A rate per request in its unit ("13.7 MiB", "64 tokens", "0.20 % of the pool")."""
    if not known(v):
        return "-"
    assert v is not None
    if unit == "MiB":
        return size(v)
    if unit == "ratio":
        return format_percent(v, 3) + " of the pool"
    return format_count(round(v, 2), unit)
