"""watch's settings: the rolling analysis (`WatchConfig`) and the watcher (`WatchOptions`).

Every number is bounded, for the library as for the command line (`check()` raises
`InputError` naming the flag): watch runs for weeks, so a setting that is not a finite
number, or one that would make its memory or its disk grow without bound, is refused before
anything is measured. The bounds (seconds unless said):

| setting | flag | bounds |
|---|---|---|
| interval_s | --interval | 0.01 .. 3600 |
| bucket_s | --bucket | 0.01 .. 86400, and at least --interval |
| window_s = bucket_s x max_buckets | --window | 2 .. MAX_BUCKETS buckets, at most 90 days |
| warmup_s | --warmup | 0 .. 30 days |
| analyse_every_s | --analyse-every | 0.01 .. 1 day |
| min_idle_s | --min-idle | 0 .. 1 hour |
| duration | --duration | 0.01 .. 366 days |
| rotate_bytes | --rotate-mib | 4 KiB .. 1 TiB |
| keep_files | --keep | 1 .. 100,000 |

`parse_duration("1h30m", "--window")` reads the command line's durations (a bare number is
seconds).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramdoctor.errors import InputError

if TYPE_CHECKING:
    from vramdoctor.judge.results import Thresholds

__all__ = [
    "MAX_BUCKETS",
    "WatchConfig",
    "WatchOptions",
    "check_seconds",
    "parse_duration",
]

MAX_BUCKETS = 20_000
"""The most buckets a series keeps (--window / --bucket): bounded memory per series."""
MAX_WINDOW_S = 90 * 86400.0
MAX_DURATION_S = 366 * 86400.0
MAX_ROTATE_BYTES = 1 << 40
MAX_KEEP = 100_000

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*([smhd]))+\s*$")


def parse_duration(text: str, what: str) -> float:
    """'90', '90s', '30m', '6h', '7d', '1h30m' -> seconds. InputError naming `what` for
    anything else, a number that is not finite included ('nan', 'inf', '1e999')."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        if not _DURATION.match(value):
            raise InputError(
                f"{what} wants a duration like 90s, 30m, 6h or 7d, not {text!r}"
            ) from None
        seconds = sum(
            float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)\s*([smhd])", value)
        )
    if not math.isfinite(seconds):
        raise InputError(f"{what} {text!r}: give a finite duration (e.g. 30s, 6h)")
    return seconds


def _thresholds() -> Thresholds:
    """soak's default thresholds (imported on first use: the judge loads numpy)."""
    from vramdoctor.judge.results import Thresholds

    return Thresholds()


def _show(seconds: float) -> str:
    return f"{seconds:g} s"


