"""A server's /metrics: scraped with requests, parsed with prometheus_client, mapped to stable names.

Which names mean what is not written here: each server kind of the registry
(`vramdoctor.servers`, e.g. `servers/sglang.py`) lists its metric names with their units, how
label sets fold, its KV pools, running/queued gauges, request counters and sleep state. This
module reads a page with those tables. The kind is the one whose prefix the most series carry
(`sglang:`: needs --enable-metrics; `vllm:`: always on). Analysis reads only the stable names;
every series scraped is also kept raw ("name{labels}" -> value), unknown ones included, so
nothing is lost when a release adds or renames a metric. Histogram `_bucket` lines and
counters' `_created` timestamps are left out of `raw` by default (many lines a scrape, no
memory signal); histograms keep their `_sum` and `_count`.

Folding over label sets (`vramdoctor.servers.base.fold`): SGLang repeats scheduler gauges per
TP/PP/EP rank with --enable-metrics-for-all-schedulers, so ranks of one replica are folded
with max before DP replicas (dp_rank) or vLLM engines (engine) are summed; ratios take the max
(the fullest pool is what runs out first).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from vramdoctor import servers
from vramdoctor.samples import KvPoolSample, MetricsSample, now
from vramdoctor.servers.base import KvPoolMetrics, ServerKind, fold, replica_key
from vramdoctor.sources.http import DEFAULT_TIMEOUT_S, Scraper, parse_exposition

__all__ = [
    "STABLE_NAMES",
    "ServerMetricsSource",
    "detect_flavour",
    "kv_pools",
    "parse_metrics_text",
    "raw_key",
    "requests_total",
    "stable_names",
]

Labels = dict[str, str]
Rows = list[tuple[Labels, float]]


def stable_names() -> tuple[str, ...]:
    """Every stable name a registered server kind can fill, in registry order."""
    return tuple(dict.fromkeys(n for k in servers.kinds() for n in k.metrics.stable_names))


# The stable names of the built-in kinds (kinds registered later: `stable_names()`).
STABLE_NAMES: tuple[str, ...] = stable_names()


def detect_flavour(names: Iterable[str]) -> str | None:
    """The server kind's name by metric prefix (the kind with more series wins), else None."""
    kind = servers.kind_of_metrics(names)
    return kind.name if kind is not None else None


def raw_key(name: str, labels: Labels) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _first(by_name: dict[str, Rows], names: Iterable[str]) -> tuple[str, Rows] | None:
    for name in names:
        rows = by_name.get(name)
        if rows:
            return name, rows
    return None


def _sum(by_name: dict[str, Rows], name: str | None) -> float | None:
    rows = by_name.get(name) if name else None
    return fold(rows, "replicas_sum") if rows else None


def _sum_first(by_name: dict[str, Rows], names: Iterable[str]) -> float | None:
    found = _first(by_name, names)
    return fold(found[1], "replicas_sum") if found else None


def _derived(kind: ServerKind, by_name: dict[str, Rows], values: dict[str, float]) -> None:
    """Values that are not one series: a hit rate from counters, numbers carried as labels of
    info metrics, the sleep state."""
    m = kind.metrics
    if "cache_hit_rate" not in values:
        for hits, queries in m.hit_rate_counters:
            if hits in by_name and queries in by_name:
                q = fold(by_name[queries], "replicas_sum")
                if q > 0:
                    values["cache_hit_rate"] = fold(by_name[hits], "replicas_sum") / q
                break
    for info in m.info_labels:
        rows = by_name.get(info.metric)
        if not rows:
            continue
        try:
            number = float(rows[0][0][info.label])
        except (KeyError, ValueError):
            continue
        # A label "inf" is not a measurement: NaN, which the run-file writer leaves out
        # and reports once (as it does for "nan").
        values[info.stable] = number if math.isfinite(number) else math.nan
    sleep = m.sleep
    if sleep is not None and (rows := by_name.get(sleep.state)):
        awake = [v for labels, v in rows if sleep.levels.get(labels.get(sleep.label, "")) == 0]
        levels = [
            sleep.levels[labels[sleep.label]]
            for labels, v in rows
            if v >= 0.5 and sleep.levels.get(labels.get(sleep.label, ""), 0) > 0
        ]
        if awake:
            values["sleeping"] = 1.0 if min(awake) < 0.5 else 0.0
            values["sleep_level"] = float(max(levels, default=0))
        if sleep.in_flight and (flight := by_name.get(sleep.in_flight)):
            values["sleep_operations_in_flight"] = fold(flight, "sum")
        if sleep.operations and (ops := by_name.get(sleep.operations)):
            values["sleep_operations_total"] = fold(ops, "sum")


