"""Evidence from inside the server's processes: what each allocator counts as live and as kept.

From outside a process, memory an allocator keeps and memory a leak holds look the same. Inside,
each allocator counts both. The in-process agent (`vramdoctor.agent`) writes one
`vramdoctor.samples.InsideSample` per armed process at the baseline and at the end of every idle
window; allocator snapshots of `soak --attribute` give the same for CUDA (soak.analyse_run turns
them into InsideSamples). Series, per process (MiB unless said):

| key | layer | what | live? |
|---|---|---|---|
| `cuda_allocated/pidP` | vram | torch.cuda allocated bytes (live tensors), all devices | live |
| `cuda_reserved/pidP` | vram | segments the caching allocator holds | kept |
| `cuda_split/pidP` | vram | free pieces of split segments (fragmentation) | kept |
| `glibc_in_use/pidP` | host | mallinfo2 uordblks + hblkhd (malloc's live bytes) | live |
| `glibc_kept/pidP` | host | mallinfo2 fordblks (freed bytes glibc keeps) | kept |
| `glibc_footprint/pidP` | host | mallinfo2 arena + hblkhd (what malloc holds from the system) | both |
| `py_blocks/pidP` | host | sys.getallocatedblocks() (Python objects; pymalloc's arenas are mmap'd outside malloc's counters), in blocks | live |
| `py_traced/pidP` | host | tracemalloc's traced bytes (--trace-python) | live |
| `pinned_in_use/pidP` | host | pinned host memory handed out (torch.cuda.host_memory_stats) | live |
| `pinned_held/pidP` | host | pinned host memory held (handed out + cached) | kept |

Each is judged over the life's rounds by the same growth model as every series
(`vramdoctor.stats.rounds.classify_series`). Then, per process, what is live decides
(`InsideEvidence.decide_vram`, `decide_host`):

- a live series that grows steadily with the requests is a LEAK (`live_grew`), at the live
  series' rate, with the stacks or lines that hold it where attribution found them;
- live series that grow but whose shape the rounds cannot name leave the process INCONCLUSIVE
  with their reason;
- live series flat (or converging: a bounded cache of live objects, `live_cache`) while the
  outside series grows: CACHING `live_flat`, named: `allocator_cache` (CUDA reserved grew),
  `fragmentation` (the split pieces grew most), `arena_retention` (glibc kept it),
  `pinned_host_memory` (the pinned cache). VRAM growth beyond the caching allocator's
  reserve (NCCL, CUDA graphs, extensions) is judged on its own from outside (`outside the
  allocator`). On the host, retention needs glibc's bytes in use AND Python's allocated
  blocks flat (pymalloc's arenas are mmap'd outside glibc's counters, so a leak of small
  Python objects grows RssAnon with glibc's bytes in use flat); growth beyond glibc's
  footprint with Python's blocks unread is INCONCLUSIVE `outside_malloc`.

Pure: records in, judged series out. Byte counts are converted to MiB here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.judge.results import (
    CACHING,
    HOST,
    INCONCLUSIVE,
    LEAK,
    NOT_MEASURED,
    R_BOUNDED,
    R_FELL_BACK,
    R_GREW_EVERY_ROUND,
    R_GREW_WITH_TIME,
    R_LIVE_FLAT,
    R_LIVE_GREW,
    R_NOISY,
    R_OUTSIDE_MALLOC,
    R_RETENTION_OR_LEAK,
    R_STEADY_OR_CONVERGING,
    R_STILL_CHANGING,
    STABLE,
    VRAM,
    X_ALLOCATOR_CACHE,
    X_ARENA_RETENTION,
    X_FRAGMENTATION,
    X_LIVE_CACHE,
    X_PINNED,
    SeriesResult,
    Thresholds,
)
from vramdoctor.samples import MIB, InsideSample
from vramdoctor.stats.rounds import classify_series
from vramdoctor.verdicts import Evidence

__all__ = [
    "LIVE_KINDS",
    "HeldBy",
    "InsideEvidence",
    "InsidePoints",
    "inside_points",
]

# kind -> (layer, unit, live?, the growth that counts, the reading's own step)
_KINDS: dict[str, tuple[str, str, bool, float, float]] = {
    "cuda_allocated": (VRAM, "MiB", True, 2.0, 0.25),
    "cuda_reserved": (VRAM, "MiB", False, 2.0, 2.0),
    "cuda_split": (VRAM, "MiB", False, 2.0, 2.0),
    "glibc_in_use": (HOST, "MiB", True, 2.0, 0.25),
    "glibc_kept": (HOST, "MiB", False, 2.0, 0.25),
    "glibc_footprint": (HOST, "MiB", False, 2.0, 0.25),
    "py_blocks": (HOST, "blocks", True, 2000.0, 100.0),
    "py_traced": (HOST, "MiB", True, 2.0, 0.25),
    "pinned_in_use": (HOST, "MiB", True, 2.0, 0.25),
    "pinned_held": (HOST, "MiB", False, 2.0, 2.0),
    # derived: NVML's count of the process minus the caching allocator's reserve (a CUDA
    # context, NCCL, CUDA graphs' driver memory, extensions' own cudaMalloc)
    "gpu_outside": (VRAM, "MiB", False, 2.0, 1.0),
}
LIVE_KINDS = frozenset(k for k, v in _KINDS.items() if v[2])
# A live series is read once a round, exactly (no idle window's spread to say its noise): a
# cache of live objects that fills at a fixed rate up to its cap is exactly linear until it is
# full, so a LEAK from live bytes needs this many increments from round 1 on (five settled
# rounds), and says INCONCLUSIVE before: the adaptive rounds go on. (Seen on an H200: the
# reference retention server's bytes in use grew exactly 9.0 MiB a round for four rounds, then
# stopped at 389 MiB; four rounds called it a 768 KiB/request leak.)
INSIDE_MIN_STEADY_STEPS = 4
_GROWING = (R_STILL_CHANGING, R_STEADY_OR_CONVERGING, R_NOISY)
_EVIDENCE = {
    "cuda_allocated": Evidence.INSIDE_CUDA,
    "glibc_in_use": Evidence.INSIDE_GLIBC,
    "py_blocks": Evidence.INSIDE_PYTHON,
    "py_traced": Evidence.INSIDE_PYTHON,
    "pinned_in_use": Evidence.INSIDE_CUDA,
}


@dataclass
class InsidePoints:
    """One inside series: its identity and its value at the end of each round's idle window
    (round 0: the baseline)."""

    key: str
    kind: str
    pid: int
    by_round: dict[int, float] = field(default_factory=dict)
    name: str | None = None  # the program, as the agent's status file names it

    @property
    def layer(self) -> str:
        return _KINDS[self.kind][0]

    @property
    def unit(self) -> str:
        return _KINDS[self.kind][1]


@dataclass(frozen=True)
class HeldBy:
    """Code that holds growing memory, as attribution found it: a CUDA allocation stack or a
    Python line (`describe`: "file:line in function ..."), its growth per request (bytes)."""

    pid: int
    memory: str  # "cuda", "pinned", "python"
    describe: str
    bytes_per_request: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "memory": self.memory,
            "describe": self.describe,
            "bytes_per_request": self.bytes_per_request,
        }


def _num(d: Mapping[str, Any] | None, key: str) -> float | None:
    v = d.get(key) if isinstance(d, Mapping) else None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
        return float(v)
    return None


def _values(rec: InsideSample) -> dict[str, float]:
    """The inside series' values of one record (MiB, blocks), leaving out what is missing."""
    out: dict[str, float] = {}
    devices = [d for d in rec.cuda or [] if isinstance(d, Mapping)]
    for kind, field_ in (
        ("cuda_allocated", "allocated_bytes"),
        ("cuda_reserved", "reserved_bytes"),
        ("cuda_split", "inactive_split_bytes"),
    ):
        vals = [_num(d, field_) for d in devices]
        if devices and all(v is not None for v in vals):
            out[kind] = sum(v for v in vals if v is not None) / MIB
    g = rec.glibc if isinstance(rec.glibc, Mapping) else None
    for kind, field_ in (("glibc_in_use", "in_use_bytes"), ("glibc_kept", "free_kept_bytes")):
        v = _num(g, field_)
        if v is not None:
            out[kind] = v / MIB
    arena, mmap = _num(g, "arena_bytes"), _num(g, "mmap_bytes")
    if arena is not None and mmap is not None:
        out["glibc_footprint"] = (arena + mmap) / MIB
    py = rec.python if isinstance(rec.python, Mapping) else None
    blocks = _num(py, "allocated_blocks")
    if blocks is not None:
        out["py_blocks"] = blocks
    traced = _num(py, "traced_bytes")
    if traced is not None and (py or {}).get("tracing", True) is not False:
        out["py_traced"] = traced / MIB
    pinned = getattr(rec, "pinned", None)
    pinned = pinned if isinstance(pinned, Mapping) else None
    for kind, field_ in (("pinned_in_use", "in_use_bytes"), ("pinned_held", "held_bytes")):
        v = _num(pinned, field_)
        if v is not None:
            out[kind] = v / MIB
    return out


