"""`ServerKind`: everything vramdoctor knows about one kind of inference server, as data.

A kind is a frozen dataclass of sections. Each section belongs to the part of vramdoctor that
reads it, and a new section is one new field with a default, so adding a section never touches
the other kinds and adding a kind never touches the readers:

- `identity` (sources: identification, process naming, crash leftovers): the probes that name
  the server from its HTTP answers, the `/metrics` prefixes, the process titles and what each
  process is (`ProcessTitle`), the shared-memory names it leaves in /dev/shm (`ShmFamily`).
- `metrics` (sources.server_metrics, watch, fleet, the judge): metric names WITH their units,
  folded to stable names (`MetricSeries`), the KV pools (`KvPoolMetrics`), running/queued
  requests, request counters, the caches that are known to be bounded (`BoundedCache`: a plateau
  there is caching, not a leak) and the sleep state (`SleepMetrics`).
- later sections (added by their owners with defaults): lifecycle endpoints, request features,
  fix levers, log marks, ab-test presets.

Everything here is pure: no I/O, no imports of sources or judge. Units are in the field names
or in `unit` (one of `UNITS`). Sources of every name are cited in the kind modules.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from vramdoctor.servers.diagnose_sections import Levers, LogMarks, no_levers
from vramdoctor.servers.lifecycle_sections import (
    Lifecycle,
    RequestFeatures,
    features_field,
    lifecycle_field,
)
from vramdoctor.servers.presets import Preset

__all__ = [
    "UNITS",
    "BoundedCache",
    "CapacityLabels",
    "Fold",
    "Identity",
    "InfoLabel",
    "KvPoolMetrics",
    "MetricSeries",
    "Metrics",
    "Probe",
    "ProbeAnswer",
    "ProcessTitle",
    "Rows",
    "ServerKind",
    "ShmFamily",
    "SleepMetrics",
    "fold",
    "replica_key",
]

Labels = Mapping[str, str]
Rows = Sequence[tuple[Labels, float]]

# How a series' label sets fold to one number (see `fold`).
Fold = Literal["max", "min", "mean", "sum", "replicas_sum", "rank_sum_max"]

# The units a metric value can carry. "ratio" is 0..1; "GiB" is what SGLang's "_gb" gauges hold
# (they divide by 1 << 30); "MiB" what its "_mb" gauges hold.
UNITS = frozenset(
    {
        "ratio",
        "tokens",
        "requests",
        "tokens/s",
        "GiB",
        "MiB",
        "bytes",
        "entries",
        "slots",
        "states",
        "count",
        "seconds",
        "level",
    }
)

# Labels that mark copies of one replica's numbers (every TP rank of a replica sees one batch).
REPLICA_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank"})
# Labels that tell one GPU/rank from another, for per-rank memory gauges.
RANK_LABELS = REPLICA_LABELS | {"dp_rank", "engine"}


def replica_key(labels: Labels) -> tuple[tuple[str, str], ...]:
    """The label set with the per-rank copies' labels left out: one key per replica/engine."""
    return tuple(sorted((k, v) for k, v in labels.items() if k not in REPLICA_LABELS))


def fold(rows: Rows, how: Fold) -> float:
    """Fold the rows of one series (label set, value) to one number. `rows` must not be empty.

    - max / min / mean / sum: over every row;
    - replicas_sum: TP/PP/EP copies of one replica folded with max, then summed over replicas
      (dp_rank, engine, ...): what a server holds in all;
    - rank_sum_max: the parts of one rank summed (e.g. graph memory per phase), then the max over
      ranks: what the fullest GPU holds.
    """
    if how == "max":
        return max(v for _, v in rows)
    if how == "min":
        return min(v for _, v in rows)
    if how == "mean":
        return sum(v for _, v in rows) / len(rows)
    if how == "sum":
        return sum(v for _, v in rows)
    if how == "replicas_sum":
        groups: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, v in rows:
            k = replica_key(labels)
            groups[k] = max(groups.get(k, v), v)
        return sum(groups.values())
    if how == "rank_sum_max":
        ranks: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, v in rows:
            k = tuple(sorted((a, b) for a, b in labels.items() if a in RANK_LABELS))
            ranks[k] = ranks.get(k, 0.0) + v
        return max(ranks.values())
    raise ValueError(f"unknown fold {how!r}")


