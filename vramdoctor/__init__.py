"""vramdoctor: is it a GPU-memory leak or only caching, what causes it, does the fix work.

The library is usable without the CLI: `vramdoctor.sources` (NVML, exporters, server
metrics), `vramdoctor.record` (run files), `vramdoctor.analysis` (pure functions over runs),
`vramdoctor.logs` (diagnose), `vramdoctor.fixes` (memory fixes to import into a server).
"""

from ._version import __version__

__all__ = ["__version__"]
