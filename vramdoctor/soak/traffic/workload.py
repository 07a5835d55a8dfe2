"""The request set of one round: the same requests, in the same order, every round.

The plan is a lazy sequence: request i is built when it is sent (`plan[i]`), so
`--requests 100000000` costs nothing before the first request (the few image data URLs are
encoded once). Traffic shapes real leaks need (facts.md): streamed responses (`stream`), and
requests the client abandons after the first chunks (`abort_fraction`), spread evenly over
the round and the same indices every round.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from vramdoctor.soak.traffic.images import PromptImage, data_url

# Short, fixed prompts: the memory under test is the server's, not the tokens'.
_TEXT_PROMPTS = [
    "Summarise the causes of GPU memory fragmentation in two sentences.",
    "List three ways an inference server can run out of memory.",
    "Explain what a KV cache is to a new engineer.",
    "Write a haiku about idle GPUs.",
]
_IMAGE_PROMPT = "Describe this image in one sentence."

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# Streamed chunks read before an aborting client closes the connection (the first tokens).
ABORT_AFTER_CHUNKS = 2


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the round: the endpoint path, the JSON body, how many images it carries,
    whether it is streamed, and after how many streamed chunks the client closes it (None:
    read to the end)."""

    index: int
    path: str
    body: dict[str, Any]
    images: int
    stream: bool = False
    abort_after_chunks: int | None = None


def aborts(index: int, fraction: float) -> bool:
    """Whether request `index` of a round is abandoned: `fraction` of the round, evenly spread
    (Bresenham: request i aborts when floor((i+1)F + 1/2) > floor(iF + 1/2)); the same every
    round. The half step keeps F = 1/4 off the text-only fourth requests."""
    if fraction <= 0:
        return False
    return math.floor((index + 1) * fraction + 0.5 + 1e-9) > math.floor(
        index * fraction + 0.5 + 1e-9
    )


class RequestPlan(Sequence[PlannedRequest]):
    """`n` requests, built on demand. With images, image prompts cycle through the images and
    every fourth request is text only (servers see mixed traffic); `text_only` or
    `api="completions"` sends text. Aborted requests are always streamed."""

    def __init__(
        self,
        n: int,
        *,
        model: str,
        images: list[PromptImage],
        max_tokens: int = 16,
        text_only: bool = False,
        api: str = "chat",
        stream: bool = False,
        abort_fraction: float = 0.0,
        abort_after_chunks: int = ABORT_AFTER_CHUNKS,
    ) -> None:
        self.n = n
        self.model = model
        self.max_tokens = max_tokens
        self.api = api
        self.stream = stream
        self.abort_fraction = abort_fraction
        self.abort_after_chunks = abort_after_chunks
        self._urls = [data_url(img) for img in images] if images and not text_only else []

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> PlannedRequest: ...
    @overload
    def __getitem__(self, i: slice) -> list[PlannedRequest]: ...

    def __getitem__(self, i: int | slice) -> PlannedRequest | list[PlannedRequest]:
        if isinstance(i, slice):
            return [self._build(k) for k in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self._build(i)

    def __iter__(self) -> Iterator[PlannedRequest]:
        return (self._build(k) for k in range(self.n))

    def _build(self, i: int) -> PlannedRequest:
        text = _TEXT_PROMPTS[i % len(_TEXT_PROMPTS)]
        abort = aborts(i, self.abort_fraction)
        stream = self.stream or abort
        after = self.abort_after_chunks if abort else None
        extra: dict[str, Any] = {"stream": True} if stream else {}
        if self.api == "completions":
            body: dict[str, Any] = {
                "model": self.model,
                "prompt": text,
                "max_tokens": self.max_tokens,
                "temperature": 0,
                **extra,
            }
            return PlannedRequest(i, ENDPOINTS["completions"], body, 0, stream, after)
        with_image = bool(self._urls) and i % 4 != 3
        if with_image:
            content: Any = [
                {"type": "image_url", "image_url": {"url": self._urls[i % len(self._urls)]}},
                {"type": "text", "text": _IMAGE_PROMPT},
            ]
        else:
            content = text
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            **extra,
        }
        return PlannedRequest(i, ENDPOINTS["chat"], body, 1 if with_image else 0, stream, after)


def build_requests(
    n: int,
    *,
    model: str,
    images: list[PromptImage],
    max_tokens: int = 16,
    text_only: bool = False,
    api: str = "chat",
    stream: bool = False,
    abort_fraction: float = 0.0,
) -> RequestPlan:
    """The round's plan (lazy; see RequestPlan)."""
    return RequestPlan(
        n,
        model=model,
        images=images,
        max_tokens=max_tokens,
        text_only=text_only,
        api=api,
        stream=stream,
        abort_fraction=abort_fraction,
    )