# --- identity -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeAnswer:
    """What one identifying HTTP answer says about the server (None = it does not say)."""

    version: str | None = None
    model: str | None = None
    # SGLang's start-up memory split (weight, kvcache, graph, token_capacity), as it gives it.
    memory_usage: dict[str, Any] | None = None
    page_size_tokens: int | None = None


@dataclass(frozen=True)
class Probe:
    """One identification request: GET `path`; `read(json)` returns a ProbeAnswer when the JSON
    answer is this kind's, None when it is not (another server answering the same path)."""

    path: str
    read: Callable[[Any], ProbeAnswer | None]


_RANK_PART = re.compile(r"_((?:ATTN_|MOE_)?[A-Z]+)(\d+)")


@dataclass(frozen=True)
class ProcessTitle:
    """A process title (setproctitle; /proc/PID/cmdline) or command line -> what the process is.

    `pattern` is searched in the command line joined by spaces, then the process name. Its
    named group `ranks`, when present, holds suffixes such as `_DP0_TP1`, which become the
    role's suffix ("sglang scheduler DP0 TP1"); a named group `index` adds " N".
    `part` is what the process does for the server:

    - "frontend": the HTTP/API process (SGLang tokenizer manager, vLLM API server);
    - "engine": the scheduler/engine core that owns the batch (and, single-GPU, the model);
    - "worker": a model worker holding weights and KV cache on one GPU;
    - "helper": detokenizer, coordinators, data-parallel controller.

    `gpu_context`: whether the process has a CUDA context on the model's GPUs by design:
    "model" (holds the model there), "possible" (it may open one on an engine GPU, e.g. vLLM's
    API server for multimodal IPC or video decode: named as such, never a stray context),
    "none" (a context there is a finding).

    `orphan_check`: an engine/worker/helper whose parent is not a process of its server is an
    orphan left by a server that is gone (census); False where the parent is another
    program's by design (Ray's workers are children of Ray's raylet).
    """

    pattern: re.Pattern[str]
    role: str
    part: Literal["frontend", "engine", "worker", "helper"]
    gpu_context: Literal["model", "possible", "none"] = "none"
    orphan_check: bool = True

    def match(self, text: str) -> str | None:
        """The role for `text` (a joined command line or a name), or None."""
        m = self.pattern.search(text)
        if m is None:
            return None
        role = self.role
        groups = m.groupdict()
        if groups.get("index"):
            role += f" {groups['index']}"
        if groups.get("ranks"):
            role += "".join(f" {name}{n}" for name, n in _RANK_PART.findall(groups["ranks"]))
        return role


@dataclass(frozen=True)
class ShmFamily:
    """A family of names a server (or its runtime) creates in /dev/shm.

    `pattern` fully matches the file name (a POSIX semaphore `/name` is the file `sem.name`).
    A named group `pid` is the creator's pid where the name carries it (then a dead pid means
    the segment is orphaned); without it, only the processes that hold it open or mapped say
    whether anyone still uses it. `source` says where the name was read.
    """

    family: str
    pattern: re.Pattern[str]
    what: str
    source: str
    semaphore: bool = False

    @property
    def pid_stamped(self) -> bool:
        return "pid" in self.pattern.groupindex

    def match(self, filename: str) -> re.Match[str] | None:
        return self.pattern.fullmatch(filename)


@dataclass(frozen=True)
class Identity:
    """How to tell this kind of server apart, and name its processes and files."""

    # Identification requests, tried in order (the first answer that reads as this kind wins).
    probes: tuple[Probe, ...] = ()
    # Prefixes of this kind's own /metrics series ("sglang:"): the kind with most series wins.
    metric_prefixes: tuple[str, ...] = ()
    titles: tuple[ProcessTitle, ...] = ()
    shm_families: tuple[ShmFamily, ...] = ()
    # The kind any OpenAI-compatible server falls back to: identified by /v1/models alone.
    fallback: bool = False