def inside_points(records: Sequence[Any]) -> dict[str, InsidePoints]:
    """Every inside series of the run (InsideSample records at idle-window ends), by key."""
    out: dict[str, InsidePoints] = {}
    for r in records:
        if not isinstance(r, InsideSample) or r.window not in ("idle_end", "baseline_end"):
            continue
        if not isinstance(r.round, int) or r.round < 0:
            continue
        for kind, v in _values(r).items():
            key = f"{kind}/pid{r.pid}"
            pts = out.get(key)
            if pts is None:
                program = getattr(r, "program", None)
                pts = out[key] = InsidePoints(
                    key, kind, r.pid, name=program if isinstance(program, str) else None
                )
            pts.by_round[r.round] = v  # the last record of a round wins (a retry)
    return out


def _growing(s: SeriesResult | None) -> bool:
    return s is not None and (
        s.verdict == LEAK or (s.verdict == INCONCLUSIVE and s.reason in (*_GROWING,))
    )


def _held_back(s: SeriesResult | None, th: Thresholds) -> bool:
    """Live bytes that grew steadily, above the floor, for too few rounds to decide
    (INSIDE_MIN_STEADY_STEPS): a leak, or a cache still filling at a fixed rate; never
    caching yet, whatever the outside series say."""
    return (
        s is not None
        and s.verdict == NOT_MEASURED
        and s.steps_missing > 0
        and s.unit == "MiB"
        and _growth_of(s) > th.min_growth_mib
    )


