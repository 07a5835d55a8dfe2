"""Move a processor's outputs to CPU inside the scope, so nothing can escape the pool."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _to_cpu(value: Any) -> Any:
    if hasattr(value, "device") and hasattr(value, "to") and hasattr(value, "dtype"):
        return value.to("cpu") if getattr(value.device, "type", "cpu") != "cpu" else value
    if isinstance(value, Mapping):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def outputs_to_cpu(mapping: Any) -> Any:
    """Return `mapping` (a BatchFeature, a dict, or nested lists/tuples) with every tensor on CPU.

    The copy is synchronous, so once this returns inside `request_scoped_pool()` no GPU tensor
    of the block is needed any more. A BatchFeature comes back as a BatchFeature.
    """
    data = getattr(mapping, "data", None)
    if isinstance(data, dict) and not isinstance(mapping, dict):
        return type(mapping)(_to_cpu(data))
    if isinstance(mapping, dict) and type(mapping) is not dict:
        # BatchFeature subclasses UserDict in some versions and dict in none; keep the type.
        try:
            return type(mapping)(_to_cpu(dict(mapping)))
        except TypeError:
            return _to_cpu(dict(mapping))
    return _to_cpu(mapping)
