"""The sample types every source produces and every analysis reads.

One vocabulary for all sources: NVML on this host and a dcgm-exporter/nvitop-exporter on
another host both yield a `GpuSample`; a server's /metrics yields a `MetricsSample`; host
memory of the server's processes yields a `HostSample`. Each carries a monotonic timestamp
(for intervals and rates) and a wall-clock one (for humans and cross-host alignment).

Sizes are MiB as floats: NVML reports bytes, DCGM reports MiB, and reports print MiB.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

MIB = 1024 * 1024


# Request outcomes (soak traffic) that mean the server received the request: it may hold memory
# for failed requests too, so leak rates are per request that reached it, not per success.
REACHED_SERVER = frozenset({"ok", "http_error", "timeout"})


def now() -> tuple[float, float]:
    """(monotonic, wall) timestamps taken together."""
    return time.monotonic(), time.time()


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


class _Record:
    """A run-file record: its `kind` tag and its fields; nested types override from_dict."""

    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        return _from_dict(cls, data)


@dataclass
class GpuMemory:
    """One GPU's device-level memory at one instant."""

    index: int
    total_mib: float
    used_mib: float
    free_mib: float
    uuid: str | None = None
    name: str | None = None
    # NVML v2 memory info: memory the driver reserves (not usable by processes).
    reserved_mib: float | None = None
    host: str | None = None
    pod: str | None = None


@dataclass
class ProcessGpuMemory:
    """One process's memory on one GPU, as the driver charges it (context included)."""

    pid: int
    gpu: int
    used_mib: float | None
    name: str | None = None
    cmdline: list[str] | None = None
    # "compute" or "graphics" (the NVML process list it came from).
    kind: str = "compute"
    # False when the PID NVML reports does not exist in our PID namespace (containers):
    # the row is kept, but name and command line cannot be read here.
    visible: bool = True
    host: str | None = None


@dataclass
class GpuSample(_Record):
    """All GPUs and their processes at one instant, from one source."""

    kind: ClassVar[str] = "gpu"
    t: float
    wall: float
    source: str
    gpus: list[GpuMemory] = field(default_factory=list)
    processes: list[ProcessGpuMemory] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSample:
        return cls(
            t=data["t"],
            wall=data["wall"],
            source=data.get("source", "nvml"),
            gpus=[_from_dict(GpuMemory, g) for g in data.get("gpus", [])],
            processes=[_from_dict(ProcessGpuMemory, p) for p in data.get("processes", [])],
        )


@dataclass
class MetricsSample(_Record):
    """A server's /metrics at one instant.

    `values` holds the series that matter for memory under stable names (see
    `vramdoctor.sources.server_metrics`), aggregated over label sets; `raw` keeps every
    series scraped, unknown ones included, as "name{labels}" -> value.
    """

    kind: ClassVar[str] = "metrics"
    t: float
    wall: float
    flavour: str | None
    values: dict[str, float] = field(default_factory=dict)
    raw: dict[str, float] = field(default_factory=dict)



@dataclass
class HostProcessMemory:
    pid: int
    rss_mib: float
    name: str | None = None
    role: str | None = None


@dataclass
class HostSample(_Record):
    """Host RAM (RSS) of the server's processes: a host-RAM leak is not a VRAM leak."""

    kind: ClassVar[str] = "host"
    t: float
    wall: float
    processes: list[HostProcessMemory] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostSample:
        return cls(
            t=data["t"],
            wall=data["wall"],
            processes=[_from_dict(HostProcessMemory, p) for p in data.get("processes", [])],
        )


@dataclass
class Event(_Record):
    """A protocol mark (round start/end, idle window, request outcome, error, note)."""

    kind: ClassVar[str] = "event"
    t: float
    wall: float
    name: str
    data: dict[str, Any] = field(default_factory=dict)



SAMPLE_TYPES: dict[str, Any] = {
    cls.kind: cls for cls in (GpuSample, MetricsSample, HostSample, Event)
}
