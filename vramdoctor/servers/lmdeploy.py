"""LMDeploy (InternLM/lmdeploy `lmdeploy serve api_server`, TurboMind and PyTorch backends).

Levers: `lmdeploy serve api_server --help`: `--cache-max-entry-count` (the KV cache's share of the
memory free after the weights, 0.8 by default), `--session-len`, `--max-batch-size`,
`--max-prefill-token-num`, `--quant-policy 8` (KV int8), `--tp`, `--model-format awq`,
`--eager-mode` (PyTorch backend). Log marks: its Python logging prefix, its package paths,
TurboMind's C++ "[TM][ERROR]", the engine configs it prints (real excerpts:
tests/fixtures/logs/wild/36-37).
"""

from __future__ import annotations

import re

from vramdoctor.servers.base import Identity, ProcessTitle, ServerKind
from vramdoctor.servers.diagnose_sections import Levers, LogMark, LogMarks, lever

TITLES = (ProcessTitle(re.compile(r"\blmdeploy serve\b"), "lmdeploy server", "engine", "model"),)

LEVERS: Levers = {
    "kv_share": (lever("--cache-max-entry-count"),),
    "context_length": (lever("--session-len"),),
    "prefill_chunk": (lever("--max-prefill-token-num"),),
    "max_running": (lever("--max-batch-size"),),
    "kv_dtype": (lever("--quant-policy 8"),),
    "tensor_parallel": (lever("--tp"),),
    "quantize": (lever("--model-format awq (AWQ / W4A16 weights)"),),
    "graph_off": (lever("--eager-mode (PyTorch backend)"),),
}

LOG_MARKS = LogMarks(
    (
        LogMark(rb" - (?:lmdeploy|turbomind) - (?:INFO|WARNING|ERROR|DEBUG) - ", 5),
        LogMark(rb"lmdeploy/(?:serve|turbomind|pytorch|cli)/", 3),
        LogMark(rb"TurbomindEngineConfig\(|PytorchEngineConfig\(|\[TM\]\[", 5),
    )
)

KIND = ServerKind(
    name="lmdeploy",
    display_name="LMDeploy",
    identity=Identity(titles=TITLES),
    levers=LEVERS,
    log_marks=LOG_MARKS,
)