def _swings(s: SeriesResult, th: Thresholds) -> bool:
    """A series judged CACHING because it fell back or moved within a band, whose settled
    levels moved by more than the floor: it went up and down, it did not hold a level."""
    levels = [v for v in s.settled if v is not None]
    return (
        s.verdict == CACHING
        and s.reason in (R_FELL_BACK, R_BOUNDED)
        and len(levels) >= 2
        and max(levels) - min(levels) > th.min_growth_mib
    )


def _flat(s: SeriesResult | None) -> bool:
    """Judged and not growing: STABLE, or CACHING (it rose and stays, or converges)."""
    return s is not None and s.verdict in (STABLE, CACHING)


def _growth_of(s: SeriesResult | None) -> float:
    return s.growth if s is not None and s.growth is not None else 0.0


# CPython's small-object allocator serves requests up to 512 bytes; larger objects come from
# malloc, where glibc's bytes in use count them. A block is at most this many bytes.
PYMALLOC_BLOCK_MAX_BYTES = 512


def _rate_excludes_zero(s: SeriesResult) -> bool:
    """The per-request rate's interval excludes zero (the rounds show growth, not a scatter
    around none); True where no interval was fitted (the growth model decided without one)."""
    return s.slope_ci is None or s.slope_ci[0] > 0.0


