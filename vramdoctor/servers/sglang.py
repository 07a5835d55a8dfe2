"""SGLang (sgl-project/sglang): identity, metric names with units, process titles, /dev/shm names.

Read from the released wheels 0.5.9, 0.5.15, 0.5.19 and 0.5.23 (research notes of 2026-12-01,
/work/research/formats/NOTES.md section 6; older names from facts.md):

- identification: `GET /server_info` (0.5.9+) and its deprecated alias `GET /get_server_info`
  (which logs a deprecation warning in the server's log, so it is asked second) answer a JSON
  object with `version`, the server args (`page_size`, `served_model_name`, `model_path`) and
  `memory_usage` (at the top level in older releases, in `internal_states[0]` in newer ones).
- metrics: `sglang/srt/observability/metrics_collector.py` (0.5.23; `metrics/collector.py` in
  0.5.9), needs `--enable-metrics`. "GB" in SGLang's names means GiB (it divides by 1 << 30),
  "MB" MiB. Scheduler gauges come from TP rank 0 unless
  `--enable-metrics-for-all-schedulers`; labels model_name, engine_type, tp_rank, pp_rank,
  moe_ep_rank, [dp_rank], [priority].
- process titles (setproctitle): `sglang::scheduler` + `_DP{n}` `_PP{n}` `_ATTN_CP{n}`
  `_MOE_DP{n}` `_TP{n}` `_EP{n}` (each only when its size > 1), `sglang::detokenizer`,
  `sglang::data_parallel_controller`, `sglang::detokenizer_router`,
  `sglang::tokenizer_worker:{pid}`; the HTTP/tokenizer process keeps its command line.
- /dev/shm: `make_shm_name(kind)` = `sgl_shm_{kind}_{pid}_{uuid4().hex[:8]}` (0.5.15+,
  sglang/srt/utils/stale_shm_cleanup.py; kinds mm, nodecheck, mq), `multi_tokenizer_args_{pid}`,
  and the pid-less `sglang_loads_{name}_{digest}.shm` (managers/load_snapshot.py). 0.5.9's
  multimodal segments have no name of their own (`psm_*`, see sources.leftovers).
- `--mm-feature-transport` (0.5.23): unset means `cpu` (features through /dev/shm segments
  `sgl_shm_mm_*`) except validated multi-node GB200/GB300 models (`cuda_vmm`); `cuda_ipc` and
  `cuda_vmm` reserve `SGLANG_MM_FEATURE_CACHE_MB` (1024 MiB) on the base GPU.
"""

from __future__ import annotations

import re
from typing import Any

from vramdoctor.servers.base import (
    BoundedCache,
    Identity,
    KvPoolMetrics,
    Metrics,
    MetricSeries,
    Probe,
    ProbeAnswer,
    ProcessTitle,
    ServerKind,
    ShmFamily,
)
from vramdoctor.servers.diagnose_sections import Levers, LogMark, LogMarks, lever
from vramdoctor.servers.lifecycle_sections import SGLANG_FEATURES, SGLANG_LIFECYCLE
from vramdoctor.servers.presets import SGLANG_PRESETS

# What `--mm-feature-transport` resolves to when it is not given (0.5.23, single node).
MM_FEATURE_TRANSPORT_DEFAULT = "cpu"


def _memory_usage(info: dict[str, Any]) -> dict[str, Any] | None:
    mem = info.get("memory_usage")
    if not isinstance(mem, dict):
        states = info.get("internal_states")
        if isinstance(states, list) and states and isinstance(states[0], dict):
            mem = states[0].get("memory_usage")
    return mem if isinstance(mem, dict) else None


def _page_size(data: dict[str, Any]) -> int | None:
    args = data.get("server_args") if isinstance(data.get("server_args"), dict) else data
    value = args.get("page_size") if isinstance(args, dict) else None
    return int(value) if isinstance(value, (int, float)) and 0 < value < 1e6 else None


