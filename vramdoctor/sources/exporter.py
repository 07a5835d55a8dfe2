"""GPU memory of another host, read from its dcgm-exporter or nvitop-exporter.

Both expose Prometheus text; we parse it with prometheus_client's parser into the same
`GpuSample` NVML gives, so soak and census work the same on a remote server.

- dcgm-exporter: `DCGM_FI_DEV_FB_USED` / `_FREE` (and `_RESERVED`, `_TOTAL` where enabled),
  in MiB, labels gpu, UUID (or uuid), device, modelName, Hostname, [GPU_I_PROFILE, GPU_I_ID],
  [pod, namespace, container]. Device level only: no processes. It refreshes every 30 s by
  default (`-c`), so a faster scrape repeats values.
- nvitop-exporter: `gpu_memory_{total,used,free}_MiB{hostname,index,devicename,uuid}` and
  per process `process_gpu_memory_MiB{...,pid,username}` plus `process_info_info{...,command}`.
  (prometheus_client appends the unit to the names; older builds may not, both are read.)
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vramdoctor.errors import SourceUnavailable
from vramdoctor.redact import redact_argv
from vramdoctor.samples import GpuMemory, GpuSample, ProcessGpuMemory, now
from vramdoctor.sources.http import DEFAULT_TIMEOUT_S, Scraper, parse_exposition

_DCGM_FIELDS = {
    "DCGM_FI_DEV_FB_USED": "used",
    "DCGM_FI_DEV_FB_FREE": "free",
    "DCGM_FI_DEV_FB_RESERVED": "reserved",
    "DCGM_FI_DEV_FB_TOTAL": "total",
}
_NVITOP_GPU = {
    "gpu_memory_total_MiB": "total",
    "gpu_memory_total": "total",
    "gpu_memory_used_MiB": "used",
    "gpu_memory_used": "used",
    "gpu_memory_free_MiB": "free",
    "gpu_memory_free": "free",
}
_NVITOP_PROC = ("process_gpu_memory_MiB", "process_gpu_memory")
_NVITOP_INFO = "process_info_info"


@dataclass
class _Gpu:
    index: int
    uuid: str | None = None
    name: str | None = None
    host: str | None = None
    pods: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)

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
        )


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else float(value)


def _index(text: str | None) -> int:
    """GPU index label; MIG devices come as 'gpu:instance' from nvitop, plain ints from DCGM."""
    try:
        return int(str(text).split(":", 1)[0])
    except ValueError:
        return -1


def flavour_of(families: Iterable[Any]) -> str | None:
    """'dcgm', 'nvitop', or None when no GPU memory series is present."""
    names = {s.name for fam in families for s in fam.samples}
    if names & set(_DCGM_FIELDS):
        return "dcgm"
    if names & set(_NVITOP_GPU):
        return "nvitop"
    return None


def parse_dcgm(families: Iterable[Any]) -> list[GpuMemory]:
    gpus: dict[tuple[str, str, str], _Gpu] = {}
    for fam in families:
        for s in fam.samples:
            field_name = _DCGM_FIELDS.get(s.name)
            if field_name is None:
                continue
            labels = s.labels
            uuid = labels.get("UUID") or labels.get("uuid")
            mig = labels.get("GPU_I_ID", "")
            host = labels.get("Hostname") or None
            key = (host or "", uuid or labels.get("gpu", "?"), mig)
            gpu = gpus.get(key)
            if gpu is None:
                name = labels.get("modelName") or None
                if mig and name:
                    name = f"{name} MIG {labels.get('GPU_I_PROFILE', '')} #{mig}".replace("  ", " ")
                gpu = gpus[key] = _Gpu(
                    index=_index(labels.get("gpu")), uuid=uuid, name=name, host=host
                )
            pod = labels.get("pod")
            if pod and pod not in gpu.pods:
                gpu.pods.append(pod)
            value = _finite(s.value)
            if value is not None:
                gpu.values[field_name] = value
    return _sorted([g.to_memory() for g in gpus.values()])


def _sorted(mems: list[GpuMemory | None]) -> list[GpuMemory]:
    out = [m for m in mems if m is not None]
    out.sort(key=lambda m: (m.host or "", m.index, m.uuid or ""))
    return out


def parse_nvitop(families: Iterable[Any]) -> tuple[list[GpuMemory], list[ProcessGpuMemory]]:
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
        try:
            pid = int(labels.get("pid", ""))
        except ValueError:
            continue
        command = commands.get((host, labels.get("uuid", ""), labels.get("pid", "")))
        cmdline = _split_command(command)
        procs.append(
            ProcessGpuMemory(
                pid=pid,
                gpu=_index(labels.get("index")),
                used_mib=used,
                name=cmdline[0].rsplit("/", 1)[-1] if cmdline else None,
                cmdline=cmdline,
                kind="compute",
                visible=True,
                host=host or None,
            )
        )
    procs.sort(key=lambda p: (p.host or "", p.gpu, p.pid))
    return _sorted([g.to_memory() for g in gpus.values()]), procs


def _split_command(command: str | None) -> list[str] | None:
    if not command:
        return None
    try:
        parts = shlex.split(command)
    except ValueError:
        parts = command.split()
    return redact_argv(parts) or None


class ExporterSource:
    """Scrapes one or more exporter URLs (one per GPU host) into a single `GpuSample`."""

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
                gpus.extend(parse_dcgm(families))
            elif flavour == "nvitop":
                g, p = parse_nvitop(families)
                gpus.extend(g)
                procs.extend(p)
            else:
                raise SourceUnavailable(
                    f"{scraper.shown_url} has no GPU memory series: expected dcgm-exporter "
                    "(DCGM_FI_DEV_FB_USED) or nvitop-exporter (gpu_memory_used_MiB)"
                )
            if len(gpus) == before:
                raise SourceUnavailable(
                    f"{scraper.shown_url} exports GPU memory used but not free or total: "
                    "enable DCGM_FI_DEV_FB_FREE in the exporter's counters file"
                )
            flavours.append(flavour)
        self.name = flavours[0] if len(set(flavours)) == 1 else "exporter"
        return GpuSample(t=t, wall=wall, source=self.name, gpus=gpus, processes=procs)
