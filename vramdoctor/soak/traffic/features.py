"""Request features for `soak --vary`: shapes of traffic that differ in ONE feature each.

A `Shape` is what every request of a round looks like: images (0, 1 or 2; small 448x448 or
large 1280x960, whose long side is over 1024 px), streamed or not, aborted by the client after
its first chunks or not, `max_tokens`, a long shared prompt prefix, structured output (a JSON
schema or a regex, in the server's own request fields), `n`, a LoRA adapter. The CONTROL shape
is plain multimodal traffic (one small image, not streamed, `--max-tokens`, n = 1, the base
model). Each `Feature` is one variant shape and the shape it is compared with (its reference:
the control, or `stream` for `abort`, so that a stream leak is not blamed on the aborts):

| feature | variant shape | reference | the sentence when it leaks |
|---|---|---|---|
| images | no image (text only) | control (has one) | requests with images leak |
| image-size | one 1280x960 image | control (448x448) | only requests with images larger than 1024 px leak |
| multi-image | two images | control (one) | requests with several images leak |
| stream | streamed, read to the end | control | streamed requests leak |
| abort | streamed, closed after 2 chunks | stream | only streamed requests the client aborts leak |
| max-tokens | max_tokens = 1 | control (--max-tokens) | requests with max_tokens = 1 leak |
| prefix | a 2,600-character shared prefix | control | requests sharing a long prompt prefix leak |
| structured | JSON-schema output (server's field) | control | requests with structured output (JSON schema) leak |
| regex | regex-constrained output (server's field) | control | requests with regex-constrained output leak |
| n | n = 2 | control (n = 1) | requests with n > 1 leak |
| lora | names the LoRA adapter (server's way) | control (base model) | requests that use the LoRA adapter leak |

`parse_features("images,abort,lora:my-adapter")` -> the features (InputError for an unknown
name); `shapes_for(features)` -> the shape names a plan needs, control first; `ShapePlan` the
lazy request sequence of one shape (`plan[i]` builds request i).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

from vramdoctor.errors import InputError
from vramdoctor.servers.lifecycle_sections import RequestFeatures
from vramdoctor.soak.traffic.images import ImageSize, PromptImage, data_url, generate_images
from vramdoctor.soak.traffic.workload import ABORT_AFTER_CHUNKS, ENDPOINTS, PlannedRequest

SMALL = ImageSize(448, 448)
LARGE = ImageSize(1280, 960)  # the long side over 1024 px
_QUESTIONS = [
    "Describe this image in one sentence.",
    "What is the main colour in this image?",
    "Name one object you can see.",
    "Is this image a photograph?",
]
_TEXT = [
    "Summarise the causes of GPU memory fragmentation in two sentences.",
    "List three ways an inference server can run out of memory.",
    "Explain what a KV cache is to a new engineer.",
    "Write a haiku about idle GPUs.",
]
# A long shared prefix (2,600 characters): what a system prompt reused by every request is, and
# what a prefix cache (SGLang's radix cache, vLLM's prefix caching) would hit on.
PREFIX = (
    "You are a meticulous assistant for an operations team running large inference servers. "
    "Answer briefly, state assumptions, and never invent numbers. "
) * 18


@dataclass(frozen=True)
class Shape:
    """What every request of a round looks like (see the module doc)."""

    name: str
    images: int = 1
    large: bool = False
    stream: bool = False
    abort: bool = False
    max_tokens: int | None = None  # None: --max-tokens
    prefix: bool = False
    structured: str | None = None  # "json_schema" | "regex"
    n: int = 1
    lora: bool = False

    def describe(self) -> str:
        parts = []
        parts.append(
            "no image"
            if self.images == 0
            else f"{self.images} {'1280x960' if self.large else '448x448'} image"
            + ("s" if self.images > 1 else "")
        )
        if self.stream:
            parts.append("streamed" + (", aborted after 2 chunks" if self.abort else ""))
        if self.max_tokens is not None:
            parts.append(f"max_tokens {self.max_tokens}")
        if self.prefix:
            parts.append("long shared prefix")
        if self.structured:
            parts.append(f"{self.structured.replace('_', ' ')} output")
        if self.n > 1:
            parts.append(f"n={self.n}")
        if self.lora:
            parts.append("LoRA adapter")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "large": self.large,
            "stream": self.stream,
            "abort": self.abort,
            "max_tokens": self.max_tokens,
            "prefix": self.prefix,
            "structured": self.structured,
            "n": self.n,
            "lora": self.lora,
            "describe": self.describe(),
        }


CONTROL = Shape("control")


@dataclass(frozen=True)
class Feature:
    """One varied feature: its variant shape, the shape it is compared with, and whether the
    feature is ON in the variant (`+1`: effect = variant - reference) or in the reference
    (`-1`: images, which the control has). `says` is the verdict's sentence."""

    name: str
    shape: Shape
    reference: str
    sign: int
    says: str
    needs_images: bool = False