def kv_pools(
    flavour: str | None,
    by_name: dict[str, Rows],
    *,
    page_size_tokens: int | None = None,
    bytes_per_token: float | None = None,
) -> list[KvPoolSample]:
    """The KV pools a server exposes, in tokens (one KvPoolSample per pool). Pure.

    Per pool of the kind (`vramdoctor.servers.base.KvPoolMetrics`), used tokens are the first
    present of: the used gauges (summed over replicas); the usage ratio x the capacity gauge
    (SGLang `token_usage` x `max_total_num_tokens`); the usage ratio x blocks x block size from
    an info metric's labels, per engine (vLLM `kv_cache_usage_perc` x `cache_config_info`).
    Without any, the pool is left out (the ratio stays in `values["kv_usage_ratio"]`).
    """
    try:
        kind = servers.get(flavour or "")
    except KeyError:
        return []
    m = kind.metrics
    out: list[KvPoolSample] = []
    running = _sum_first(by_name, m.running_requests)
    queued = _sum_first(by_name, m.queued_requests)
    for spec in m.kv_pools:
        sample = _pool(spec, by_name, page_size_tokens, bytes_per_token)
        if sample is None:
            continue
        sample.running_requests, sample.queued_requests = running, queued
        out.append(sample)
    return out


def _pool(
    spec: KvPoolMetrics,
    by_name: dict[str, Rows],
    page_size_tokens: int | None,
    bytes_per_token: float | None,
) -> KvPoolSample | None:
    if spec.capacity_labels is not None:
        return _labelled_pool(spec, by_name, bytes_per_token)
    capacity = _sum(by_name, spec.capacity)
    per_token = bytes_per_token
    mem_rows = by_name.get(spec.memory_gib) if spec.memory_gib else None
    cap_rows = by_name.get(spec.capacity) if spec.capacity else None
    if per_token is None and mem_rows and cap_rows and capacity:
        # Bytes of K and V one token holds on one GPU (SGLang 0.5.17+ constant gauges).
        per_token = fold(mem_rows, "max") * 2**30 / fold(cap_rows, "max")
    used: float | None = None
    source = spec.used[0] if spec.used else None
    if found := _first(by_name, spec.used):
        source, used = found[0], fold(found[1], "replicas_sum")
    if used is None and capacity and (ratio := _first(by_name, spec.usage_ratio)):
        shown = (spec.capacity or "").split(":", 1)[-1]
        used, source = fold(ratio[1], "max") * capacity, f"{ratio[0]}*{shown}"
    if used is None:
        return None
    avail = _sum(by_name, spec.available)
    evict = _sum(by_name, spec.evictable)
    total = capacity if spec.primary else None
    if total is None and avail is not None:
        total = used + avail + (evict or 0.0)
    if not spec.primary and not total:
        return None  # a hybrid pool the model does not have (gauges left at 0)
    return KvPoolSample(
        pool=spec.pool,
        used_tokens=used,
        total_tokens=total,
        evictable_tokens=evict,
        page_size_tokens=page_size_tokens,
        bytes_per_token=per_token if spec.primary else None,
        source=source,
    )


def _labelled_pool(
    spec: KvPoolMetrics, by_name: dict[str, Rows], bytes_per_token: float | None
) -> KvPoolSample | None:
    """A pool sized by info-metric labels (vLLM): usage x blocks x block size, per engine."""
    assert spec.capacity_labels is not None
    found = _first(by_name, spec.usage_ratio)
    config = _capacity_from_labels(spec, by_name)
    if found is None or config is None:
        return None
    name, rows = found
    blocks, block_size = config
    engines = {replica_key(labels) for labels, _ in rows}
    used = 0.0
    for key in engines:
        used += max(v for labels, v in rows if replica_key(labels) == key) * blocks * block_size
    cl = spec.capacity_labels
    return KvPoolSample(
        pool=spec.pool,
        used_tokens=used,
        total_tokens=float(blocks * block_size * len(engines)),
        page_size_tokens=block_size,
        bytes_per_token=bytes_per_token,
        source=f"{name}*{cl.blocks_label}*{cl.block_size_label}",
    )


