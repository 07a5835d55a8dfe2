"""The typed results of the soak analysis: numbers and codes, never sentences.

Everything here is data: the report side (`vramdoctor.soak.report`) turns codes into
sentences and numbers into text with their units. Sizes are MiB (`*_mib`), KV amounts are
tokens, times are monotonic seconds (`t`) or durations (`*_s`), rates are per request that
reached the server (`vramdoctor.samples.REACHED_SERVER`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vramdoctor.verdicts import RANK as _RANK
from vramdoctor.verdicts import Caveat, Explanation, Reason, Verdict

SCHEMA = "vramdoctor.soak/2"

# Verdicts of a series, a layer and a run (vramdoctor.verdicts: one vocabulary for soak, watch
# and fleet; each name below is the same object as there, kept so old imports work).
LEAK = Verdict.LEAK
CACHING = Verdict.CACHING
STABLE = Verdict.STABLE
INCONCLUSIVE = Verdict.INCONCLUSIVE
NOT_MEASURED = Verdict.NOT_MEASURED  # a layer no source measured (no /metrics: no KV layer)
RANK = _RANK

# The memory layers, in the order the report answers them (the built-in ones; the registry,
# vramdoctor.judge.layers, holds every layer, plugins included).
VRAM = "vram"
KV = "kv"
HOST = "host"
LAYERS = (VRAM, KV, HOST)

# Why a series got its verdict (the report words them): vramdoctor.verdicts.Reason.
R_FLAT = Reason.FLAT
R_ROSE_THEN_FLAT = Reason.ROSE_THEN_FLAT
R_CONVERGING = Reason.CONVERGING
R_FELL_BACK = Reason.FELL_BACK
R_BOUNDED = Reason.BOUNDED
R_LIVE_FLAT = Reason.LIVE_FLAT
R_GREW_EVERY_ROUND = Reason.GREW_EVERY_ROUND
R_GREW_WITH_TIME = Reason.GREW_WITH_TIME
R_LIVE_GREW = Reason.LIVE_GREW
R_NO_LEVEL = Reason.NO_LEVEL
R_NO_REFERENCE = Reason.NO_REFERENCE
R_ONE_ROUND = Reason.ONE_ROUND
R_TOO_FEW_ROUNDS = Reason.TOO_FEW_ROUNDS
R_STILL_CHANGING = Reason.STILL_CHANGING
R_STEADY_OR_CONVERGING = Reason.STEADY_OR_CONVERGING
R_RETENTION_OR_LEAK = Reason.RETENTION_OR_LEAK
R_OUTSIDE_MALLOC = Reason.OUTSIDE_MALLOC
R_TRANSIENT = Reason.TRANSIENT
R_NEVER_IDLE = Reason.NEVER_IDLE
R_NO_TRAFFIC = Reason.NO_TRAFFIC
R_SERVER_DIED = Reason.SERVER_DIED
R_NOISY = Reason.NOISY

# Why a layer is undecided (SoakAnalysis.undecided), for the adaptive rounds and the live view.
U_TOO_FEW_ROUNDS = Reason.TOO_FEW_ROUNDS
U_STILL_CHANGING = Reason.STILL_CHANGING
U_STEADY_OR_CONVERGING = Reason.STEADY_OR_CONVERGING
U_RETENTION_OR_LEAK = Reason.RETENTION_OR_LEAK
U_NO_LEVEL = Reason.NO_LEVEL
U_NEVER_IDLE = Reason.NEVER_IDLE
U_NOISY = Reason.NOISY  # idle windows too noisy for the floor
U_NO_TRAFFIC = Reason.NO_TRAFFIC

# Explanations of growth that is not a leak (LayerResult.explanation, SeriesResult.explanation).
X_MALLOC_ARENAS = Explanation.MALLOC_ARENAS
X_ARENA_RETENTION = Explanation.ARENA_RETENTION
X_PINNED = Explanation.PINNED
X_FILE_BACKED = Explanation.FILE_BACKED
X_KV_RESIDUE = Explanation.KV_RESIDUE
X_STRAY_CONTEXT = Explanation.STRAY_CONTEXT
X_ALLOCATOR_CACHE = Explanation.ALLOCATOR_CACHE
X_FRAGMENTATION = Explanation.FRAGMENTATION
X_CONVERGING_CACHE = Explanation.CONVERGING_CACHE
X_LIVE_CACHE = Explanation.LIVE_CACHE

# Caveats: what the analysis could not see.
C_NO_KINDS = Caveat.NO_KINDS
C_NO_ARENAS = Caveat.NO_ARENAS
C_PAGE_SIZE_ASSUMED = Caveat.PAGE_SIZE_ASSUMED
C_KV_RATIO_ONLY = Caveat.KV_RATIO_ONLY
C_NOT_IDLE_FILTERED = Caveat.NOT_IDLE_FILTERED
C_TENANTS_IN_DEVICE = Caveat.TENANTS_IN_DEVICE
C_INSIDE_PARTIAL = Caveat.INSIDE_PARTIAL


@dataclass(frozen=True)
class Thresholds:
    """What counts as growth. Memory series are MiB; KV series are tokens (or a 0..1 ratio)."""

    min_growth_mib: float = 2.0  # below this a change is resolution (NVML/DCGM report whole MiB)
    noise_k: float = 4.0  # growth must exceed noise_k x the noise measured inside idle windows
    rss_rel_floor: float = 0.0025  # host RSS: growth must also exceed 0.25 % of the level
    settle_fraction: float = 0.5  # settled level: median of the last half of each idle window
    decay_ratio: float = 0.5  # a leak's last increment is at least this share of its rate
    # Identical rounds leak identical amounts: the smallest increment after round 1 (plus the
    # noise) is at least this share of the largest, or the growth is not proportional to
    # requests (glibc heap growth under contention: +3 then +18 MiB; measured on an H200 host).
    proportional_ratio: float = 0.25
    # "Rose, then flat" after steady growth: the last increment is at most this share of the
    # rise before it (a steady creep under the floor is still changing, not flat).
    flat_share: float = 0.25
    trend_p: float = 0.05  # Kendall tau p-value over the settled samples of rounds 2..K
    trend_min_samples: int = 12  # below this many settled samples the trend test cannot veto
    # KV floor when the server does not say its page size: one token (SGLang's default page
    # size is 1; no other size is assumed).
    default_page_tokens: int = 1
    kv_ratio_floor: float = 0.001  # KV floor when only a 0..1 usage ratio is known
    arena_mib: float = 64.0  # glibc reserves each non-main arena heap in 64 MiB units
    arenas_per_core: int = 8  # glibc's default MALLOC_ARENA_MAX on 64-bit: 8 x cores


@dataclass
class Window:
    """A protocol window from the run's events; `end` None when it never closed."""

    kind: str  # "baseline", "load", "idle"
    round: int  # 0 for the baseline
    start: float
    end: float | None