def check_seconds(what: str, value: float, lo: float, hi: float) -> float:
    """`value` as a float when it is finite and within [lo, hi]; InputError naming `what`."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{what}: give a number of seconds, not {value!r}") from None
    if not math.isfinite(v):
        raise InputError(f"{what}: give a finite duration, not {value!r}")
    if not lo <= v <= hi:
        raise InputError(f"{what} {_show(v)}: must be between {_show(lo)} and {_show(hi)}")
    return v


@dataclass(frozen=True)
class WatchConfig:
    """The rolling analysis. Window = bucket_s x max_buckets (default 6 hours of 1-minute
    buckets).

    `warmup_s`: left out after each server (or process) start. `min_idle_s`: an idle stretch
    (0 requests running or queued, by the server's /metrics) this long is an idle window, a
    comparable moment. `max_rounds`: idle windows kept in the window (more are merged, the
    smallest round first). `window_samples`: samples of each kind kept per idle window
    (decimated beyond). `settle_s` (default half of `min_idle_s`): samples of an idle
    stretch's first seconds are left out (an exporter publishes late, a finished thread's RSS
    counter lags). `inside_every_s`: the agent (where the server has it) is asked for its
    counters once per idle stretch, as soon as it settled, and at most this often (60 s: its
    cost bound for weeks). `quiet_quantile`: on a server that is never idle, the buckets at or
    below this quantile of the in-flight count are its quiet moments. `th`: the judge's
    thresholds (the same as soak's); `time_floor_mib`: the smallest growth that counts when
    only time is known (no request counter).
    """

    bucket_s: float = 60.0
    max_buckets: int = 360
    warmup_s: float = 1800.0
    min_idle_s: float = 10.0
    settle_s: float | None = None  # default: half of min_idle_s
    max_rounds: int = 24
    window_samples: int = 24
    quiet_quantile: float = 0.25
    quiet_blocks: int = 12
    restart_window_s: float = 900.0
    max_series: int = 2048
    max_events: int = 200
    inside_every_s: float = 60.0
    th: Thresholds = field(default_factory=lambda: _thresholds())
    time_floor_mib: float = 16.0
    kv_time_floor_tokens: float = 32.0
    # Schema-1 spellings (stats.trend.TrendThresholds): their min_growth is the time floor.
    memory: Any = None
    kv: Any = None

    def __post_init__(self) -> None:
        if self.settle_s is None:
            object.__setattr__(self, "settle_s", float(self.min_idle_s) / 2.0)
        for old, new in (("memory", "time_floor_mib"), ("kv", "kv_time_floor_tokens")):
            given = getattr(self, old)
            if given is not None and getattr(given, "min_growth", None) is not None:
                object.__setattr__(self, new, float(given.min_growth))

    @property
    def window_s(self) -> float:
        return self.bucket_s * self.max_buckets

    def check(self) -> WatchConfig:
        """Self when every setting is within its bounds (module doc); else InputError."""
        check_seconds("--bucket", self.bucket_s, 0.01, 86400.0)
        if not isinstance(self.max_buckets, int) or not 2 <= self.max_buckets <= MAX_BUCKETS:
            raise InputError(
                f"--window / --bucket gives {self.max_buckets} buckets per series: keep it "
                f"between 2 and {MAX_BUCKETS:,} (--window at least two buckets; a coarser "
                "--bucket for a longer window)"
            )
        check_seconds("--window", self.window_s, 2 * self.bucket_s, MAX_WINDOW_S)
        check_seconds("--warmup", self.warmup_s, 0.0, 30 * 86400.0)
        check_seconds("--min-idle", self.min_idle_s, 0.0, 3600.0)
        check_seconds("settle_s", float(self.settle_s or 0.0), 0.0, 3600.0)
        check_seconds("restart_window_s", self.restart_window_s, 0.0, 86400.0)
        check_seconds("inside_every_s", self.inside_every_s, 0.0, 86400.0)
        if not 0.0 <= self.quiet_quantile <= 1.0:
            raise InputError(f"quiet_quantile {self.quiet_quantile}: must be between 0 and 1")
        for name, value, lo, hi in (
            ("max_rounds", self.max_rounds, 3, 200),
            ("window_samples", self.window_samples, 2, 1000),
            ("quiet_blocks", self.quiet_blocks, 3, 200),
            ("max_series", self.max_series, 1, 100_000),
            ("max_events", self.max_events, 1, 100_000),
        ):
            if not isinstance(value, int) or not lo <= value <= hi:
                raise InputError(f"{name} {value}: must be a whole number from {lo} to {hi}")
        return self


@dataclass
class WatchOptions:
    """What to watch and how. Durations in seconds; `listen=None` serves no /metrics.

    `server_url`: the server (its /metrics; on this host its process tree is the server);
    `metrics_url`: its /metrics when not SERVER/metrics; `pids`: more processes of the server
    (--pid); `gpu_metrics`: GPU exporters instead of NVML; `launch`: the server's command,
    started by watch (`vramdoctor.soak.launch`) and stopped at the end; `agent`: the agent
    in a launched server; `out_dir`: rotating run files there.
    """

    interval_s: float = 5.0
    analyse_every_s: float = 30.0
    server_url: str | None = None
    metrics_url: str | None = None
    pids: list[int] = field(default_factory=list)
    gpu_metrics: list[str] = field(default_factory=list)
    gpus: list[int] | None = None
    use_nvml: bool = True
    config: WatchConfig = field(default_factory=WatchConfig)
    out_dir: Path | None = None
    rotate_bytes: int = 64 * 1024 * 1024
    keep_files: int = 8
    listen: str | None = "127.0.0.1:9840"
    headers: dict[str, str] | None = None
    launch: tuple[str, ...] | None = None
    startup_timeout_s: float = 600.0
    stop_grace_s: float = 15.0
    agent: bool = True
    inside: bool = True  # collect the agent's inside evidence when the server has the agent
    trace_python: bool = False

    def check(self) -> WatchOptions:
        """Self when every setting is within its bounds (module doc); else InputError."""
        self.config.check()
        check_seconds("--interval", self.interval_s, 0.01, 3600.0)
        if self.config.bucket_s < self.interval_s:
            raise InputError(
                f"--bucket {_show(self.config.bucket_s)} is shorter than --interval "
                f"{_show(self.interval_s)}: a bucket holds at least one sample"
            )
        check_seconds("--analyse-every", self.analyse_every_s, 0.01, 86400.0)
        check_seconds("--startup-timeout", self.startup_timeout_s, 0.1, 86400.0)
        check_seconds("--stop-grace", self.stop_grace_s, 0.0, 3600.0)
        if (
            not isinstance(self.rotate_bytes, int)
            or not 4096 <= self.rotate_bytes <= MAX_ROTATE_BYTES
        ):
            raise InputError("--rotate-mib: a run file part must hold between 4 KiB and 1 TiB")
        if not isinstance(self.keep_files, int) or not 1 <= self.keep_files <= MAX_KEEP:
            raise InputError(f"--keep {self.keep_files}: keep between 1 and {MAX_KEEP:,} run files")
        for pid in self.pids:
            if not isinstance(pid, int) or not 0 < pid < 2**31:
                raise InputError(f"--pid {pid}: not a process id")
        return self


def check_pids(pids: list[int]) -> None:
    """InputError for a --pid that names no process on this host (read from /proc: cheap, so
    the command refuses it before the analysis' imports load)."""
    import psutil

    for pid in pids:
        if not psutil.pid_exists(pid):
            raise InputError(f"--pid {pid}: no such process on this host")


def rotate_bytes_of(mib: float) -> int:
    """--rotate-mib MiB -> bytes; InputError for a value that is not a finite positive size."""
    try:
        v = float(mib)
    except (TypeError, ValueError):
        raise InputError(f"--rotate-mib {mib!r}: give a size in MiB") from None
    if not math.isfinite(v) or v <= 0:
        raise InputError(f"--rotate-mib {mib!r}: give a finite size in MiB, more than 0")
    if v * 1024 * 1024 > MAX_ROTATE_BYTES:
        raise InputError(f"--rotate-mib {v:g}: at most 1 TiB a part")
    return max(int(v * 1024 * 1024), 1)


def max_buckets_of(window_s: float, bucket_s: float) -> int:
    """The buckets a --window of --bucket holds; InputError when it is not a sane count."""
    check_seconds("--bucket", bucket_s, 0.01, 86400.0)
    check_seconds("--window", window_s, 0.02, MAX_WINDOW_S)
    n = window_s / bucket_s
    if not math.isfinite(n) or n < 2:
        raise InputError("--window must hold at least two buckets (--window >= 2 x --bucket)")
    if n > MAX_BUCKETS:
        raise InputError(
            f"--window {window_s:g} s of --bucket {bucket_s:g} s is {n:,.0f} buckets per series: "
            f"at most {MAX_BUCKETS:,} (give a coarser --bucket)"
        )
    return int(n)


__all__ += ["check_pids", "max_buckets_of", "rotate_bytes_of"]
