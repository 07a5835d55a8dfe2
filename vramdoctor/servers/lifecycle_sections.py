"""The `lifecycle` and `request_features` sections of `ServerKind` (COMMON_CONTRACTS §1, owner:
soak --cycle / --vary).

`Lifecycle`: the server's own memory lifecycle operations, each as the pair of HTTP calls that
make one cycle (`CycleOperation`: `do` then `undo`: sleep then wake up; release then resume
memory occupation; load then unload a LoRA adapter), the switch the server needs for the routes
to exist or to free anything (`gate`, `needs`), and where that was read. `RequestFeatures`: the
server's own request fields for what `soak --vary` varies: structured output (JSON schema and
regex, each as the body fields to add), how a request names a LoRA adapter, and whether `n` > 1
and streaming are served.

Endpoint bodies and queries are templates: "{name}" and "{path}" (a LoRA adapter's name and
path), "{level}" (a sleep level) are filled in by `Endpoint.render`. Everything was read from the
released wheels (vllm 0.33.0 with 0.13-0.31 for history, sglang 0.5.23 with 0.5.9 for history,
transformers 5.24; /work/research/servers/NOTES.md); `source` names the file. Pure data: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

__all__ = [
    "NO_FEATURES",
    "CycleOperation",
    "Endpoint",
    "Lifecycle",
    "RequestFeatures",
]

Operation = Literal["sleep", "release", "lora"]


def _fill(value: Any, params: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for k, v in params.items():
            value = value.replace("{" + k + "}", v)
        return value
    if isinstance(value, Mapping):
        return {k: _fill(v, params) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_fill(v, params) for v in value]
    return value


@dataclass(frozen=True)
class Endpoint:
    """One HTTP call. `query` pairs (a name may repeat: `tags=weights&tags=kv_cache`), `body`
    the JSON body (None: no body), `ok` the statuses that mean done, `success_key` a JSON key
    that must be true in the answer as well (SGLang's LoRA answers carry `success`)."""

    method: Literal["GET", "POST"]
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: Mapping[str, Any] | None = None
    ok: tuple[int, ...] = (200,)
    success_key: str | None = None

    def render(self, **params: str) -> tuple[str, list[tuple[str, str]], Any]:
        """(path, query pairs, JSON body or None) with the templates filled in."""
        query = [(k, _fill(v, params)) for k, v in self.query]
        body = None if self.body is None else _fill(dict(self.body), params)
        return self.path, query, body

    def describe(self, **params: str) -> str:
        path, query, body = self.render(**params)
        q = "&".join(f"{k}={v}" for k, v in query)
        text = f"{self.method} {path}" + (f"?{q}" if q else "")
        if body is not None:
            import json

            text += " " + json.dumps(body, separators=(",", ":"))
        return text


@dataclass(frozen=True)
class CycleOperation:
    """One lifecycle operation as a cycle: `do`, then `undo` (the server is back to serving).
    `check` reads the state between (None: nothing to read). `gate`: the environment or flag
    without which the routes answer 404 (said when they do); `needs`: the start-up flag without
    which the cycle frees nothing; `residue_expected`: what a healthy server keeps after a cycle
    (e.g. vLLM's LoRA LRU); `source`: where it was read."""

    operation: Operation
    display: str
    do: Endpoint
    undo: Endpoint
    check: Endpoint | None = None
    gate: str | None = None
    needs: str | None = None
    residue_expected: str | None = None
    source: str = ""


@dataclass(frozen=True)
class Lifecycle:
    """The server's lifecycle operations (None: the server has none)."""

    sleep: CycleOperation | None = None
    release: CycleOperation | None = None
    lora: CycleOperation | None = None

    def get(self, operation: str) -> CycleOperation | None:
        return {"sleep": self.sleep, "release": self.release, "lora": self.lora}.get(operation)

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in ("sleep", "release", "lora") if self.get(n) is not None)


@dataclass(frozen=True)
class RequestFeatures:
    """The server's own request fields for the features soak --vary varies.

    `json_schema` / `regex`: the body fields that constrain the output (None: the server has no
    such field, or ignores it: the feature cannot be varied there); `lora_by`: how a request
    names an adapter ("model": `model` = the adapter's name, vLLM; "model_suffix": `model` =
    "BASE:ADAPTER", SGLang; None: no LoRA); `n_choices` / `stream`: whether n > 1 and streaming
    are served (transformers serve ignores n); `source`: where it was read."""

    json_schema: Mapping[str, Any] | None = None
    regex: Mapping[str, Any] | None = None
    lora_by: Literal["model", "model_suffix"] | None = None
    n_choices: bool = True
    stream: bool = True
    source: str = ""


