"""The reference server as a package: a small OpenAI-compatible server whose memory does what
`--mode` says (one module per mode under `refserver.modes`), the target vramdoctor's own tests
run soak against. Entry point: examples/reference_server/server.py (`refserver.cli.main`).

- `refserver.state`: the shared state (metrics, KV accounting, the per-request pipeline).
- `refserver.routes`: the HTTP routes (OpenAI completions, /metrics, /reference/info, ...).
- `refserver.request`: one request's features, parsed once.
- `refserver.malloc`: glibc tuning and its own counters (mallinfo2) for the truth.
- `refserver.modes`: the registry of modes; each mode's docstring states its TRUTH.
"""