def _blocks_too_few(s: SeriesResult, th: Thresholds) -> bool:
    """Python's block count grew by fewer blocks than could hold the layer's growth floor (at
    most PYMALLOC_BLOCK_MAX_BYTES each: 2,000 blocks are at most 1 MiB, below a 2 MiB floor;
    seen on a GPU server whose blocks rose while glibc's bytes in use were flat)."""
    blocks_mib = _growth_of(s) * PYMALLOC_BLOCK_MAX_BYTES / MIB
    return s.unit == "blocks" and blocks_mib < th.min_growth_mib


@dataclass
class InsideEvidence:
    """The judged inside series of one server life, by key, and what decides with them.

    `held_by`: per pid, the code attribution found holding growing memory. `partial`: pids
    whose agent missed rounds (a caveat where they decide)."""

    series: dict[str, SeriesResult]
    held_by: Mapping[int, Sequence[HeldBy]] = field(default_factory=dict)
    names: Mapping[int, str] = field(default_factory=dict)  # pid -> program (agent's status)

    @property
    def pids(self) -> set[int]:
        return {s.pid for s in self.series.values() if s.pid is not None}

    def of(self, pid: int | None, kind: str) -> SeriesResult | None:
        return None if pid is None else self.series.get(f"{kind}/pid{pid}")

    def _live(self, pid: int | None, layer: str) -> list[SeriesResult]:
        return [
            s
            for k in sorted(LIVE_KINDS)
            if _KINDS[k][0] == layer and (s := self.of(pid, k)) is not None
        ]

    @staticmethod
    def _apply(
        target: SeriesResult,
        verdict: str,
        reason: str,
        evidence: str,
        kind: str | None,
        *,
        explanation: str | None = None,
        rate_from: SeriesResult | None = None,
    ) -> None:
        target.verdict, target.reason, target.decided_by = verdict, reason, evidence
        target.evidence_kind = kind
        target.explanation = explanation
        target.creep_floor_per_request = None
        if rate_from is not None and rate_from.unit == target.unit:
            target.slope_per_request = rate_from.slope_per_request
            target.slope_ci = rate_from.slope_ci
            target.round_growth = rate_from.round_growth
            target.time_rate_per_s = None

    def _hold(self, target: SeriesResult, live: SeriesResult, evidence: str) -> None:
        """`target` undecided for want of rounds: `live` grew steadily, rounds short."""
        self._apply(target, INCONCLUSIVE, R_STEADY_OR_CONVERGING, evidence, live.kind)
        target.steps_to_decide = live.steps_missing

    def decide_vram(self, proc: SeriesResult, th: Thresholds, main_gpu: bool = True) -> bool:
        """Decide one process's VRAM series (`gpu_process`) from its CUDA counters, in place;
        False when the process has none (or the series is not its main GPU's)."""
        live = self.of(proc.pid, "cuda_allocated")
        if live is None or not main_gpu or proc.kind != "gpu_process":
            return False
        reserved = self.of(proc.pid, "cuda_reserved")
        split = self.of(proc.pid, "cuda_split")
        if live.verdict == LEAK and _rate_excludes_zero(live):
            self._apply(proc, LEAK, R_LIVE_GREW, Evidence.INSIDE_CUDA, live.kind, rate_from=live)
            return True
        if _growing(live):
            reason = R_NOISY if live.verdict == LEAK else live.reason
            self._apply(proc, INCONCLUSIVE, reason, Evidence.INSIDE_CUDA, live.kind)
            return True
        if live.steps_missing and proc.verdict == LEAK and _rate_excludes_zero(live):
            # Held back for its few rounds, but NVML grew every round too: the outside rule
            # decides a LEAK on these rounds, and the live tensors say it is theirs.
            self._apply(proc, LEAK, R_LIVE_GREW, Evidence.INSIDE_CUDA, live.kind, rate_from=live)
            return True
        if _held_back(live, th):
            # The live tensors grew every round, too few rounds to tell a leak from a cache
            # still filling: not decided, whatever NVML says (the adaptive rounds go on).
            self._hold(proc, live, Evidence.INSIDE_CUDA)
            return True
        if live.verdict == NOT_MEASURED or not _flat(live):
            return False  # too few rounds inside: the outside rules stand
        if not _growing(proc) and proc.verdict != CACHING:
            proc.decided_by, proc.evidence_kind = Evidence.INSIDE_CUDA, live.kind
            return True
        # Live tensors flat: what grew is the allocator's reserve, or memory outside it.
        outside = _growth_of(proc) - max(_growth_of(reserved), 0.0)
        derived = self.of(proc.pid, "gpu_outside")
        if outside > th.min_growth_mib and _growing(proc):
            # Beyond the caching allocator's reserve: that part judged on its own, from outside.
            if derived is None:
                return False
            if derived.verdict == LEAK:
                self._apply(
                    proc,
                    LEAK,
                    R_GREW_EVERY_ROUND,
                    Evidence.ROUNDS,
                    derived.kind,
                    rate_from=derived,
                )
                return True
            if derived.verdict == INCONCLUSIVE:
                self._apply(proc, INCONCLUSIVE, derived.reason, Evidence.ROUNDS, derived.kind)
                return True
        if _growth_of(live) > th.min_growth_mib and live.reason == "converging":
            explanation = X_LIVE_CACHE
        elif _growth_of(split) > max(th.min_growth_mib, 0.5 * _growth_of(reserved)):
            explanation = X_FRAGMENTATION
        else:
            explanation = X_ALLOCATOR_CACHE
        self._apply(
            proc,
            CACHING,
            R_LIVE_FLAT,
            Evidence.INSIDE_CUDA,
            live.kind,
            explanation=explanation,
        )
        return True

    def decide_unsampled(self, pid: int) -> SeriesResult | None:
        """The series that decides the host layer for a server process whose RSS was never
        sampled (a helper the agent reports from through the run's agent directory, outside
        the port owner's tree): its live bytes in MiB (glibc's bytes in use, tracemalloc's
        traced bytes, pinned host memory handed out), marked as deciding: a LEAK at the live
        series' rate (`live_grew`), INCONCLUSIVE while it grows with a shape the rounds cannot
        name, else as judged (STABLE, CACHING). None when the process has no such series (a
        count of Python blocks alone has no size to give the layer)."""
        live = [s for s in self._live(pid, HOST) if s.unit == "MiB" and s.verdict != NOT_MEASURED]
        if not live:
            return None
        leaking = [s for s in live if s.verdict == LEAK and _rate_excludes_zero(s)]
        growing = [s for s in live if _growing(s)]
        if leaking:
            top = max(leaking, key=lambda s: s.slope_per_request or 0.0)
            top.reason = R_LIVE_GREW
        elif growing:
            top = growing[0]
            if top.verdict == LEAK:  # its rate's interval holds zero: not established
                top.verdict, top.reason = INCONCLUSIVE, R_NOISY
        else:
            top = next((s for s in live if s.kind == "glibc_in_use"), live[0])
        top.decides = True
        top.name = top.name or self.names.get(pid)
        top.decided_by = _EVIDENCE.get(top.kind, Evidence.INSIDE_GLIBC)
        top.evidence_kind = top.kind
        return top

    def decide_host(
        self,
        rss: SeriesResult,
        anon: SeriesResult | None,
        shmem: SeriesResult | None,
        th: Thresholds,
    ) -> bool:
        """Decide one process's host series (RSS) from its allocators' counters, in place;
        False when the process has none that can decide."""
        live = self._live(rss.pid, HOST)
        grows = _growing(rss) or rss.reason == R_RETENTION_OR_LEAK or rss.verdict == LEAK
        # A block count is a count, not bytes: it says which memory grew only where the
        # process's memory did grow (RSS). A count that grew by fewer blocks than could hold
        # the floor says nothing about the layer's bytes either. Both are left out, as if flat
        # (seen on the H200: transformers serve's blocks +1,200 a round, about 100 a request,
        # with glibc's bytes in use and the RSS flat for 4 rounds).
        live = [s for s in live if s.unit != "blocks" or (grows and not _blocks_too_few(s, th))]
        if not live:
            return False
        if self._decide_host_growing(rss, anon, live, th):
            return True
        return self._decide_host_live_flat(rss, anon, shmem, live, grows, th)

    def _decide_host_leak(
        self, rss: SeriesResult, anon: SeriesResult | None, leaking: list[SeriesResult]
    ) -> None:
        """Decides `rss` a LEAK from the live series that leak (`leaking`), in place (returns
        nothing): `grew_with_time` at the outside series' rate per second where the RSS or
        RssAnon grew inside the idle windows, else `live_grew` at the top live series' rate
        per request (where that series is in MiB)."""
        # MiB rates first (bytes in use, traced bytes), Python's block count last.
        top = sorted(leaking, key=lambda s: (s.unit != "MiB", -(s.slope_per_request or 0)))[0]
        timed = next(
            (
                x
                for x in (rss, anon)
                if x is not None and x.reason == R_GREW_WITH_TIME and x.time_rate_per_s
            ),
            None,
        )
        if timed is not None:
            # The outside series grew inside the idle windows too, at the rate the rounds
            # show: a leak in time that the live bytes confirm is held, not one per
            # request (seen: a background thread keeping 1 MiB a second was given as
            # 231 KiB per request, its time to OOM in requests).
            rate_s = timed.time_rate_per_s
            self._apply(
                rss,
                LEAK,
                R_GREW_WITH_TIME,
                _EVIDENCE.get(top.kind, Evidence.INSIDE_GLIBC),
                top.kind,
            )
            rss.time_rate_per_s = rate_s
            return
        self._apply(
            rss,
            LEAK,
            R_LIVE_GREW,
            _EVIDENCE.get(top.kind, Evidence.INSIDE_GLIBC),
            top.kind,
            rate_from=top if top.unit == "MiB" else None,
        )

    def _decide_host_growing(
        self,
        rss: SeriesResult,
        anon: SeriesResult | None,
        live: list[SeriesResult],
        th: Thresholds,
    ) -> bool:
        """True when the process's live series (`live`) grow and have decided `rss` in place:
        a LEAK where they leak, INCONCLUSIVE where they grow with a shape the rounds cannot
        name, grew for too few rounds, or swing under an RSS that never settled; False when
        none of them grows (the flat rules decide)."""
        leaking = [s for s in live if s.verdict == LEAK and _rate_excludes_zero(s)]
        if leaking:
            self._decide_host_leak(rss, anon, leaking)
            return True
        undecided = [s for s in live if _growing(s)]
        if undecided:
            top = undecided[0]
            # A LEAK whose rate's interval holds zero is growth the rounds do not establish.
            self._apply(
                rss,
                INCONCLUSIVE,
                R_NOISY if top.verdict == LEAK else top.reason,
                _EVIDENCE.get(top.kind, Evidence.INSIDE_GLIBC),
                top.kind,
            )
            return True
        held = [s for s in live if _held_back(s, th)]
        if held:
            # Live bytes grew every round, for too few rounds to tell a leak from a cache
            # still filling at a fixed rate: not caching, whatever the RSS says (a
            # server leaking 256 KiB/request under glibc's retention read +5.0 MiB a round
            # in use for four rounds, and was called allocator caching, exit 0).
            self._hold(rss, held[0], _EVIDENCE.get(held[0].kind, Evidence.INSIDE_GLIBC))
            return True
        swinging = [s for s in live if s.unit == "MiB" and _swings(s, th)]
        if swinging and rss.verdict == INCONCLUSIVE and rss.reason == R_NOISY:
            # The RSS never settled in the idle windows, and the live bytes themselves swing
            # from round to round (memory still held when the window is read): neither says
            # what stays (seen: a server holding 50-200 MiB buffers for seconds, its bytes in
            # use 177, 146, 19, 105 MiB, was called arena retention over a 256 KiB/request
            # leak that a longer --idle found).
            top = swinging[0]
            self._apply(
                rss, INCONCLUSIVE, R_NOISY, _EVIDENCE.get(top.kind, Evidence.INSIDE_GLIBC), top.kind
            )
            return True
        return False

    def _decide_host_live_flat(
        self,
        rss: SeriesResult,
        anon: SeriesResult | None,
        shmem: SeriesResult | None,
        live: list[SeriesResult],
        grows: bool,
        th: Thresholds,
    ) -> bool:
        """With the live series not growing: True when they have decided `rss` in place (as
        judged where it does not grow, else CACHING `live_flat` for pinned host memory or
        glibc's retention, or INCONCLUSIVE `outside_malloc`); False when the outside rules
        stand (too few rounds inside, or glibc's counters unread)."""
        in_use = self.of(rss.pid, "glibc_in_use")
        blocks = self.of(rss.pid, "py_blocks")
        if not all(_flat(s) for s in live):
            return False  # too few rounds inside (NOT_MEASURED / no level): outside rules
        evidence = Evidence.INSIDE_GLIBC if in_use is not None else Evidence.INSIDE_PYTHON
        kind = in_use.kind if in_use is not None else live[0].kind
        if not grows:
            rss.decided_by, rss.evidence_kind = evidence, kind
            return True
        shm_growth, anon_growth = _growth_of(shmem), _growth_of(anon) if anon else _growth_of(rss)
        if shm_growth > anon_growth and self.of(rss.pid, "pinned_in_use") is not None:
            self._apply(
                rss,
                CACHING,
                R_LIVE_FLAT,
                Evidence.INSIDE_CUDA,
                "pinned_in_use",
                explanation=X_PINNED,
            )
            return True
        footprint = self.of(rss.pid, "glibc_footprint")
        if in_use is None or footprint is None:
            # glibc's counters unread (jemalloc, musl): Python's objects alone cannot say
            # whether malloc's live bytes grew.
            return False
        beyond = anon_growth - max(_growth_of(footprint), 0.0)
        if blocks is None and beyond > max(th.min_growth_mib, rss.threshold):
            # Growth outside glibc's counters, and Python's objects (whose arenas are mmap'd
            # outside them) were not read: they could be what grows.
            self._apply(rss, INCONCLUSIVE, R_OUTSIDE_MALLOC, evidence, kind)
            return True
        # Live bytes flat (malloc's, and Python's objects where read): what grew is kept, not
        # held -- freed bytes in glibc's arenas, and beyond its counters thread stacks,
        # Python's own arenas, libraries' mappings.
        self._apply(rss, CACHING, R_LIVE_FLAT, evidence, kind, explanation=X_ARENA_RETENTION)
        return True