@dataclass
class RoundInfo:
    """One round of traffic: requests sent and how they ended (kinds as the load records)."""

    round: int
    sent: int
    ok: int  # answered, or aborted by the client as planned
    errors: int
    reached: int  # requests that reached the server (model.REACHED_SERVER)
    error_kinds: dict[str, int]
    load_s: float | None
    complete: bool
    messages: list[str] = field(default_factory=list)  # a few distinct error messages
    life: int = 0  # which server life the round belongs to (Life.index); -1: cut by a death
    streamed: int | None = None  # requests sent streaming, when the load recorded it
    aborted: int | None = None  # requests the client abandoned mid-stream


@dataclass
class Life:
    """One life of the server: from the start (or a replacement) to its death or the end."""

    index: int
    start_t: float
    end_t: float | None
    pid: int | None
    ended_by: str | None  # None (the run ended), "server_died", "server_replaced"
    reason: str | None = None  # the producer's reason ("connection refused", "process gone")
    rounds: list[int] = field(default_factory=list)


@dataclass
class ProcessChange:
    """A process that appeared or exited during the run (event or series evidence)."""

    pid: int
    change: str  # "appeared", "exited", "transient" (appeared and exited)
    t: float | None
    round: int | None
    name: str | None = None
    gpu: int | None = None
    settled_rounds: int = 0


