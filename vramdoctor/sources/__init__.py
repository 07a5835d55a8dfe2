"""Measurement sources: the only code that touches the outside world.

NVML on this host (`nvml`), GPU exporters on another host (`exporter`), a server's /metrics
(`server_metrics`), process details (`procinfo`), all over one HTTP helper (`http`). Each
yields the sample types of `vramdoctor.model`; everything downstream is pure.
"""
