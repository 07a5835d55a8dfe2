"""GPU memory of another host, read from its GPU exporter's /metrics page.

Three exporters, every spelling of the releases in use in 2026, parsed with prometheus_client's
parser into the same `GpuSample` NVML gives, so soak, watch and census work the same on a
remote server. Names, labels and units are in `FIELDS` (read from the exporters' released
source: see docs/sources.md for versions and how each was checked):

- dcgm-exporter: framebuffer fields `DCGM_FI_DEV_FB_{USED,FREE,RESERVED,TOTAL}` in MiB up to
  4.8 (the DCGM field definitions say "in MB", the default counters' HELP "(in MiB)");
  4.9.0 renamed the default fields to their DCGM 4.7 names and moved GPU memory to bytes
  (`DCGM_FI_DEV_FB_CAPACITY_BYTES` is collected by default; the used/free names were not in
  any source we could read, so every `DCGM_FI_DEV_FB_*` family is read by the quantity its name
  carries: USED, FREE, RESERVED, TOTAL or CAPACITY). Labels: gpu, UUID (uuid with
  --use-old-namespace), device, modelName, `Hostname` up to 4.8.2 and `hostname` from 4.8.3,
  MIG `GPU_I_PROFILE`/`GPU_I_ID` (no compute-instance label exists), pod/namespace/container;
  with --kubernetes-virtual-gpus (4.5.3-4.8.2+) per-pod `DCGM_FI_DEV_FB_USED` rows with
  `pod_uid` sit next to the device row. Device level only: no processes. It refreshes every
  30 s by default (`-c`), so a faster scrape repeats values.
- nvitop-exporter (1.x, 1.7.0 checked): `gpu_memory_{total,used,free}_MiB{hostname,index,
  devicename,uuid}`, per process `process_gpu_memory_MiB{...,pid,username}` and
  `process_info_info{...,command}` (prometheus_client appends the unit; builds without it
  are read too). A MIG device's index is "gpu:mig" (its position in the GPU, not a GPU
  instance id) and its uuid `MIG-...`.
- nvidia_gpu_exporter (utkuozdemir, 1.x, 1.14.0 checked): `nvidia_smi_memory_{used,free,total,
  reserved}_bytes{uuid}` in BYTES although `# HELP` says "[MiB]" (it echoes the nvidia-smi
  field), uuid lowercase without "GPU-", index from `nvidia_smi_gpu_info`; per process (with
  --collect.compute-apps, 1.9.0+) `nvidia_smi_compute_app_used_memory_bytes{pid,process_name,
  uuid[,gpu_instance_id,compute_instance_id]}`; MIG (NVML backend, 1.12.0+)
  `nvidia_smi_mig_memory_*_bytes{uuid,gpu_instance_id}` and `nvidia_smi_mig_info`.

Units: the name's suffix first (`_bytes`, `_BYTES`, `_MiB`), then the unit named in `# HELP`
("(in MiB)", "in bytes"), then the field's own definition (DCGM's legacy FB fields: MB = MiB).
A family whose unit none of them gives is not read, and the page says so. A page with GPU
series but no memory field vramdoctor knows is refused naming the fields it saw.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from vramdoctor import servers
from vramdoctor.errors import SourceUnavailable
from vramdoctor.redact import redact_argv
from vramdoctor.samples import MIB, GpuMemory, GpuSample, ProcessGpuMemory, now
from vramdoctor.sources.http import DEFAULT_TIMEOUT_S, Scraper, parse_exposition

__all__ = [
    "FIELDS",
    "ExporterField",
    "ExporterSource",
    "flavour_of",
    "page_notes",
    "parse_dcgm",
    "parse_nvidia_smi",
    "parse_nvitop",
    "unit_of",
]

Quantity = Literal["used", "free", "total", "reserved", "process_used", "process_rss"]


@dataclass(frozen=True)
class ExporterField:
    """One exporter metric vramdoctor reads: what it measures, its unit, where it was read."""

    exporter: str  # "dcgm-exporter", "nvitop-exporter", "nvidia_gpu_exporter"
    name: str
    quantity: Quantity
    unit: Literal["MiB", "bytes"]
    level: Literal["gpu", "mig", "process", "pod"]
    versions: str
    source: str


_DCGM_SRC = "NVIDIA/dcgm-exporter etc/default-counters.csv; DCGM dcgm_fields.h ('in MB')"
_DCGM49 = "dcgm-exporter 4.9.0 release notes (GPU memory in bytes, DCGM 4.7 names)"
FIELDS: tuple[ExporterField, ...] = (
    ExporterField(
        "dcgm-exporter", "DCGM_FI_DEV_FB_USED", "used", "MiB", "gpu", "<= 4.8", _DCGM_SRC
    ),
    ExporterField(
        "dcgm-exporter", "DCGM_FI_DEV_FB_FREE", "free", "MiB", "gpu", "<= 4.8", _DCGM_SRC
    ),
    ExporterField(
        "dcgm-exporter", "DCGM_FI_DEV_FB_RESERVED", "reserved", "MiB", "gpu", "4.3-4.8", _DCGM_SRC
    ),
    ExporterField(
        "dcgm-exporter", "DCGM_FI_DEV_FB_TOTAL", "total", "MiB", "gpu", "custom counters", _DCGM_SRC
    ),
    ExporterField(
        "dcgm-exporter", "DCGM_FI_DEV_FB_CAPACITY_BYTES", "total", "bytes", "gpu", ">= 4.9", _DCGM49
    ),
    ExporterField(
        "dcgm-exporter",
        "DCGM_FI_DEV_FB_USED_BYTES",
        "used",
        "bytes",
        "gpu",
        ">= 4.9 (name inferred: read by pattern)",
        _DCGM49,
    ),
    ExporterField(
        "dcgm-exporter",
        "DCGM_FI_DEV_FB_FREE_BYTES",
        "free",
        "bytes",
        "gpu",
        ">= 4.9 (name inferred: read by pattern)",
        _DCGM49,
    ),
    ExporterField(
        "nvitop-exporter",
        "gpu_memory_total_MiB",
        "total",
        "MiB",
        "gpu",
        "1.x",
        "nvitop-exporter/exporter.py",
    ),
    ExporterField(
        "nvitop-exporter", "gpu_memory_used_MiB", "used", "MiB", "gpu", "1.x", "exporter.py"
    ),
    ExporterField(
        "nvitop-exporter", "gpu_memory_free_MiB", "free", "MiB", "gpu", "1.x", "exporter.py"
    ),
    ExporterField(
        "nvitop-exporter",
        "process_gpu_memory_MiB",
        "process_used",
        "MiB",
        "process",
        "1.x",
        "exporter.py",
    ),
    ExporterField(
        "nvitop-exporter",
        "process_rss_memory_MiB",
        "process_rss",
        "MiB",
        "process",
        "1.x",
        "exporter.py",
    ),
    *(
        ExporterField(
            "nvidia_gpu_exporter",
            f"nvidia_smi_memory_{q}_bytes",
            q,
            "bytes",
            "gpu",
            "1.x",
            "utkuozdemir/nvidia_gpu_exporter docs/METRICS.md (HELP says [MiB]; values are bytes)",
        )
        for q in ("used", "free", "total", "reserved")
    ),
    *(
        ExporterField(
            "nvidia_gpu_exporter",
            f"nvidia_smi_mig_memory_{q}_bytes",
            q,
            "bytes",
            "mig",
            ">= 1.12 (NVML backend)",
            "nvidia_gpu_exporter internal/exporter (per GPU instance)",
        )
        for q in ("used", "free", "total", "reserved")
    ),
    ExporterField(
        "nvidia_gpu_exporter",
        "nvidia_smi_compute_app_used_memory_bytes",
        "process_used",
        "bytes",
        "process",
        ">= 1.9 (--collect.compute-apps)",
        "nvidia_gpu_exporter docs/METRICS.md",
    ),
)

# DCGM framebuffer families: DCGM_FI_DEV_FB_<PROPERTY>[_<UNIT>]; the ratio fields are not sizes.
_DCGM_FB = re.compile(r"DCGM_FI_DEV_FB_(?:MEM_)?(USED|FREE|RESERVED|TOTAL|CAPACITY)(?:_(\w+))?")
_DCGM_PROPERTY: dict[str, Quantity] = {
    "USED": "used",
    "FREE": "free",
    "RESERVED": "reserved",
    "TOTAL": "total",
    "CAPACITY": "total",
}
# DCGM's own field definitions (dcgm_fields.h, DCGM 4.6): the legacy FB fields are "in MB" (MiB).
_DCGM_LEGACY_MIB = frozenset(
    {
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_FB_TOTAL",
    }
)
_NVITOP_GPU: dict[str, Quantity] = {
    "gpu_memory_total_MiB": "total",
    "gpu_memory_total": "total",
    "gpu_memory_used_MiB": "used",
    "gpu_memory_used": "used",
    "gpu_memory_free_MiB": "free",
    "gpu_memory_free": "free",
}
_NVITOP_PROC = ("process_gpu_memory_MiB", "process_gpu_memory")
_NVITOP_INFO = "process_info_info"
_SMI_GPU = re.compile(r"nvidia_smi_memory_(used|free|total|reserved)_bytes")
_SMI_MIG = re.compile(r"nvidia_smi_mig_memory_(used|free|total|reserved)_bytes")
_SMI_PROC = "nvidia_smi_compute_app_used_memory_bytes"


def unit_of(name: str, help_text: str | None) -> tuple[float, str] | None:
    """(factor to MiB, what the unit rests on) for one family, or None when nothing says.

    The name's unit suffix wins over `# HELP`: nvidia_gpu_exporter's `..._bytes` families say
    "[MiB]" in HELP (the nvidia-smi field it echoes) but carry bytes."""
    lowered = name.lower()
    if lowered.endswith("_bytes"):
        return 1.0 / MIB, "bytes, from the name"
    if lowered.endswith("_mib"):
        return 1.0, "MiB, from the name"
    if lowered.endswith("_gib"):
        return 1024.0, "GiB, from the name"
    text = help_text or ""
    if re.search(r"\bMiB\b|\(in MB\)|\bin MB\b|\[MiB\]", text):
        return 1.0, "MiB, from # HELP"
    if re.search(r"\bin bytes\b|\(in B\)|\bbytes\b", text, re.IGNORECASE):
        return 1.0 / MIB, "bytes, from # HELP"
    if name in _DCGM_LEGACY_MIB:
        return 1.0, "MiB, from DCGM's field definition ('in MB')"
    return None


@dataclass
class _Gpu:
    index: int
    uuid: str | None = None
    name: str | None = None
    host: str | None = None
    pods: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_profile: str | None = None
    reachable_by: str = "the exporter's total minus reserved"

    def to_memory(self) -> GpuMemory | None:
        """None when total cannot be known (only `used` exported): never invent a size."""
        used, free = self.values.get("used"), self.values.get("free")
        total, reserved = self.values.get("total"), self.values.get("reserved")
        if used is None or (total is None and free is None):
            return None
        if total is None:
            total = used + free + (reserved or 0.0)  # type: ignore[operator]
        if free is None:
            free = max(total - used - (reserved or 0.0), 0.0)
        return GpuMemory(
            index=self.index,
            total_mib=total,
            used_mib=used,
            free_mib=free,
            uuid=self.uuid,
            name=self.name,
            driver_reserved_mib=reserved,
            host=self.host,
            pod=",".join(self.pods) or None,
            gpu_instance_id=self.gpu_instance_id,
            compute_instance_id=self.compute_instance_id,
            mig_profile=self.mig_profile,
            reachable_mib=total - (reserved or 0.0),
            reachable_by=self.reachable_by if reserved is not None else "the exporter's total",
        )


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else float(value)


def _int(text: str | None) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def _index(text: str | None) -> int:
    """GPU index label; MIG devices come as 'gpu:instance' from nvitop, plain ints elsewhere."""
    try:
        return int(str(text).split(":", 1)[0])
    except ValueError:
        return -1


def _host(labels: dict[str, str]) -> str | None:
    """dcgm-exporter `Hostname` (<= 4.8.2) or `hostname` (4.8.3+), nvitop `hostname`."""
    return labels.get("hostname") or labels.get("Hostname") or None


def _names(families: Iterable[Any]) -> set[str]:
    return {s.name for fam in families for s in fam.samples}


def flavour_of(families: Iterable[Any]) -> str | None:
    """'dcgm', 'nvitop', 'nvidia_smi', or None when no GPU memory series is present."""
    families = list(families)
    names = _names(families)
    if any(_DCGM_FB.fullmatch(n) for n in names):
        return "dcgm"
    if names & set(_NVITOP_GPU):
        return "nvitop"
    if any(_SMI_GPU.fullmatch(n) or _SMI_MIG.fullmatch(n) for n in names):
        return "nvidia_smi"
    return None


def _dcgm_fields(families: Iterable[Any]) -> tuple[dict[str, tuple[Quantity, float]], list[str]]:
    """family name -> (quantity, factor to MiB) for the DCGM FB families, and notes."""
    out: dict[str, tuple[Quantity, float]] = {}
    notes: list[str] = []
    for fam in families:
        for s in fam.samples:
            m = _DCGM_FB.fullmatch(s.name)
            if m is None or s.name in out or (m.group(2) or "").upper() in ("RATIO", "PERCENT"):
                continue
            unit = unit_of(s.name, getattr(fam, "documentation", None))
            if unit is None:
                notes.append(
                    f"{s.name}: no unit in its name or # HELP, and not a field vramdoctor knows: "
                    "not read"
                )
                out[s.name] = ("used", math.nan)  # a marker: skipped below
                continue
            out[s.name] = (_DCGM_PROPERTY[m.group(1)], unit[0])
    return {k: v for k, v in out.items() if not math.isnan(v[1])}, notes


def parse_dcgm(families: Iterable[Any]) -> list[GpuMemory]:
    """dcgm-exporter families -> one GpuMemory per GPU (or MIG instance) and host."""
    return _parse_dcgm(list(families))[0]


def _parse_dcgm(families: list[Any]) -> tuple[list[GpuMemory], list[str]]:
    fields_, notes = _dcgm_fields(families)
    gpus: dict[tuple[str, str, str], _Gpu] = {}
    pod_used: dict[tuple[str, str, str], float] = {}
    for fam in families:
        for s in fam.samples:
            spec = fields_.get(s.name)
            if spec is None:
                continue
            quantity, factor = spec
            labels = s.labels
            uuid = labels.get("UUID") or labels.get("uuid")
            mig = labels.get("GPU_I_ID", "")
            host = _host(labels)
            key = (host or "", uuid or labels.get("gpu", "?"), mig)
            gpu = gpus.get(key)
            if gpu is None:
                name = labels.get("modelName") or None
                profile = labels.get("GPU_I_PROFILE") or None
                if mig and name:
                    name = f"{name} MIG {profile or ''} #{mig}".replace("  ", " ")
                gpu = gpus[key] = _Gpu(
                    index=_index(labels.get("gpu")),
                    uuid=uuid,
                    name=name,
                    host=host,
                    gpu_instance_id=_int(mig) if mig else None,
                    mig_profile=profile if mig else None,
                    reachable_by="dcgm-exporter FB total minus reserved",
                )
            pod = labels.get("pod")
            if pod and pod not in gpu.pods:
                gpu.pods.append(pod)
            value = _finite(s.value)
            if value is None:
                continue
            if labels.get("pod_uid") and quantity == "used":
                # --kubernetes-virtual-gpus: one row per pod sharing the GPU, next to the
                # device row; the device's own row is what the GPU holds.
                pod_used[key] = pod_used.get(key, 0.0) + value * factor
                continue
            gpu.values[quantity] = value * factor
    for key, used in pod_used.items():
        if "used" not in gpus[key].values:
            gpus[key].values["used"] = used
            notes.append(
                f"GPU {gpus[key].index}: no device-level DCGM_FI_DEV_FB_USED row, only per-pod rows "
                "(--kubernetes-virtual-gpus): their sum is taken as the GPU's used memory"
            )
    return _sorted([g.to_memory() for g in gpus.values()]), notes


def _sorted(mems: list[GpuMemory | None]) -> list[GpuMemory]:
    out = [m for m in mems if m is not None]
    out.sort(key=lambda m: (m.host or "", m.index, m.gpu_instance_id or -1, m.uuid or ""))
    return out


def _nvitop_mig(index: str | None) -> int | None:
    """nvitop's MIG index 'gpu:mig' -> the MIG device's position in its GPU (not a GI id)."""
    if index and ":" in index:
        return _int(index.split(":", 1)[1])
    return None


def parse_nvitop(families: Iterable[Any]) -> tuple[list[GpuMemory], list[ProcessGpuMemory]]:
    """nvitop-exporter families -> GPUs (MIG devices as their own rows) and processes."""
    gpus: dict[tuple[str, str], _Gpu] = {}
    commands: dict[tuple[str, str, str], str] = {}
    proc_rows: list[tuple[dict[str, str], float | None]] = []
    for fam in families:
        for s in fam.samples:
            labels = s.labels
            host = labels.get("hostname") or ""
            if s.name in _NVITOP_GPU:
                key = (host, labels.get("uuid") or labels.get("index", "?"))
                gpu = gpus.get(key)
                if gpu is None:
                    gpu = gpus[key] = _Gpu(
                        index=_index(labels.get("index")),
                        uuid=labels.get("uuid") or None,
                        name=labels.get("devicename") or None,
                        host=host or None,
                        gpu_instance_id=_nvitop_mig(labels.get("index")),
                        reachable_by="nvitop-exporter total",
                    )
                value = _finite(s.value)
                if value is not None:
                    gpu.values[_NVITOP_GPU[s.name]] = value
            elif s.name in _NVITOP_PROC:
                proc_rows.append((labels, _finite(s.value)))
            elif s.name == _NVITOP_INFO and labels.get("command"):
                commands[(host, labels.get("uuid", ""), labels.get("pid", ""))] = labels["command"]
    procs: list[ProcessGpuMemory] = []
    for labels, used in proc_rows:
        host = labels.get("hostname") or ""
        pid = _int(labels.get("pid", ""))
        if pid is None:
            continue
        command = commands.get((host, labels.get("uuid", ""), labels.get("pid", "")))
        cmdline = _split_command(command)
        name = cmdline[0].rsplit("/", 1)[-1] if cmdline else None
        title = servers.title_of(name, cmdline)
        procs.append(
            ProcessGpuMemory(
                pid=pid,
                gpu=_index(labels.get("index")),
                used_mib=used,
                name=name,
                cmdline=cmdline,
                kind="compute",
                visible=True,
                host=host or None,
                username=labels.get("username") or None,
                title_role=title.role if title else None,
                gpu_instance_id=_nvitop_mig(labels.get("index")),
            )
        )
    procs.sort(key=lambda p: (p.host or "", p.gpu, p.pid))
    return _sorted([g.to_memory() for g in gpus.values()]), procs


def parse_nvidia_smi(families: Iterable[Any]) -> tuple[list[GpuMemory], list[ProcessGpuMemory]]:
    """nvidia_gpu_exporter families -> GPUs (MIG instances as their own rows) and processes."""
    families = list(families)
    info: dict[str, dict[str, str]] = {}
    mig_info: dict[tuple[str, str], dict[str, str]] = {}
    for fam in families:
        for s in fam.samples:
            if s.name == "nvidia_smi_gpu_info" and s.labels.get("uuid"):
                info[s.labels["uuid"]] = dict(s.labels)
            elif s.name == "nvidia_smi_mig_info" and s.labels.get("uuid"):
                mig_info[(s.labels["uuid"], s.labels.get("gpu_instance_id", ""))] = dict(s.labels)

    def gpu_uuid(raw: str) -> str:
        return raw if raw.upper().startswith(("GPU-", "MIG-")) else f"GPU-{raw}"

    gpus: dict[tuple[str, str], _Gpu] = {}
    procs: list[ProcessGpuMemory] = []
    for fam in families:
        for s in fam.samples:
            labels = s.labels
            raw = labels.get("uuid", "")
            value = _finite(s.value)
            m_gpu, m_mig = _SMI_GPU.fullmatch(s.name), _SMI_MIG.fullmatch(s.name)
            if m_gpu or m_mig:
                gi = labels.get("gpu_instance_id", "") if m_mig else ""
                gpu = gpus.get((raw, gi))
                if gpu is None:
                    meta = info.get(raw, {})
                    mig = mig_info.get((raw, gi), {})
                    name = meta.get("name") or None
                    profile = mig.get("profile") or None
                    if gi and name:
                        name = f"{name} MIG {profile or ''} #{gi}".replace("  ", " ")
                    gpu = gpus[(raw, gi)] = _Gpu(
                        index=_int(meta.get("index")) if meta.get("index") else -1,  # type: ignore[arg-type]
                        uuid=gpu_uuid(raw) if raw else None,
                        name=name,
                        gpu_instance_id=_int(gi) if gi else None,
                        mig_profile=profile,
                        reachable_by="nvidia_gpu_exporter total minus reserved",
                    )
                match = m_gpu or m_mig
                assert match is not None
                if value is not None:
                    gpu.values[match.group(1)] = value / MIB
            elif s.name == _SMI_PROC:
                pid = _int(labels.get("pid"))
                if pid is None:
                    continue
                meta = info.get(raw, {})
                name = labels.get("process_name") or None
                title = servers.title_of(name, [name] if name else None)
                gi, ci = labels.get("gpu_instance_id", ""), labels.get("compute_instance_id", "")
                procs.append(
                    ProcessGpuMemory(
                        pid=pid,
                        gpu=_int(meta.get("index")) if meta.get("index") else -1,  # type: ignore[arg-type]
                        used_mib=None if value is None else value / MIB,
                        name=name,
                        cmdline=None,
                        kind="compute",
                        visible=True,
                        title_role=title.role if title else None,
                        gpu_instance_id=_int(gi) if gi else None,
                        compute_instance_id=_int(ci) if ci else None,
                    )
                )
    # A GPU in MIG mode: its slices are the rows; the parent row (the whole board) is kept
    # only when no slice reports memory.
    mems = {key: g.to_memory() for key, g in gpus.items()}
    with_slices = {raw for (raw, gi), mem in mems.items() if gi and mem is not None}
    rows = [mem for (raw, gi), mem in mems.items() if gi or raw not in with_slices]
    procs.sort(key=lambda p: (p.gpu, p.pid))
    return _sorted(rows), procs


def page_notes(families: Iterable[Any]) -> list[str]:
    """What a page says about its memory fields that a reader should know (units not given)."""
    families = list(families)
    if flavour_of(families) == "dcgm":
        return _parse_dcgm(families)[1]
    return []


def _gpu_fields_seen(names: set[str]) -> list[str]:
    """The GPU-looking families of a page that has no memory field vramdoctor knows."""
    prefixes = ("DCGM_FI_", "DCGM_EXP_", "nvidia_smi_", "gpu_", "nvitop_", "nv_")
    return sorted(n for n in names if n.startswith(prefixes))


def _split_command(command: str | None) -> list[str] | None:
    if not command:
        return None
    try:
        parts = shlex.split(command)
    except ValueError:
        parts = command.split()
    return redact_argv(parts) or None


class ExporterSource:
    """Scrapes one or more exporter URLs (one per GPU host) into a single `GpuSample`.

    `notes` collects, once each, what the pages said that a reader should know (a family
    without a unit, per-pod rows summed)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        headers: dict[str, str] | None = None,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise SourceUnavailable("no exporter URL given")
        self._scrapers = [
            Scraper(u, what="GPU exporter", timeout=timeout, headers=headers) for u in urls
        ]
        self.name = "exporter"
        self.notes: list[str] = []
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        for s in self._scrapers:
            s.close()

    def __enter__(self) -> ExporterSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def devices(self) -> list[dict[str, Any]]:
        return [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "total_mib": g.total_mib,
                "host": g.host,
            }
            for g in self.sample().gpus
        ]

    def _texts(self) -> list[str]:
        """Every exporter's page; several hosts are scraped at once, so one slow host costs
        one deadline, not one per host. The first failure is raised."""
        if len(self._scrapers) == 1:
            return [self._scrapers[0].get_text()]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=min(len(self._scrapers), 16), thread_name_prefix="vramdoctor-exporter"
            )
        futures = [self._pool.submit(s.get_text) for s in self._scrapers]
        return [f.result() for f in futures]

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def sample(self) -> GpuSample:
        t, wall = now()
        gpus: list[GpuMemory] = []
        procs: list[ProcessGpuMemory] = []
        flavours: list[str] = []
        for scraper, text in zip(self._scrapers, self._texts(), strict=True):
            families = parse_exposition(text, what="GPU exporter", shown_url=scraper.shown_url)
            flavour = flavour_of(families)
            before = len(gpus)
            if flavour == "dcgm":
                found, notes = _parse_dcgm(families)
                gpus.extend(found)
                for note in notes:
                    self._note(f"{scraper.shown_url}: {note}")
            elif flavour == "nvitop":
                g, p = parse_nvitop(families)
                gpus.extend(g)
                procs.extend(p)
            elif flavour == "nvidia_smi":
                g, p = parse_nvidia_smi(families)
                gpus.extend(g)
                procs.extend(p)
            else:
                seen = _gpu_fields_seen(_names(families))
                if seen:
                    shown = ", ".join(seen[:12]) + (
                        f" and {len(seen) - 12} more" if len(seen) > 12 else ""
                    )
                    raise SourceUnavailable(
                        f"{scraper.shown_url} has GPU series but no memory field vramdoctor "
                        f"knows (it saw {shown}): enable the framebuffer fields "
                        "(dcgm-exporter: DCGM_FI_DEV_FB_USED and _FREE, or their DCGM 4.7 "
                        "names) in the exporter's counters file"
                    )
                raise SourceUnavailable(
                    f"{scraper.shown_url} has no GPU memory series: expected dcgm-exporter "
                    "(DCGM_FI_DEV_FB_USED), nvitop-exporter (gpu_memory_used_MiB) or "
                    "nvidia_gpu_exporter (nvidia_smi_memory_used_bytes)"
                )
            if len(gpus) == before:
                raise SourceUnavailable(
                    f"{scraper.shown_url} exports GPU memory used but not free or total: "
                    "enable DCGM_FI_DEV_FB_FREE in the exporter's counters file"
                )
            flavours.append(flavour)
        self.name = flavours[0] if len(set(flavours)) == 1 else "exporter"
        return GpuSample(t=t, wall=wall, source=self.name, gpus=gpus, processes=procs)
