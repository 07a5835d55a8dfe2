"""One completion request as the server sees it: what it asks for, read once from the body.

Fields (all from the JSON body; nothing else is trusted): `images` (decoded `data:` URLs of the
chat messages, bytes), `stream`, `max_tokens` (clamped 1..256 for the answer), `n` (choices),
`structured` (which server-native structured-output field named a constraint, e.g.
"response_format", "structured_outputs", "regex", "json_schema", "ebnf"; None when the request is
unconstrained), `lora` (the adapter the request names: vLLM's `model` equal to a loaded adapter's
name, SGLang's `lora_path`, or `model` written "base:adapter"), `prompt_chars` (characters of text
in the prompt) and `prefix_key` (a hash of the prompt's first `PREFIX_CHARS` characters when the
prompt is at least that long: the shared prefix a prefix cache would reuse).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any

# A prompt at least this long (characters) shares its head with others: a prefix-cache hit.
PREFIX_CHARS = 2048
# Request fields that constrain the output, as each server names them (read off their source:
# vLLM 0.33 protocol.py `structured_outputs`/`response_format`, removed `guided_*`; SGLang 0.5.23
# `regex`, `ebnf`, `json_schema` (completions), `response_format`).
STRUCTURED_FIELDS = (
    "structured_outputs",
    "regex",
    "json_schema",
    "ebnf",
    "guided_json",
    "guided_regex",
)


def images_in(body: dict[str, Any]) -> list[bytes]:
    """The `data:` URL images of a chat body, decoded from base64 (other URLs are skipped)."""
    out: list[bytes] = []
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                if url.startswith("data:") and "," in url:
                    out.append(base64.b64decode(url.split(",", 1)[1]))
    return out


def prompt_text(body: dict[str, Any]) -> str:
    """All text of the prompt: `prompt` (completions) or the messages' text parts, joined."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    parts: list[str] = []
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                str(p.get("text", ""))
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
    return "\n".join(parts)


def structured_field(body: dict[str, Any]) -> str | None:
    """The field that asks for constrained output, or None (a `response_format` of type
    "text" constrains nothing)."""
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") not in (None, "text"):
        return "response_format"
    for name in STRUCTURED_FIELDS:
        value = body.get(name)
        if value not in (None, "", {}):
            return name
    return None


@dataclass
class Request:
    """A parsed completion request; `aborted` is set when the client left mid-stream."""

    path: str
    body: dict[str, Any]
    images: list[bytes]
    stream: bool
    max_tokens: int
    n: int
    structured: str | None
    lora: str | None
    prompt_chars: int
    prefix_key: str | None
    aborted: bool = False
    # What the image processing saw, filled in as images are decoded: (width, height) in px.
    image_sizes: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def parse(cls, path: str, body: dict[str, Any], adapters: set[str]) -> Request:
        """Read a request body; `adapters` are the names of the LoRA adapters now loaded."""
        text = prompt_text(body)
        model = body.get("model")
        lora: str | None = None
        lora_path = body.get("lora_path")
        if isinstance(lora_path, str) and lora_path:
            lora = lora_path
        elif isinstance(model, str) and model in adapters:
            lora = model
        elif isinstance(model, str) and ":" in model and model.split(":", 1)[1] in adapters:
            lora = model.split(":", 1)[1]
        try:
            n = max(1, int(body.get("n") or 1))
        except (TypeError, ValueError):
            n = 1
        prefix = (
            hashlib.sha1(text[:PREFIX_CHARS].encode()).hexdigest()
            if len(text) >= PREFIX_CHARS
            else None
        )
        return cls(
            path=path,
            body=body,
            images=images_in(body),
            stream=bool(body.get("stream")),
            max_tokens=max(1, min(int(body.get("max_tokens") or 16), 256)),
            n=n,
            structured=structured_field(body),
            lora=lora,
            prompt_chars=len(text),
            prefix_key=prefix,
        )
