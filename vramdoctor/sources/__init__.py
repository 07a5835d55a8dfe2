"""Measurement sources: the only code that touches the outside world.

NVML on this host (`nvml`), GPU exporters on another host (`exporter`), a server's /metrics
(`server_metrics`), process details (`procinfo`), all over one HTTP helper (`http`). Each
yields the sample types of `vramdoctor.samples`; everything downstream is pure.
"""

# A namespace of modules: import what you need from them (e.g. vramdoctor.sources.nvml).
__all__: list[str] = []
