"""PyTorch's allocator settings as a server process has them: read, parsed, merged, never refused.

PyTorch reads `PYTORCH_ALLOC_CONF` and, only when that is unset, the deprecated
`PYTORCH_CUDA_ALLOC_CONF` (c10/core/AllocatorConfig.cpp: "PYTORCH_CUDA_ALLOC_CONF is deprecated,
use PYTORCH_ALLOC_CONF instead"); ROCm builds also read `PYTORCH_HIP_ALLOC_CONF`. The text is
`key:value` pairs joined by `,`; a list value is bracketed (`roundup_power2_divisions:[256:1,>:4]`).

Keys differ between releases and a newer torch adds keys an older vramdoctor has never seen:
`parse` keeps every pair in order and marks the ones it does not know (`AllocConf.unknown`) but
never treats them as an error, and `merge` sets or overrides keys while keeping all the others
untouched, so writing `expandable_segments:True` for an experiment never drops a user's
`pinned_reserve_segment_size_mb`. `KNOWN_KEYS` lists the keys of torch 2.11-2.15 (strings of
libc10.so / libc10_cuda.so 2.14.1 and the newer parse code; research notes 2026-12-01).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ENV_NAMES",
    "KNOWN_KEYS",
    "AllocConf",
    "effective",
    "merge",
    "parse",
    "process_alloc_conf",
]

# In the order PyTorch looks them up (the first one set wins on CUDA builds; HIP on ROCm).
ENV_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")

# key -> where it is read (device-generic AllocatorConfig or the CUDA/HIP one) and since when.
KNOWN_KEYS: Mapping[str, str] = {
    "max_split_size_mb": "generic",
    "max_non_split_rounding_mb": "generic",
    "garbage_collection_threshold": "generic",
    "roundup_power2_divisions": "generic",
    "expandable_segments": "generic",
    "pinned_use_background_threads": "generic",
    "pinned_max_round_threshold_mb": "generic",
    "pinned_max_cached_size_mb": "generic",
    "large_segment_size_mb": "generic",
    "backend": "cuda (native | cudaMallocAsync)",
    "release_lock_on_cudamalloc": "cuda",
    "release_lock_on_hipmalloc": "hip",
    "pinned_use_cuda_host_register": "cuda",
    "pinned_use_hip_host_register": "hip",
    "pinned_num_register_threads": "cuda (power of 2, <= 128)",
    "pinned_reserve_segment_size_mb": "cuda",
    "graph_capture_record_stream_reuse": "cuda",
    "per_process_memory_fraction": "cuda ([0, 1]), 2.13+",
    "pinned_free_catch_all": "cuda, 2.13+",
    "throw_on_cudamalloc_oom": "cuda, 2.13+",
    "expandable_segments_reserve": "cuda, after 2.14.1",
    "expandable_segments_reserve_by_class": "cuda, after 2.14.1",
}


@dataclass(frozen=True)
class AllocConf:
    """A parsed allocator setting: its pairs in order, which keys vramdoctor does not know, and
    the pieces that are not `key:value` at all (kept, said, never raised)."""

    text: str
    pairs: tuple[tuple[str, str], ...] = ()
    unknown: tuple[str, ...] = ()
    malformed: tuple[str, ...] = ()
    source: str | None = None  # the environment variable it came from
    notes: tuple[str, ...] = field(default=())

    def get(self, key: str) -> str | None:
        """The value of the last pair with `key` (PyTorch applies pairs in order)."""
        for k, v in reversed(self.pairs):
            if k == key:
                return v
        return None

    @property
    def expandable_segments(self) -> bool | None:
        value = self.get("expandable_segments")
        return None if value is None else value.strip().lower() in ("true", "1")


def _split(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse(text: str | None, *, source: str | None = None) -> AllocConf:
    """Parse an allocator setting. Pure; accepts anything (None or "" is an empty setting)."""
    pairs: list[tuple[str, str]] = []
    malformed: list[str] = []
    for piece in _split(text or ""):
        key, sep, value = piece.partition(":")
        if not sep or not key.strip():
            malformed.append(piece)
            continue
        pairs.append((key.strip(), value.strip()))
    unknown = tuple(dict.fromkeys(k for k, _ in pairs if k not in KNOWN_KEYS))
    notes = []
    if unknown:
        notes.append(
            "keys vramdoctor does not know (a newer PyTorch's, kept as they are): "
            + ", ".join(unknown)
        )
    if malformed:
        notes.append("pieces that are not key:value: " + ", ".join(repr(m) for m in malformed))
    return AllocConf(
        text=text or "",
        pairs=tuple(pairs),
        unknown=unknown,
        malformed=tuple(malformed),
        source=source,
        notes=tuple(notes),
    )


def effective(environ: Mapping[str, str], *, hip: bool = False) -> AllocConf:
    """The setting PyTorch would use in a process with this environment: PYTORCH_ALLOC_CONF
    when set, else PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_HIP_ALLOC_CONF on ROCm)."""
    fallback = ENV_NAMES[2] if hip else ENV_NAMES[1]
    for name in (ENV_NAMES[0], fallback):
        value = environ.get(name)
        if not value:
            continue
        conf = parse(value, source=name)
        if name == ENV_NAMES[0] and environ.get(fallback):
            note = f"{fallback} is set too and ignored by PyTorch ({name} wins)"
            conf = AllocConf(
                conf.text, conf.pairs, conf.unknown, conf.malformed, name, (*conf.notes, note)
            )
        return conf
    return parse("", source=None)


def merge(text: str | None, overrides: Mapping[str, str]) -> str:
    """`text` with each key of `overrides` set to its value: an existing pair is replaced in
    place (its last occurrence), a new key is appended; every other pair, known or not, and
    every malformed piece is kept as written."""
    pieces = _split(text or "")
    done: set[str] = set()
    out: list[str] = []
    last: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        key = piece.partition(":")[0].strip()
        last[key] = i
    for i, piece in enumerate(pieces):
        key = piece.partition(":")[0].strip()
        if key in overrides:
            if last[key] != i:
                continue  # an earlier duplicate: the override replaces the one PyTorch applies
            out.append(f"{key}:{overrides[key]}")
            done.add(key)
        else:
            out.append(piece)
    out += [f"{k}:{v}" for k, v in overrides.items() if k not in done]
    return ",".join(out)


def process_alloc_conf(pid: int, proc: str = "/proc", *, hip: bool = False) -> AllocConf | None:
    """The allocator setting of a running process, from its environment; None where the
    environment cannot be read (another user's process, gone). Nothing else of the
    environment (which may hold secrets) leaves this function."""
    environ = _environ(pid, proc)
    return None if environ is None else effective(environ, hip=hip)


def _environ(pid: int, proc: str = "/proc") -> dict[str, str] | None:
    try:
        with open(f"{proc}/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out
