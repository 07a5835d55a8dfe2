"""The memory layers, one module each: `vram` (NVML per GPU and process), `kv` (the server's KV
pool in tokens), `host` (RSS of the server's processes by kind)."""

# A namespace of modules: import what you need from them (e.g. vramdoctor.judge.layers.kv).
__all__: list[str] = []
