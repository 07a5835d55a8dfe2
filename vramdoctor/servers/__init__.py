"""The server registry: one module per kind of inference server, everything else asks here.

    from vramdoctor import servers
    servers.kinds()            # (ServerKind, ...) in identification order; the fallback last
    servers.get("vllm")        # KeyError for an unknown name
    servers.register(kind)     # a plugin or a test adds a kind (before the fallback)
    servers.unregister("toy")  # and takes it away again

A kind (`vramdoctor.servers.base.ServerKind`) is data: `kind.identity` (probes, /metrics
prefixes, process titles, /dev/shm families), `kind.metrics` (metric names with units, KV
pools, running/queued, request counters, bounded caches, sleep state), and the sections other
parts add. Built-in kinds: `sglang`, `vllm`, `tgi`, `trtllm`, `llamacpp`, `ollama`, `lmdeploy`
(the last five read by diagnose from their logs: process titles, `levers`, `log_marks`; no probe or
/metrics vote yet), and `openai` (any OpenAI-compatible server, e.g. `transformers serve`: the
fallback, identified by /v1/models alone).

Lookups across kinds:

- `kind_of_metrics(names)`: the kind whose /metrics prefix the most series carry (None: none);
- `title_of(name, cmdline)`: `ProcessName(kind, title, role)` for a process, from the titles
  the servers set (`VLLM::EngineCore_DP0` -> "vllm engine core DP0") or their command lines;
- `shm_family(filename)`: `(kind, ShmFamily)` for a /dev/shm file a server creates;
- `metric_names()`: every server metric name vramdoctor reads (docs, fleet's rules check).

For consumers switching over (watch, fleet, diagnose, soak): read names from
`servers.get(k).metrics` rather than writing them; `Metrics.request_counters`,
`.running_requests`, `.queued_requests`, `.kv_pools[i].used/.usage_ratio/.capacity`,
`.series_named("kv_usage_ratio").names`, `.bounded_caches`, `.sleep`. Adding a kind is one module
here plus its name in `_BUILTIN`; adding a section is one field with a default in `base.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vramdoctor.servers import llamacpp, lmdeploy, ollama, openai, sglang, tgi, trtllm, vllm
from vramdoctor.servers.base import ProcessTitle, ServerKind, ShmFamily

__all__ = [
    "ProcessName",
    "ProcessTitle",
    "ServerKind",
    "ShmFamily",
    "display_name",
    "get",
    "kind_of_metrics",
    "kinds",
    "metric_names",
    "register",
    "shm_family",
    "title_of",
    "unregister",
]

# The built-in kinds, in identification order (the fallback last).
_BUILTIN: tuple[ServerKind, ...] = (
    sglang.KIND,
    vllm.KIND,
    # identified from their logs by diagnose (no probe or /metrics vote yet)
    tgi.KIND,
    trtllm.KIND,
    llamacpp.KIND,
    ollama.KIND,
    lmdeploy.KIND,
    openai.KIND,
)

_lock = threading.Lock()
_kinds: list[ServerKind] = list(_BUILTIN)


def kinds() -> tuple[ServerKind, ...]:
    """The registered kinds, in identification order: specific kinds first, fallbacks last."""
    with _lock:
        return tuple(_kinds)


def get(name: str) -> ServerKind:
    """The kind called `name` ("sglang", "vllm", "openai", or a registered one). KeyError if none."""
    for kind in kinds():
        if kind.name == name:
            return kind
    raise KeyError(f"no server kind {name!r}: known are {', '.join(k.name for k in kinds())}")


def register(kind: ServerKind, *, replace: bool = False) -> None:
    """Add a kind, identified before the fallback kinds. ValueError when the name is taken
    (unless `replace`, which puts the new kind where the old one was)."""
    if not isinstance(kind, ServerKind):
        raise TypeError(f"register() takes a ServerKind, not {type(kind).__name__}")
    with _lock:
        for i, old in enumerate(_kinds):
            if old.name == kind.name:
                if not replace:
                    raise ValueError(f"a server kind named {kind.name!r} is registered already")
                _kinds[i] = kind
                return
        if kind.identity.fallback:
            _kinds.append(kind)
            return
        at = next((i for i, k in enumerate(_kinds) if k.identity.fallback), len(_kinds))
        _kinds.insert(at, kind)


def unregister(name: str) -> None:
    """Remove a registered kind (KeyError if there is none). A built-in kind removed this way
    comes back only with `register`."""
    with _lock:
        for i, kind in enumerate(_kinds):
            if kind.name == name:
                del _kinds[i]
                return
    raise KeyError(f"no server kind {name!r}")


def display_name(name: str | None) -> str:
    """ "SGLang" for "sglang"; an unknown or missing name reads as the fallback's name."""
    for kind in kinds():
        if kind.name == name:
            return kind.display_name
    return next((k.display_name for k in kinds() if k.identity.fallback), "a server")


def kind_of_metrics(names: Iterable[str]) -> ServerKind | None:
    """The kind whose /metrics prefix the most of `names` carry; None when none does.
    A tie goes to the kind registered first."""
    registered = [k for k in kinds() if k.identity.metric_prefixes]
    counts = [0] * len(registered)
    for name in names:
        for i, kind in enumerate(registered):
            if name.startswith(kind.identity.metric_prefixes):
                counts[i] += 1
                break
    if not counts or max(counts) == 0:
        return None
    return registered[counts.index(max(counts))]


@dataclass(frozen=True)
class ProcessName:
    """What a process is for its server: the kind, the matching title and the role it gives."""

    kind: str
    title: ProcessTitle
    role: str  # e.g. "vllm engine core DP0", "sglang scheduler TP1"


def title_of(name: str | None, cmdline: Sequence[str] | None) -> ProcessName | None:
    """The server role of a process from its title or command line (first kind that knows it)."""
    for kind in kinds():
        found = kind.title_of(name, cmdline)
        if found is not None:
            return ProcessName(kind.name, found[0], found[1])
    return None


def shm_family(filename: str) -> tuple[ServerKind, ShmFamily] | None:
    """The server kind and family of a /dev/shm file name, when a server's family matches."""
    for kind in kinds():
        family = kind.shm_family(filename)
        if family is not None:
            return kind, family
    return None


def metric_names() -> tuple[str, ...]:
    """Every server metric name any registered kind reads."""
    out: list[str] = []
    for kind in kinds():
        out += kind.metrics.names
    return tuple(dict.fromkeys(out))