@dataclass
class SeriesResult:
    """One memory series judged over the settled level after each round.

    `key` names it: "gpu0" (device), "gpu0/pid42" (a process on a GPU), "rss/pid42" (host
    RSS), "rss_anon/pid42", "rss_shmem/pid42", "rss_file/pid42", "arenas/pid42" (count),
    "arena_mib/pid42", "dev_shm", "kv/full" (a KV pool).
    """

    key: str
    layer: str  # "vram", "kv", "host"
    kind: str  # gpu, gpu_process, rss, rss_anon, rss_file, rss_shmem, arenas, kv, dev_shm
    unit: str  # "MiB", "tokens", "ratio", "arenas"
    pid: int | None = None
    gpu: int | None = None
    name: str | None = None
    role: str | None = None
    pool: str | None = None
    baseline: float | None = None
    settled: list[float | None] = field(default_factory=list)  # per round of the run
    last: float | None = None
    growth: float | None = None  # last settled - reference
    noise: float = 0.0
    threshold: float = 0.0
    slope_per_request: float | None = None  # unit per request
    slope_ci: tuple[float, float] | None = None  # 90 % (Theil-Sen)
    tau: float | None = None
    tau_p: float | None = None
    increments: list[float] = field(default_factory=list)
    verdict: str = INCONCLUSIVE
    reason: str = R_NO_LEVEL
    creep_floor_per_request: float | None = None  # CACHING with a creep under the floor
    round_growth: float | None = None  # growth a normal round gives at the fitted rate
    time_rate_per_s: float | None = None  # LEAK grew_with_time: unit per second, idle included
    settled_rounds: int = 0  # rounds where the series was present and settled
    presence: str = "whole"  # whole, appeared, exited, transient
    decides: bool = True  # False: evidence only (a transient, a device total with processes)
    explanation: str | None = None  # X_* code when growth is explained as caching
    life: int = 0
    first_t: float | None = None  # first and last sample (monotonic s)
    last_t: float | None = None
    # The growth model (vramdoctor.stats.growth): which one explains the rounds, the share of a
    # round's growth the next adds (1 steady, < 1 converging) with its interval, the projected
    # level of a converging series (and at the slowest convergence allowed), and about how
    # many more rounds would decide an undecided one.
    model: str | None = None
    ratio: float | None = None
    ratio_ci: tuple[float, float] | None = None
    bound: float | None = None
    bound_hi: float | None = None
    steps_to_decide: int | None = None
    # an inside live series held back: steady, but this many rounds short of what live bytes
    # need to rule out a cache still filling (vramdoctor.judge.inside.INSIDE_MIN_STEADY_STEPS)
    steps_missing: int = 0
    scope: str = "server"  # "server" (the port owner's tree, --pid) or "tenant"
    gpu_instance: int | None = None  # MIG: the GPU instance (slice) of GPU `gpu`
    compute_instance: int | None = None
    device: str | None = None  # "GPU 0", "GPU 0 MIG 3g.71gb GI 1"
    username: str | None = None  # whose process, where the host could see it
    decided_by: str | None = None  # vramdoctor.verdicts.Evidence: what decided the verdict
    # Inside evidence: the kind of counter that decided ("cuda_allocated", "glibc_in_use",
    # "py_blocks", "py_traced"), for an outside series whose verdict came from inside.
    evidence_kind: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _finite_dict(
            {
                "id": self.key,
                "layer": self.layer,
                "kind": self.kind,
                "unit": self.unit,
                "pid": self.pid,
                "gpu": self.gpu,
                "name": self.name,
                "role": self.role,
                "pool": self.pool,
                "baseline": self.baseline,
                "settled": list(self.settled),
                "last": self.last,
                "growth": self.growth,
                "noise": self.noise,
                "threshold": self.threshold,
                "slope_per_request": self.slope_per_request,
                "slope_ci": list(self.slope_ci) if self.slope_ci else None,
                "tau": self.tau,
                "tau_p": self.tau_p,
                "increments": list(self.increments),
                "verdict": self.verdict,
                "reason": self.reason,
                "creep_floor_per_request": self.creep_floor_per_request,
                "time_rate_per_s": self.time_rate_per_s,
                "settled_rounds": self.settled_rounds,
                "presence": self.presence,
                "decides": self.decides,
                "explanation": self.explanation,
                "life": self.life,
                "model": self.model,
                "ratio": self.ratio,
                "ratio_ci": list(self.ratio_ci) if self.ratio_ci else None,
                "bound": self.bound,
                "bound_hi": self.bound_hi,
                "steps_to_decide": self.steps_to_decide,
                "scope": self.scope,
                "gpu_instance": self.gpu_instance,
                "compute_instance": self.compute_instance,
                "device": self.device,
                "username": self.username,
                "decided_by": self.decided_by,
                "evidence_kind": self.evidence_kind,
            }
        )


@dataclass
class Culprit:
    """Who holds the growing memory: a process (pid, name, GPU), a GPU, or a KV pool."""

    series: str
    pid: int | None = None
    name: str | None = None
    gpu: int | None = None
    pool: str | None = None
    # What kind of leak: "allocator" (VRAM through the allocator, KV flat), "stray_context",
    # "outside_allocator" (VRAM the caching allocator does not hold), "kv_pages", "host_ram",
    # "pinned_host_memory", "dev_shm".
    cause: str | None = None
    gpu_instance: int | None = None  # MIG: the slice (GPU instance) of GPU `gpu`
    device: str | None = None  # "GPU 0 MIG 3g.71gb GI 1"
    # Code that holds the growing memory, where attribution found it (HeldBy.to_dict()).
    held_by: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "series": self.series,
            "pid": self.pid,
            "name": self.name,
            "gpu": self.gpu,
            "pool": self.pool,
            "cause": self.cause,
            "gpu_instance": self.gpu_instance,
            "device": self.device,
            "held_by": list(self.held_by),
        }


