"""TGI (huggingface/text-generation-inference) and its fork LoRAX (predibase/lorax): diagnose's view.

Identity: the launcher (`text-generation-launcher`) starts one Python shard per GPU
(`text-generation-server serve`) and the Rust router; no probe or /metrics vote yet (TGI's
/metrics prefix is `tgi_`, not read by soak). Levers: the launcher's flags (its `--help`,
docs "Text-generation-launcher arguments"): `--max-input-tokens` was `--max-input-length` before
TGI 2.0. Log marks: the tracing targets of the launcher, router and client, the shard's package,
its warm-up and shard lines (real excerpts: tests/fixtures/logs/wild/25-28).
"""

from __future__ import annotations

import re

from vramdoctor.servers.base import Identity, ProcessTitle, ServerKind
from vramdoctor.servers.diagnose_sections import Levers, LogMark, LogMarks, lever

TITLES = (
    ProcessTitle(
        re.compile(r"text-generation-launcher|lorax-launcher"), "tgi launcher", "helper", "none"
    ),
    ProcessTitle(
        re.compile(r"text-generation-router|lorax-router"), "tgi router", "frontend", "none"
    ),
    ProcessTitle(
        re.compile(r"text-generation-server\b|lorax-server\b"), "tgi shard", "worker", "model"
    ),
)

LEVERS: Levers = {
    "memory_share": (lever("--cuda-memory-fraction"),),
    "kv_size": (lever("--max-batch-total-tokens"),),
    "context_length": (lever("--max-total-tokens"),),
    "input_length": (lever("--max-input-tokens (--max-input-length before TGI 2.0)"),),
    "prefill_chunk": (lever("--max-batch-prefill-tokens"),),
    "max_running": (lever("--max-batch-size"),),
    "graph_off": (lever("--cuda-graphs 0"),),
    "tensor_parallel": (lever("--num-shard"),),
    "quantize": (lever("--quantize"),),
}

LOG_MARKS = LogMarks(
    (
        LogMark(rb"text_generation_(?:launcher|router|client)\b", 5),
        LogMark(rb"text_generation_server/", 3),
        LogMark(rb"text-generation-(?:launcher|server|router)", 3),
        LogMark(rb"Method (?:Warmup|Prefill|Decode) encountered an error", 3),
        LogMark(rb"router/src/(?:main|infer|server)\.rs", 2),
        LogMark(
            rb"Shard ready in |Waiting for shard to be ready|Setting max batch total tokens to", 3
        ),
        LogMark(rb"lorax_(?:launcher|client|router)\b|lorax_server/", 5, variant="LoRAX"),
    )
)

KIND = ServerKind(
    name="tgi",
    display_name="TGI",
    identity=Identity(titles=TITLES),
    levers=LEVERS,
    log_marks=LOG_MARKS,
)
