"""Two sections of `ServerKind` that `vramdoctor diagnose` reads: fix levers and log marks.

- `levers` (`Levers`): the server's own setting for each fix lever, by lever name (the shared
  vocabulary is `vramdoctor.diagnose.levers.LEVER_NAMES`: "memory_share", "prefill_chunk",
  "graph_off", ...). Each lever holds one or more `Lever` options: the text in the server's words,
  the platforms it exists on (None: all the server runs on) and the versions ([since, until)) where
  that spelling is the one to use. A lever the server does not have is absent: diagnose then names
  none, and ab-test presets can ask the same question.
- `log_marks` (`LogMarks`): byte patterns (regexes, literals scan fastest) that only this server
  prints in its logs, each with a weight (votes per occurrence) and a cap, and optionally the
  variant (a fork or wrapper) it names; `embeds` lists the kinds whose lines this server's log
  carries (Ollama's runner prints llama.cpp's).

Pure data: no I/O, no imports of diagnose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Lever:
    """One way to set a lever: `text` in the server's own words ("--mem-fraction-static",
    "kv_cache_free_gpu_mem_fraction in config.pbtxt"), on `platforms` ("cuda", "rocm", "npu"; None:
    every platform the server runs on), for versions in [`since`, `until`) when known."""

    text: str
    platforms: tuple[str, ...] | None = None
    since: str | None = None
    until: str | None = None


Levers = Mapping[str, tuple[Lever, ...]]


def lever(text: str, *platforms: str, since: str | None = None, until: str | None = None) -> Lever:
    """A `Lever` with its platforms as positional arguments (the kind modules' tables read better)."""
    return Lever(text, platforms or None, since, until)


@dataclass(frozen=True)
class LogMark:
    """A byte pattern only this server prints, and its weight (votes per occurrence, up to `cap`)."""

    pattern: bytes
    weight: int = 1
    cap: int = 20
    variant: str | None = None  # a fork or wrapper the mark names ("LoRAX", "vLLM-Ascend")


@dataclass(frozen=True)
class LogMarks:
    """A server kind's log marks."""

    marks: tuple[LogMark, ...] = ()
    embeds: tuple[str, ...] = ()  # kinds whose lines this server's log carries (Ollama: llama.cpp)


def no_levers() -> Levers:
    return {}


__all__ = ["Lever", "Levers", "LogMark", "LogMarks", "field", "lever", "no_levers"]
