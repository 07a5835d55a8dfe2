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

from vramdoctor.redact import secret_name

# Launch commands of both servers, every generation.
LAUNCH = re.compile(
    r"(?:sglang\.launch_server|sglang serve|vllm serve|vllm\.entrypoints\.openai\.api_server|vllm\.entrypoints\.api_server"
    r"|lmdeploy serve api_server|text-generation-launcher)\b"
)
# NAME=value in front of the command; after shlex a quoted value keeps its spaces (HF_TOKEN="a b")
_ENV = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$", re.DOTALL)
# Flags whose value is a secret: --api-key, --admin-api-key, --hf-token, --token, --password,
# --ssl-keyfile-password, ... (the same names as extract.SECRET_ARG, as flags).
_SECRET_FLAG = re.compile(
    r"^--?(?:[\w-]*[-_])?(?:api[-_]key|token|password|passwd|secret|secret[-_]key|access[-_]key)$",
    re.IGNORECASE,
)
# Flags that take one value or more (argparse nargs="+"): vLLM's --api-key is `list[str]`
# (FrontendArgs.api_key), so `--api-key k1 k2` gives two keys.
_MANY_VALUES = frozenset({"--api-key", "--api_key"})
# Environment values that are settings, not secrets, even under a secret-looking name.
_NOT_SECRET = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off"})

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
    # LMDeploy (`lmdeploy serve api_server MODEL`) and TGI (`text-generation-launcher`)
    "--cache-max-entry-count": ("kv_share", float),
    "--session-len": ("context_length", int),
    "--num-shard": ("tp_size", int),
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
    secrets: list[str] = []
    for w in words:
        em = _ENV.match(w)
        if em:
            env[em.group(1)] = em.group(2)
            if _secret_env(em.group(1), em.group(2)):
                secrets.append(em.group(2))  # HF_TOKEN=... vllm serve
    facts: dict[str, Any] = {}
    for j in range(len(words) - 2):
        if (
            words[j] in ("vllm", "sglang")
            and words[j + 1] == "serve"
            and not words[j + 2].startswith("-")
        ):
            facts["model"] = words[j + 2]  # vllm serve MODEL
            break
        if (
            words[j] == "serve"
            and words[j + 1] == "api_server"
            and not words[j + 2].startswith("-")
        ):
            facts["model"] = words[j + 2]  # lmdeploy serve api_server MODEL
            break
    i = 0
    while i < len(words):
        w = words[i]
        key, _, inline = w.partition("=") if w.startswith("--") else (w, "", "")
        if w in SWITCHES:
            facts[w.lstrip("-").replace("-", "_")] = True
        elif _SECRET_FLAG.match(key):
            if inline:
                secrets.append(inline)
            else:
                many = key in _MANY_VALUES and m.group(0).startswith("vllm")
                while i + 1 < len(words) and not words[i + 1].startswith("-"):
                    secrets.append(words[i + 1])
                    i += 1
                    if not many:
                        break
        elif key.replace("_", "-") in FLAGS:
            fact, typ = FLAGS[key.replace("_", "-")]
            val = inline or (words[i + 1] if i + 1 < len(words) else "")
            with contextlib.suppress(ValueError):
                facts[fact] = typ(val)
            i += 0 if inline else 1
        i += 1
    # 4+ characters, not a number: `--max-new-token 1234` is a count (see redact's rule 4)
    return facts, env, [v for v in secrets if len(v) >= 4 and not _is_number(v)]


def _is_number(value: str) -> bool:
    return value.strip().replace(".", "", 1).lstrip("+-").isdigit()


def _secret_env(name: str, value: str) -> bool:
    """Whether an environment assignment in front of a command holds a secret (`HF_TOKEN=V`,
    `OPENAI_API_KEY=V`), not a setting (`SGLANG_..._TOKEN_LIMIT=4096`, `..._KEY=true`)."""
    v = value.strip()
    return len(v) >= 4 and secret_name(name) and v.lower() not in _NOT_SECRET and not _is_number(v)