def _outside_points(
    points: Mapping[str, InsidePoints], nvml: Sequence[SeriesResult], run_rounds: Sequence[int]
) -> dict[str, InsidePoints]:
    """NVML's count of each process on its main GPU minus its CUDA reserve, per round."""
    out: dict[str, InsidePoints] = {}
    best: dict[int, SeriesResult] = {}
    for s in nvml:
        if s.kind == "gpu_process" and s.pid is not None and s.last is not None:
            cur = best.get(s.pid)
            if cur is None or (cur.last is not None and s.last > cur.last):
                best[s.pid] = s
    for pid, s in best.items():
        reserved = points.get(f"cuda_reserved/pid{pid}")
        if reserved is None:
            continue
        pts = InsidePoints(f"gpu_outside/pid{pid}", "gpu_outside", pid)
        levels = dict(zip(run_rounds, s.settled, strict=False))
        if s.baseline is not None:
            levels[0] = s.baseline
        for r, v in levels.items():
            res = reserved.by_round.get(r)
            if v is not None and res is not None:
                pts.by_round[r] = v - res
        if pts.by_round:
            out[pts.key] = pts
    return out


def judge_inside(
    points: Mapping[str, InsidePoints],
    rounds: Sequence[int],
    cum_requests: Sequence[float],
    *,
    with_baseline: bool,
    run_rounds: Sequence[int],
    life: int,
    th: Thresholds,
    held_by: Mapping[int, Sequence[HeldBy]] | None = None,
    nvml: Sequence[SeriesResult] = (),
) -> InsideEvidence:
    """Judge every inside series over one life's rounds (the same growth model as outside).
    `nvml`: the life's judged per-process GPU series: for each process with CUDA counters,
    its NVML count minus the allocator's reserve becomes the derived `gpu_outside` series."""
    out: dict[str, SeriesResult] = {}
    points = {**points, **_outside_points(points, nvml, run_rounds)}
    for key, pts in points.items():
        _, unit, _, floor, resolution = _KINDS[pts.kind]
        baseline = pts.by_round.get(0) if with_baseline else None
        # A process that was not there at the baseline started during the run (a successor
        # taking over the socket, a new worker): its first reading is taken while it starts up
        # (imports, model load, CUDA context), which grows with time, not with requests; it is
        # left out, and the process is judged on the rounds it ran whole (seen on the H200: a
        # handover's successor read 103, 129, 151 MiB in use while it started beside the old
        # server, which three rounds called a 2 MiB/request leak).
        started = min(pts.by_round, default=0) if 0 not in pts.by_round else None
        levels = [pts.by_round.get(r) if r != started else None for r in rounds]
        if sum(v is not None for v in levels) == 0:
            continue
        fit = classify_series(
            baseline,
            levels,
            cum_requests,
            [[v] if v is not None else [] for v in levels],
            floor=th.min_growth_mib
            if unit == "MiB"
            else floor,  # the run's floor (--min-growth-mib)
            noise_k=th.noise_k,
            resolution=resolution,
            min_steady_steps=INSIDE_MIN_STEADY_STEPS if pts.kind in LIVE_KINDS else 0,
        )
        settled: list[float | None] = [pts.by_round.get(r) for r in run_rounds]
        if fit.growth_fit is not None and fit.growth_fit.steps_missing:
            # Steady, but too few rounds for live bytes to rule out a cache still filling:
            # not decided inside yet (the outside rules stand; the adaptive rounds go on).
            fit.verdict = NOT_MEASURED
        missing = fit.growth_fit.steps_missing if fit.growth_fit is not None else 0
        out[key] = SeriesResult(
            key=key,
            layer=pts.layer,
            kind=pts.kind,
            unit=unit,
            pid=pts.pid,
            baseline=baseline,
            settled=settled,
            last=next((v for v in reversed(levels) if v is not None), None),
            growth=fit.growth,
            noise=fit.noise,
            threshold=fit.threshold,
            slope_per_request=fit.slope,
            slope_ci=fit.ci,
            increments=fit.increments,
            verdict=fit.verdict,
            reason=fit.reason,
            round_growth=fit.round_growth,
            settled_rounds=sum(v is not None for v in levels),
            decides=False,
            life=life,
            model=fit.model,
            ratio=fit.ratio,
            ratio_ci=fit.ratio_ci,
            bound=fit.bound,
            bound_hi=fit.bound_hi,
            steps_to_decide=fit.steps_to_decide,
            steps_missing=missing,
            decided_by=Evidence.INSIDE_CUDA if pts.layer == VRAM else Evidence.INSIDE_GLIBC,
        )
    names = {pts.pid: pts.name for pts in points.values() if pts.name}
    return InsideEvidence(out, held_by or {}, names)


__all__ += ["judge_inside"]
