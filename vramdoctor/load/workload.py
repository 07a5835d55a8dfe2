"""The request set of one round: built once, replayed identically every round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .images import PromptImage, data_url

# Short, fixed prompts: the memory under test is the server's, not the tokens'.
_TEXT_PROMPTS = [
    "Summarise the causes of GPU memory fragmentation in two sentences.",
    "List three ways an inference server can run out of memory.",
    "Explain what a KV cache is to a new engineer.",
    "Write a haiku about idle GPUs.",
]
_IMAGE_PROMPT = "Describe this image in one sentence."

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the round: the endpoint path, the JSON body, how many images it carries."""

    index: int
    path: str
    body: dict[str, Any]
    images: int


def build_requests(
    n: int,
    *,
    model: str,
    images: list[PromptImage],
    max_tokens: int = 16,
    text_only: bool = False,
    api: str = "chat",
) -> list[PlannedRequest]:
    """n requests: with images, image prompts cycle through the images and every fourth request
    is text only (servers see mixed traffic); text-only or `api="completions"` sends text."""
    urls = [data_url(img) for img in images] if images and not text_only else []
    out: list[PlannedRequest] = []
    for i in range(n):
        text = _TEXT_PROMPTS[i % len(_TEXT_PROMPTS)]
        with_image = bool(urls) and api == "chat" and i % 4 != 3
        if api == "completions":
            body: dict[str, Any] = {"model": model, "prompt": text, "max_tokens": max_tokens,
                                    "temperature": 0}
            out.append(PlannedRequest(i, ENDPOINTS["completions"], body, 0))
            continue
        if with_image:
            url = urls[i % len(urls)]
            content: Any = [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": _IMAGE_PROMPT},
            ]
        else:
            content = text
        body = {"model": model, "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens, "temperature": 0}
        out.append(PlannedRequest(i, ENDPOINTS["chat"], body, 1 if with_image else 0))
    return out
