"""vLLM (vllm-project/vllm): identity, metric names with units, process titles, /dev/shm names.

Read from the released wheels 0.33.0 and 0.12.0 (research notes of 2026-12-01,
/work/research/formats/NOTES.md section 5; older names from facts.md):

- identification: `GET /version` answers `{"version": "X"}`. (vLLM's dev-mode `/server_info`
  answers `vllm_config`/`vllm_env`/`system_env`, which the SGLang probe refuses.)
- metrics: `vllm/v1/metrics/loggers.py` (labels model_name, engine), always on.
  `vllm:kv_cache_usage_perc` from 0.9.2 (`vllm:gpu_cache_usage_perc` up to 0.10.x, hidden in
  0.11, gone in 0.12), both 0..1 ratios; `vllm:cache_config_info` carries num_gpu_blocks,
  block_size and gpu_memory_utilization as labels. No vLLM metric gives GPU memory in bytes.
- sleep mode: `vllm:engine_sleep_state{sleep_state=awake|weights_offloaded|discard_all}`
  (awake = 1 awake, 0 asleep; weights_offloaded = 1 level 1; discard_all = 1 level 2; all 0
  after a level-0 sleep or release_kv_cache_memory); 0.33 adds
  `vllm:sleep_mode_operation_duration_seconds{operation}` and `vllm:sleep_mode_operations_in_flight`.
- process titles (vllm/utils/system_utils.py `set_process_title`, prefix
  VLLM_PROCESS_NAME_PREFIX = "VLLM"): `VLLM::EngineCore[_DP{n}]`, `VLLM::Worker` +
  `_DP{n}` `_PP{n}` `_PCP{n}` `_TP{n}` `_DCP{n}` `_EP{n}` (plain `VLLM::Worker` with TP=1),
  `VLLM::APIServer_{i}` (only with several API servers; the default single API server keeps its
  `vllm serve ...` command line), `VLLM::APIServer_DP{n}`, `VLLM::DPCoordinator`. The API server
  may hold its own CUDA context on an engine GPU (multimodal IPC on the GPU, video decode).
- multimodal processor cache: `mm_processor_cache_gb` (default 4 GiB, vllm/config/multimodal.py),
  "duplicated for each API process and engine core process" (host RAM); with
  `--mm-processor-cache-type shm` one ring buffer `/dev/shm/vllm_mm_<22 chars>` instead
  (0.12: `VLLM_OBJECT_STORAGE_SHM_BUFFER`).
- /dev/shm: the CPU KV-offload region `vllm_offload_{engine_id}.mmap` (+ `.1`, `.2`, ...;
  vllm/v1/kv_offload/cpu/shared_offload_region.py, 0.33) and the encoder-cache region
  `vllm_ec_{engine_id}.mmap`; other vLLM segments are Python's unnamed `psm_*`.
"""

from __future__ import annotations

import re
from typing import Any

from vramdoctor.servers.base import (
    BoundedCache,
    CapacityLabels,
    Identity,
    InfoLabel,
    KvPoolMetrics,
    Metrics,
    MetricSeries,
    Probe,
    ProbeAnswer,
    ProcessTitle,
    ServerKind,
    ShmFamily,
    SleepMetrics,
)
from vramdoctor.servers.diagnose_sections import Levers, LogMark, LogMarks, lever
from vramdoctor.servers.lifecycle_sections import VLLM_FEATURES, VLLM_LIFECYCLE
from vramdoctor.servers.presets import VLLM_PRESETS


def read_version(data: Any) -> ProbeAnswer | None:
    """vLLM's /version JSON -> its version; None when it is not that answer."""
    if isinstance(data, dict) and isinstance(data.get("version"), str):
        return ProbeAnswer(version=data["version"])
    return None


TITLES = (
    ProcessTitle(
        re.compile(r"VLLM::EngineCore(?P<ranks>(?:_DP\d+)?)"), "vllm engine core", "engine", "model"
    ),
    ProcessTitle(
        re.compile(r"VLLM::Worker(?P<ranks>(?:_(?:DP|PP|PCP|TP|DCP|EP)\d+)*)"),
        "vllm worker",
        "worker",
        "model",
    ),
    ProcessTitle(
        re.compile(r"VLLM::APIServer(?:_(?P<index>\d+)|(?P<ranks>_DP\d+))?"),
        "vllm API server",
        "frontend",
        "possible",
    ),
    ProcessTitle(re.compile(r"VLLM::DPCoordinator"), "vllm DP coordinator", "helper"),
    ProcessTitle(
        re.compile(r"ray::RayWorkerWrapper"),
        "vllm worker (ray)",
        "worker",
        "model",
        orphan_check=False,
    ),
    ProcessTitle(
        re.compile(r"vllm serve\b|vllm\.entrypoints|vllm/entrypoints"),
        "vllm API server",
        "frontend",
        "possible",
    ),
)

