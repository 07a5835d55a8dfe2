"""Read a pasted launch command (`python -m sglang.launch_server ...`, `vllm serve ...`).

People paste the command above the log; it says what they asked for (the argument dump says
what the server resolved, and wins over it). Environment assignments in front of the command
(`SGLANG_USE_CUDA_IPC_TRANSPORT=1 python -m ...`) are read too. Secret flag values are
returned separately so that every output can blank them.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from typing import Any

# Launch commands of both servers, every generation.
LAUNCH = re.compile(
    r"(?:sglang\.launch_server|sglang serve|vllm serve|vllm\.entrypoints\.openai\.api_server|vllm\.entrypoints\.api_server)\b"
)
_ENV = re.compile(r"^([A-Z][A-Z0-9_]*)=(\S*)$")
_SECRET_FLAG = re.compile(
    r"^--?(?:api[-_]key|admin[-_]api[-_]key|hf[-_]token|token|password)$", re.IGNORECASE
)

# flag -> (fact, type); SGLang and vLLM spellings side by side.
FLAGS: dict[str, tuple[str, type]] = {
    "--model-path": ("model", str),
    "--model": ("model", str),
    "--tp": ("tp_size", int),
    "--tp-size": ("tp_size", int),
    "--tensor-parallel-size": ("tp_size", int),
    "-tp": ("tp_size", int),
    "--dp": ("dp_size", int),
    "--dp-size": ("dp_size", int),
    "--data-parallel-size": ("dp_size", int),
    "--pp-size": ("pp_size", int),
    "--pipeline-parallel-size": ("pp_size", int),
    "--mem-fraction-static": ("mem_fraction_static", float),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--attention-backend": ("attention_backend", str),
    "--tokenizer-worker-num": ("tokenizer_worker_num", int),
    "--cuda-graph-max-bs": ("cuda_graph_max_bs", int),
    "--chunked-prefill-size": ("chunked_prefill_size", int),
    "--max-running-requests": ("max_running_requests", int),
    "--max-num-seqs": ("max_running_requests", int),
    "--max-total-tokens": ("max_total_tokens", int),
    "--context-length": ("context_length", int),
    "--max-model-len": ("max_model_len", int),
    "--image-processor-backend": ("image_processor_backend", str),
    "--mm-feature-transport": ("mm_feature_transport", str),
    "--limit-mm-per-prompt": ("limit_mm_per_prompt", str),  # vLLM, 'image=4' or '{"image": 4}'
}
SWITCHES = {
    "--disable-fast-image-processor",
    "--disable-cuda-graph",
    "--enforce-eager",
    "--enable-multimodal",
}


def parse_command(line: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(flags as fact name -> value, environment assignments, secret values) of a launch line."""
    m = LAUNCH.search(line)
    if not m:
        return {}, {}, []
    try:
        words = shlex.split(line, posix=True)
    except ValueError:  # an unbalanced quote in a pasted line
        words = line.split()
    env: dict[str, str] = {}
    for w in words:
        em = _ENV.match(w)
        if em:
            env[em.group(1)] = em.group(2)
    facts: dict[str, Any] = {}
    secrets: list[str] = []
    for j in range(len(words) - 2):
        if (
            words[j] in ("vllm", "sglang")
            and words[j + 1] == "serve"
            and not words[j + 2].startswith("-")
        ):
            facts["model"] = words[j + 2]  # vllm serve MODEL
            break
    i = 0
    while i < len(words):
        w = words[i]
        key, _, inline = w.partition("=") if w.startswith("--") else (w, "", "")
        if w in SWITCHES:
            facts[w.lstrip("-").replace("-", "_")] = True
        elif _SECRET_FLAG.match(key):
            val = inline or (words[i + 1] if i + 1 < len(words) else "")
            if len(val) >= 4:
                secrets.append(val)
            i += 0 if inline else 1
        elif key.replace("_", "-") in FLAGS:
            fact, typ = FLAGS[key.replace("_", "-")]
            val = inline or (words[i + 1] if i + 1 < len(words) else "")
            with contextlib.suppress(ValueError):
                facts[fact] = typ(val)
            i += 0 if inline else 1
        i += 1
    return facts, env, secrets