# --- metrics --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricSeries:
    """One stable name: the series that carry it (first present wins), how they fold, the unit.

    `since`/`until` are the server versions that export it (documentation; None = unknown)."""

    stable: str
    names: tuple[str, ...]
    fold: Fold
    unit: str
    doc: str
    since: str | None = None
    until: str | None = None

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"{self.stable}: unit {self.unit!r} is not one of {sorted(UNITS)}")


@dataclass(frozen=True)
class CapacityLabels:
    """A pool size carried as labels of an info metric (vLLM `cache_config_info`):
    capacity in tokens = `blocks_label` x `block_size_label`, per engine."""

    metric: str
    blocks_label: str
    block_size_label: str


@dataclass(frozen=True)
class KvPoolMetrics:
    """One KV pool: its used tokens, and what sizes it. Used tokens, first that is present:
    the `used` gauges (tokens, summed over replicas), else a `usage_ratio` (0..1) times the
    capacity (`capacity`, tokens summed over replicas, or `capacity_labels`, per engine).

    `primary`: the pool that the page size, bytes per token and memory gauges describe (SGLang's
    full-attention pool; vLLM's one pool); other pools are left out when their size is 0 (a
    hybrid pool the model does not have). `memory_gib`: a gauge of this pool's memory per GPU
    in GiB, from which bytes per token = memory / capacity."""

    pool: str
    used: tuple[str, ...] = ()
    available: str | None = None
    evictable: str | None = None
    capacity: str | None = None
    capacity_labels: CapacityLabels | None = None
    usage_ratio: tuple[str, ...] = ()
    memory_gib: str | None = None
    primary: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """Every metric name this pool reads."""
        out = [*self.used, *self.usage_ratio]
        out += [n for n in (self.available, self.evictable, self.capacity, self.memory_gib) if n]
        if self.capacity_labels:
            out.append(self.capacity_labels.metric)
        return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class InfoLabel:
    """A number carried as a label of an info metric, e.g. vLLM's
    `vllm:cache_config_info{gpu_memory_utilization="0.9"}` -> stable `gpu_memory_utilization`."""

    metric: str
    label: str
    stable: str
    unit: str


@dataclass(frozen=True)
class BoundedCache:
    """A cache the server keeps up to a bound: growth that levels off there is caching.

    `layer` is where it lives ("vram", "host", "host_kv": a host-side KV tier). `holders` are the
    roles (`ProcessTitle.role` prefixes) of the processes that each keep one copy. The bound is
    `default_size` in `unit` unless the server's `flag` (command line) or `env` (environment)
    sets it; `size_of` reads them. `used`/`capacity` name stable metric values that show it
    filling, when the server exports them. `source`: where this was read.
    """

    name: str
    layer: Literal["vram", "host", "host_kv"]
    what: str
    source: str
    holders: tuple[str, ...] = ()
    flag: str | None = None
    env: str | None = None
    default_size: float | None = None
    unit: str = "MiB"
    used: str | None = None
    capacity: str | None = None

    def size_of(
        self, cmdline: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
    ) -> tuple[float | None, str]:
        """(bound in `unit`, what it rests on) for one process. Pure.

        The flag on the command line wins over the environment, which wins over the default.
        A value that is not a finite number >= 0 is skipped (and said)."""
        said: list[str] = []
        if self.flag and cmdline:
            for i, arg in enumerate(cmdline):
                value: str | None = None
                if arg == self.flag and i + 1 < len(cmdline):
                    value = cmdline[i + 1]
                elif arg.startswith(self.flag + "="):
                    value = arg.split("=", 1)[1]
                if value is not None:
                    number = _number(value)
                    if number is not None:
                        return number, f"{self.flag} {value} on the command line"
                    said.append(f"{self.flag} {value!r} is not a size")
        if self.env and environ and self.env in environ:
            number = _number(environ[self.env])
            if number is not None:
                return number, f"{self.env}={environ[self.env]} in the environment"
            said.append(f"{self.env}={environ[self.env]!r} is not a size")
        if self.default_size is not None:
            said.append(f"the default {self.default_size:g} {self.unit}")
            return self.default_size, "; ".join(said)
        return None, "; ".join(said) or "no default known"


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class SleepMetrics:
    """A sleep mode's metrics (vLLM): `state` is a gauge with one row per state value in label
    `label`, 1 for the engine's current state; `levels` maps state values to sleep levels
    (0 = awake). `in_flight`: a gauge of sleep/wake operations running; `operations`: a counter
    of finished operations (a histogram's `_count`), labelled by operation."""

    state: str
    label: str
    levels: Mapping[str, int]
    in_flight: str | None = None
    operations: str | None = None