def read_server_info(data: Any) -> ProbeAnswer | None:
    """SGLang's /server_info (or /get_server_info) JSON -> what it says; None if not SGLang's.

    vLLM's dev-mode /server_info answers `vllm_config`, `vllm_env`, `system_env` (no version):
    that is not SGLang."""
    if not isinstance(data, dict) or "vllm_config" in data:
        return None
    if "version" not in data and "memory_usage" not in data:
        return None
    model = data.get("served_model_name") or data.get("model_path")
    return ProbeAnswer(
        version=str(data.get("version") or "") or None,
        model=str(model) if model else None,
        memory_usage=_memory_usage(data),
        page_size_tokens=_page_size(data),
    )


_RANKS = r"(?P<ranks>(?:_(?:ATTN_CP|MOE_DP|DP|PP|TP|EP)\d+)*)"

TITLES = (
    ProcessTitle(re.compile(r"sglang::scheduler" + _RANKS), "sglang scheduler", "engine", "model"),
    ProcessTitle(re.compile(r"sglang::gpu_worker"), "sglang GPU worker", "worker", "model"),
    ProcessTitle(re.compile(r"sglang::detokenizer_router"), "sglang detokenizer router", "helper"),
    ProcessTitle(re.compile(r"sglang::detokenizer"), "sglang detokenizer", "helper"),
    ProcessTitle(
        re.compile(r"sglang::data_parallel_controller"), "sglang data-parallel controller", "helper"
    ),
    ProcessTitle(re.compile(r"sglang::tokenizer_worker"), "sglang tokenizer worker", "frontend"),
    ProcessTitle(re.compile(r"sglang::"), "sglang", "helper"),
    ProcessTitle(
        re.compile(r"sglang[./]launch_server|sglang serve\b|-m sglang\b"),
        "sglang server (tokenizer)",
        "frontend",
    ),
)

SHM_FAMILIES = (
    ShmFamily(
        "sglang sgl_shm",
        re.compile(r"sgl_shm_(?P<kind>[a-z]+)_(?P<pid>\d+)_[0-9a-f]{8}"),
        "SGLang shared memory (mm: multimodal features sent over CPU shm; mq: broadcast queue; "
        "nodecheck)",
        "sglang/srt/utils/stale_shm_cleanup.py make_shm_name (0.5.15+)",
    ),
    ShmFamily(
        "sglang multi-tokenizer args",
        re.compile(r"multi_tokenizer_args_(?P<pid>\d+)"),
        "SGLang's arguments for its tokenizer workers",
        "sglang/srt/managers/multi_tokenizer_mixin.py",
    ),
    ShmFamily(
        "sglang load snapshot",
        re.compile(r"sglang_loads_.+\.shm"),
        "SGLang's load snapshot for the data-parallel router (pid-less)",
        "sglang/srt/managers/load_snapshot.py (0.5.19+ lists it as an orphan prefix)",
    ),
    ShmFamily(
        "sglang download lock",
        re.compile(r"sglang_download_lock_.+"),
        "SGLang's weight-download lock (pid-less)",
        "sglang (CI weight validation)",
    ),
)


def _s(
    stable: str,
    names: str | tuple[str, ...],
    fold: Any,
    unit: str,
    doc: str,
    since: str | None = None,
) -> MetricSeries:
    return MetricSeries(
        stable, (names,) if isinstance(names, str) else names, fold, unit, doc, since
    )


