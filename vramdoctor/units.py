"""Units: the one place that converts and formats memory sizes, rates and durations.

Every number vramdoctor prints carries its unit, and every command formats it the same way:
sizes in binary units (MiB, GiB: 1 MiB = 2**20 bytes, the unit NVML, PyTorch and
nvidia-smi report in), durations in words ("6 minutes and 40 seconds"). Durations and the
choice of size unit come from `humanize`; this module only fixes the conventions.

Names carry their unit: `*_bytes`, `*_mib`, `*_s`. Use these helpers instead of writing
`/ 2**20` or an f-string with a unit in place.
"""

from __future__ import annotations

import math

import humanize

__all__ = [
    "GIB",
    "KIB",
    "MIB",
    "bytes_to_mib",
    "format_bytes",
    "format_count",
    "format_duration",
    "format_mib",
    "format_percent",
    "gib_to_mib",
    "mib_to_bytes",
]

KIB = 1024
"""Bytes in one KiB."""
MIB = 1024**2
"""Bytes in one MiB."""
GIB = 1024**3
"""Bytes in one GiB."""

_DASH = "-"


def bytes_to_mib(n_bytes: float) -> float:
    """Bytes -> MiB (2**20 bytes)."""
    return n_bytes / MIB


def mib_to_bytes(mib: float) -> float:
    """MiB -> bytes."""
    return mib * MIB


def gib_to_mib(gib: float) -> float:
    """GiB -> MiB (SGLang's and vLLM's "GB" in logs are GiB)."""
    return gib * 1024.0


def _finite(value: float | None) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def format_mib(mib: float | None, digits: int = 1, *, signed: bool = False) -> str:
    """A size given in MiB, in MiB: ``format_mib(412) == "412.0 MiB"``.

    Fixed MiB for tables and sentences that compare levels (a column in one unit reads
    better than a mix). ``signed`` prints a ``+`` for growth. None, NaN and inf print ``-``.
    """
    if not _finite(mib):
        return _DASH
    assert mib is not None
    sign = "+" if signed and mib > 0 else ""
    return f"{sign}{mib:,.{digits}f} MiB"


def format_bytes(n_bytes: float | None, *, signed: bool = False) -> str:
    """A size in bytes, in the largest binary unit that keeps it >= 1: "13.7 MiB", "1.5 GiB".

    Uses humanize's binary sizes. None, NaN and inf print ``-``.
    """
    if not _finite(n_bytes):
        return _DASH
    assert n_bytes is not None
    sign = "+" if signed and n_bytes > 0 else ("-" if n_bytes < 0 else "")
    text = humanize.naturalsize(abs(n_bytes), binary=True, format="%.1f")
    return f"{sign}{text}"


def format_duration(seconds: float | None) -> str:
    """A duration in words: "40 seconds", "6 minutes and 40 seconds", "3 days and 4 hours".

    Rounded to whole seconds under an hour and to minutes above; None, NaN, inf and
    negative durations print ``-``.
    """
    if not _finite(seconds) or seconds is None or seconds < 0:
        return _DASH
    if seconds < 1:
        return f"{seconds:.1f} seconds"
    minimum = "seconds" if seconds < 3600 else ("minutes" if seconds < 86400 else "hours")
    return str(humanize.precisedelta(seconds, minimum_unit=minimum, format="%0.0f"))


def format_count(value: float | None, unit: str) -> str:
    """A count with its unit and thousands separators: ``format_count(1920, "tokens")``."""
    if not _finite(value):
        return _DASH
    assert value is not None
    if float(value).is_integer():
        return f"{int(value):,} {unit}"
    return f"{value:,.1f} {unit}"


def format_percent(ratio: float | None, digits: int = 1) -> str:
    """A 0..1 ratio as a percentage: ``format_percent(0.125) == "12.5 %"``."""
    if not _finite(ratio):
        return _DASH
    assert ratio is not None
    return f"{ratio * 100:.{digits}f} %"
