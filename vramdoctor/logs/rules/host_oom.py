"""Host RAM exhausted (Ray's memory monitor killed a worker): not GPU memory."""

from __future__ import annotations

from ..model import Diagnosis, Finding
from . import Rule
from ._common import by_server, first_evidence


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("host_oom")
    if not evs:
        return []
    return [
        Finding(
            RULE.id,
            "critical",
            "Host RAM exhausted: Ray killed a worker (not a CUDA OOM)",
            explanation=(
                "ray.exceptions.OutOfMemoryError is Ray's monitor killing a task because the node's "
                "host memory ran low. GPU memory is not involved. Loading weights (each TP worker reads "
                "the checkpoint), pinned CPU swap space and /dev/shm all use host RAM."
            ),
            fix=by_server(
                d.server,
                generic
                := "Give the node/container more RAM and /dev/shm (docker --shm-size), load safetensors, or "
                "run fewer workers per node; watch host memory with `vramdoctor soak` (it samples host RSS too).",
                "Lower --swap-space (vLLM V0 pins it per GPU), give the node/container more RAM and "
                "/dev/shm (docker --shm-size), load safetensors, or run fewer workers per node; watch "
                "host memory with `vramdoctor soak` (it samples host RSS too).",
                generic,
            ),
            evidence=first_evidence(evs),
        )
    ]


RULE = Rule(
    id="host-oom",
    severity="critical",
    title="Host memory exhausted (Ray OutOfMemoryError)",
    fires_when="'ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory'",
    fix="lower --swap-space, more host RAM and /dev/shm, fewer workers per node",
    check=check,
)