FEATURES: Mapping[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "images", Shape("images", images=0), "control", -1, "requests with images leak", True
        ),
        Feature(
            "image-size",
            Shape("image-size", large=True),
            "control",
            1,
            "only requests with images larger than 1024 px leak",
            True,
        ),
        Feature(
            "multi-image",
            Shape("multi-image", images=2),
            "control",
            1,
            "requests with several images leak",
            True,
        ),
        Feature("stream", Shape("stream", stream=True), "control", 1, "streamed requests leak"),
        Feature(
            "abort",
            Shape("abort", stream=True, abort=True),
            "stream",
            1,
            "only streamed requests the client aborts leak",
        ),
        Feature(
            "max-tokens",
            Shape("max-tokens", max_tokens=1),
            "control",
            1,
            "requests with max_tokens = 1 leak",
        ),
        Feature(
            "prefix",
            Shape("prefix", prefix=True),
            "control",
            1,
            "requests sharing a long prompt prefix leak",
        ),
        Feature(
            "structured",
            Shape("structured", structured="json_schema"),
            "control",
            1,
            "requests with structured output (JSON schema) leak",
        ),
        Feature(
            "regex",
            Shape("regex", structured="regex"),
            "control",
            1,
            "requests with regex-constrained output leak",
        ),
        Feature("n", Shape("n", n=2), "control", 1, "requests with n > 1 leak"),
        Feature(
            "lora",
            Shape("lora", lora=True),
            "control",
            1,
            "requests that use the LoRA adapter leak",
        ),
    )
}


@dataclass(frozen=True)
class VaryRequest:
    """What `--vary` was given: the features (in the order given) and the LoRA adapter named
    with `lora:NAME` (None: found on the server, or no lora feature)."""

    features: tuple[str, ...]
    lora_name: str | None = None


def parse_features(text: str | Sequence[str]) -> VaryRequest:
    """`"images,abort,lora:NAME"` (or a list of such parts) -> VaryRequest; `all` = every
    feature but lora and regex. InputError (one line) for an unknown or repeated name."""
    parts: list[str] = []
    for chunk in [text] if isinstance(text, str) else list(text):
        parts.extend(p.strip() for p in chunk.split(",") if p.strip())
    if not parts:
        raise InputError("--vary: give at least one feature, e.g. --vary images,stream")
    out: list[str] = []
    lora: str | None = None
    for p in parts:
        name, _, arg = p.partition(":")
        name = name.strip().lower()
        if name == "all":
            out.extend(n for n in FEATURES if n not in ("lora", "regex") and n not in out)
            continue
        if name not in FEATURES:
            raise InputError(
                f"--vary {p!r}: unknown feature; known: {', '.join(FEATURES)} (or all)"
            )
        if name == "lora" and arg:
            lora = arg.strip()
        elif arg:
            raise InputError(f"--vary {p!r}: only lora takes a value (lora:ADAPTER)")
        if name in out:
            raise InputError(f"--vary: {name} is given twice")
        out.append(name)
    return VaryRequest(tuple(out), lora)


def shapes_for(features: Sequence[str]) -> tuple[Shape, ...]:
    """The shapes a plan needs: the control, each feature's variant, and each reference shape
    not already in (abort brings stream)."""
    shapes: dict[str, Shape] = {"control": CONTROL}
    for name in features:
        f = FEATURES[name]
        if f.reference not in shapes:
            shapes[f.reference] = FEATURES[f.reference].shape
        shapes[name] = f.shape
    return tuple(shapes.values())


