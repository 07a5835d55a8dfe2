"""Ollama (ollama/ollama): its Go server and the llama.cpp runner it starts per model.

Levers: a model's options (Modelfile `PARAMETER` or the API's `options`): `num_ctx`, `num_gpu`
(layers on the GPU), `num_batch`; and the server's environment: `OLLAMA_CONTEXT_LENGTH`,
`OLLAMA_NUM_PARALLEL`, `OLLAMA_KV_CACHE_TYPE` (with `OLLAMA_FLASH_ATTENTION=1`). Log marks: Go
slog key=value lines, the older Go log format, the runner, its environment, journald's unit; the
runner's llama.cpp lines count for Ollama once Ollama's own marks are there (`embeds`) (real
excerpts: tests/fixtures/logs/wild/32-35, 47, 48).
"""

from __future__ import annotations

import re

from vramdoctor.servers.base import Identity, ProcessTitle, ServerKind
from vramdoctor.servers.diagnose_sections import Levers, LogMark, LogMarks, lever

TITLES = (
    ProcessTitle(
        re.compile(r"\bollama (?:runner|_llama_server)\b"), "ollama runner", "worker", "model"
    ),
    ProcessTitle(re.compile(r"\bollama serve\b"), "ollama server", "frontend", "none"),
)

LEVERS: Levers = {
    "context_length": (lever("num_ctx (OLLAMA_CONTEXT_LENGTH for every model)"),),
    "gpu_layers": (lever("num_gpu"),),
    "compute_batch": (lever("num_batch"),),
    "parallel": (lever("OLLAMA_NUM_PARALLEL"),),
    "kv_dtype": (lever("OLLAMA_KV_CACHE_TYPE=q8_0 (with OLLAMA_FLASH_ATTENTION=1)"),),
    "quantize": (lever("a smaller quantization tag of the model"),),
}

LOG_MARKS = LogMarks(
    (
        LogMark(rb"level=(?:INFO|WARN|DEBUG|ERROR) source=\w+\.go:\d+ msg=", 5),
        LogMark(
            rb"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (?:llama|routes|server|gpu|images|sched)\.go:\d+: ", 5
        ),
        LogMark(
            rb"llama runner|ollama runner|OLLAMA_[A-Z_]+|github\.com/(?:ollama|jmorganca)/ollama", 3
        ),
        LogMark(rb"\bollama\[\d+\]: ", 3),
    ),
    embeds=("llamacpp",),
)

KIND = ServerKind(
    name="ollama",
    display_name="Ollama",
    identity=Identity(titles=TITLES),
    levers=LEVERS,
    log_marks=LOG_MARKS,
)
