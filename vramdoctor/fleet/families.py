"""What fleet reads: the exporters' memory metrics, the servers' KV pools, and whose series it is.

Exporters (names, units and labels as their released sources publish them; see
docs/fleet.md and research/formats/NOTES.md):

- dcgm-exporter: `DCGM_FI_DEV_FB_USED` / `DCGM_FI_DEV_FB_FREE` in MiB per GPU (labels `gpu`,
  `UUID` or `uuid`, `Hostname` up to 4.8.2 and `hostname` from 4.8.3, MIG `GPU_I_ID` /
  `GPU_I_PROFILE`, pod labels); 4.9.0 moved GPU memory to bytes under the DCGM 4.7 names, which
  no stored source confirms: `DCGM_FI_DEV_FB_USED_BYTES` / `_FREE_BYTES` are read as bytes and
  marked `inferred`. With `--kubernetes-virtual-gpus` each pod sharing a GPU has its own
  FB_USED row (`pod`, `pod_uid`).
- nvitop-exporter: `process_gpu_memory_MiB`, `process_rss_memory_MiB` per process (`hostname`,
  `index` ('0' or '0:1' for a MIG device), `uuid`, `pid`, `username`), `gpu_memory_used_MiB` /
  `gpu_memory_free_MiB` per GPU; older builds without the unit suffix.
- nvidia_gpu_exporter: `nvidia_smi_compute_app_used_memory_bytes{uuid,pid,process_name}`
  (`--collect.compute-apps`), `nvidia_smi_memory_used_bytes` / `_free_bytes{uuid}`, MIG
  `nvidia_smi_mig_memory_used_bytes` / `_free_bytes{uuid,gpu_instance_id}`; its uuid is
  lower-case without `GPU-`.
- vramdoctor watch: `vramdoctor_process_memory_bytes{gpu,pid,process,layer}`,
  `vramdoctor_gpu_memory_free_bytes{gpu}`.
- node-exporter: `node_memory_MemAvailable_bytes` (host memory left, for host-RAM rows).

Servers' KV pools come from the server registry (`vramdoctor.servers`: each kind's
`metrics.kv_pools`, running/queued gauges and request counters), never from names written here.

Identity: `host_of` (the exporter's host label, else a node label, else `instance` without its
port), `gpu_of`, `mig_of`, `pid_of`, `uuid_of`. A *slot* is where a life runs (a GPU, a slice,
a process name on a GPU, a pod sharing a GPU); an *identity* inside it is one life (a pid, a
pod): a new identity in a slot is a restart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from vramdoctor import servers
from vramdoctor.units import MIB

__all__ = [
    "FAMILIES",
    "HOST_LABELS",
    "Family",
    "KvSource",
    "family",
    "gpu_of",
    "host_of",
    "identity_of",
    "kv_sources",
    "metric_names_used",
    "mig_of",
    "pid_of",
    "slot_of",
    "uuid_of",
]

Kind = Literal["memory", "free", "host_free"]


@dataclass(frozen=True)
class Family:
    """One stored metric: its exporter, the layer it measures, its scale to MiB, and whether
    it is per process. `kind` "free" is GPU memory left (for time to OOM), "host_free" host
    memory left. `inferred`: the name is not confirmed in a released exporter source."""

    name: str
    source: str
    layer: str  # "device", "vram", "rss", or "label" (the layer is in the `layer` label)
    scale: float = 1.0  # multiply to get MiB
    kind: Kind = "memory"
    per_process: bool = False
    inferred: bool = False
    alias_of: str | None = None  # an older spelling: read only when the newer one is absent

    @property
    def unit(self) -> str:
        return "MiB"


def _exporter_families() -> tuple[Family, ...]:
    """The GPU exporters' memory fields, from the one table of them (`sources.exporter.FIELDS`:
    names, units and levels as the released sources publish them)."""
    from vramdoctor.sources.exporter import FIELDS

    layer = {"used": "device", "process_used": "vram", "process_rss": "rss", "free": "free"}
    out = []
    for f in FIELDS:
        if f.quantity not in layer:
            continue  # totals and reserved: not what grows
        out.append(
            Family(
                f.name,
                f.exporter,
                layer[f.quantity],
                1 / MIB if f.unit == "bytes" else 1.0,
                kind="free" if f.quantity == "free" else "memory",
                per_process=f.level == "process",
                inferred="inferred" in f.versions,
            )
        )
    return tuple(out)


FAMILIES: tuple[Family, ...] = (
    *_exporter_families(),
    # nvitop-exporter built with a prometheus_client that does not append units
    Family(
        "process_gpu_memory",
        "nvitop-exporter",
        "vram",
        per_process=True,
        alias_of="process_gpu_memory_MiB",
    ),
    Family(
        "process_rss_memory",
        "nvitop-exporter",
        "rss",
        per_process=True,
        alias_of="process_rss_memory_MiB",
    ),
    Family("gpu_memory_used", "nvitop-exporter", "device", alias_of="gpu_memory_used_MiB"),
    Family(
        "gpu_memory_free", "nvitop-exporter", "free", kind="free", alias_of="gpu_memory_free_MiB"
    ),
    # vramdoctor watch's own exporter (watch.EXPORTED_METRICS)
    Family(
        "vramdoctor_process_memory_bytes", "vramdoctor watch", "label", 1 / MIB, per_process=True
    ),
    Family("vramdoctor_gpu_memory_free_bytes", "vramdoctor watch", "free", 1 / MIB, kind="free"),
    # node-exporter: host memory left, for host-RAM rows
    Family("node_memory_MemAvailable_bytes", "node-exporter", "host", 1 / MIB, kind="host_free"),
)
"""Every metric fleet reads for memory: the exporters' (from `sources.exporter.FIELDS`), older
spellings, watch's, node-exporter's."""


def family(name: str) -> Family:
    """The family called `name` (KeyError if fleet does not read it)."""
    for f in FAMILIES:
        if f.name == name:
            return f
    raise KeyError(name)


@dataclass(frozen=True)
class KvSource:
    """One server kind's KV pool as fleet reads it, from the server registry.

    `used` is the stored metric of used tokens (unit "tokens") or of the usage ratio (unit
    "ratio", 0..1); `running`/`queued` the gauges whose sum is 0 at an idle moment;
    `capacity` the pool size in tokens (None: unknown, or a ratio whose pool is 1);
    `counter` a request counter whose reset is a restart."""

    kind: str  # server kind name ("sglang")
    display: str  # "SGLang"
    pool: str  # "full", "swa", "kv", ...
    used: str
    unit: Literal["tokens", "ratio"]
    running: tuple[str, ...]
    queued: tuple[str, ...]
    capacity: str | None
    counter: str | None
    primary: bool

    @property
    def source(self) -> str:
        return self.display


def kv_sources(present: Iterable[str]) -> list[KvSource]:
    """The KV pools of every registered server kind whose used metric Prometheus holds
    (`present`: the stored metric names). The first present name of each pool wins."""
    have = set(present)
    out: list[KvSource] = []
    for kind in servers.kinds():
        m = kind.metrics
        for pool in m.kv_pools:
            used = next((n for n in pool.used if n in have), None)
            unit: Literal["tokens", "ratio"] = "tokens"
            if used is None:
                used = next((n for n in pool.usage_ratio if n in have), None)
                unit = "ratio"
            if used is None:
                continue
            out.append(
                KvSource(
                    kind=kind.name,
                    display=kind.display_name,
                    pool=pool.pool,
                    used=used,
                    unit=unit,
                    running=tuple(n for n in m.running_requests if n in have),
                    queued=tuple(n for n in m.queued_requests if n in have),
                    capacity=pool.capacity if unit == "tokens" and pool.capacity in have else None,
                    counter=next((n for n in m.request_counters if n in have), None),
                    primary=pool.primary,
                )
            )
    return out


def metric_names_used() -> set[str]:
    """Every metric name fleet reads (for the rules check and the docs)."""
    names = {f.name for f in FAMILIES}
    for kind in servers.kinds():
        m = kind.metrics
        for pool in m.kv_pools:
            names.update(pool.used)
            names.update(pool.usage_ratio)
            if pool.capacity:
                names.add(pool.capacity)
        names.update(m.running_requests)
        names.update(m.queued_requests)
        names.update(m.request_counters)
    return names


# --- identity ---------------------------------------------------------------------------------

HOST_LABELS = ("Hostname", "hostname", "node", "kubernetes_node", "nodename", "host")
"""Labels that name a host, in the order they are trusted (exporters' own labels first)."""

_PORT = re.compile(r":\d+$")


def instance_host(instance: str) -> str:
    """`instance` without its port (`10.0.0.5:9400` -> `10.0.0.5`, `[::1]:9090` -> `[::1]`)."""
    return _PORT.sub("", instance)


def host_of(labels: Mapping[str, str], ip_names: Mapping[str, str] | None = None) -> str:
    """The host of a series: an exporter's or a node label, else the name another exporter
    gives that `instance`'s address (`ip_names`: address -> host name), else the address."""
    for key in HOST_LABELS:
        value = labels.get(key)
        if value:
            return value
    instance = labels.get("instance")
    if instance:
        address = instance_host(instance)
        if ip_names and address in ip_names:
            return ip_names[address]
        return address
    return "?"


def uuid_of(labels: Mapping[str, str]) -> str | None:
    """A GPU's UUID, normalised to lower case without `GPU-` (nvidia_gpu_exporter's form)."""
    uuid = labels.get("UUID") or labels.get("uuid") or labels.get("gpu_uuid")
    if not uuid:
        return None
    u = uuid.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def gpu_of(labels: Mapping[str, str]) -> str | None:
    """The GPU index (`gpu`, nvitop `index` before its ':'), else the UUID as the exporter
    writes it (nvidia_gpu_exporter has no index), else None."""
    for key in ("gpu", "index"):
        value = labels.get(key)
        if value not in (None, ""):
            assert value is not None
            return value.split(":", 1)[0]
    return labels.get("UUID") or labels.get("uuid") or labels.get("gpu_uuid") or None


def mig_of(labels: Mapping[str, str]) -> str | None:
    """The MIG GPU instance (dcgm `GPU_I_ID`, nvidia_gpu_exporter `gpu_instance_id`, nvitop's
    index '0:1'), or None for a whole GPU."""
    for key in ("GPU_I_ID", "gpu_instance_id"):
        value = labels.get(key)
        if value not in (None, ""):
            return value
    index = labels.get("index", "")
    if ":" in index:
        return index.split(":", 1)[1]
    return None


def mig_profile(labels: Mapping[str, str]) -> str | None:
    return labels.get("GPU_I_PROFILE") or labels.get("profile") or None


def pid_of(labels: Mapping[str, str]) -> int | None:
    try:
        return int(labels["pid"])
    except (KeyError, ValueError):
        return None


def pod_of(labels: Mapping[str, str]) -> str | None:
    pod = labels.get("pod") or labels.get("pod_name")
    if not pod:
        return None
    ns = labels.get("namespace") or labels.get("pod_namespace") or ""
    return f"{ns}/{pod}" if ns else pod


def process_of(labels: Mapping[str, str]) -> str | None:
    return labels.get("process") or labels.get("process_name") or None


def layer_of(fam: Family, labels: Mapping[str, str], *, virtual_gpus: bool) -> str:
    if fam.layer == "label":
        return labels.get("layer") or "vram"
    if fam.layer == "device" and virtual_gpus and pod_of(labels):
        return "pod"
    return fam.layer


Slot = tuple[str, ...]


def slot_of(
    fam: Family,
    labels: Mapping[str, str],
    *,
    virtual_gpus: bool,
    ip_names: Mapping[str, str] | None = None,
) -> Slot:
    """Where a series' life runs: (source, layer, host, gpu, mig, and for per-process
    families the process name or user; for virtual-GPU pods the pod). Series of one slot
    that do not overlap in time are one history with restarts between them."""
    layer = layer_of(fam, labels, virtual_gpus=virtual_gpus)
    base = (
        fam.source,
        layer,
        host_of(labels, ip_names),
        gpu_of(labels) or "",
        mig_of(labels) or "",
    )
    if fam.per_process:
        who = process_of(labels) or labels.get("username") or ""
        return (*base, who)
    if layer == "pod":
        return (*base, pod_of(labels) or "")
    return base


_IDENTITY_LABELS = ("pid", "pod", "pod_name", "pod_uid", "namespace", "container", "container_name")


def identity_of(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What tells one life from the next within a slot: pid, pod and container labels."""
    return tuple((k, labels[k]) for k in _IDENTITY_LABELS if labels.get(k))