@dataclass
class Projection:
    """When the leaking layer runs out: always in requests, in hours only at a stated rate.

    `capacity_left` (in the layer's unit) is what is still free: the GPU's free MiB, the
    host's available MiB, or the KV pool's free tokens. `hours` is None unless a production
    request rate is known (`production_rate_rps`): the soak's own burst load is never used.
    """

    capacity_left: float | None
    capacity_of: str  # "gpu_free", "host_available", "kv_free_tokens"
    requests: float | None  # requests until the capacity is used up, at the measured rate
    production_rate_rps: float | None = None
    production_rate_source: str | None = None  # "argument", "server_counter"
    hours: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return _finite_dict(
            {
                "capacity_left": self.capacity_left,
                "capacity_of": self.capacity_of,
                "requests": self.requests,
                "production_rate_rps": self.production_rate_rps,
                "production_rate_source": self.production_rate_source,
                "hours": self.hours,
            }
        )


@dataclass
class KvPoolResult:
    """One KV pool's verdict, in tokens, pages and (when bytes per token are known) MiB."""

    pool: str
    unit: str  # "tokens", or "ratio" when the pool size is unknown
    total_tokens: float | None
    page_size_tokens: int | None  # None: the server does not say (tokens only, no pages)
    page_size_assumed: bool  # True: page size unknown (the name is kept from schema /2's start)
    bytes_per_token: float | None
    idle_residue: float | None  # the last settled level (0 on a healthy idle pool)
    tokens_per_request: float | None
    pages_per_request: float | None
    mib_per_request: float | None
    source: str | None
    series: str  # SeriesResult.key


@dataclass
class HostProcessResult:
    """One process's host memory by kind, and what explains its growth."""

    pid: int
    name: str | None
    role: str | None
    rss_growth_mib: float | None
    anon_growth_mib: float | None
    file_growth_mib: float | None
    shmem_growth_mib: float | None
    arenas_first: int | None  # non-main malloc arenas at the first settled level
    arenas_last: int | None
    arena_reserved_growth_mib: float | None
    arena_bound: int | None  # MALLOC_ARENA_MAX in effect: the server's, else 8 x cores if known
    growth_kind: str | None  # "anon", "file", "shmem": which kind grew most
    explanation: str | None  # X_MALLOC_ARENAS, X_PINNED, X_FILE_BACKED
    missing: list[str] = field(default_factory=list)  # C_NO_KINDS, C_NO_ARENAS
    series: str = ""
    arena_bound_set: bool = False  # the bound is MALLOC_ARENA_MAX from the server's environment


@dataclass
class LayerResult:
    """One memory layer's verdict with its rate, interval, culprit and evidence.

    `rate_per_request` and `rate_ci` are in `unit` per request (MiB for VRAM and host RAM,
    tokens for KV); `rate_mib_per_request` is the same in MiB where it can be (KV needs bytes
    per token). `series` holds every series of the layer, deciding ones first.
    """

    layer: str
    verdict: str
    reason: str
    unit: str
    rate_per_request: float | None = None
    rate_ci: tuple[float, float] | None = None
    rate_mib_per_request: float | None = None
    # A leak driven by time (reason grew_with_time): unit per hour, idle included; the rate
    # per request is then only an average at the soak's load.
    rate_per_hour: float | None = None
    # Every round abandoned some streams (--abort-fraction): the same growth per request the
    # client abandoned, should only those leak (one soak cannot tell: the share is constant).
    rate_per_aborted_request: float | None = None
    growth: float | None = None
    culprit: Culprit | None = None
    projection: Projection | None = None
    explanation: str | None = None
    caveats: list[str] = field(default_factory=list)
    undecided_reason: str | None = None
    series: list[SeriesResult] = field(default_factory=list)
    kv_pools: list[KvPoolResult] = field(default_factory=list)
    host_processes: list[HostProcessResult] = field(default_factory=list)
    stray_contexts: list[str] = field(default_factory=list)  # series keys
    main_series: str | None = None  # the series that carries the verdict
    life: int = 0
    # Which evidence decided (vramdoctor.verdicts.Evidence): the agent's counters inside the
    # process, or the rounds / idle windows seen from outside.
    decided_by: str | None = None
    # Other tenants' processes on the server's GPUs (or host): series keys; listed with their
    # growth, never deciding, never the culprit.
    tenants: list[str] = field(default_factory=list)

    @property
    def deciding(self) -> list[SeriesResult]:
        return [s for s in self.series if s.decides]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return _finite_dict(
            {
                "verdict": self.verdict,
                "reason": self.reason,
                "unit": self.unit,
                "rate_per_request": self.rate_per_request,
                "rate_ci": list(self.rate_ci) if self.rate_ci else None,
                "rate_mib_per_request": self.rate_mib_per_request,
                "rate_per_hour": self.rate_per_hour,
                "rate_per_aborted_request": self.rate_per_aborted_request,
                "growth": self.growth,
                "culprit": self.culprit.to_dict() if self.culprit else None,
                "projection": self.projection.to_dict() if self.projection else None,
                "explanation": self.explanation,
                "caveats": list(self.caveats),
                "undecided_reason": self.undecided_reason,
                "life": self.life,
                "main_series": self.main_series,
                "decided_by": self.decided_by,
                "tenants": list(self.tenants),
                "evidence": [s.key for s in self.series if s.decides],
                "pools": [asdict(p) for p in self.kv_pools],
                "processes": [asdict(p) for p in self.host_processes],
                "stray_contexts": list(self.stray_contexts),
            }
        )