SHM_FAMILIES = (
    ShmFamily(
        "vllm offload region",
        re.compile(r"vllm_offload_(?P<engine>[^/]+?)\.mmap(?:\.\d+)?"),
        "vLLM's CPU KV-offload region (OffloadingConnector); leaks on an unclean exit "
        "(vllm #51579, #54002)",
        "vllm/v1/kv_offload/cpu/shared_offload_region.py (0.33)",
    ),
    ShmFamily(
        "vllm encoder-cache region",
        re.compile(r"vllm_ec_(?P<engine>[^/]+?)\.mmap(?:\.\d+)?"),
        "vLLM's shared encoder-cache region (ec_transfer CPU connector)",
        "vllm/distributed/ec_transfer/ec_connector/cpu/ec_shared_region.py (0.33)",
    ),
    ShmFamily(
        "vllm mm processor cache",
        re.compile(r"vllm_mm_[A-Za-z0-9_-]{22}|VLLM_OBJECT_STORAGE_SHM_BUFFER"),
        "vLLM's multimodal processor cache ring buffer (--mm-processor-cache-type shm)",
        "vllm/multimodal/cache (0.33: vllm_mm_<urlsafe b64 uuid4>; 0.12: a fixed name)",
    ),
)

SERIES = (
    MetricSeries(
        "kv_usage_ratio",
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "max",
        "ratio",
        "KV cache usage 0..1 (kv_cache_usage_perc from 0.9.2; gpu_cache_usage_perc up to 0.10.x)",
    ),
    MetricSeries(
        "running_requests",
        ("vllm:num_requests_running",),
        "replicas_sum",
        "requests",
        "requests in the running batch",
    ),
    MetricSeries(
        "queued_requests",
        ("vllm:num_requests_waiting",),
        "replicas_sum",
        "requests",
        "requests waiting",
    ),
    MetricSeries(
        "swapped_requests",
        ("vllm:num_requests_swapped",),
        "replicas_sum",
        "requests",
        "requests swapped to CPU (V0)",
        until="0.10",
    ),
    MetricSeries(
        "preemptions_total",
        ("vllm:num_preemptions_total",),
        "replicas_sum",
        "requests",
        "preemptions since start, counter",
    ),
    MetricSeries(
        "cache_hit_rate",
        ("vllm:gpu_prefix_cache_hit_rate",),
        "mean",
        "ratio",
        "prefix cache hit rate 0..1 (V0 gauge)",
        until="0.10",
    ),
    MetricSeries(
        "cpu_kv_usage_ratio",
        ("vllm:cpu_cache_usage_perc",),
        "max",
        "ratio",
        "CPU swap-space KV usage 0..1 (V0)",
        until="0.10",
    ),
)

CACHE_CONFIG = "vllm:cache_config_info"

KV_POOLS = (
    KvPoolMetrics(
        "kv",
        usage_ratio=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        capacity_labels=CapacityLabels(CACHE_CONFIG, "num_gpu_blocks", "block_size"),
        primary=True,
    ),
)

BOUNDED_CACHES = (
    BoundedCache(
        "vllm_mm_processor_cache",
        "host",
        "multimodal processor cache (LRU of processed inputs), one copy in each API process and "
        "engine core: mm_processor_cache_gb x (api_server_count + data_parallel_size) in all; "
        "0 disables it; a sleep of level >= 1 clears the API side (0.33)",
        "vllm/config/multimodal.py mm_processor_cache_gb: float = 4 (0.12.0, 0.33.0)",
        holders=("vllm API server", "vllm engine core"),
        flag="--mm-processor-cache-gb",
        default_size=4.0,
        unit="GiB",
    ),
)

