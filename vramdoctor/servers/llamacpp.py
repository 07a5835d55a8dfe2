"""llama.cpp's server (ggml-org/llama.cpp `llama-server`, 2023-2025 builds): diagnose's view.

Levers: the server's flags (`llama-server --help`): `-c/--ctx-size`, `-ngl/--n-gpu-layers`,
`-ub/--ubatch-size`, `-np/--parallel`, `-ts/--tensor-split`, `-ctk/-ctv` (a quantized V cache
needs `-fa`), `-nkvo/--no-kv-offload`. ROCm builds use the same flags (ggml's HIP backend).
Log marks: the loader and context prefixes, ggml's backend lines, the server's listening lines;
older builds' llm_load_* names and JSON log lines (real excerpts: tests/fixtures/logs/wild/09-12, 45).
"""

from __future__ import annotations

import re

from vramdoctor.servers.base import Identity, ProcessTitle, ServerKind
from vramdoctor.servers.diagnose_sections import Levers, LogMark, LogMarks, lever

TITLES = (
    ProcessTitle(
        re.compile(r"\bllama-server\b|\bllama\.cpp/server\b"), "llama.cpp server", "engine", "model"
    ),
)

LEVERS: Levers = {
    "context_length": (lever("--ctx-size (-c)"),),
    "compute_batch": (lever("--ubatch-size (-ub)"),),
    "parallel": (lever("--parallel (-np)"),),
    "gpu_layers": (lever("--n-gpu-layers (-ngl)"),),
    "tensor_split": (lever("--tensor-split (-ts)"),),
    "kv_dtype": (lever("--cache-type-k / --cache-type-v q8_0 (the V cache needs --flash-attn)"),),
    "kv_offload_cpu": (lever("--no-kv-offload (-nkvo)"),),
    "quantize": (lever("a smaller quantization of the GGUF"),),
}

LOG_MARKS = LogMarks(
    (
        LogMark(rb"\bllama_model_loader: ", 2),
        LogMark(rb"\bggml_cuda_init: |\bggml_init_cublas: |\bload_backend: loaded ", 3),
        LogMark(rb"\bload_tensors: |\bllm_load_tensors: |\bllm_load_print_meta: ", 2),
        LogMark(rb"\bllama_context: |\bllama_new_context_with_model: |\bllama_kv_cache", 2),
        LogMark(rb"\bggml_backend_\w+: |\bggml_gallocr_\w+: ", 2),
        LogMark(
            rb"main: HTTP server is listening|main: server is listening on|llama server listening at",
            5,
        ),
        LogMark(rb"\bllama_model_load(?:_from_file_impl)?: ", 2),
        LogMark(rb"\bsrv +\w+: |\bslot +\w+: ", 1),
    )
)

KIND = ServerKind(
    name="llamacpp",
    display_name="llama.cpp server",
    identity=Identity(titles=TITLES),
    levers=LEVERS,
    log_marks=LOG_MARKS,
)