@dataclass
class Undecided:
    """A layer still undecided, and why (U_* code): more rounds may decide it."""

    layer: str
    reason: str
    series: str | None = None


@dataclass
class SoakAnalysis:
    """The whole run: one verdict per layer and the overall verdict by the documented rule.

    Overall rule (`overall_verdict`): LEAK if any layer is LEAK; else INCONCLUSIVE if any
    measured layer is INCONCLUSIVE; else CACHING if any layer is CACHING; else STABLE (and
    INCONCLUSIVE when no layer was measured or no request succeeded). `healthy` is False on
    a LEAK, a server death or a failed collector; `exit_code` is then 1.
    """

    verdict: str
    layers: dict[str, LayerResult]
    rounds: list[RoundInfo]
    windows: list[Window]
    lives: list[Life]
    series: list[SeriesResult]
    process_changes: list[ProcessChange] = field(default_factory=list)
    undecided: list[Undecided] = field(default_factory=list)
    status: str = "complete"
    server_died: bool = False
    server_replaced: bool = False
    collector_failed: str | None = None
    source_errors: int = 0
    no_request_succeeded: bool = False
    first_error: str | None = None
    observed_requests_per_hour: float | None = None  # the soak's burst load (never projected)
    production_rate_rps: float | None = None
    production_rate_source: str | None = None
    cpu_count: int | None = None
    notes: list[str] = field(default_factory=list)  # added by callers (e.g. "torn tail")
    points: dict[str, list[tuple[float, float]]] = field(default_factory=dict, repr=False)
    # Why the traffic stopped early (the run's `stopped` event): auth-failed (round 1 refused
    # as unauthorized), requests-failed (no request of round 1 succeeded), duration, ...
    stopped_by: str | None = None

    @property
    def interrupted(self) -> bool:
        """Stopped by Ctrl-C or SIGTERM: the report covers what was measured; never healthy."""
        return self.status == "interrupted"

    @property
    def healthy(self) -> bool:
        return (
            self.verdict != LEAK
            and not self.server_died
            and self.collector_failed is None
            and self.status not in ("failed", "interrupted")
            and not self.no_request_succeeded
        )

    @property
    def exit_code(self) -> int:
        """README "Exit codes": 1 a problem (LEAK, server death, failed collector, no request
        succeeded: the server is failing), found before an interrupt too; else 130 when
        interrupted; 2 when the server refused the requests as unauthorized (the key: usage);
        else 0."""
        if (
            self.verdict == LEAK
            or self.server_died
            or self.collector_failed is not None
            or self.status == "failed"
        ):
            return 1
        if self.interrupted:
            return 130
        if self.stopped_by == "auth-failed":
            return 2
        return 1 if self.no_request_succeeded else 0

    @property
    def decided(self) -> bool:
        return not self.undecided

    def undecided_layers(self) -> dict[str, str]:
        """layer -> reason code for every layer more rounds could still decide."""
        return {u.layer: u.reason for u in self.undecided}

    def layer(self, name: str) -> LayerResult:
        return self.layers[name]


def finite(obj: Any) -> Any:
    """JSON has no NaN/inf: map them to null, numpy scalars and tuples to Python ones."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _finite_dict(doc: dict[str, Any]) -> dict[str, Any]:
    """`finite` of a JSON object, typed as one."""
    out: dict[str, Any] = finite(doc)
    return out
