"""Bounded, downsampled history of one series: fixed-width time buckets in a ring. Pure.

`watch` runs for weeks; it must not keep every sample. Each series keeps at most
`max_buckets` buckets of `bucket_s` wall-clock seconds (min, max, mean, last, count), so its
memory is fixed whatever the run length, and the rolling window is `bucket_s * max_buckets`.
Buckets are keyed by `floor(wall / bucket_s)`, so every series of one watch (memory, the
server's request counter, its in-flight requests) lines up bucket by bucket.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Bucket", "BucketSeries"]


@dataclass
class Bucket:
    """One bucket of samples: `key` = floor(wall / bucket_s)."""

    key: int
    n: int
    vmin: float
    vmax: float
    vsum: float
    vlast: float

    @property
    def mean(self) -> float:
        return self.vsum / self.n


class BucketSeries:
    """A ring of at most `max_buckets` buckets; `add` is O(1), memory is O(max_buckets)."""

    __slots__ = ("_buckets", "bucket_s", "max_buckets")

    def __init__(self, bucket_s: float, max_buckets: int) -> None:
        if bucket_s <= 0 or max_buckets < 2:
            raise ValueError("bucket_s must be > 0 and max_buckets >= 2")
        self.bucket_s = float(bucket_s)
        self.max_buckets = int(max_buckets)
        self._buckets: deque[Bucket] = deque(maxlen=self.max_buckets)

    def key(self, wall: float) -> int:
        return math.floor(wall / self.bucket_s)

    def add(self, wall: float, value: float) -> None:
        """Add one sample. A sample older than the newest bucket is dropped (clock step back)."""
        if not math.isfinite(value):
            return
        k = self.key(wall)
        if self._buckets:
            last = self._buckets[-1]
            if k == last.key:
                last.n += 1
                last.vsum += value
                last.vlast = value
                if value < last.vmin:
                    last.vmin = value
                if value > last.vmax:
                    last.vmax = value
                return
            if k < last.key:
                return
        self._buckets.append(Bucket(k, 1, value, value, value, value))

    def drop_before(self, key: int) -> None:
        """Forget buckets older than `key` (outside the rolling window)."""
        while self._buckets and self._buckets[0].key < key:
            self._buckets.popleft()

    def __iter__(self) -> Iterator[Bucket]:
        return iter(self._buckets)

    def __len__(self) -> int:
        return len(self._buckets)

    @property
    def last(self) -> Bucket | None:
        return self._buckets[-1] if self._buckets else None

    @property
    def first(self) -> Bucket | None:
        return self._buckets[0] if self._buckets else None
