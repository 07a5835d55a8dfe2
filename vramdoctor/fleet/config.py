"""fleet's knobs (`FleetConfig`): durations in seconds, growth floors per unit. Pure, light.

Kept apart from the analysis so the command line can build one without importing numpy (which
then loads on a thread while the first queries are on their way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FleetConfig"]


@dataclass(frozen=True)
class FleetConfig:
    """Durations in seconds; growth floors per unit (MiB, tokens, ratio).

    `block_s`: floors are the least memory of each block. `warmup_s`: left out after a life
    starts inside the range. `empty_mib`: a device floor at or below this is an empty GPU (a
    life ended). `stale_s`: a series with no sample this long before the range end stopped
    reporting. `screen_sd_mib` / `screen_sd_tokens` / `screen_sd_ratio`: a series whose
    3-block floor moved less than this (standard deviation over the range) is flat and not
    pulled. `min_points`: comparable points the trend test needs.
    """

    block_s: float = 3600.0
    warmup_s: float = 7200.0
    empty_mib: float = 1024.0
    stale_s: float = 900.0
    min_growth_mib: float = 32.0
    min_growth_tokens: float = 64.0
    min_growth_ratio: float = 0.01
    screen_sd_mib: float = 4.0
    screen_sd_tokens: float = 0.0  # KV: any token held at idle is worth a look
    screen_sd_ratio: float = 0.0
    min_points: int = 8
    max_points: int = 240  # longer lives are judged on coarser floors (the least of k in a row)
    noise_k: float = 4.0
    decay_ratio: float = 0.5
    trend_p: float = 0.01
    bic_margin: float = 10.0

    def min_growth(self, unit: str) -> float:
        return {"MiB": self.min_growth_mib, "tokens": self.min_growth_tokens}.get(
            unit, self.min_growth_ratio
        )

    def screen_sd(self, unit: str) -> float:
        return {"MiB": self.screen_sd_mib, "tokens": self.screen_sd_tokens}.get(
            unit, self.screen_sd_ratio
        )

    def thresholds(self, unit: str) -> Any:
        """The `stats.trend.TrendThresholds` for a unit (imported here: it brings scipy)."""
        from vramdoctor.stats.trend import TrendThresholds

        return TrendThresholds(
            min_growth=self.min_growth(unit),
            noise_k=self.noise_k,
            decay_ratio=self.decay_ratio,
            trend_p=self.trend_p,
            min_points=self.min_points,
        )