SERIES = (
    _s(
        "kv_usage_ratio",
        "sglang:token_usage",
        "max",
        "ratio",
        "KV pool usage 0..1 (0.5.23: max over full/SWA/mamba pools)",
    ),
    _s(
        "used_tokens",
        ("sglang:num_used_tokens", "sglang:kv_used_tokens"),
        "replicas_sum",
        "tokens",
        "tokens held in the KV pool",
    ),
    _s(
        "running_requests",
        "sglang:num_running_reqs",
        "replicas_sum",
        "requests",
        "requests in the running batch",
    ),
    _s("queued_requests", "sglang:num_queue_reqs", "replicas_sum", "requests", "requests waiting"),
    _s(
        "cache_hit_rate",
        "sglang:cache_hit_rate",
        "mean",
        "ratio",
        "prefix (radix) cache hit rate 0..1",
    ),
    _s(
        "retracted_requests",
        "sglang:num_retracted_reqs",
        "replicas_sum",
        "requests",
        "requests retracted (decode out of KV), gauge",
    ),
    _s(
        "retractions_total",
        "sglang:num_retracted_requests_total",
        "replicas_sum",
        "requests",
        "requests retracted since start, counter",
    ),
    _s("gen_throughput", "sglang:gen_throughput", "replicas_sum", "tokens/s", "generated tokens/s"),
    _s(
        "max_total_tokens",
        "sglang:max_total_num_tokens",
        "max",
        "tokens",
        "KV pool capacity in tokens (0.5.9+)",
        "0.5.9",
    ),
    _s(
        "kv_available_tokens",
        "sglang:kv_available_tokens",
        "replicas_sum",
        "tokens",
        "free KV tokens (0.5.12+)",
        "0.5.12",
    ),
    _s(
        "kv_evictable_tokens",
        "sglang:kv_evictable_tokens",
        "replicas_sum",
        "tokens",
        "radix-cached, evictable KV tokens (0.5.12+)",
        "0.5.12",
    ),
    _s(
        "startup_available_gpu_memory_gib",
        "sglang:startup_available_gpu_memory_gb",
        "min",
        "GiB",
        "free GPU memory after start-up, GiB, lowest rank (0.5.12+)",
        "0.5.12",
    ),
    _s(
        "weight_memory_gib",
        "sglang:weight_memory_usage_gb",
        "max",
        "GiB",
        "weights per GPU, GiB (0.5.17+)",
        "0.5.17",
    ),
    _s(
        "kv_cache_memory_gib",
        "sglang:kv_cache_memory_usage_gb",
        "max",
        "GiB",
        "KV cache per GPU, GiB (0.5.17+)",
        "0.5.17",
    ),
    _s(
        "graph_memory_gib",
        "sglang:graph_memory_usage_gb",
        "rank_sum_max",
        "GiB",
        "CUDA graphs per GPU, all phases, GiB (0.5.17+)",
        "0.5.17",
    ),
    _s(
        "encoder_cache_mib",
        "sglang:encoder_cache_size_mb",
        "max",
        "MiB",
        "multimodal encoder cache, MiB (0.5.15+, encoder-disaggregation server only)",
        "0.5.15",
    ),
    _s(
        "encoder_cache_entries",
        "sglang:encoder_cache_entries",
        "max",
        "entries",
        "multimodal encoder cache entries (0.5.15+, encoder-disaggregation server only)",
        "0.5.15",
    ),
    _s(
        "hicache_host_used_tokens",
        "sglang:hicache_host_used_tokens",
        "replicas_sum",
        "tokens",
        "tokens in the host KV cache (hierarchical cache, 0.5.15+)",
        "0.5.15",
    ),
    _s(
        "hicache_host_total_tokens",
        "sglang:hicache_host_total_tokens",
        "replicas_sum",
        "tokens",
        "capacity of the host KV cache in tokens (hierarchical cache, 0.5.15+)",
        "0.5.15",
    ),
    _s(
        "hicache_host_mamba_used_states",
        "sglang:hicache_host_mamba_used_states",
        "replicas_sum",
        "states",
        "mamba states in the host cache (0.5.23)",
        "0.5.23",
    ),
    _s(
        "hicache_host_mamba_total_states",
        "sglang:hicache_host_mamba_total_states",
        "replicas_sum",
        "states",
        "capacity of the host cache in mamba states (0.5.23)",
        "0.5.23",
    ),
    _s(
        "lora_slots_used",
        "sglang:lora_pool_slots_used",
        "max",
        "slots",
        "LoRA adapter slots occupied in GPU memory (with LoRA enabled)",
        "0.5.9",
    ),
    _s(
        "lora_slots_total",
        "sglang:lora_pool_slots_total",
        "max",
        "slots",
        "LoRA adapter slots available (max_loras_per_batch)",
        "0.5.9",
    ),
    _s(
        "lora_pool_utilization",
        "sglang:lora_pool_utilization",
        "max",
        "ratio",
        "LoRA pool utilization 0..1 (1.0 = full)",
        "0.5.9",
    ),
)

