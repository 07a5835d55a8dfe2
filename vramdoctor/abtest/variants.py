"""The variants `ab-test` compares. Pure data: what each one changes, and why it is there."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Variant:
    name: str
    title: str
    # "cuda" or "cpu": where the image processor runs.
    device: str = "cuda"
    # "none", "guarded" (vramdoctor.fixes.request_scoped_pool), "unguarded" (plain pool).
    scope: str = "none"
    empty_cache_each_request: bool = False
    # Keep a reference to the request's GPU output past the scope (a bug the guard catches).
    escape: bool = False
    env: dict[str, str] = field(default_factory=dict)
    # A mitigation a user could adopt (the escape cases only demonstrate the guard).
    mitigation: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Variant:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


VARIANTS: tuple[Variant, ...] = (
    Variant("baseline", "fast processor on the GPU (no mitigation)", mitigation=False),
    Variant("scoped_pool", "request-scoped MemPool (vramdoctor.fixes)", scope="guarded"),
    Variant(
        "empty_cache", "torch.cuda.empty_cache() after each request", empty_cache_each_request=True
    ),
    Variant(
        "expandable_segments",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    ),
    Variant("cpu", "preprocessing on CPU", device="cpu"),
    Variant(
        "escaped_unguarded",
        "scoped pool, GPU output kept past the scope, no guard",
        scope="unguarded",
        escape=True,
        mitigation=False,
    ),
    Variant(
        "escaped_guarded",
        "scoped pool, GPU output kept past the scope, vramdoctor guard",
        scope="guarded",
        escape=True,
        mitigation=False,
    ),
    # The baseline again, last: variants run one after another in separate processes, and on
    # an H200 the same variant's p50 moved by up to ±15% between runs. The two baselines'
    # p50s measure that drift in every run, so small overheads are read against it.
    Variant(
        "baseline_again", "the baseline again, last (measures latency drift)", mitigation=False
    ),
)

BY_NAME = {v.name: v for v in VARIANTS}


def select(names: list[str] | None) -> list[Variant]:
    """The variants to run, in the canonical order; the baseline always runs first and last."""
    from vramdoctor.errors import InputError

    if not names:
        return list(VARIANTS)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise InputError(
            f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}"
        )
    wanted = set(names) | {"baseline", "baseline_again"}
    return [v for v in VARIANTS if v.name in wanted]
