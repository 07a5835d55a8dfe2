"""What a soak run is asked to do: one typed, validated object.

`SoakConfig` is what the CLI builds from its options and what library users build in code;
`validate()` rejects every value that cannot be run (NaN, infinity, negative, out of range)
with one line naming the option, before anything is sent or recorded.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vramdoctor.errors import InputError

DEFAULT_SIZES = ("448x448", "896x672")
MIN_GROWTH_MIB = 2.0  # NVML/DCGM report whole MiB; the allocator rounds to 2 MiB blocks
DEFAULT_MAX_ROUNDS = 12
INTERRUPTED = 130  # exit code of a soak stopped by Ctrl-C or SIGTERM
# Bounds that keep one option from asking for unbounded work (issue 11 kind 6).
MAX_REQUESTS_PER_ROUND = 10**9
MAX_ROUNDS = 10_000
MAX_SECONDS = 30 * 24 * 3600.0  # a month: anything longer is a typo


@dataclass
class SoakConfig:
    """A soak's settings. Durations are seconds, sizes MiB, rates requests per second.

    `rounds` identical rounds of `requests` requests at `concurrency`, each followed by
    `idle_s` of idle; while a layer is undecided after them, more rounds up to `max_rounds`
    (`adapt=False`: exactly `rounds`). `duration_s` and `max_requests` bound everything.
    `stream` streams every request; `abort_fraction` of each round's requests are streamed
    and closed by the client after the first chunks. `production_rate_rps` is the request rate
    projections use (default: the server's own counters during the baseline, when they show
    traffic). `api_key` is sent in the Authorization header only, never recorded.
    """

    url: str
    rounds: int = 4
    requests: int = 50
    concurrency: int = 4
    idle_s: float = 10.0
    baseline_s: float | None = None  # default: idle_s
    adapt: bool = True
    max_rounds: int | None = None  # default: max(12, rounds)
    image_sizes: tuple[str, ...] = DEFAULT_SIZES
    image_dir: Path | None = None
    text_only: bool = False
    api: str = "chat"  # chat or completions
    model: str | None = None  # default: the server's first /v1/models id
    max_tokens: int = 16
    seed: int = 0
    stream: bool = False
    abort_fraction: float = 0.0
    out: Path | None = None  # run file; default runs/soak-<UTC time>-<pid>-<random>.jsonl
    max_requests: int | None = None
    duration_s: float | None = None
    api_key: str | None = field(default=None, repr=False)
    interval_s: float = 0.5
    timeout_s: float = 120.0
    min_growth_mib: float = MIN_GROWTH_MIB
    gpu_metrics: str | None = None  # dcgm-exporter / nvitop-exporter URL
    gpus: tuple[int, ...] | None = None  # NVML indices
    pids: tuple[int, ...] = ()  # extra PIDs whose host memory is sampled
    production_rate_rps: float | None = None

    def validate(self) -> SoakConfig:
        """Raise InputError (one line naming the option) for anything that cannot be run."""
        _int_range("--rounds", self.rounds, 1, MAX_ROUNDS)
        _int_range("--requests", self.requests, 1, MAX_REQUESTS_PER_ROUND)
        _int_range("--concurrency", self.concurrency, 1, 1024)
        _int_range("--max-tokens", self.max_tokens, 1, 1_000_000)
        if self.max_rounds is not None:
            _int_range("--max-rounds", self.max_rounds, 1, MAX_ROUNDS)
        if self.adapt and self.max_rounds is not None and self.max_rounds < self.rounds:
            raise InputError(
                f"--max-rounds {self.max_rounds} is below --rounds {self.rounds}: "
                "raise it, or pass --no-adapt"
            )
        if self.max_requests is not None:
            _int_range("--max-requests", self.max_requests, 1, 10**12)
        _seconds("--idle", self.idle_s, zero_ok=True)
        if self.baseline_s is not None:
            _seconds("--baseline", self.baseline_s, zero_ok=True)
        if self.duration_s is not None:
            _seconds("--duration", self.duration_s)
        _seconds("--timeout", self.timeout_s)
        _seconds("--interval", self.interval_s)
        if self.interval_s < 0.05:
            raise InputError(f"--interval {self.interval_s:g}: must be at least 0.05 s")
        _finite("--abort-fraction", self.abort_fraction)
        if not 0.0 <= self.abort_fraction <= 1.0:
            raise InputError(f"--abort-fraction {self.abort_fraction:g}: must be between 0 and 1")
        _finite("--min-growth-mib", self.min_growth_mib)
        if self.min_growth_mib < 0:
            raise InputError("--min-growth-mib must not be negative")
        if self.production_rate_rps is not None:
            _finite("--production-rate", self.production_rate_rps)
            if not 0 < self.production_rate_rps <= 1e9:
                raise InputError(
                    f"--production-rate {self.production_rate_rps:g}: give requests per "
                    "second, more than 0"
                )
        if self.api not in ("chat", "completions"):
            raise InputError(f"--api {self.api!r}: use chat or completions")
        if self.text_only and self.image_dir:
            raise InputError("--text-only and --image-dir contradict each other")
        for pid in self.pids:
            _int_range("--pid", pid, 1, 2**31)
        self._check_credentials()
        return self

    def _check_credentials(self) -> None:
        """A user:password in --url and an API key cannot both be sent: HTTP has one
        Authorization header, and the URL's Basic credentials would replace the bearer key
        (the key was then silently never sent). Refused with one line (exit 2)."""
        if not self.resolved_api_key:
            return
        netloc = urlsplit(self.url if "://" in self.url else "http://" + self.url).netloc
        if "@" not in netloc:
            return
        source = (
            "--api-key"
            if self.api_key
            else "$OPENAI_API_KEY"
            if os.environ.get("OPENAI_API_KEY")
            else "$VRAMDOCTOR_API_KEY"
        )
        raise InputError(
            f"--url carries a user:password and an API key is set ({source}): both would "
            "go in the one Authorization header; drop the user:password from --url to "
            f"send the key, or unset {source} to send the URL's password (HTTP Basic)"
        )

    @property
    def rounds_cap(self) -> int:
        """The most rounds this run may take: `rounds` without adapting, else `max_rounds`
        (default the larger of 12 and `rounds`)."""
        if not self.adapt:
            return self.rounds
        return (
            self.max_rounds if self.max_rounds is not None else max(DEFAULT_MAX_ROUNDS, self.rounds)
        )

    @property
    def baseline(self) -> float:
        return self.idle_s if self.baseline_s is None else self.baseline_s

    @property
    def resolved_api_key(self) -> str | None:
        """The key to send: the field, else $OPENAI_API_KEY, else $VRAMDOCTOR_API_KEY."""
        return (
            self.api_key
            or os.environ.get("OPENAI_API_KEY")
            or os.environ.get("VRAMDOCTOR_API_KEY")
            or None
        )

    def to_record(self) -> dict[str, Any]:
        """The settings as recorded in the run file's header (no key, paths as strings)."""
        d = asdict(self)
        d.pop("api_key", None)
        d.pop("url", None)  # the header's target carries it, redacted
        return {
            k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for k, v in d.items()
        }


def _finite(option: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{option} {value}: give a finite number")


def _seconds(option: str, value: float, *, zero_ok: bool = False) -> None:
    _finite(option, value)
    if value < 0 or (value == 0 and not zero_ok):
        raise InputError(
            f"{option} {value:g}: must be {'0 or more' if zero_ok else 'more than 0'} seconds"
        )
    if value > MAX_SECONDS:
        raise InputError(f"{option} {value:g}: more than 30 days; give seconds")


def _int_range(option: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise InputError(f"{option} {value}: must be between {lo} and {hi}")