KV_POOLS = (
    KvPoolMetrics(
        "full",
        used=("sglang:kv_used_tokens", "sglang:num_used_tokens"),
        available="sglang:kv_available_tokens",
        evictable="sglang:kv_evictable_tokens",
        capacity="sglang:max_total_num_tokens",
        usage_ratio=("sglang:token_usage",),
        memory_gib="sglang:kv_cache_memory_usage_gb",
        primary=True,
    ),
    # Hybrid models' pools (0.5.12+); the mamba pool counts state slots, judged the same way.
    KvPoolMetrics(
        "swa",
        used=("sglang:swa_used_tokens",),
        available="sglang:swa_available_tokens",
        evictable="sglang:swa_evictable_tokens",
    ),
    KvPoolMetrics(
        "mamba",
        used=("sglang:mamba_used_tokens",),
        available="sglang:mamba_available_tokens",
        evictable="sglang:mamba_evictable_tokens",
    ),
)

BOUNDED_CACHES = (
    BoundedCache(
        "sglang_vlm_embedding_cache",
        "vram",
        "multimodal embedding cache (vision-encoder outputs kept on the GPU, MultiModalStaticCache), "
        "one per scheduler process; 0.5.23 reserves it out of the KV budget and sets it to 0 for "
        "Qwen3-VL on Hopper GPUs of 60 GiB or more when unset",
        "sglang/srt/environ.py SGLANG_VLM_CACHE_SIZE_MB = EnvInt(100) (0.5.9-0.5.23)",
        holders=("sglang scheduler",),
        env="SGLANG_VLM_CACHE_SIZE_MB",
        default_size=100.0,
        unit="MiB",
    ),
    BoundedCache(
        "sglang_encoder_cache",
        "vram",
        "the encoder-disaggregation server's multimodal encoder cache",
        "sglang/srt/disaggregation/encoder/server.py SGLANG_VLM_CACHE_SIZE_MB default '4096'",
        env="SGLANG_VLM_CACHE_SIZE_MB",
        default_size=4096.0,
        unit="MiB",
        used="encoder_cache_mib",
    ),
    BoundedCache(
        "sglang_mm_feature_pool",
        "vram",
        "the GPU pool of multimodal features for --mm-feature-transport cuda_ipc/cuda_vmm, on the "
        "base GPU; the default transport (cpu) sends features through /dev/shm instead",
        "sglang/srt/arg_groups/fields/mm.py (0.5.23)",
        env="SGLANG_MM_FEATURE_CACHE_MB",
        default_size=1024.0,
        unit="MiB",
    ),
    BoundedCache(
        "sglang_hicache_host",
        "host_kv",
        "the host tier of the hierarchical KV cache: it fills to its capacity and keeps what it "
        "holds (a host KV cache that fills is caching)",
        "sglang:hicache_host_used_tokens / _total_tokens (0.5.15+)",
        holders=("sglang scheduler",),
        unit="tokens",
        used="hicache_host_used_tokens",
        capacity="hicache_host_total_tokens",
    ),
    BoundedCache(
        "sglang_lora_pool",
        "vram",
        "LoRA adapter slots in GPU memory (preallocated, max_loras_per_batch)",
        "sglang:lora_pool_slots_used / _slots_total",
        holders=("sglang scheduler",),
        flag="--max-loras-per-batch",
        unit="slots",
        used="lora_slots_used",
        capacity="lora_slots_total",
    ),
)