# The schema and pattern soak sends when it varies structured output: small, always satisfiable.
SCHEMA: Mapping[str, Any] = MappingProxyType(
    {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
    }
)
REGEX = "[a-z ]{1,40}"
RESPONSE_FORMAT_SCHEMA: Mapping[str, Any] = MappingProxyType(
    {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": dict(SCHEMA), "strict": True},
        }
    }
)

NO_FEATURES = RequestFeatures(
    json_schema=RESPONSE_FORMAT_SCHEMA,
    regex=None,
    lora_by=None,
    source="OpenAI chat completions: response_format json_schema",
)


def lifecycle_field() -> Lifecycle:
    return Lifecycle()


def features_field() -> RequestFeatures:
    return NO_FEATURES


# --- the kinds' sections (used by vllm.py, sglang.py, openai.py) ---------------------------------

VLLM_LIFECYCLE = Lifecycle(
    sleep=CycleOperation(
        operation="sleep",
        display="sleep at level {level} and wake up",
        do=Endpoint("POST", "/sleep", query=(("level", "{level}"),)),
        undo=Endpoint("POST", "/wake_up"),
        check=Endpoint("GET", "/is_sleeping"),
        gate="VLLM_SERVER_DEV_MODE=1 (the sleep routes exist only in dev mode)",
        needs="--enable-sleep-mode (without it a sleep frees nothing)",
        source="vllm==0.33.0:vllm/entrypoints/serve/dev/sleep/api_router.py",
    ),
    lora=CycleOperation(
        operation="lora",
        display="load and unload the LoRA adapter {name}",
        do=Endpoint(
            "POST", "/v1/load_lora_adapter", body={"lora_name": "{name}", "lora_path": "{path}"}
        ),
        undo=Endpoint("POST", "/v1/unload_lora_adapter", body={"lora_name": "{name}"}),
        gate="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (the LoRA routes exist only then)",
        needs="--enable-lora",
        residue_expected="vLLM's unload drops the name only: the weights stay in its LRU of "
        "--max-cpu-loras adapters (one rise, then flat: caching)",
        source="vllm==0.33.0:vllm/entrypoints/serve/lora/api_router.py",
    ),
)

VLLM_FEATURES = RequestFeatures(
    json_schema=RESPONSE_FORMAT_SCHEMA,
    regex=MappingProxyType({"structured_outputs": {"regex": REGEX}}),
    lora_by="model",
    source="vllm==0.33.0:vllm/entrypoints/openai/chat_completion/protocol.py "
    "(response_format, structured_outputs; guided_* removed in 0.12 and ignored)",
)

SGLANG_LIFECYCLE = Lifecycle(
    release=CycleOperation(
        operation="release",
        display="release and resume memory occupation",
        do=Endpoint("POST", "/release_memory_occupation", body={"tags": None}),
        undo=Endpoint("POST", "/resume_memory_occupation", body={"tags": None}),
        needs="--enable-memory-saver (without it a release frees nothing)",
        source="sglang==0.5.23:sglang/srt/entrypoints/http_server.py",
    ),
    lora=CycleOperation(
        operation="lora",
        display="load and unload the LoRA adapter {name}",
        do=Endpoint(
            "POST",
            "/load_lora_adapter",
            body={"lora_name": "{name}", "lora_path": "{path}"},
            success_key="success",
        ),
        undo=Endpoint(
            "POST", "/unload_lora_adapter", body={"lora_name": "{name}"}, success_key="success"
        ),
        needs="--enable-lora (or --lora-paths)",
        source="sglang==0.5.23:sglang/srt/entrypoints/http_server.py, managers/io_struct.py",
    ),
)

SGLANG_FEATURES = RequestFeatures(
    json_schema=RESPONSE_FORMAT_SCHEMA,
    regex=MappingProxyType({"regex": REGEX}),
    lora_by="model_suffix",
    source="sglang==0.5.23:sglang/srt/entrypoints/openai/protocol.py (response_format, regex, "
    "ebnf on chat; json_schema only on /v1/completions; model 'base:adapter' or lora_path)",
)

OPENAI_FEATURES = RequestFeatures(
    json_schema=RESPONSE_FORMAT_SCHEMA,
    regex=None,
    lora_by=None,
    n_choices=True,
    source="OpenAI chat completions (transformers serve 5.24 ignores response_format and n, "
    "and answers 422 to fields it does not know)",
)
