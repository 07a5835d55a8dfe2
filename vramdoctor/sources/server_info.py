"""Say what the server is before sending it anything.

The probes are the registry's (`vramdoctor.servers`): each kind, in identification order,
names the GET requests whose JSON answer identifies it, and reads its version, model and
start-up memory from them. SGLang: `GET /server_info` (and its deprecated alias
`/get_server_info`) gives "version" next to `memory_usage` (weight, kvcache, graph,
token_capacity) and the server args. vLLM: `GET /version`. Any OpenAI-compatible server (the
fallback kind): `GET /v1/models` gives the model id to send. A server that answers none of
them is not there: SourceUnavailable, one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import requests

from vramdoctor import servers
from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.redact import redact_url
from vramdoctor.sources.http import metrics_url


@dataclass
class ServerInfo:
    kind: str  # a registered kind's name: "sglang", "vllm", "openai" (the fallback), ...
    base_url: str
    version: str | None = None
    model: str | None = None
    memory_usage: dict[str, Any] | None = None
    owned_by: str | None = None
    # SGLang's --page-size (tokens per KV page) from its server info, when it says.
    page_size_tokens: int | None = None
    # What identification tolerated (e.g. /v1/models failing with --model given).
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [servers.display_name(self.kind) + (f" {self.version}" if self.version else "")]
        if self.model:
            parts.append(f"serving {self.model}")
        if self.owned_by and _is_fallback(self.kind):
            parts.append(f"({self.owned_by})")
        if self.memory_usage:
            mem = ", ".join(
                f"{k}={v}" for k, v in self.memory_usage.items() if isinstance(v, (int, float))
            )
            if mem:
                parts.append(f"startup memory: {mem}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "base_url": redact_url(self.base_url),
            "version": self.version,
            "model": self.model,
            "memory_usage": self.memory_usage,
            "owned_by": self.owned_by,
            "page_size_tokens": self.page_size_tokens,
        }


def base_url(url: str) -> str:
    """http://host:port from what the user typed (a /v1 suffix or trailing path dropped)."""
    full = metrics_url(url, default_path="/")
    if "?" in full or "#" in full:  # /v1/models etc. are appended to this: a query would break them
        raise InputError(
            f"--url {redact_url(url)}: give the server's base URL without a query string "
            "(pass a key with --api-key or OPENAI_API_KEY)"
        )
    for suffix in ("/v1/", "/v1", "/"):
        if full.endswith(suffix):
            full = full[: -len(suffix)]
            break
    return full


def _body(resp: requests.Response) -> Any:
    """The JSON of a 200 answer (None when it is not JSON), else the status code."""
    if resp.status_code != 200:
        return resp.status_code
    try:
        return resp.json()
    except ValueError:
        return None


def _get(session: requests.Session, url: str, timeout: float) -> Any:
    try:
        return _body(session.get(url, timeout=timeout))
    except requests.RequestException:
        return None


def _is_fallback(name: str) -> bool:
    try:
        return servers.get(name).identity.fallback
    except KeyError:
        return True


def identify(
    url: str,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
    *,
    model: str | None = None,
) -> ServerInfo:
    """Probe the server; raise SourceUnavailable when nothing OpenAI-like answers at url.

    With `model` (the user's --model), a failing or empty `/v1/models` is a note in
    `ServerInfo.notes`, not an error: some servers answer chat completions but not that
    (`transformers serve` with a local path answers 500 when no Hugging Face cache exists).
    Without it, the error names --model.
    """
    base = base_url(url)
    with requests.Session() as s:
        if headers:
            s.headers.update(headers)
        return _identify(s, base, timeout, model)


def _identify(
    s: requests.Session, base: str, timeout: float, model: str | None = None
) -> ServerInfo:
    shown = redact_url(base)
    try:
        models = _body(s.get(base + "/v1/models", timeout=timeout))
    except requests.exceptions.SSLError:  # a subclass of ConnectionError: the port is there
        raise SourceUnavailable(
            f"TLS handshake with {shown} failed: does the server speak plain "
            "http (try http://), or is its certificate not trusted?"
        ) from None
    except requests.ConnectionError:
        raise SourceUnavailable(
            f"no server answers at {shown}: is it running, and is the port right?"
        ) from None
    except requests.Timeout:
        if model is None:
            raise SourceUnavailable(
                f"the server at {shown} did not answer within {timeout:g} s"
            ) from None
        models = "timeout"
    except requests.RequestException as exc:
        raise InputError(f"cannot reach {shown}: {type(exc).__name__}") from None
    info = _probe(s, base, timeout)
    if models in (401, 403):
        raise SourceUnavailable(
            f"the server at {shown} refused /v1/models (HTTP {models}): pass --api-key or set OPENAI_API_KEY"
        )
    listed = isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]
    if not listed:
        what = (
            "did not answer /v1/models in time"
            if models == "timeout"
            else f"answered /v1/models with HTTP {models}"
            if isinstance(models, int)
            else "listed no model on /v1/models"
            if isinstance(models, dict)
            else "gave no JSON on /v1/models"
        )
        if model is None and info is None:
            raise SourceUnavailable(
                f"the server at {shown} answers, but not as an OpenAI-compatible server (it {what}): "
                "if it serves chat completions anyway, name the model with --model"
            )
        if info is None:
            info = ServerInfo(_fallback_name(), base)
        info.notes.append(f"the server {what}; sending model {model or info.model!r} as given")
    if info is None:
        info = ServerInfo(_fallback_name(), base)
    if listed:
        first = models["data"][0]
        if isinstance(first, dict):
            info.model = str(first.get("id") or info.model or "") or info.model
            info.owned_by = first.get("owned_by")
    return info


def _fallback_name() -> str:
    return next((k.name for k in servers.kinds() if k.identity.fallback), "openai")


def _probe(s: requests.Session, base: str, timeout: float) -> ServerInfo | None:
    """The first registered kind whose probe reads as its own answer, else None."""
    for kind in servers.kinds():
        for probe in kind.identity.probes:
            answer = probe.read(_get(s, base + probe.path, timeout))
            if answer is not None:
                return ServerInfo(
                    kind.name,
                    base,
                    version=answer.version,
                    model=answer.model,
                    memory_usage=answer.memory_usage,
                    page_size_tokens=answer.page_size_tokens,
                )
    return None