# --- diagnose: this server's fix levers and the marks its logs carry ----------------------------------
# Flag names: SGLang's argument parser as released (0.5.9-0.5.23, parse-checked: research notes
# servers/NOTES.md section 5). Versioned spellings: the per-phase CUDA-graph flags from 0.5.14 (0.5.20
# rejects the old --cuda-graph-max-bs as ambiguous), --image-processor-backend from 0.5.18,
# --mm-feature-transport from 0.5.17 (before it the env SGLANG_USE_CUDA_IPC_TRANSPORT).
LEVERS: Levers = {
    "memory_share": (lever("--mem-fraction-static"),),
    "kv_size": (lever("--max-total-tokens"),),
    "context_length": (lever("--context-length"),),
    "prefill_chunk": (lever("--chunked-prefill-size"),),
    "batch_tokens": (lever("--max-prefill-tokens"),),
    "max_running": (lever("--max-running-requests"),),
    "graph_batch": (
        lever("--cuda-graph-max-bs-decode", since="0.5.14"),
        lever("--cuda-graph-max-bs", until="0.5.14"),
        lever("--cuda-graph-max-bs (--cuda-graph-max-bs-decode from 0.5.14)"),
    ),
    "graph_off": (
        lever("--cuda-graph-backend-decode disabled", since="0.5.14"),
        lever("--disable-cuda-graph", until="0.5.14"),
        lever(
            "--disable-cuda-graph (deprecated from 0.5.14 for --cuda-graph-backend-decode disabled)"
        ),
    ),
    "compile_off": (lever("no --enable-torch-compile"),),
    "compile_batch": (lever("--torch-compile-max-bs"),),
    "kv_dtype": (lever("--kv-cache-dtype fp8_e5m2", "cuda", "rocm"),),
    "tensor_parallel": (lever("--tp-size"),),
    "quantize": (lever("--quantization"),),
    # 0.5.23's choices: fa3/fa4/flashinfer/flashmla/trtllm_* are "NVIDIA specific", aiter/wave "AMD specific"
    "attention_backend": (
        lever("--attention-backend flashinfer, fa3 or triton", "cuda"),
        lever("--attention-backend aiter or triton", "rocm"),
        lever("--attention-backend ascend", "npu"),
    ),
    "image_processor_cpu": (
        lever("--image-processor-backend pil", since="0.5.18"),
        lever("--disable-fast-image-processor", until="0.5.18"),
        lever("--disable-fast-image-processor (0.5.18+: --image-processor-backend pil)"),
    ),
    "mm_limits": (lever("--limit-mm-data-per-request"),),
    "mm_transport_cpu": (
        lever("--mm-feature-transport cpu", since="0.5.17"),
        lever("no SGLANG_USE_CUDA_IPC_TRANSPORT=1", until="0.5.17"),
        lever("--mm-feature-transport cpu (before 0.5.17: unset SGLANG_USE_CUDA_IPC_TRANSPORT)"),
    ),
    "mm_feature_pool": (lever("SGLANG_MM_FEATURE_CACHE_MB"),),
    "cpu_offload": (lever("--cpu-offload-gb"),),
    "schedule_conservativeness": (lever("--schedule-conservativeness"),),
    "host_cache": (lever("--hicache-ratio / --hicache-size"),),
    "rdma_device": (lever("--disaggregation-ib-device"),),
}
# SGLang's batch lines (scheduler, every version since 2024) and its launcher's SIGQUIT line: an excerpt
# with no server_args dump still names the server (its other marks: vramdoctor/diagnose/diagnosis.py _sniff)
LOG_MARKS = LogMarks(
    (
        LogMark(rb"Prefill batch\. #new-seq: |Decode batch\.? #running-req: ", 2),
        LogMark(rb"SIGQUIT received\. It usually means one child failed", 3),
    )
)

KIND = ServerKind(
    name="sglang",
    display_name="SGLang",
    identity=Identity(
        probes=(
            Probe("/server_info", read_server_info),
            Probe("/get_server_info", read_server_info),
        ),
        metric_prefixes=("sglang:",),
        titles=TITLES,
        shm_families=SHM_FAMILIES,
    ),
    metrics=Metrics(
        series=SERIES,
        kv_pools=KV_POOLS,
        running_requests=("sglang:num_running_reqs",),
        queued_requests=("sglang:num_queue_reqs",),
        request_counters=("sglang:num_requests_total",),
        bounded_caches=BOUNDED_CACHES,
    ),
    levers=LEVERS,
    log_marks=LOG_MARKS,
    presets=SGLANG_PRESETS,
    lifecycle=SGLANG_LIFECYCLE,
    request_features=SGLANG_FEATURES,
)
