"""Any OpenAI-compatible server (the fallback kind): identified by `GET /v1/models` alone.

`transformers serve` (transformers 5.x) is one: chat completions with images, no /metrics (404);
its `/v1/models` lists the Hugging Face cache and answers 500 when no cache directory exists
(a local model path on a fresh host), an empty list when the cache is empty (facts.md).
No metrics, no process titles of its own: its process keeps its command line.
"""

from __future__ import annotations

import re

from vramdoctor.servers.base import Identity, ProcessTitle, ServerKind
from vramdoctor.servers.lifecycle_sections import OPENAI_FEATURES
from vramdoctor.servers.presets import TRANSFORMERS_PRESETS

TITLES = (
    ProcessTitle(
        re.compile(r"transformers serve\b|transformers[./]commands[./]serving"),
        "transformers serve",
        "engine",
        "model",
    ),
)

KIND = ServerKind(
    name="openai",
    display_name="an OpenAI-compatible server",
    identity=Identity(titles=TITLES, fallback=True),
    presets=TRANSFORMERS_PRESETS,
    request_features=OPENAI_FEATURES,
)
