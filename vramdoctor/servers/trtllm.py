"""TensorRT-LLM (NVIDIA/TensorRT-LLM), served by Triton's tensorrtllm backend or trtllm-serve.

Levers: the KV cache share of free memory is a runtime setting (the Triton backend's
`config.pbtxt` parameter `kv_cache_free_gpu_mem_fraction`, named by its own log lines;
trtllm-serve's `--kv_cache_free_gpu_memory_fraction`); batch, token and sequence limits are baked
into the engine at build time (`trtllm-build --max_batch_size / --max_num_tokens / --max_seq_len /
--max_input_len`): rebuilding is the lever. TensorRT runs on NVIDIA GPUs only. Log marks: the C++
runtime's "[TensorRT-LLM][INFO] ", the Python logger's "[TRT-LLM] [I] ", its package paths, the
Triton backend library (real excerpts: tests/fixtures/logs/wild/29-31, 54).
"""

from __future__ import annotations

import re

from vramdoctor.servers.base import Identity, ProcessTitle, ServerKind
from vramdoctor.servers.diagnose_sections import Levers, LogMark, LogMarks, lever

TITLES = (
    ProcessTitle(re.compile(r"\btrtllm-serve\b"), "trtllm-serve", "engine", "model"),
    ProcessTitle(re.compile(r"\btritonserver\b"), "triton server", "engine", "model"),
)

LEVERS: Levers = {
    "kv_share": (
        lever(
            "kv_cache_free_gpu_mem_fraction (config.pbtxt; trtllm-serve: "
            "--kv_cache_free_gpu_memory_fraction)"
        ),
    ),
    "kv_size": (lever("max_tokens_in_paged_kv_cache (config.pbtxt)"),),
    "context_length": (lever("--max_seq_len (trtllm-build)"),),
    "input_length": (lever("--max_input_len (trtllm-build)"),),
    "prefill_chunk": (lever("--max_num_tokens (trtllm-build)"),),
    "max_running": (lever("--max_batch_size (trtllm-build)"),),
    "tensor_parallel": (lever("--tp_size (convert_checkpoint)"),),
    "quantize": (lever("an FP8/INT4 engine (quantize.py, then trtllm-build)"),),
}

LOG_MARKS = LogMarks(
    (
        LogMark(rb"\[TensorRT-LLM\]", 5),
        LogMark(rb"\[TRT-LLM\]", 5),
        LogMark(rb"tensorrt_llm/|libtriton_tensorrtllm|tensorrtllm_backend", 3),
    )
)

KIND = ServerKind(
    name="trtllm",
    display_name="TensorRT-LLM",
    identity=Identity(titles=TITLES),
    levers=LEVERS,
    log_marks=LOG_MARKS,
)
