"""Pure analysis over recorded samples: no I/O, no clocks, no printing."""

# A namespace of modules: import what you need from them (e.g. vramdoctor.sources.nvml).
__all__: list[str] = []
