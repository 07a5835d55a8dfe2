"""leak-on-FEATURE: a leak that only requests with ONE feature have (issue #25's --vary).

Every request is served as in stable; a request that has the mode's feature also leaves
`--leak-kib` KiB (times `--leak-scale`) behind on `--leak-layer`: host (a numpy buffer, every
page written), vram (device memory: real CUDA, or the virtual GPU) or kv (`--kv-leak-tokens` of
its KV tokens never return to the pool: publish with --metrics-flavour sglang|vllm). The
features, each named as soak --vary names it, with the real mechanism it stands for:

| mode | feature | the request that leaks | stands for |
|---|---|---|---|
| leak-on-images | images | has at least one image | an encoder output kept per multimodal request |
| leak-on-large-images | image-size | has an image whose long side > 1024 px | a tiling path for large images that keeps its tiles |
| leak-on-multi-image | multi-image | has two images or more | a batch-collation buffer of multi-image prompts |
| leak-on-stream | stream | is streamed (whether read to the end or not) | an SSE chunk buffer kept per stream |
| leak-on-abort | abort | is a stream the client abandons mid-way | a disconnect path that skips the clean-up (sglang #36475) |
| leak-on-max-tokens-1 | max-tokens | asks max_tokens = 1 | a prefill-only finish path that skips freeing (vLLM #44175) |
| leak-on-prefix | prefix | shares a long prompt prefix (>= 2048 chars) | a prefix-cache hit path that copies and keeps |
| leak-on-structured | structured | constrains its output (response_format json_schema/json_object, structured_outputs, regex, json_schema, ebnf) | a compiled grammar kept per request (sglang #19410) |
| leak-on-n | n | asks n > 1 | forked sequence states of the n-1 extra choices (leaks (n-1) x) |
| leak-on-lora | lora | names a loaded LoRA adapter | an adapter activation buffer kept per request |
| leak-on-every | (none) | every request alike | a leak no feature explains |

TRUTH: a LEAK on --leak-layer, only for requests with the feature, at `leak_bytes_per_request`
per such request (`feature` names it; GET /reference/info `feature_requests` counts them);
requests without it keep nothing. leak-on-every: every request alike, no feature to name.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from refserver.modes.base import Mode, layer

if TYPE_CHECKING:
    from refserver.request import Request
    from refserver.state import State


class FeatureLeakMode(Mode):
    name = "leak-on-every"
    feature: ClassVar[str | None] = None
    when: ClassVar[str] = "every request"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--leak-layer",
            choices=["host", "vram", "kv"],
            default="host",
            help="leak-on-*: where the leak lives",
        )
        if "--kv-leak-tokens" not in parser._option_string_actions:  # kv-leaking's flag
            parser.add_argument("--kv-leak-tokens", type=int, default=200)

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.feature_requests = 0
        self.other_requests = 0

    def has(self, req: Request) -> bool:
        """Whether the request has the feature (every request for leak-on-every)."""
        return True

    def copies(self, req: Request) -> int:
        """How many leak units such a request leaves (n: n - 1)."""
        return 1

    def request_end(self, state: State, req: Request) -> None:
        hit = self.has(req)
        with state.lock:
            if hit:
                self.feature_requests += 1
            else:
                self.other_requests += 1
        if not hit or self.args.leak_layer == "kv":
            return
        nbytes = state.leak_bytes(self.args.leak_kib) * self.copies(req)
        if not nbytes:
            return
        if self.args.leak_layer == "vram":
            obj: Any = state.gpu_mem.alloc(nbytes)
        else:
            obj = np.ones(nbytes, dtype=np.uint8)  # every page written
        with state.lock:
            state.keep(obj, nbytes)
            state.m_kept.set(state.kept_bytes)

    def kv_tokens_kept(self, state: State, req: Request) -> int:
        if self.args.leak_layer != "kv" or state.release_buffers or not self.has(req):
            return 0
        return int(self.args.kv_leak_tokens * self.copies(req))

    def leak_bytes_per_request(self, state: State) -> float | None:
        if self.args.leak_layer == "kv":
            return None
        return float(state.leak_bytes(self.args.leak_kib))

    def kv_leak_tokens_per_request(self, state: State) -> int:
        return int(self.args.kv_leak_tokens) if self.args.leak_layer == "kv" else 0

    def info(self, state: State) -> dict[str, Any]:
        return {
            "feature": self.feature,
            "feature_requests": self.feature_requests,
            "other_requests": self.other_requests,
        }

    def truth(self, state: State) -> dict[str, Any]:
        where = self.args.leak_layer
        layers = {
            "vram": layer("STABLE", "requests keep nothing on the device"),
            "kv": layer("STABLE", "every request's KV tokens return to the pool"),
            "host": layer("STABLE", "requests keep nothing on the host"),
        }
        extra: dict[str, Any] = {"feature": self.feature, "when": self.when}
        if where == "kv":
            extra["tokens_per_request"] = int(self.args.kv_leak_tokens)
        else:
            extra["bytes_per_request"] = self.leak_bytes_per_request(state)
        layers[where] = layer(
            "LEAK",
            f"only requests where {self.when} leak"
            if self.feature
            else "every request leaks alike: no feature causes it",
            **extra,
        )
        return {
            "summary": f"a {where} leak of requests where {self.when}"
            if self.feature
            else f"a {where} leak of every request alike",
            "layers": layers,
        }


class ImagesLeak(FeatureLeakMode):
    name = "leak-on-images"
    feature = "images"
    when = "the request has an image"

    def has(self, req: Request) -> bool:
        return len(req.images) >= 1


class LargeImagesLeak(FeatureLeakMode):
    name = "leak-on-large-images"
    feature = "image-size"
    when = "an image's long side is larger than 1024 px"

    def has(self, req: Request) -> bool:
        return any(max(w, h) > 1024 for w, h in req.image_sizes)


class MultiImageLeak(FeatureLeakMode):
    name = "leak-on-multi-image"
    feature = "multi-image"
    when = "the request has two images or more"

    def has(self, req: Request) -> bool:
        return len(req.images) >= 2


class StreamLeak(FeatureLeakMode):
    name = "leak-on-stream"
    feature = "stream"
    when = "the request is streamed"

    def has(self, req: Request) -> bool:
        return req.stream


class AbortLeak(FeatureLeakMode):
    name = "leak-on-abort"
    feature = "abort"
    when = "the client abandons the stream"

    def has(self, req: Request) -> bool:
        return req.aborted


class MaxTokensOneLeak(FeatureLeakMode):
    name = "leak-on-max-tokens-1"
    feature = "max-tokens"
    when = "max_tokens is 1"

    def has(self, req: Request) -> bool:
        value = req.body.get("max_tokens", req.body.get("max_completion_tokens"))
        return value == 1


class PrefixLeak(FeatureLeakMode):
    name = "leak-on-prefix"
    feature = "prefix"
    when = "the prompt shares a long prefix (>= 2048 characters)"

    def has(self, req: Request) -> bool:
        return req.prefix_key is not None


class StructuredLeak(FeatureLeakMode):
    name = "leak-on-structured"
    feature = "structured"
    when = "the output is constrained (JSON schema / regex)"

    def has(self, req: Request) -> bool:
        return req.structured is not None


class NLeak(FeatureLeakMode):
    name = "leak-on-n"
    feature = "n"
    when = "the request asks n > 1 choices"

    def has(self, req: Request) -> bool:
        return req.n > 1

    def copies(self, req: Request) -> int:
        return max(1, req.n - 1)


class LoraLeak(FeatureLeakMode):
    name = "leak-on-lora"
    feature = "lora"
    when = "the request names a LoRA adapter"

    def check(self, state: State) -> None:
        if not (self.args.enable_lora or self.args.lora_modules):
            raise SystemExit("--mode leak-on-lora needs --enable-lora or --lora-modules NAME=PATH")

    def has(self, req: Request) -> bool:
        return req.lora is not None


MODES = [
    FeatureLeakMode,
    ImagesLeak,
    LargeImagesLeak,
    MultiImageLeak,
    StreamLeak,
    AbortLeak,
    MaxTokensOneLeak,
    PrefixLeak,
    StructuredLeak,
    NLeak,
    LoraLeak,
]


class FeaturesLeak(FeatureLeakMode):
    """leak-on-features: several features leak at once, each on its own layer:
    `--leak-on FEATURE:LAYER[:SIZE],...` (FEATURE as soak --vary names it; LAYER host|vram|kv;
    SIZE KiB for host/vram, tokens for kv; default --leak-kib / --kv-leak-tokens). The
    predicates are the single-feature modes' own.

    TRUTH: per layer, a LEAK of requests with that layer's feature at its size (GET
    /reference/info "feature_requests_by" counts each feature's requests)."""

    name = "leak-on-features"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--leak-on",
            default="",
            metavar="FEATURE:LAYER[:SIZE],...",
            help="leak-on-features: which feature leaks on which layer, and how much",
        )

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        by_feature = {cls.feature: cls for cls in MODES if cls.feature}
        self.parts: list[tuple[str, str, float, FeatureLeakMode]] = []
        for spec in [p for p in str(args.leak_on).split(",") if p.strip()]:
            bits = spec.strip().split(":")
            feature, where = bits[0], bits[1] if len(bits) > 1 else "host"
            if feature not in by_feature or where not in ("host", "vram", "kv"):
                raise SystemExit(f"--leak-on {spec!r}: FEATURE:host|vram|kv[:SIZE]")
            default = args.kv_leak_tokens if where == "kv" else args.leak_kib
            size = float(bits[2]) if len(bits) > 2 else float(default)
            self.parts.append((feature, where, size, by_feature[feature](args)))
        if not self.parts:
            raise SystemExit("--mode leak-on-features needs --leak-on FEATURE:LAYER[,...]")
        self.counts = {f: 0 for f, *_ in self.parts}

    def check(self, state: State) -> None:
        for _f, _w, _s, part in self.parts:
            part.check(state)

    def request_end(self, state: State, req: Request) -> None:
        for feature, where, size, part in self.parts:
            if not part.has(req):
                continue
            with state.lock:
                self.counts[feature] += 1
            if where == "kv":
                continue
            nbytes = int(state.leak_bytes(size)) * part.copies(req)
            if not nbytes:
                continue
            obj: Any = (
                state.gpu_mem.alloc(nbytes) if where == "vram" else np.ones(nbytes, dtype=np.uint8)
            )
            with state.lock:
                state.keep(obj, nbytes)
                state.m_kept.set(state.kept_bytes)

    def kv_tokens_kept(self, state: State, req: Request) -> int:
        if state.release_buffers:
            return 0
        return sum(
            int(size) * part.copies(req)
            for _f, where, size, part in self.parts
            if where == "kv" and part.has(req)
        )

    def leak_bytes_per_request(self, state: State) -> float | None:
        return None

    def info(self, state: State) -> dict[str, Any]:
        return {"feature": None, "feature_requests_by": dict(self.counts)}

    def truth(self, state: State) -> dict[str, Any]:
        layers = {
            "vram": layer("STABLE", "requests keep nothing on the device"),
            "kv": layer("STABLE", "every request's KV tokens return to the pool"),
            "host": layer("STABLE", "requests keep nothing on the host"),
        }
        for feature, where, size, part in self.parts:
            unit = (
                {"tokens_per_request": int(size)}
                if where == "kv"
                else {"bytes_per_request": size * 1024}
            )
            layers[where] = layer(
                "LEAK", f"only requests where {part.when} leak", feature=feature, **unit
            )
        return {"summary": "several features, each leaking on its own layer", "layers": layers}


MODES.append(FeaturesLeak)
