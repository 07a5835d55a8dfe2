"""A server's /metrics: scraped with requests, parsed with prometheus_client, mapped to stable names.

SGLang (`sglang:` prefix, needs --enable-metrics) and vLLM (`vllm:`, always on) name the same
ideas differently and renamed them across releases. Analysis reads only the stable names
below; every series scraped is also kept raw ("name{labels}" -> value), unknown ones included,
so nothing is lost when a release adds or renames a metric. Histogram `_bucket` lines and
counters' `_created` timestamps are left out of `raw` by default (many lines a scrape, no
memory signal); histograms keep their `_sum` and `_count`.

Aggregation over label sets: SGLang repeats scheduler gauges per TP/PP/EP rank when
--enable-metrics-for-all-schedulers is on, so ranks of one replica are folded with max before
DP replicas (dp_rank) or vLLM engines (engine) are summed; ratios take the max (the fullest
pool is what runs out first).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vramdoctor.samples import KvPoolSample, MetricsSample, now
from vramdoctor.sources.http import DEFAULT_TIMEOUT_S, Scraper, parse_exposition

Labels = dict[str, str]
Rows = list[tuple[Labels, float]]

# Labels that mark copies of one replica's numbers (every TP rank sees the same batch).
REPLICA_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank"})
# Labels that tell one GPU/rank from another, for per-rank memory gauges.
RANK_LABELS = REPLICA_LABELS | {"dp_rank", "engine"}


def _key(labels: Labels, drop: frozenset[str] | set[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))


def agg_max(rows: Rows) -> float:
    return max(v for _, v in rows)


def agg_min(rows: Rows) -> float:
    return min(v for _, v in rows)


def agg_mean(rows: Rows) -> float:
    return sum(v for _, v in rows) / len(rows)


def agg_replicas_sum(rows: Rows) -> float:
    """Fold TP/PP/EP copies with max, then sum over replicas (dp_rank, engine, ...)."""
    groups: dict[Any, float] = {}
    for labels, v in rows:
        k = _key(labels, REPLICA_LABELS)
        groups[k] = max(groups.get(k, v), v)
    return sum(groups.values())


def agg_rank_sum_max(rows: Rows) -> float:
    """Sum the parts of one rank (e.g. graph memory per phase), then max over ranks."""
    ranks: dict[Any, float] = {}
    for labels, v in rows:
        k = tuple(sorted((k, v2) for k, v2 in labels.items() if k in RANK_LABELS))
        ranks[k] = ranks.get(k, 0.0) + v
    return max(ranks.values())


@dataclass(frozen=True)
class Series:
    """One stable name: the sample names that carry it (first present wins) and how to fold."""

    stable: str
    names: tuple[str, ...]
    agg: Callable[[Rows], float]
    doc: str


def _s(stable: str, names: str | Sequence[str], agg: Callable[[Rows], float], doc: str) -> Series:
    return Series(stable, (names,) if isinstance(names, str) else tuple(names), agg, doc)


SGLANG: tuple[Series, ...] = (
    _s(
        "kv_usage_ratio",
        "sglang:token_usage",
        agg_max,
        "KV pool usage 0..1 (0.5.23: max over full/SWA/mamba pools)",
    ),
    _s(
        "used_tokens",
        ("sglang:num_used_tokens", "sglang:kv_used_tokens"),
        agg_replicas_sum,
        "tokens held in the KV pool",
    ),
    _s(
        "running_requests",
        "sglang:num_running_reqs",
        agg_replicas_sum,
        "requests in the running batch",
    ),
    _s("queued_requests", "sglang:num_queue_reqs", agg_replicas_sum, "requests waiting"),
    _s("cache_hit_rate", "sglang:cache_hit_rate", agg_mean, "prefix (radix) cache hit rate 0..1"),
    _s(
        "retracted_requests",
        "sglang:num_retracted_reqs",
        agg_replicas_sum,
        "requests retracted (decode out of KV), gauge",
    ),
    _s(
        "retractions_total",
        "sglang:num_retracted_requests_total",
        agg_replicas_sum,
        "requests retracted since start, counter",
    ),
    _s("gen_throughput", "sglang:gen_throughput", agg_replicas_sum, "generated tokens/s"),
    _s(
        "max_total_tokens",
        "sglang:max_total_num_tokens",
        agg_max,
        "KV pool capacity in tokens (0.5.9+)",
    ),
    _s(
        "kv_available_tokens",
        "sglang:kv_available_tokens",
        agg_replicas_sum,
        "free KV tokens (0.5.12+)",
    ),
    _s(
        "kv_evictable_tokens",
        "sglang:kv_evictable_tokens",
        agg_replicas_sum,
        "radix-cached, evictable KV tokens (0.5.12+)",
    ),
    _s(
        "startup_available_gpu_memory_gib",
        "sglang:startup_available_gpu_memory_gb",
        agg_min,
        "free GPU memory after start-up, GiB, lowest rank (0.5.12+)",
    ),
    _s(
        "weight_memory_gib",
        "sglang:weight_memory_usage_gb",
        agg_max,
        "weights per GPU, GiB (0.5.17+)",
    ),
    _s(
        "kv_cache_memory_gib",
        "sglang:kv_cache_memory_usage_gb",
        agg_max,
        "KV cache per GPU, GiB (0.5.17+)",
    ),
    _s(
        "graph_memory_gib",
        "sglang:graph_memory_usage_gb",
        agg_rank_sum_max,
        "CUDA graphs per GPU, all phases, GiB (0.5.17+)",
    ),
    _s(
        "encoder_cache_mib",
        "sglang:encoder_cache_size_mb",
        agg_max,
        "multimodal encoder cache, MiB (0.5.15+)",
    ),
)

VLLM: tuple[Series, ...] = (
    _s(
        "kv_usage_ratio",
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        agg_max,
        "KV cache usage 0..1 (kv_cache_usage_perc from 0.9.2; gpu_cache_usage_perc up to 0.10.x)",
    ),
    _s(
        "running_requests",
        "vllm:num_requests_running",
        agg_replicas_sum,
        "requests in the running batch",
    ),
    _s("queued_requests", "vllm:num_requests_waiting", agg_replicas_sum, "requests waiting"),
    _s(
        "swapped_requests",
        "vllm:num_requests_swapped",
        agg_replicas_sum,
        "requests swapped to CPU (V0)",
    ),
    _s(
        "preemptions_total",
        "vllm:num_preemptions_total",
        agg_replicas_sum,
        "preemptions since start, counter",
    ),
    _s(
        "cache_hit_rate",
        "vllm:gpu_prefix_cache_hit_rate",
        agg_mean,
        "prefix cache hit rate 0..1 (V0 gauge)",
    ),
    _s(
        "cpu_kv_usage_ratio",
        "vllm:cpu_cache_usage_perc",
        agg_max,
        "CPU swap-space KV usage 0..1 (V0)",
    ),
)

FLAVOURS: dict[str, tuple[Series, ...]] = {"sglang": SGLANG, "vllm": VLLM}
STABLE_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys(s.stable for fl in FLAVOURS.values() for s in fl)
)


def detect_flavour(names: Iterable[str]) -> str | None:
    """'sglang' or 'vllm' by metric prefix (the one with more series wins), else None."""
    counts = {"sglang": 0, "vllm": 0}
    for name in names:
        if name.startswith("sglang:"):
            counts["sglang"] += 1
        elif name.startswith("vllm:"):
            counts["vllm"] += 1
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] else None


def raw_key(name: str, labels: Labels) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _vllm_derived(by_name: dict[str, Rows], values: dict[str, float]) -> None:
    """vLLM values that are not one series: V1 hit rate from counters, cache config labels."""
    if "cache_hit_rate" not in values:
        for hits, queries in (
            ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
            ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
        ):
            if hits in by_name and queries in by_name:
                q = agg_replicas_sum(by_name[queries])
                if q > 0:
                    values["cache_hit_rate"] = agg_replicas_sum(by_name[hits]) / q
                break
    for labels, _ in by_name.get("vllm:cache_config_info", []):
        for label, stable in (
            ("num_gpu_blocks", "num_gpu_blocks"),
            ("gpu_memory_utilization", "gpu_memory_utilization"),
        ):
            try:
                number = float(labels[label])
            except (KeyError, ValueError):
                continue
            # A label "inf" is not a measurement: NaN, which the run-file writer leaves out
            # and reports once (as it does for "nan").
            values[stable] = number if math.isfinite(number) else math.nan
        break


def _sum(by_name: dict[str, Rows], name: str) -> float | None:
    rows = by_name.get(name)
    return agg_replicas_sum(rows) if rows else None


# SGLang pools (collector.py, 0.5.12+): one used/available/evictable triple per pool. The
# mamba pool counts state slots, not tokens; it is judged the same way (0 used at idle).
SGLANG_POOLS = (("full", "sglang:kv"), ("swa", "sglang:swa"), ("mamba", "sglang:mamba"))
# Request counters: SGLang's tokenizer manager (`sglang:num_requests_total`, every request
# processed) and vLLM's (`vllm:request_success_total`, by finished_reason, aborts included).
REQUEST_COUNTERS = {
    "sglang": ("sglang:num_requests_total",),
    "vllm": ("vllm:request_success_total",),
}


def kv_pools(
    flavour: str | None,
    by_name: dict[str, Rows],
    *,
    page_size_tokens: int | None = None,
    bytes_per_token: float | None = None,
) -> list[KvPoolSample]:
    """The KV pools a server exposes, in tokens (one KvPoolSample per pool). Pure.

    SGLang: 0.5.12+ `kv_used_tokens` (+ available, evictable) per pool (full, swa, mamba);
    older `num_used_tokens`; else `token_usage` x `max_total_num_tokens`. vLLM:
    `kv_cache_usage_perc` (or `gpu_cache_usage_perc`) x `num_gpu_blocks` x `block_size` from
    the `vllm:cache_config_info` labels; without those labels there is no pool size and the
    ratio stays in `values["kv_usage_ratio"]` only.
    """
    out: list[KvPoolSample] = []
    if flavour == "sglang":
        running = _sum(by_name, "sglang:num_running_reqs")
        queued = _sum(by_name, "sglang:num_queue_reqs")
        max_total = by_name.get("sglang:max_total_num_tokens")
        capacity = agg_replicas_sum(max_total) if max_total else None
        per_token = bytes_per_token
        kv_gib = by_name.get("sglang:kv_cache_memory_usage_gb")
        if per_token is None and kv_gib and capacity:
            # Bytes of K and V one token holds on one GPU (0.5.17+ constant gauges).
            per_token = agg_max(kv_gib) * 2**30 / agg_max(max_total)  # type: ignore[arg-type]
        for pool, prefix in SGLANG_POOLS:
            used = _sum(by_name, f"{prefix}_used_tokens")
            avail = _sum(by_name, f"{prefix}_available_tokens")
            evict = _sum(by_name, f"{prefix}_evictable_tokens")
            source = f"{prefix}_used_tokens"
            total: float | None = None
            if pool == "full":
                total = capacity
                if used is None and (rows := by_name.get("sglang:num_used_tokens")):
                    used, source = agg_replicas_sum(rows), "sglang:num_used_tokens"
                if used is None and capacity and (ratio := by_name.get("sglang:token_usage")):
                    used, source = (
                        agg_max(ratio) * capacity,
                        "sglang:token_usage*max_total_num_tokens",
                    )
            if used is None:
                continue
            if total is None and avail is not None:
                total = used + avail + (evict or 0.0)
            if pool != "full" and not total:
                continue  # a hybrid pool the model does not have (gauges left at 0)
            out.append(
                KvPoolSample(
                    pool=pool,
                    used_tokens=used,
                    total_tokens=total,
                    evictable_tokens=evict,
                    running_requests=running,
                    queued_requests=queued,
                    page_size_tokens=page_size_tokens,
                    bytes_per_token=per_token if pool == "full" else None,
                    source=source,
                )
            )
    elif flavour == "vllm":
        rows = by_name.get("vllm:kv_cache_usage_perc") or by_name.get("vllm:gpu_cache_usage_perc")
        name = (
            "vllm:kv_cache_usage_perc"
            if by_name.get("vllm:kv_cache_usage_perc")
            else "vllm:gpu_cache_usage_perc"
        )
        config = _vllm_cache_config(by_name)
        if rows and config is not None:
            blocks, block_size = config
            engines = {_key(labels, REPLICA_LABELS) for labels, _ in rows}
            used = 0.0
            for key in engines:
                used += (
                    max(v for labels, v in rows if _key(labels, REPLICA_LABELS) == key)
                    * blocks
                    * block_size
                )
            out.append(
                KvPoolSample(
                    pool="kv",
                    used_tokens=used,
                    total_tokens=float(blocks * block_size * len(engines)),
                    running_requests=_sum(by_name, "vllm:num_requests_running"),
                    queued_requests=_sum(by_name, "vllm:num_requests_waiting"),
                    page_size_tokens=block_size,
                    bytes_per_token=bytes_per_token,
                    source=f"{name}*num_gpu_blocks*block_size",
                )
            )
    return out


def _vllm_cache_config(by_name: dict[str, Rows]) -> tuple[int, int] | None:
    """(num_gpu_blocks, block_size) from `vllm:cache_config_info` labels, when both are sane."""
    for labels, _ in by_name.get("vllm:cache_config_info", []):
        try:
            blocks, size = float(labels["num_gpu_blocks"]), float(labels["block_size"])
        except (KeyError, ValueError):
            continue
        if math.isfinite(blocks) and math.isfinite(size) and 0 < blocks < 1e12 and 0 < size < 1e6:
            return int(blocks), int(size)
    return None


def requests_total(flavour: str | None, by_name: dict[str, Rows]) -> float | None:
    """The server's cumulative count of finished requests (all label sets summed), or None."""
    for name in REQUEST_COUNTERS.get(flavour or "", ()):
        rows = by_name.get(name)
        if rows:
            return sum(v for _, v in rows)
    return None


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
    values: dict[str, float] = {}
    for series in FLAVOURS.get(flavour or "", ()):
        for name in series.names:
            rows = by_name.get(name)
            if rows:
                values[series.stable] = series.agg(rows)
                break
    if flavour == "vllm":
        _vllm_derived(by_name, values)
    return values


def map_families(
    families: Iterable[Any], *, keep_buckets: bool = False
) -> tuple[str | None, dict[str, float], dict[str, float]]:
    """(flavour, stable values, raw series) from parsed families. Pure."""
    by_name, raw = _by_name(families, keep_buckets)
    flavour = detect_flavour(by_name)
    return flavour, _stable_values(flavour, by_name), raw


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
