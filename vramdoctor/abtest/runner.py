"""Run each variant in its own worker process and stream its records to a sink.

The runner knows nothing about torch: it starts `python -m vramdoctor.abtest.worker` (or any
command speaking the same `@@VD {json}` line protocol), with the variant's environment, and
hands every record, tagged with the variant, to `sink` as it arrives, so a run file written
by the sink keeps everything measured even if a later variant crashes or the user presses
Ctrl-C.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vramdoctor.abtest.variants import Variant
from vramdoctor.abtest.wire import stream
from vramdoctor.units import format_duration

Sink = Callable[[dict[str, Any]], object]  # e.g. RunWriter.write (its return value is ignored)


@dataclass
class VariantOutcome:
    variant: str
    status: str  # "ok", "failed", "error", "timeout"
    returncode: int | None
    message: str | None = None

    @property
    def usage_error(self) -> bool:
        """The worker said the run cannot work here (no torch, no CUDA): exit code 2."""
        return self.status == "error" and self.returncode == 2


def worker_command() -> list[str]:
    return [sys.executable, "-m", "vramdoctor.abtest.worker"]


def variant_env(variant: Variant, base: dict[str, str] | None = None) -> dict[str, str]:
    """The worker's environment: ours, minus allocator settings, plus the variant's own."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.update(variant.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_one(
    variant: Variant,
    config: dict[str, Any],
    sink: Sink,
    *,
    command: Sequence[str] | None = None,
    timeout_s: float = 600.0,
) -> VariantOutcome:
    """Run one variant to completion; records go to `sink` tagged {"variant": name}."""
    cmd = [*(command or worker_command()), json.dumps({**config, "variant": variant.to_dict()})]
    errors: list[str] = []
    done = False

    def on_record(record: dict[str, Any]) -> None:
        nonlocal done
        kind = record.pop("kind", "?")
        if kind == "error":
            errors.append(str(record.get("message")))
        elif kind == "done":
            done = True
        sink({"kind": f"abtest.{kind}", "variant": variant.name, **record})

    def on_start(pid: int) -> None:
        sink(
            {
                "kind": "abtest.variant",
                "variant": variant.name,
                "event": "start",
                "pid": pid,
                "title": variant.title,
                "config": variant.to_dict(),
            }
        )

    rc, tail, timed_out = stream(
        cmd, on_record, env=variant_env(variant), timeout_s=timeout_s, on_start=on_start
    )
    error: str | None = errors[-1] if errors else None
    if done and rc == 0:
        status = "ok"
    elif timed_out and error is None:
        status, error = "timeout", f"no result within {format_duration(timeout_s)}"
    elif error is not None:
        status = "error"
    else:
        status = "failed"
        error = f"worker exited with code {rc}" + (f": {tail[-1]}" if tail else "")
    sink(
        {
            "kind": "abtest.variant",
            "variant": variant.name,
            "event": "end",
            "status": status,
            "returncode": rc,
            "message": error,
            "log_tail": tail[-10:],
        }
    )
    return VariantOutcome(variant.name, status, rc, error)


def run_variants(
    variants: Sequence[Variant],
    config: dict[str, Any],
    sink: Sink,
    *,
    command: Sequence[str] | None = None,
    timeout_s: float = 600.0,
    on_start: Callable[[Variant], None] | None = None,
) -> list[VariantOutcome]:
    """Each variant in turn, each in a fresh process. Stops early when the first one reports a
    usage error (no CUDA, no torch): every other would say the same."""
    outcomes: list[VariantOutcome] = []
    for variant in variants:
        if on_start is not None:
            on_start(variant)
        outcome = run_one(variant, config, sink, command=command, timeout_s=timeout_s)
        outcomes.append(outcome)
        if outcome.usage_error:
            break
    return outcomes