def check_supported(
    features: Sequence[str],
    request_features: RequestFeatures,
    *,
    server: str,
    text_only: bool,
    api: str,
    lora_name: str | None,
) -> None:
    """InputError (one line, before anything is sent) for a feature this server or these
    options cannot vary."""
    if api != "chat":
        raise InputError("--vary sends chat requests: leave --api at chat")
    for name in features:
        f = FEATURES[name]
        if f.needs_images and text_only:
            raise InputError(f"--vary {name} varies images: drop --text-only")
        if name == "structured" and request_features.json_schema is None:
            raise InputError(f"--vary structured: {server} has no JSON-schema request field")
        if name == "regex" and request_features.regex is None:
            raise InputError(
                f"--vary regex: {server} has no regex request field (vLLM: structured_outputs, "
                "SGLang: regex)"
            )
        if name == "n" and not request_features.n_choices:
            raise InputError(f"--vary n: {server} does not serve n > 1")
        if name in ("stream", "abort") and not request_features.stream:
            raise InputError(f"--vary {name}: {server} does not stream")
        if name == "lora":
            if request_features.lora_by is None:
                raise InputError(f"--vary lora: {server} has no way to name a LoRA adapter")
            if not lora_name:
                raise InputError(
                    "--vary lora: no LoRA adapter is loaded on the server; load one, or name it "
                    "with --vary lora:ADAPTER"
                )


class ShapePlan(Sequence[PlannedRequest]):
    """`n` requests of one shape, built on demand (the same requests every round of it).
    `model` is the base model's name; `lora_model` the value of `model` that names the adapter
    (vLLM: the adapter's name; SGLang: BASE:ADAPTER)."""

    def __init__(
        self,
        shape: Shape,
        n: int,
        *,
        model: str,
        max_tokens: int,
        request_features: RequestFeatures,
        lora_model: str | None = None,
        seed: int = 0,
    ) -> None:
        self.shape = shape
        self.n = n
        self.model = model
        self.max_tokens = max_tokens
        self.features = request_features
        self.lora_model = lora_model
        size = LARGE if shape.large else SMALL
        count = max(shape.images, 1) if shape.images else 0
        # Two distinct images per size (the same every round), so the second image of a
        # multi-image request is not the first one again.
        images: list[PromptImage] = generate_images([size, size], seed) if count else []
        self._urls = [data_url(img) for img in images]

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
        s = self.shape
        content: Any
        if s.images:
            parts: list[dict[str, Any]] = [
                {"type": "image_url", "image_url": {"url": self._urls[(i + k) % len(self._urls)]}}
                for k in range(s.images)
            ]
            parts.append({"type": "text", "text": _QUESTIONS[i % len(_QUESTIONS)]})
            content = parts
        else:
            content = _TEXT[i % len(_TEXT)]
        messages: list[dict[str, Any]] = []
        if s.prefix:
            messages.append({"role": "system", "content": PREFIX})
        messages.append({"role": "user", "content": content})
        body: dict[str, Any] = {
            "model": self.lora_model if s.lora and self.lora_model else self.model,
            "messages": messages,
            "max_tokens": s.max_tokens if s.max_tokens is not None else self.max_tokens,
            "temperature": 0,
        }
        if s.stream:
            body["stream"] = True
        if s.n > 1:
            body["n"] = s.n
        if s.structured == "json_schema" and self.features.json_schema is not None:
            body.update(_plain(self.features.json_schema))
        elif s.structured == "regex" and self.features.regex is not None:
            body.update(_plain(self.features.regex))
        return PlannedRequest(
            i,
            ENDPOINTS["chat"],
            body,
            s.images,
            s.stream,
            ABORT_AFTER_CHUNKS if s.abort else None,
        )


def _plain(value: Any) -> Any:
    """Mappings (MappingProxyType included) as plain dicts, for JSON."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def lora_model_name(request_features: RequestFeatures, base: str, adapter: str) -> str:
    """The `model` value that names `adapter` on this server (vLLM: the name; SGLang: BASE:NAME)."""
    if request_features.lora_by == "model_suffix":
        return f"{base}:{adapter}"
    return adapter


__all__ = [
    "CONTROL",
    "FEATURES",
    "LARGE",
    "PREFIX",
    "SMALL",
    "Feature",
    "Shape",
    "ShapePlan",
    "VaryRequest",
    "check_supported",
    "lora_model_name",
    "parse_features",
    "replace",
    "shapes_for",
]
