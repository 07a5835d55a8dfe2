"""stable: preprocessing only, on the CPU, nothing cached or kept.

TRUTH: STABLE on every layer. Each image is decoded and normalised and the result dropped at
the request's end; the KV tokens of every request return to the pool.
"""

from __future__ import annotations

from refserver.modes.base import Mode


class StableMode(Mode):
    name = "stable"


MODES = [StableMode]