def _capacity_from_labels(spec: KvPoolMetrics, by_name: dict[str, Rows]) -> tuple[int, int] | None:
    """(blocks, block size) from the info metric's labels, when both are sane."""
    cl = spec.capacity_labels
    assert cl is not None
    for labels, _ in by_name.get(cl.metric, []):
        try:
            blocks, size = float(labels[cl.blocks_label]), float(labels[cl.block_size_label])
        except (KeyError, ValueError):
            continue
        if math.isfinite(blocks) and math.isfinite(size) and 0 < blocks < 1e12 and 0 < size < 1e6:
            return int(blocks), int(size)
    return None


def requests_total(flavour: str | None, by_name: dict[str, Rows]) -> float | None:
    """The server's cumulative count of finished requests (all label sets summed), or None."""
    try:
        names = servers.get(flavour or "").metrics.request_counters
    except KeyError:
        return None
    found = _first(by_name, names)
    return fold(found[1], "sum") if found else None


def _by_name(
    families: Iterable[Any], keep_buckets: bool
) -> tuple[dict[str, Rows], dict[str, float]]:
    by_name: dict[str, Rows] = {}
    raw: dict[str, float] = {}
    for fam in families:
        for s in fam.samples:
            value = float(s.value)
            if not math.isfinite(value):
                continue  # NaN/Inf cannot go into a JSON run file
            labels = dict(s.labels)
            by_name.setdefault(s.name, []).append((labels, value))
            if s.name.endswith("_created") or (s.name.endswith("_bucket") and not keep_buckets):
                continue
            raw[raw_key(s.name, labels)] = value
    return by_name, raw


def _stable_values(flavour: str | None, by_name: dict[str, Rows]) -> dict[str, float]:
    try:
        kind = servers.get(flavour or "")
    except KeyError:
        return {}
    values: dict[str, float] = {}
    for series in kind.metrics.series:
        found = _first(by_name, series.names)
        if found is not None:
            values[series.stable] = fold(found[1], series.fold)
    _derived(kind, by_name, values)
    return values


def _filter_text(text: str) -> str:
    # Most of a vLLM/SGLang page is histogram buckets; the pure-Python parser costs
    # ~12 us a line, so drop them (and counters' _created lines) before parsing.
    return (
        "\n".join(
            line
            for line in text.splitlines()
            if "_bucket{" not in line
            and "_created{" not in line
            and not line.endswith("_created")
            and "_created " not in line
        )
        + "\n"
    )


def parse_metrics_text(
    text: str,
    *,
    keep_buckets: bool = False,
    shown_url: str = "text",
    page_size_tokens: int | None = None,
    bytes_per_token: float | None = None,
) -> MetricsSample:
    """Prometheus exposition text -> MetricsSample (timestamped now), KV pools and the
    request counter included. `page_size_tokens`/`bytes_per_token` come from elsewhere
    (SGLang's server info) when the metrics do not carry them."""
    t, wall = now()
    if not keep_buckets:
        text = _filter_text(text)
    families = parse_exposition(text, what="server /metrics", shown_url=shown_url)
    by_name, raw = _by_name(families, keep_buckets)
    flavour = detect_flavour(by_name)
    return MetricsSample(
        t=t,
        wall=wall,
        flavour=flavour,
        values=_stable_values(flavour, by_name),
        raw=raw,
        kv=kv_pools(
            flavour, by_name, page_size_tokens=page_size_tokens, bytes_per_token=bytes_per_token
        ),
        requests_total=requests_total(flavour, by_name),
    )


class ServerMetricsSource:
    """Scrapes a server's /metrics. Life cycle: sample()* -> close()."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        headers: dict[str, str] | None = None,
        keep_buckets: bool = False,
        page_size_tokens: int | None = None,
        bytes_per_token: float | None = None,
    ) -> None:
        self._scraper = Scraper(url, what="server /metrics", timeout=timeout, headers=headers)
        self.keep_buckets = keep_buckets
        self.page_size_tokens = page_size_tokens
        self.bytes_per_token = bytes_per_token
        self.flavour: str | None = None

    @property
    def shown_url(self) -> str:
        return self._scraper.shown_url

    def sample(self) -> MetricsSample:
        t, wall = now()
        text = self._scraper.get_text()
        sample = parse_metrics_text(
            text,
            keep_buckets=self.keep_buckets,
            shown_url=self.shown_url,
            page_size_tokens=self.page_size_tokens,
            bytes_per_token=self.bytes_per_token,
        )
        sample.t, sample.wall = t, wall
        self.flavour = sample.flavour or self.flavour
        return sample

    def close(self) -> None:
        self._scraper.close()

    def __enter__(self) -> ServerMetricsSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
