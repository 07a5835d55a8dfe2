"""What fleet asks Prometheus, and how each exporter's labels map to host, GPU and process.

Sources fleets already have (names and units as their exporters publish them):

- dcgm-exporter: `DCGM_FI_DEV_FB_USED` / `DCGM_FI_DEV_FB_FREE` (MiB) per GPU; the host label
  is `Hostname` in releases and `hostname` on its main branch (both accepted, then
  `instance`); GPU `gpu`, `UUID`/`uuid`. Pod labels (`pod`, `namespace`) change when a pod is
  replaced; with `--kubernetes-virtual-gpus` each pod sharing a GPU has its own FB_USED, so
  each pod is its own series.
- nvitop-exporter: `process_gpu_memory_MiB` and `process_rss_memory_MiB` per process
  (`hostname`, `index`, `uuid`, `pid`, `username`), `gpu_memory_free_MiB` per GPU. Its
  `process_info_info` carries the command line and is never read.
- nvidia_gpu_exporter (`--collect.compute-apps`): `nvidia_smi_compute_app_used_memory_bytes`
  (`uuid`, `pid`, `process_name`), `nvidia_smi_memory_free_bytes` (`uuid`).
- watch's exporter: `vramdoctor_process_memory_bytes{gpu,pid,process,layer}`,
  `vramdoctor_gpu_memory_free_bytes{gpu}`.
- the servers' KV pools at idle moments, selected in PromQL (used tokens / usage where the
  same instance has 0 running and 0 queued requests): SGLang `sglang:num_used_tokens`
  (or `sglang:kv_used_tokens`) with `sglang:num_running_reqs` + `sglang:num_queue_reqs`;
  vLLM `vllm:kv_cache_usage_perc` (or `vllm:gpu_cache_usage_perc`, a 0..1 ratio) with
  `vllm:num_requests_running` + `vllm:num_requests_waiting`.

Memory is asked as `min_over_time(NAME{match}[STEP])` at `STEP`: Prometheus downsamples to
each step's minimum, the low envelope the analysis compares.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from vramdoctor.errors import InputError
from vramdoctor.fleet.analysis import FleetSeries
from vramdoctor.sources.prometheus import PrometheusClient, RangeSeries
from vramdoctor.units import MIB

__all__ = ["FAMILIES", "KV_QUERIES", "Family", "collect", "host_of", "metric_names_used"]


@dataclass(frozen=True)
class Family:
    """One stored metric: its exporter, the layer it measures, and its scale to MiB."""

    name: str
    source: str
    layer: str  # "device", "vram", "rss", "free", or "label" (layer in the `layer` label)
    scale: float = 1.0  # multiply to get MiB


FAMILIES: tuple[Family, ...] = (
    Family("DCGM_FI_DEV_FB_USED", "dcgm-exporter", "device"),
    Family("DCGM_FI_DEV_FB_FREE", "dcgm-exporter", "free"),
    Family("process_gpu_memory_MiB", "nvitop-exporter", "vram"),
    Family("process_gpu_memory", "nvitop-exporter", "vram"),
    Family("process_rss_memory_MiB", "nvitop-exporter", "rss"),
    Family("process_rss_memory", "nvitop-exporter", "rss"),
    Family("gpu_memory_free_MiB", "nvitop-exporter", "free"),
    Family("nvidia_smi_compute_app_used_memory_bytes", "nvidia_gpu_exporter", "vram", 1.0 / MIB),
    Family("nvidia_smi_memory_free_bytes", "nvidia_gpu_exporter", "free", 1.0 / MIB),
    Family("vramdoctor_process_memory_bytes", "vramdoctor watch", "label", 1.0 / MIB),
    Family("vramdoctor_gpu_memory_free_bytes", "vramdoctor watch", "free", 1.0 / MIB),
)


@dataclass(frozen=True)
class KvQuery:
    source: str
    unit: str
    used: tuple[str, ...]  # first present wins
    running: str
    queued: str
    capacity: str | None  # the pool's size in the same unit (None: a 0..1 ratio)


KV_QUERIES: tuple[KvQuery, ...] = (
    KvQuery(
        "sglang",
        "tokens",
        ("sglang:num_used_tokens", "sglang:kv_used_tokens"),
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:max_total_num_tokens",
    ),
    KvQuery(
        "vllm",
        "ratio",
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        None,
    ),
)

_PORT = re.compile(r":\d+$")
_MATCH = re.compile(r'^\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*$')


def metric_names_used() -> set[str]:
    """Every metric name fleet reads (for the rules check and the docs)."""
    names = {f.name for f in FAMILIES}
    for q in KV_QUERIES:
        names.update(q.used)
        names.update((q.running, q.queued))
        if q.capacity:
            names.add(q.capacity)
    return names


def check_matchers(matchers: Iterable[str]) -> list[str]:
    """Validate `--match 'label="value"'` items (PromQL label matchers)."""
    out = []
    for m in matchers:
        if not _MATCH.match(m):
            raise InputError(
                f'--match wants a PromQL label matcher like cluster="a" or node=~"gpu-.*", not {m!r}'
            )
        out.append(m.strip())
    return out


def _selector(name: str, matchers: list[str]) -> str:
    inner = ",".join([f'__name__="{name}"', *matchers])
    return "{" + inner + "}"


def host_of(labels: dict[str, str]) -> str:
    """dcgm-exporter `Hostname` (releases) or `hostname` (main), nvitop `hostname`, else `instance` without its port."""
    for key in ("Hostname", "hostname"):
        value = labels.get(key)
        if value:
            return value
    instance = labels.get("instance")
    if instance:
        return _PORT.sub("", instance)  # the host, so several exporters of one host line up
    return "?"


def _pid(labels: dict[str, str]) -> int | None:
    try:
        return int(labels["pid"])
    except (KeyError, ValueError):
        return None


def _gpu(labels: dict[str, str]) -> str | None:
    for key in ("gpu", "index"):
        if labels.get(key) not in (None, ""):
            return labels[key]
    uuid = labels.get("UUID") or labels.get("uuid")
    return uuid or None


def _merge(series: list[RangeSeries]) -> tuple[np.ndarray, np.ndarray]:
    """Series of one identity (e.g. one GPU across pod label changes): max per timestamp."""
    if len(series) == 1:
        return series[0].t, series[0].v
    t = np.concatenate([s.t for s in series])
    v = np.concatenate([s.v for s in series])
    order = np.lexsort((-np.nan_to_num(v, nan=-np.inf), t))
    t, v = t[order], v[order]
    first = np.ones(len(t), dtype=bool)
    first[1:] = t[1:] != t[:-1]
    return t[first], v[first]


def to_series(family: Family, rows: list[RangeSeries], *, virtual_gpus: bool) -> list[FleetSeries]:
    """Map one family's range result to FleetSeries, one per host/GPU/process identity."""
    groups: dict[
        tuple[str, str | None, int | None, str, str | None],
        tuple[dict[str, str], list[RangeSeries]],
    ] = {}
    for r in rows:
        lab = r.labels
        host, gpu, pid = host_of(lab), _gpu(lab), _pid(lab)
        layer = lab.get("layer", "vram") if family.layer == "label" else family.layer
        pod: str | None = None
        if family.layer == "device" and virtual_gpus and lab.get("pod"):
            layer = "pod"
            pod = f"{lab.get('namespace', '')}/{lab['pod']}".lstrip("/")
        key = (host, gpu, pid, layer, pod)
        groups.setdefault(key, (lab, []))[1].append(r)
    out = []
    for (host, gpu, pid, layer, pod), (lab, rs) in groups.items():
        t, v = _merge(rs)
        unit = "MiB"
        out.append(
            FleetSeries(
                host=host,
                layer=layer,
                unit=unit,
                source=family.source,
                t=t,
                v=v * family.scale,
                gpu=gpu,
                uuid=lab.get("UUID") or lab.get("uuid"),
                pid=pid,
                process=lab.get("process") or lab.get("process_name") or None,
                pod=pod,
            )
        )
    return out


