"""What fleet asks the database, and how the answers become rows: screen, pull, join.

Two strategies, one result (`collect`):

- **screen** (the default: the work where the data is). Per memory family, the database
  computes for every series at the range end (`promql.screen`): how much its 3-hour floor
  moved over the range (a standard deviation), the slope of its hourly floor over the late
  window, its level now and whether it was there at the range start. Only *candidates* are
  pulled: series whose floor moved (`FleetConfig.screen_sd_*`) or grew late, that started or
  stopped inside the range. Their hourly floors come back (one range query per batch, one
  point an hour); every other series is STABLE on the database's own figures. KV pools: the
  most tokens held at an idle moment; a server that never held any is STABLE, one that never
  was idle gets a row saying so. With the shipped recording rules present
  (`promql.rules`), the floors are read from them instead of the raw samples.
- **pull** (`strategy="pull"`, for comparison and the benchmarks): every series' minimum of
  each `step` is pulled and the floors are made here, as fleet did before.

Then per slot (`families.slot_of`), series that follow each other in time are one history
with restarts between them (a new pid or pod); the free memory of each GPU (the least free of
the last block), a KV pool's size and its counter resets are joined to the rows.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from vramdoctor.errors import InputError
from vramdoctor.fleet import promql
from vramdoctor.fleet.analysis import REASONS, FleetConfig, FleetRow, FleetSeries, Screen
from vramdoctor.fleet.families import (
    FAMILIES,
    Family,
    KvSource,
    gpu_of,
    host_of,
    instance_host,
    kv_sources,
    layer_of,
    mig_of,
    mig_profile,
    pid_of,
    pod_of,
    process_of,
    slot_of,
    uuid_of,
)
from vramdoctor.redact import one_line
from vramdoctor.sources.prometheus import InstantSample, PrometheusClient, RangeSeries

__all__ = ["Collected", "Plan", "collect"]

LabelKey = tuple[tuple[str, str], ...]


def _key(labels: dict[str, str]) -> LabelKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def _clean(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "__name__"}


@dataclass
class _Member:
    """One series (one identity's life) of a memory family."""

    fam: Family
    labels: dict[str, str]
    screen: Screen | None = None
    t: np.ndarray | None = None  # floors, when pulled
    v: np.ndarray | None = None
    last_seen: float | None = None

    def span(self, start: float, end: float, block_s: float) -> tuple[float, float]:
        if self.t is not None and len(self.t):
            return float(self.t[0]) - block_s, float(self.t[-1])
        return start, end


@dataclass
class Collected:
    """What `collect` found: the series to analyse, rows made here, free memory, notes."""

    series: list[FleetSeries] = field(default_factory=list)
    rows: list[FleetRow] = field(default_factory=list)
    free: dict[tuple[str, str, str], float] = field(default_factory=dict)
    free_notes: dict[tuple[str, str, str], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    recorded: list[str] = field(default_factory=list)
    candidates: int = 0
    screened: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, *, candidates: int = 0, screened: int = 0) -> None:
        """Add to the counts (the stages run on threads of their own)."""
        with self._lock:
            self.candidates += candidates
            self.screened += screened

    def note(self, text: str) -> None:
        with self._lock:
            if text not in self.notes:
                self.notes.append(text)


@dataclass(frozen=True)
class Plan:
    """The range and knobs of one collection (times unix s, durations s)."""

    start: float
    end: float
    step_s: float
    config: FleetConfig
    matchers: tuple[str, ...] = ()
    virtual_gpus: bool = False
    strategy: str = "screen"
    max_candidates: int = 5000
    batch_bytes: int = 8 * 1024 * 1024
    names: frozenset[str] = frozenset()  # the metric names stored in the range (collect sets it)

    @property
    def window_s(self) -> float:
        return self.end - self.start

    @property
    def block_s(self) -> float:
        return self.config.block_s

    @property
    def late_s(self) -> float:
        """The late window of the screen: the last day, at most a quarter of the range, and at
        least four blocks."""
        return max(min(self.window_s / 4, 86_400.0), 4 * self.block_s)

    @property
    def floors_start(self) -> float:
        """The end of the first block: floors are at end - k * block, k = n-1 .. 0."""
        n = max(1, math.floor(self.window_s / self.block_s + 1e-9))
        return self.end - (n - 1) * self.block_s


def _sel(name: str, plan: Plan, extra: Sequence[str] = ()) -> str:
    return promql.selector(name, plan.matchers, extra)


# --- the regex that selects a batch of series ----------------------------------------------

_RE_SPECIAL = re.compile(r"([\\.^$|?*+()\[\]{}-])")


def _re_escape(value: str) -> str:
    return _RE_SPECIAL.sub(r"\\\1", value)


def _batch_floor(
    name: str,
    plan: Plan,
    batch: Sequence[dict[str, str]],
    universe: Sequence[dict[str, str]],
    *,
    recorded: bool,
) -> str:
    """The floor expression for exactly the series of `batch` among `universe` (all series of
    the family): a regex over a label whose value is unique per series when there is one
    (compact: UUID, pid, ...), else an `or` of one exact selector per series."""
    for label in ("UUID", "uuid", "pid", "pod_uid", "pod", "instance", "gpu"):
        values = [b.get(label) for b in batch]
        if any(v is None for v in values):
            continue
        seen = [u.get(label) for u in universe]
        if None in seen or len(set(seen)) != len(seen):
            continue
        regex = "|".join(_re_escape(v) for v in values if v is not None)
        sel = _sel(name, plan, [f"{label}=~{promql.quote(regex)}"])
        return promql.floor(sel, plan.block_s, recorded=recorded)
    return " or ".join(
        promql.floor(promql.select_exact(name, b), plan.block_s, recorded=recorded) for b in batch
    )


# --- collect --------------------------------------------------------------------------------


def collect(client: PrometheusClient, plan: Plan) -> Collected:
    """Screen (or pull) every family the database holds in the range, pull the candidates'
    floors, and join them into rows' histories. InputError when the range holds none of the
    metrics fleet reads."""
    out = Collected()
    t0 = time.perf_counter()
    if not plan.names:  # run_fleet asks for them before numpy is loaded
        plan = dataclasses.replace(plan, names=frozenset(client.metric_names(plan.start, plan.end)))
    names = set(plan.names)
    out.seconds["names"] = time.perf_counter() - t0
    memory, frees, kvs = _families_stored(client, plan, names, out)
    recorded, kv_recorded = _rules_read(client, plan, names, memory, kvs, out)
    members, ip_names, free_got, kv_made = _ask_every_stage(
        client, plan, names, memory, frees, kvs, recorded, kv_recorded, out
    )
    _name_hosts_from_members(members, ip_names)
    _free(free_got, out, ip_names)
    out.series.extend(_chains(members, plan, ip_names))
    _join_kv(kv_made, out, ip_names)
    for note in client.notes:
        if note not in out.notes:
            out.note(note)
    return out


def _families_stored(
    client: PrometheusClient, plan: Plan, names: set[str], out: Collected
) -> tuple[list[Family], list[Family], list[KvSource]]:
    """The families stored in the range: (memory, free memory, KV sources), with a note for
    each name read as bytes on inference. InputError when neither memory nor KV is stored."""
    fams = [f for f in FAMILIES if f.name in names and not (f.alias_of and f.alias_of in names)]
    memory = [f for f in fams if f.kind == "memory"]
    frees = [f for f in fams if f.kind in ("free", "host_free")]
    kvs = kv_sources(names)
    for f in fams:
        if f.inferred:
            out.note(
                f"{f.name} read as bytes: dcgm-exporter 4.9 renamed its GPU memory fields to "
                "bytes, and no released source read here confirms this name"
            )
    if not memory and not kvs:
        raise InputError(
            f"{client.shown_url} holds none of the memory metrics fleet reads between "
            f"{_when(plan.start)} and {_when(plan.end)} (dcgm-exporter DCGM_FI_DEV_FB_USED, "
            "nvitop-exporter process_gpu_memory_MiB, nvidia_gpu_exporter "
            "nvidia_smi_compute_app_used_memory_bytes, vramdoctor watch, SGLang/vLLM KV gauges): "
            "check --since, --until and --match"
        )
    return memory, frees, kvs


def _rules_read(
    client: PrometheusClient,
    plan: Plan,
    names: set[str],
    memory: Sequence[Family],
    kvs: Sequence[KvSource],
    out: Collected,
) -> tuple[dict[str, str], dict[str, str]]:
    """The recording rules whose floors are read instead of the raw samples: (memory family
    name -> rule, KV used-metric name -> rule); only rules of whole-hour blocks that reach back
    to the range start. Sets `out.recorded` (the rules read, the counter-reset rules included)."""
    recorded = {f.name: promql.rule_name(f) for f in memory if promql.rule_name(f) in names}
    kv_recorded = {s.used: promql.kv_rule_name(s) for s in kvs if promql.kv_rule_name(s) in names}
    use_rules = plan.block_s % promql.RULE_BLOCK_S == 0
    if (recorded or kv_recorded) and not use_rules:
        out.note(
            f"recording rules hold 1-hour floors; --block {plan.block_s:g} s is not a multiple of "
            "an hour, so the raw samples are read"
        )
        recorded, kv_recorded = {}, {}
    if recorded or kv_recorded:
        covered = _rules_cover(client, plan, {**recorded, **kv_recorded})
        for name in list(recorded):
            if recorded[name] not in covered:
                out.note(
                    f"recording rule {recorded[name]} does not reach back to the range start: {name} is read raw"
                )
                del recorded[name]
        for name in list(kv_recorded):
            if kv_recorded[name] not in covered:
                del kv_recorded[name]
    counted = {
        promql.resets_rule_name(s.counter)
        for s in kvs
        if s.used in kv_recorded and s.counter and promql.resets_rule_name(s.counter) in names
    }
    out.recorded = sorted({*recorded.values(), *kv_recorded.values(), *counted})
    return recorded, kv_recorded


def _ask_every_stage(
    client: PrometheusClient,
    plan: Plan,
    names: set[str],
    memory: Sequence[Family],
    frees: Sequence[Family],
    kvs: Sequence[KvSource],
    recorded: dict[str, str],
    kv_recorded: dict[str, str],
    out: Collected,
) -> tuple[list[_Member], dict[str, str], list[tuple[Family, list[InstantSample]]], list[Pending]]:
    """Every family, free memory, host names and every KV pool at once (the database works on
    them in parallel while this process parses what has come back): (memory members, address ->
    host name, free memory readings, per KV pool what it made). Records each stage's seconds."""
    t1 = time.perf_counter()
    seconds: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            t = time.perf_counter()
            try:
                return fn()
            finally:
                seconds[name] = time.perf_counter() - t

        return run

    stages: list[Callable[[], Any]] = [
        timed("memory", partial(_memory, client, plan, memory, recorded, out)),
        timed("uname", partial(_uname, client, plan, names)),
        timed("free", partial(_free_query, client, plan, frees)),
        *(
            timed(
                f"kv {s.kind} {s.pool}", partial(_kv, client, plan, s, kv_recorded.get(s.used), out)
            )
            for s in kvs
        ),
    ]
    members, ip_names, free_got, *kv_made = client.many(stages, at_once=len(stages))
    out.seconds.update(seconds)
    out.seconds["stages"] = time.perf_counter() - t1
    return members, ip_names, free_got, kv_made


def _name_hosts_from_members(members: Sequence[_Member], ip_names: dict[str, str]) -> None:
    """Adds to `ip_names` (address -> host name) the host names memory series carry, where the
    address has none yet; returns nothing."""
    for m in members:
        host = next(
            (
                m.labels[k]
                for k in ("Hostname", "hostname", "node", "kubernetes_node", "nodename", "host")
                if m.labels.get(k)
            ),
            None,
        )
        inst = m.labels.get("instance")
        if host and inst:
            ip_names.setdefault(instance_host(inst), host)


def _join_kv(kv_made: Sequence[Pending], out: Collected, ip_names: dict[str, str]) -> None:
    """Names the KV series and rows after the exporters on their address and adds them to
    `out` (series to analyse, rows as they are); returns nothing."""
    for made in kv_made:
        for obj, labels in made:  # KV rows are named after the exporters on their address
            obj.host = host_of(labels, ip_names)
            if isinstance(obj, FleetSeries):
                out.series.append(obj)
            else:
                out.rows.append(obj)


def _uname(client: PrometheusClient, plan: Plan, names: set[str]) -> dict[str, str]:
    """Address -> host name from node-exporter's `node_uname_info{nodename}` (when stored)."""
    if "node_uname_info" not in names:
        return {}
    got = client.instant(
        f"last_over_time({_sel('node_uname_info', plan)}[{promql.dur(plan.window_s)}])", plan.end
    )
    out: dict[str, str] = {}
    for s in got:
        inst, node = s.labels.get("instance"), s.labels.get("nodename")
        if inst and node:
            out.setdefault(instance_host(inst), node)
    return out


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _rules_cover(client: PrometheusClient, plan: Plan, names: dict[str, str]) -> set[str]:
    """Rule names with recorded floors in the first blocks of the range."""
    at = min(plan.start + 3 * plan.block_s, plan.end)
    look = promql.dur(3 * plan.block_s)
    rules = sorted(set(names.values()))
    jobs = [
        lambda r=r: (r, client.instant(f"count(last_over_time({promql.selector(r)}[{look}]))", at))
        for r in rules
    ]
    return {r for r, got in client.many(jobs) if got and got[0].value > 0}


def _memory(
    client: PrometheusClient,
    plan: Plan,
    memory: Sequence[Family],
    recorded: dict[str, str],
    out: Collected,
) -> list[_Member]:
    """Every memory series: screened (or pulled, strategy "pull"), candidates' floors pulled."""
    members: list[_Member] = []
    if plan.strategy == "pull":
        pulls = [partial(_pull_all, client, plan, f, recorded.get(f.name)) for f in memory]
        for got in client.many(pulls):
            members.extend(got)
        return members
    jobs: list[Callable[[], Any]] = []
    for f in memory:
        jobs.extend(_screen_jobs(client, plan, f, recorded.get(f.name)))
    results = client.many(jobs)
    per_family: dict[str, dict[str, list[InstantSample]]] = {}
    i = 0
    for f in memory:
        per_family[f.name] = dict(
            zip(("sd", "late", "level", "start"), results[i : i + 4], strict=True)
        )
        i += 4
    candidates: list[_Member] = []
    for f in memory:
        found = _screened(f, per_family[f.name], plan)
        threshold = plan.config.screen_sd(f.unit)
        grow = plan.config.min_growth(f.unit) / 2
        for m in found:
            sc = m.screen
            assert sc is not None
            flat = (
                sc.sd is not None
                and sc.sd < threshold
                and sc.at_start
                and m.last_seen is not None
                and (sc.late_slope is None or abs(sc.late_slope) * plan.late_s < grow)
            )
            if not flat:
                candidates.append(m)
            members.append(m)
    if len(candidates) > plan.max_candidates:
        candidates.sort(
            key=lambda m: -(m.screen.sd if m.screen and m.screen.sd is not None else math.inf)
        )
        left = candidates[plan.max_candidates :]
        out.note(
            f"{len(candidates):,} series moved enough to be analysed; the {plan.max_candidates:,} "
            f"that moved most were, {len(left):,} others were not (their rows are missing): "
            "narrow --match or raise --max-candidates"
        )
        drop = {id(m) for m in left}
        members = [m for m in members if id(m) not in drop]
        candidates = candidates[: plan.max_candidates]
    out.count(candidates=len(candidates), screened=len(members) - len(candidates))
    _pull_floors(client, plan, candidates, members, recorded)
    return members


def _screened(f: Family, got: dict[str, list[InstantSample]], plan: Plan) -> list[_Member]:
    """One family's series with the screen's figures (in MiB) attached."""
    found: dict[LabelKey, _Member] = {}

    def member(s: InstantSample) -> Screen:
        k = _key(s.labels)
        m = found.get(k)
        if m is None:
            m = found[k] = _Member(f, _clean(s.labels))
            m.screen = Screen(None, None, None, False, plan.late_s)
        assert m.screen is not None
        return m.screen

    scale = f.scale
    for s in got["sd"]:
        member(s).sd = s.value * scale if math.isfinite(s.value) else None
    for s in got["late"]:
        member(s).late_slope = s.value * scale if math.isfinite(s.value) else None
    for s in got["level"]:
        member(s).level = s.value * scale if math.isfinite(s.value) and s.value >= 0 else None
        found[_key(s.labels)].last_seen = plan.end
    for s in got["start"]:
        member(s).at_start = True
    return list(found.values())


def _screen_jobs(
    client: PrometheusClient, plan: Plan, f: Family, rule: str | None
) -> list[Callable[[], list[InstantSample]]]:
    sel = _sel(rule or f.name, plan)
    device = f.layer == "device"
    exprs = promql.screen(
        sel,
        window_s=plan.window_s,
        late_s=plan.late_s,
        block_s=plan.block_s,
        recorded=rule is not None,
        empty=plan.config.empty_mib / f.scale if device else None,
    )
    raw = _sel(f.name, plan)
    stale = promql.dur(plan.config.stale_s)
    head = promql.dur(3 * plan.block_s)
    at_start = min(plan.start + 3 * plan.block_s, plan.end)
    return [
        lambda: client.instant(exprs["sd"], plan.end),
        lambda: client.instant(exprs["late"], plan.end),
        lambda: client.instant(f"last_over_time({raw}[{stale}])", plan.end),
        # at the range start: the recorded floors when there are (raw samples may be gone)
        lambda: client.instant(f"last_over_time({sel}[{head}])", at_start),
    ]


def _batches(members: Sequence[_Member], plan: Plan) -> list[list[_Member]]:
    points = max(1, round(plan.window_s / plan.block_s))
    per_series = 24 * points + 400
    size = max(1, min(400, plan.batch_bytes // per_series))
    return [list(members[i : i + size]) for i in range(0, len(members), size)]


def _pull_floors(
    client: PrometheusClient,
    plan: Plan,
    candidates: Sequence[_Member],
    members: Sequence[_Member],
    recorded: dict[str, str],
) -> None:
    """The hourly floors of the candidates, batched per family; last-seen times of the stale."""
    by_family: dict[str, list[_Member]] = {}
    for m in candidates:
        by_family.setdefault(m.fam.name, []).append(m)
    universe: dict[str, list[dict[str, str]]] = {}
    for m in members:
        universe.setdefault(m.fam.name, []).append(m.labels)
    jobs: list[Callable[[], tuple[list[_Member], list[RangeSeries]]]] = []
    for name, ms in by_family.items():
        rule = recorded.get(name)
        for batch in _batches(ms, plan):
            expr = _batch_floor(
                rule or name,
                plan,
                [m.labels for m in batch],
                universe[name],
                recorded=rule is not None,
            )
            jobs.append(partial(_tagged_range, client, expr, plan, batch))
    stale: list[_Member] = []
    for batch, got in client.many(jobs):
        index = {_key(m.labels): m for m in batch}
        for rs in got:
            found = index.get(_key(rs.labels))
            if found is None:
                continue
            found.t, found.v = rs.t, rs.v * found.fam.scale
        for m in batch:
            if m.t is None:
                m.t, m.v = np.empty(0), np.empty(0)
            if m.last_seen is None:
                stale.append(m)
    _last_seen(client, plan, stale)


def _tagged_range(
    client: PrometheusClient, expr: str, plan: Plan, tag: list[_Member]
) -> tuple[list[_Member], list[RangeSeries]]:
    return tag, client.range(expr, plan.floors_start, plan.end, plan.block_s)


def _tagged_instant(
    client: PrometheusClient, expr: str, plan: Plan, tag: list[_Member]
) -> tuple[list[_Member], list[InstantSample]]:
    return tag, client.instant(expr, plan.end)


def _last_seen(client: PrometheusClient, plan: Plan, stale: Sequence[_Member]) -> None:
    """The last raw sample of series that stopped reporting: to the minute when it was in
    the last 6 hours, else the end of its last floor's block."""
    if not stale:
        return
    look = min(plan.window_s, 6 * 3600.0 + plan.block_s)
    recent: list[_Member] = []
    for m in stale:
        if m.t is not None and len(m.t):
            m.last_seen = float(m.t[-1])
            if m.last_seen >= plan.end - look + plan.block_s:
                recent.append(m)
    by_family: dict[str, list[_Member]] = {}
    for m in recent:
        by_family.setdefault(m.fam.name, []).append(m)
    jobs: list[Callable[[], tuple[list[_Member], list[InstantSample]]]] = []
    for name, ms in by_family.items():
        for batch in _batches(ms, plan):
            sel = " or ".join(f"timestamp({promql.select_exact(name, m.labels)})" for m in batch)
            expr = f"max_over_time(({sel})[{promql.dur(look)}:60s])"
            jobs.append(partial(_tagged_instant, client, expr, plan, batch))
    for batch, got in client.many(jobs):
        index = {_key(m.labels): m for m in batch}
        for s in got:
            found = index.get(_key(s.labels))
            if found is not None and math.isfinite(s.value) and s.value <= plan.end:
                found.last_seen = s.value


def _pull_all(client: PrometheusClient, plan: Plan, f: Family, rule: str | None) -> list[_Member]:
    """strategy "pull": every series' minimum of each step, floors made here."""
    if rule is not None:
        got = client.range(
            promql.floor(_sel(rule, plan), plan.block_s, recorded=True),
            plan.floors_start,
            plan.end,
            plan.block_s,
        )
        out = []
        for rs in got:
            m = _Member(f, _clean(rs.labels), t=rs.t, v=rs.v * f.scale)
            out.append(m)
        raw = client.instant(
            f"last_over_time({_sel(f.name, plan)}[{promql.dur(plan.config.stale_s)}])", plan.end
        )
        now = {_key(s.labels) for s in raw}
        for m in out:
            m.last_seen = (
                plan.end
                if _key(m.labels) in now
                else (float(m.t[-1]) if m.t is not None and len(m.t) else None)
            )
        return out
    step = plan.step_s
    got = client.range(
        f"min_over_time({_sel(f.name, plan)}[{promql.dur(step)}])", plan.start, plan.end, step
    )
    out = []
    for rs in got:
        ok = np.isfinite(rs.v) & (rs.v >= 0)
        t, v = rs.t[ok], rs.v[ok] * f.scale
        ft, fv = _floors(t, v, plan)
        m = _Member(f, _clean(rs.labels), t=ft, v=fv)
        m.last_seen = float(rs.t[-1]) if len(rs.t) else None
        if m.last_seen is not None and m.last_seen >= plan.end - plan.config.stale_s:
            m.last_seen = plan.end
        out.append(m)
    return out


def _floors(t: np.ndarray, v: np.ndarray, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The least value of each block (blocks end at end - k * block), at the block's end."""
    if len(t) == 0:
        return np.empty(0), np.empty(0)
    k = np.maximum(np.floor((plan.end - t) / plan.block_s), 0)  # 0: the block ending at end
    ends = plan.end - k * plan.block_s
    order = np.lexsort((v, ends))
    ends, v = ends[order], v[order]
    first = np.r_[True, ends[1:] != ends[:-1]]
    return ends[first], v[first]


def _chains(members: Sequence[_Member], plan: Plan, ip_names: dict[str, str]) -> list[FleetSeries]:
    """Series of one slot that follow each other in time -> one history with restarts."""
    slots: dict[tuple[str, ...], list[_Member]] = {}
    for m in members:
        slots.setdefault(
            slot_of(m.fam, m.labels, virtual_gpus=plan.virtual_gpus, ip_names=ip_names), []
        ).append(m)
    out: list[FleetSeries] = []
    tol = plan.block_s + 1e-6
    for ms in slots.values():
        if len(ms) > 1 and ms[0].fam.layer == "device":
            # a GPU row with no identity while no server ran (between two pods): empty floors
            # only, part of the GPU's history between lives, not a row of its own
            empty = plan.config.empty_mib
            busy = [
                m for m in ms if not (m.v is not None and len(m.v) and bool((m.v <= empty).all()))
            ]
            ms = busy or ms
        ms.sort(key=lambda m: m.span(plan.start, plan.end, plan.block_s))
        chains: list[list[_Member]] = []
        for m in ms:
            first, _ = m.span(plan.start, plan.end, plan.block_s)
            for chain in chains:
                _, last = chain[-1].span(plan.start, plan.end, plan.block_s)
                if chain[-1].t is not None and m.t is not None and last <= first + tol:
                    chain.append(m)
                    break
            else:
                chains.append([m])
        for chain in chains:
            out.append(_series_of(chain, plan, ip_names))
    return out


def _series_of(chain: Sequence[_Member], plan: Plan, ip_names: dict[str, str]) -> FleetSeries:
    cur = chain[-1]
    lab = cur.labels
    f = cur.fam
    ts: list[np.ndarray] = []
    vs: list[np.ndarray] = []
    cuts: list[tuple[float, str]] = []
    for i, m in enumerate(chain):
        if m.t is None or m.v is None:
            continue
        t, v = m.t, m.v
        if i + 1 < len(chain) and chain[i + 1].t is not None and len(chain[i + 1].t):  # type: ignore[arg-type]
            nxt = float(chain[i + 1].t[0])  # type: ignore[index]
            keep = t < nxt
            t, v = t[keep], v[keep]
        if i > 0 and len(m.t):
            cuts.append((float(m.t[0]), "new identity"))
        ts.append(t)
        vs.append(v)
    t = np.concatenate(ts) if ts else np.empty(0)
    v = np.concatenate(vs) if vs else np.empty(0)
    screen = cur.screen if cur.t is None else None
    return FleetSeries(
        host=host_of(lab, ip_names),
        layer=layer_of(f, lab, virtual_gpus=plan.virtual_gpus),
        unit="MiB",
        source=f.source,
        t=t,
        v=v,
        gpu=gpu_of(lab),
        mig=mig_of(lab),
        mig_profile=mig_profile(lab),
        uuid=uuid_of(lab),
        pid=pid_of(lab),
        process=process_of(lab),
        pod=pod_of(lab),
        instance=lab.get("instance"),
        cuts=cuts,
        last_seen=cur.last_seen,
        level=cur.screen.level if cur.screen is not None else None,
        screen=screen,
    )


def _free_query(
    client: PrometheusClient, plan: Plan, frees: Sequence[Family]
) -> list[tuple[Family, list[InstantSample]]]:
    """Memory left now per GPU and host: the least free of the last block."""
    block = promql.dur(plan.block_s)
    jobs = [
        partial(_tagged_free, client, f"min_over_time({_sel(f.name, plan)}[{block}])", plan, f)
        for f in frees
    ]
    return list(client.many(jobs))


def _tagged_free(
    client: PrometheusClient, expr: str, plan: Plan, f: Family
) -> tuple[Family, list[InstantSample]]:
    return f, client.instant(expr, plan.end)


def _free(
    got: Sequence[tuple[Family, list[InstantSample]]], out: Collected, ip_names: dict[str, str]
) -> None:
    """Free memory by (host, gpu, mig), (host, uuid, mig) and (host, "", "") for a host."""
    for f, samples in got:
        for s in samples:
            host = host_of(s.labels, ip_names)
            if f.kind == "host_free":
                key = (host, "", "")
            else:
                gpu = gpu_of(s.labels)
                if gpu is None:
                    continue
                key = (host, gpu, mig_of(s.labels) or "")
            value = s.value * f.scale
            if not math.isfinite(value) or value < 0:
                out.free_notes[key] = (
                    f"free memory reading impossible ({one_line(f'{s.value:g}')} in {f.name}): "
                    "time to OOM unknown"
                )
                out.free.pop(key, None)
                continue
            if key not in out.free_notes:
                out.free[key] = min(value, out.free.get(key, math.inf))
            uuid = uuid_of(s.labels)
            if uuid and f.kind == "free":
                out.free.setdefault((host, uuid, mig_of(s.labels) or ""), value)


Pending = list[tuple[Any, dict[str, str]]]
"""KV rows and series made before the host names are known: (object, its labels)."""


_KvKey = tuple[str, str]
"""A KV server: (job, instance)."""

_KvCandidate = tuple[_KvKey, dict[str, str]]
"""A KV server whose floors are pulled: its key and labels."""


@dataclass(frozen=True)
class _KvAsk:
    """The instant queries that find one kind and pool's servers (None: not asked)."""

    recent: str  # servers with a sample in the stale window before the range end
    first: str  # servers with a sample at the range start
    at_start: float
    held: str | None  # the most held at an idle moment; None: idle moments cannot be told
    capacity: str | None
    resets: str | None
    recorded_resets: str | None  # the recording rule of the counter's resets, when read


@dataclass
class _KvServers:
    """One kind and pool's servers as the database sees them, by `_kv_key`."""

    seen: dict[_KvKey, dict[str, str]]  # every server found, with its labels
    live: set[_KvKey]  # reporting at the range end
    from_start: set[_KvKey]  # there at the range start
    held: dict[_KvKey, float]  # the most held at an idle moment
    capacity: dict[_KvKey, float]
    resets: dict[_KvKey, int]


def _kv(
    client: PrometheusClient, plan: Plan, src: KvSource, rule: str | None, out: Collected
) -> Pending:
    """Every server of one kind and pool: screened (0 held at idle), pulled, never idle.
    Returns what it made with the labels its host is named from (named later)."""
    ask = _kv_ask(plan, src, rule)
    servers = _kv_servers(client, plan, ask)
    if ask.held is None:
        return _kv_idle_unknown(src, plan, servers, out)
    made, candidates = _kv_screen(src, plan, servers, out)
    out.count(candidates=len(candidates))
    if not candidates:
        return made
    floors, cuts = _kv_pull(client, plan, src, rule, ask.recorded_resets, candidates)
    made.extend(_kv_candidate_series(src, plan, servers, candidates, floors, cuts))
    return made


def _kv_ask(plan: Plan, src: KvSource, rule: str | None) -> _KvAsk:
    """Returns the queries that find the servers of one kind and pool, what each held at idle,
    its pool size and its restarts (from the recording rules when `rule`)."""
    m = plan.matchers
    group = ", ".join(promql.KV_GROUP)
    stale = promql.dur(plan.config.stale_s)
    head = promql.dur(3 * plan.block_s)
    used = promql.selector(src.used, m)
    at_start = min(plan.start + 3 * plan.block_s, plan.end)
    early = promql.selector(rule, m) if rule is not None else used  # raw may be gone there
    floor_expr = promql.kv_floor(src, m, plan.block_s)
    window = promql.dur(plan.window_s)
    if rule is not None:
        held_expr: str | None = f"max_over_time({promql.selector(rule, m)}[{window}])"
    elif floor_expr is not None:
        held_expr = f"max_over_time({floor_expr}[{window}:{promql.dur(plan.block_s)}])"
    else:
        held_expr = None
    cap = promql.kv_capacity(src, m)
    counted = promql.resets_rule_name(src.counter) if src.counter else None
    recorded_resets = counted if rule is not None and counted in plan.names else None
    resets = promql.kv_resets(src, m, plan.window_s, recorded=recorded_resets)
    return _KvAsk(
        recent=f"group by ({group}) (last_over_time({used}[{stale}]))",
        first=f"group by ({group}) (last_over_time({early}[{head}]))",
        at_start=at_start,
        held=held_expr,
        capacity=cap,
        resets=resets,
        recorded_resets=recorded_resets,
    )


def _kv_servers(client: PrometheusClient, plan: Plan, ask: _KvAsk) -> _KvServers:
    """Asks the database the queries of `ask` at once; returns the servers they found."""

    def asked(expr: str | None, at: float) -> Callable[[], list[InstantSample]]:
        return (lambda: client.instant(expr, at)) if expr else (lambda: [])

    recent, first, held, caps, rs = client.many(
        [
            asked(ask.recent, plan.end),
            asked(ask.first, ask.at_start),
            asked(ask.held, plan.end),
            asked(ask.capacity, plan.end),
            asked(ask.resets, plan.end),
        ]
    )
    seen = {_kv_key(s.labels): _clean(s.labels) for s in [*recent, *first]}
    for s in held:
        seen.setdefault(_kv_key(s.labels), _clean(s.labels))
    return _KvServers(
        seen=seen,
        live={_kv_key(s.labels) for s in recent},
        from_start={_kv_key(s.labels) for s in first},
        held={_kv_key(s.labels): s.value for s in held},
        capacity={
            _kv_key(s.labels): s.value for s in caps if math.isfinite(s.value) and s.value > 0
        },
        resets={_kv_key(s.labels): int(s.value) for s in rs if math.isfinite(s.value)},
    )


def _kv_idle_unknown(src: KvSource, plan: Plan, servers: _KvServers, out: Collected) -> Pending:
    """Returns an INCONCLUSIVE row per server when idle moments cannot be told (no running or
    queued gauges stored), with a note saying so."""
    made: Pending = []
    for labels in servers.seen.values():
        made.append((_kv_row(src, labels, "idle_unknown", plan), labels))
    if servers.seen:
        out.note(
            f"{src.used} is stored but not "
            f"{' and '.join(src.running + src.queued) or 'the running/queued gauges'}: "
            "idle moments cannot be told, so KV held at idle is not judged"
        )
    return made


def _kv_screen(
    src: KvSource, plan: Plan, servers: _KvServers, out: Collected
) -> tuple[Pending, list[_KvCandidate]]:
    """Returns what the screen settles without pulling (a row for each server never idle, a
    STABLE series for each that held nothing at idle the whole range) and the candidates
    whose floors are pulled."""
    made: Pending = []
    candidates: list[_KvCandidate] = []
    for k, labels in servers.seen.items():
        if k not in servers.held:
            made.append(
                (_kv_row(src, labels, "never_idle", plan, stale=k not in servers.live), labels)
            )
            continue
        value = servers.held[k]
        if (
            plan.strategy == "screen"
            and math.isfinite(value)
            and value <= plan.config.screen_sd(src.unit)
            and k in servers.live
            and k in servers.from_start
        ):
            series = _kv_series(src, labels, np.empty(0), np.empty(0), servers.capacity.get(k))
            series.screen = Screen(
                0.0, 0.0, 0.0, True, plan.late_s, restarts=servers.resets.get(k, 0)
            )
            series.last_seen = plan.end
            made.append((series, labels))
            out.count(screened=1)
            continue
        candidates.append((k, labels))
    return made, candidates


def _kv_pull(
    client: PrometheusClient,
    plan: Plan,
    src: KvSource,
    rule: str | None,
    recorded_resets: str | None,
    candidates: Sequence[_KvCandidate],
) -> tuple[dict[_KvKey, RangeSeries], dict[_KvKey, list[tuple[float, str]]]]:
    """Pulls the candidates' floors (and the blocks where their request counter reset), in
    batches of instances; returns (floors, restarts as cuts) by server."""
    m = plan.matchers
    group = ", ".join(promql.KV_GROUP)
    jobs: list[Callable[[], tuple[bool, list[RangeSeries]]]] = []
    size = max(
        1, min(200, plan.batch_bytes // (24 * max(1, round(plan.window_s / plan.block_s)) + 400))
    )
    for i in range(0, len(candidates), size):
        batch = candidates[i : i + size]
        regex = "|".join(_re_escape(labels.get("instance", "")) for _, labels in batch)
        extra = (*m, f"instance=~{promql.quote(regex)}")
        if rule is not None:
            expr = promql.floor(
                promql.selector(rule, extra), plan.block_s, recorded=True, ratio=src.unit == "ratio"
            )
        else:
            sub = promql.kv_floor(src, extra, plan.block_s)
            assert sub is not None
            expr = sub
        jobs.append(partial(_flagged_range, client, expr, plan, False))
        if src.counter is not None:
            if recorded_resets is not None:
                sel = promql.selector(recorded_resets, extra)
                rexpr = f"sum by ({group}) (last_over_time({sel}[{promql.dur(plan.block_s)}])) > 0"
            else:
                counter = promql.selector(src.counter, extra)
                rexpr = f"sum by ({group}) (resets({counter}[{promql.dur(plan.block_s)}])) > 0"
            jobs.append(partial(_flagged_range, client, rexpr, plan, True))
    floors: dict[_KvKey, RangeSeries] = {}
    cuts: dict[_KvKey, list[tuple[float, str]]] = {}
    for is_resets, got in client.many(jobs):
        for r in got:
            k = _kv_key(r.labels)
            if is_resets:
                cuts[k] = [(float(t) - plan.block_s / 2, "counter reset") for t in r.t]
            else:
                floors[k] = r
    return floors, cuts


def _kv_candidate_series(
    src: KvSource,
    plan: Plan,
    servers: _KvServers,
    candidates: Sequence[_KvCandidate],
    floors: dict[_KvKey, RangeSeries],
    cuts: dict[_KvKey, list[tuple[float, str]]],
) -> Pending:
    """Returns one series per candidate from its pulled floors (empty when none came back),
    its restarts and when it was last seen."""
    made: Pending = []
    for k, labels in candidates:
        r = floors.get(k)
        t = r.t if r is not None else np.empty(0)
        v = r.v if r is not None else np.empty(0)
        series = _kv_series(src, labels, t, v, servers.capacity.get(k))
        series.cuts = cuts.get(k, [])
        series.last_seen = plan.end if k in servers.live else (float(t[-1]) if len(t) else None)
        made.append((series, labels))
    return made


def _flagged_range(
    client: PrometheusClient, expr: str, plan: Plan, flag: bool
) -> tuple[bool, list[RangeSeries]]:
    return flag, client.range(expr, plan.floors_start, plan.end, plan.block_s)


def _kv_key(labels: dict[str, str]) -> tuple[str, str]:
    return (labels.get("job", ""), labels.get("instance", ""))


def _kv_series(
    src: KvSource,
    labels: dict[str, str],
    t: np.ndarray,
    v: np.ndarray,
    capacity: float | None,
) -> FleetSeries:
    return FleetSeries(
        host=host_of(labels),
        layer="kv",
        unit=src.unit,
        source=src.display,
        t=t,
        v=v,
        instance=labels.get("instance"),
        server=src.kind,
        pool=src.pool,
        capacity=capacity if src.unit == "tokens" else 1.0,
    )


def _kv_row(
    src: KvSource,
    labels: dict[str, str],
    reason: str,
    plan: Plan,
    *,
    stale: bool = False,
) -> FleetRow:
    why = REASONS[reason]
    if reason == "never_idle":
        why = (
            f"never idle in {_span(plan.window_s)} (no {_span(plan.block_s)} without a request "
            "running or waiting): KV held at idle cannot be measured; fleet needs moments with "
            "0 running and 0 waiting requests"
        )
    s = _kv_series(src, labels, np.empty(0), np.empty(0), None)
    return FleetRow(
        host=s.host,
        layer="kv",
        unit=src.unit,
        source=src.display,
        gpu=None,
        mig=None,
        mig_profile=None,
        uuid=None,
        pid=None,
        process=None,
        pod=None,
        instance=s.instance,
        server=src.kind,
        pool=src.pool,
        verdict="INCONCLUSIVE",
        reason=reason,
        why=why,
        level=None,
        runs_out="pool",
        stale=stale,
    )


def _span(seconds: float) -> str:
    from vramdoctor.units import format_duration

    return format_duration(seconds)