@dataclass(frozen=True)
class Metrics:
    """A server's /metrics, as vramdoctor reads it. Empty for a server without /metrics."""

    series: tuple[MetricSeries, ...] = ()
    kv_pools: tuple[KvPoolMetrics, ...] = ()
    # Requests in the running batch and waiting (summed over replicas); 0 and 0 = idle.
    running_requests: tuple[str, ...] = ()
    queued_requests: tuple[str, ...] = ()
    # Cumulative finished requests (first present wins, every label set summed).
    request_counters: tuple[str, ...] = ()
    # (hits, queries) counter pairs for a hit rate when no hit-rate gauge is exported.
    hit_rate_counters: tuple[tuple[str, str], ...] = ()
    info_labels: tuple[InfoLabel, ...] = ()
    bounded_caches: tuple[BoundedCache, ...] = ()
    sleep: SleepMetrics | None = None

    @property
    def stable_names(self) -> tuple[str, ...]:
        """Every stable name this kind can fill, in order."""
        names = [s.stable for s in self.series] + [i.stable for i in self.info_labels]
        if self.hit_rate_counters:
            names.append("cache_hit_rate")
        if self.sleep is not None:
            names += ["sleeping", "sleep_level"]
            if self.sleep.in_flight:
                names.append("sleep_operations_in_flight")
            if self.sleep.operations:
                names.append("sleep_operations_total")
        return tuple(dict.fromkeys(names))

    @property
    def names(self) -> tuple[str, ...]:
        """Every metric name this kind reads (for docs, fleet's rules check)."""
        out: list[str] = []
        for s in self.series:
            out += s.names
        for p in self.kv_pools:
            out += p.names
        out += [*self.running_requests, *self.queued_requests, *self.request_counters]
        for hits, queries in self.hit_rate_counters:
            out += [hits, queries]
        out += [i.metric for i in self.info_labels]
        if self.sleep is not None:
            out += [n for n in (self.sleep.state, self.sleep.in_flight, self.sleep.operations) if n]
        return tuple(dict.fromkeys(out))

    def series_named(self, stable: str) -> MetricSeries | None:
        return next((s for s in self.series if s.stable == stable), None)


# --- the kind -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerKind:
    """One kind of inference server. Sections owned by other parts of vramdoctor are added as
    new fields with defaults below `metrics` (see the package docstring)."""

    name: str  # "sglang", "vllm", "openai": the value run files and JSON carry
    display_name: str  # "SGLang", "vLLM", "an OpenAI-compatible server"
    identity: Identity = field(default_factory=Identity)
    metrics: Metrics = field(default_factory=Metrics)
    # Sections of other owners go here, each a field with a default (None / empty).
    # diagnose: the server's fix levers and the marks its logs carry (diagnose_sections.py)
    levers: Levers = field(default_factory=no_levers)
    log_marks: LogMarks = field(default_factory=LogMarks)
    # ab-test: named `ab-test --server` variants with the server's real flags (presets.py)
    presets: tuple[Preset, ...] = ()
    # soak --cycle / --vary: lifecycle endpoints and request fields (lifecycle_sections.py)
    lifecycle: Lifecycle = field(default_factory=lifecycle_field)
    request_features: RequestFeatures = field(default_factory=features_field)

    def title_of(
        self, name: str | None, cmdline: Sequence[str] | None
    ) -> tuple[ProcessTitle, str] | None:
        """(title, role) of the first process title of this kind found in the command line
        joined by spaces and the process name, or None."""
        text = " ".join(cmdline or []) + " " + (name or "")
        for title in self.identity.titles:
            role = title.match(text)
            if role is not None:
                return title, role
        return None

    def shm_family(self, filename: str) -> ShmFamily | None:
        """The shared-memory family a /dev/shm file name belongs to, if it is this kind's."""
        return next((f for f in self.identity.shm_families if f.match(filename)), None)