def collect(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step_s: float,
    matchers: list[str] | None = None,
    virtual_gpus: bool = False,
) -> tuple[list[FleetSeries], dict[tuple[str, str], float], list[str]]:
    """(memory series, free MiB now per (host, gpu), notes) from every family Prometheus holds."""
    matchers = check_matchers(matchers or [])
    present = client.metric_names(start, end)
    notes: list[str] = []
    series: list[FleetSeries] = []
    free: dict[tuple[str, str], float] = {}
    step = f"{max(round(step_s), 1)}s"
    found_any = False
    skip = {"process_gpu_memory"} if "process_gpu_memory_MiB" in present else set()
    skip |= {"process_rss_memory"} if "process_rss_memory_MiB" in present else set()
    for fam in FAMILIES:
        if fam.name not in present or fam.name in skip:
            continue
        found_any = True
        if fam.layer == "free":  # only the latest value matters: one instant query at the end
            for lab, value in client.query(
                f"last_over_time({_selector(fam.name, matchers)}[1h])", at=end
            ):
                gpu = _gpu(lab)
                if gpu is not None and np.isfinite(value):
                    free[(host_of(lab), gpu)] = value * fam.scale
            continue
        rows = client.query_range(
            f"min_over_time({_selector(fam.name, matchers)}[{step}])", start, end, step_s
        )
        series.extend(to_series(fam, rows, virtual_gpus=virtual_gpus))
    for q in KV_QUERIES:
        used = next((u for u in q.used if u in present), None)
        if used is None:
            continue
        found_any = True
        if q.running not in present or q.queued not in present:
            notes.append(
                f"{used} is stored but not {q.running} and {q.queued}: its idle moments cannot be told, so it is left out"
            )
            continue
        sel = lambda n: _selector(n, matchers)  # noqa: E731
        query = (
            f"max by (instance) ({sel(used)}) unless on (instance) "
            f"(sum by (instance) ({sel(q.running)}) + sum by (instance) ({sel(q.queued)}) > 0)"
        )
        kv_rows = client.query_range(query, start, end, step_s)
        capacity: dict[str, float] = {}
        if q.capacity is None:
            capacity = {
                r.labels.get("instance", "?"): 1.0 for r in kv_rows
            }  # a 0..1 ratio: the pool is 1
        elif q.capacity in present:
            capacity = {
                lab.get("instance", "?"): v
                for lab, v in client.query(
                    f"max by (instance) (last_over_time({sel(q.capacity)}[1h]))", at=end
                )
            }
        for r in kv_rows:
            inst = r.labels.get("instance", "?")
            series.append(
                FleetSeries(host=inst, layer="kv", unit=q.unit, source=q.source, t=r.t, v=r.v)
            )
            ok = np.isfinite(r.v)
            if inst in capacity and ok.any():
                free[(inst, "kv")] = capacity[inst] - float(r.v[ok][-1])
    if not found_any:
        notes.append(
            "Prometheus holds none of the memory metrics fleet reads (dcgm-exporter DCGM_FI_DEV_FB_USED, "
            "nvitop-exporter process_gpu_memory_MiB, nvidia_gpu_exporter "
            "nvidia_smi_compute_app_used_memory_bytes, vramdoctor watch, SGLang/vLLM KV gauges) "
            "in this range"
        )
    return series, free, notes