# --- diagnose: this server's fix levers and the marks its logs carry ----------------------------------
# Flag names: vLLM's argument parser as released (0.11-0.33, parse-checked: research notes
# servers/NOTES.md section 5). --cuda-graph-sizes is gone by 0.13 (--cudagraph-capture-sizes /
# --max-cudagraph-capture-size), --swap-space by 0.18; VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is "1" by
# default from 0.21 (the estimate lines name it).
LEVERS: Levers = {
    "memory_share": (lever("--gpu-memory-utilization"),),
    "kv_size": (lever("--kv-cache-memory-bytes", since="0.11"),),
    "context_length": (lever("--max-model-len"),),
    "prefill_chunk": (lever("--max-num-batched-tokens"),),
    "max_running": (lever("--max-num-seqs"),),
    "graph_sizes": (
        lever("--max-cudagraph-capture-size (or fewer --cudagraph-capture-sizes)", since="0.13"),
        lever("--compilation-config '{\"cudagraph_capture_sizes\": [...]}' with fewer sizes"),
    ),
    "graph_off": (lever("--enforce-eager"),),
    "graph_estimate_off": (lever("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0"),),
    "compile_off": (lever("-O0"),),
    "kv_dtype": (lever("--kv-cache-dtype fp8", "cuda", "rocm"),),
    "tensor_parallel": (lever("--tensor-parallel-size"),),
    "quantize": (lever("--quantization"),),
    # ROCm priority list (vllm/platforms/rocm.py): ROCM_ATTN, ROCM_AITER_FA, TRITON_ATTN, ...; FLASH_ATTN and
    # FLASHINFER are CUDA backends
    "attention_backend": (
        lever("--attention-backend (VLLM_ATTENTION_BACKEND before 0.11)", "cuda"),
        lever(
            "--attention-backend TRITON_ATTN or ROCM_AITER_FA (VLLM_ATTENTION_BACKEND before 0.11)",
            "rocm",
        ),
    ),
    "image_processor_cpu": (lever("--mm-processor-kwargs '{\"use_fast\": false}'"),),
    "mm_limits": (lever("--limit-mm-per-prompt"),),
    "mm_pixels": (lever("--mm-processor-kwargs '{\"max_pixels\": ...}'"),),
    "cpu_offload": (lever("--cpu-offload-gb"),),
    "swap": (lever("--swap-space", until="0.18"), lever("--swap-space (before vLLM 0.18)")),
    "rdma_device": (lever("the device names in --kv-transfer-config"),),
}
# vLLM's own logger prefix without a process tag ("ERROR 07-03 22:34:37 [core.py:588] ", 0.8+: vllm/logger.py
# `_FORMAT`, `_DATE_FORMAT` "%m-%d %H:%M:%S"), its argparse error line, its process tags on lines without
# that prefix (a traceback relayed by the engine), and the forks' packages.
LOG_MARKS = LogMarks(
    (
        LogMark(
            rb"(?m)^[^\n]{0,48}(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[\w.]+:\d+\] ",
            1,
        ),
        LogMark(rb"vllm serve: error: ", 5),
        LogMark(
            rb"\((?:EngineCore(?:_DP\d+|_\d+)?|Worker(?:_[A-Z]+\d+)*|VllmWorker(?: rank=\d+| TP\d+)?|APIServer) pid=\d+\) ",
            1,
        ),
        LogMark(rb"vllm_ascend/|Platform plugin ascend is activated", 3, variant="vLLM-Ascend"),
        LogMark(rb"vllm_omni/|vLLM-Omni", 3, variant="vLLM-Omni"),
    )
)

KIND = ServerKind(
    name="vllm",
    display_name="vLLM",
    identity=Identity(
        probes=(Probe("/version", read_version),),
        metric_prefixes=("vllm:",),
        titles=TITLES,
        shm_families=SHM_FAMILIES,
    ),
    metrics=Metrics(
        series=SERIES,
        kv_pools=KV_POOLS,
        running_requests=("vllm:num_requests_running",),
        queued_requests=("vllm:num_requests_waiting",),
        request_counters=("vllm:request_success_total",),
        hit_rate_counters=(
            ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
            ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
        ),
        info_labels=(
            InfoLabel(CACHE_CONFIG, "num_gpu_blocks", "num_gpu_blocks", "count"),
            InfoLabel(CACHE_CONFIG, "gpu_memory_utilization", "gpu_memory_utilization", "ratio"),
        ),
        bounded_caches=BOUNDED_CACHES,
        sleep=SleepMetrics(
            state="vllm:engine_sleep_state",
            label="sleep_state",
            levels={"awake": 0, "weights_offloaded": 1, "discard_all": 2},
            in_flight="vllm:sleep_mode_operations_in_flight",
            operations="vllm:sleep_mode_operation_duration_seconds_count",
        ),
    ),
    levers=LEVERS,
    log_marks=LOG_MARKS,
    presets=VLLM_PRESETS,
    lifecycle=VLLM_LIFECYCLE,
    request_features=VLLM_FEATURES,
)
