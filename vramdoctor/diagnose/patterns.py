"""Every log format string diagnose recognises, in one place, with the version that prints it.

Written from the servers' own format strings (SGLang 0.1 to 0.5.23, vLLM 0.1 to 0.33), not
from samples: each regex names the generation(s) it covers. `ANCHORS` are the literal byte
fragments the reader's prefilter looks for; every regex below must contain one of them (a
test checks this), so a line that no regex can use is never even decoded.
"""

from __future__ import annotations

import re
from typing import Any

try:  # RE2 (a declared dependency) scans a traceback for a long alternation of frame names in linear
    import re2 as _re2  # time, several times faster than Python's engine there

    _LATIN1 = _re2.Options()
    _LATIN1.encoding = _re2.Options.Encoding.LATIN1  # bytes as bytes: invalid UTF-8 still scans

    def _fast(pattern: str) -> Any:
        """A regex for scanning long traceback text (RE2; the stdlib engine as a fallback)."""
        return _re2.compile(pattern)

    def fast_bytes(pattern: bytes) -> Any:
        """A bytes regex for scanning raw log blocks (RE2, a DFA: linear whatever the number of
        alternatives; the stdlib engine as a fallback)."""
        return _re2.compile(pattern, _LATIN1)
except ImportError:  # pragma: no cover

    def _fast(pattern: str) -> Any:
        return re.compile(pattern)

    def fast_bytes(pattern: bytes) -> Any:
        return re.compile(pattern)


# Traceback frames only a multimodal model runs (vision model files, encoder calls): the reader yields
# these frame lines (other frames are read through look-back when an error needs them), as it does the
# frames of SGLang's CUDA IPC transport (its frame proves the transport on).
MM_FRAME_ANCHORS: tuple[bytes, ...] = (
    b"_vl.py",
    b"_vl_moe.py",
    b"_mm_encoder",
    b"multimodal_embeddings",
    b"_video_input",
    b"_image_input",
)
READ_FRAME_ANCHORS: tuple[bytes, ...] = (*MM_FRAME_ANCHORS, b"cuda_ipc_transport_utils")


def __getattr__(name: str) -> object:
    """`ANCHORS`, the prefilter's fragments, are built from the line vocabulary (vocabulary.GATES)."""
    if name == "ANCHORS":
        from vramdoctor.diagnose.vocabulary import ANCHORS

        return ANCHORS
    raise AttributeError(name)


# --- line prefixes (stripped for display and continuation detection) -------------------
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
QUOTE = re.compile(r"^(?:\s*>)+ ?")  # markdown quote markers
COMPOSE = re.compile(  # docker-compose "name-1  | ", log shippers "2026-05-01 21:55:54.036 | "
    r"^(?:\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?Z? |[\w.-]*\s*)\| "
)
# Log shippers' and CI's wrappers: Buildkite "[2025-07-04T05:34:37Z] ", kubectl --timestamps and
# GitHub Actions "2026-07-08T22:40:03.166647879Z ", Lemonade's "2026-05-08 11:47:02.257 [Error] (Process) ",
# a TUI log viewer's border "│ ... │".
WRAPPER = re.compile(
    r"^(?:\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z\] |\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \[(?:Error|Info|Warning|Debug)\] \(Process\) |\u2502 )"
)
JOURNALD = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?:\S+ )?[\w.@/-]+(?:\[\d+\])?: ")
PROC = re.compile(  # one or more (nested: "(EngineCore_0 pid=715) (VllmWorker TP0 pid=720) ")
    # (a word character, then anything up to "pid=": one way to read it, linear on a 1 MiB line)
    r"^(?:\(\w[^)]*?pid=\d+(?:, ip=[\w.:-]+)?\)\s*)+"
)
# vLLM's own process tags (vllm/v1/executor/multiproc_executor.py `setup_proc_title_and_log_prefix`,
# vllm/utils `decorate_logs`): "(APIServer pid=P)", "(EngineCore pid=P)", "(EngineCore_DP0 pid=P)",
# "(EngineCore_0 pid=P)" (0.10), "(Worker pid=P)", "(Worker_DP1_PP0_PCP0_TP3_DCP0_EP1 pid=P)" (0.10.2+:
# Worker[_DPn][_PPn][_PCPn][_TPn][_DCPn][_EPn]); 0.8-0.9: "(VllmWorker rank=N pid=P)"; 0.10.0-0.10.1:
# "(VllmWorker pid=P)", "(VllmWorker TPn pid=P)", "(VllmWorker PPn pid=P)", "(VllmWorker PPn_TPn pid=P)"
# (WorkerProc: PP rank = rank // tp, TP rank = rank % tp, each only when its size > 1), nested under the
# engine's tag when the engine relays them ("(EngineCore_0 pid=715) (VllmWorker TP0 pid=720) ");
# V0: "(VllmWorkerProcess pid=P)", Ray's "(RayWorkerWrapper pid=P, ip=A)".
VLLM_TAG_NAME = (
    r"(?:APIServer(?:_\d+)?|ApiServer_\d+|EngineCore(?:_DP\d+|_\d+)?|Worker(?:_[A-Z]+\d+)*"
    r"|VllmWorker(?: rank=\d+| PP\d+(?:_TP\d+)?| TP\d+)?|VllmWorkerProcess|RayWorkerWrapper)"
)
VLLM_PROC = re.compile(r"^\(" + VLLM_TAG_NAME + r" pid=\d+(?:, ip=[\w.:-]+)?\)")
# Sniffed in the first MiB (bytes): a vLLM process tag followed by vLLM's logger prefix
# ("INFO 05-02 08:11:40 [file.py:N]" from 0.8, "INFO 05-02 08:11:40 file.py:N]" before), and SGLang's
# prefix with rank tags ("[2025-09-14 03:22:10 DP0 TP0] ", sglang/srt/utils `configure_logger`).
VLLM_PREFIX_SNIFF = re.compile(  # (the tag may be coloured: "\x1b[1;36m(VllmWorker TP2 pid=415)\x1b[0;0m ")
    rb"\(" + VLLM_TAG_NAME.encode() + rb" pid=\d+(?:, ip=[\w.:-]+)?\)(?:\x1b\[[0-9;]*m)?"
    rb" (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
)
# The pids of the server's own processes, from vLLM's process tags in the first MiB.
# (group 1: the name with its ranks, "VllmWorker TP1", "Worker_PP1_TP3"; group 2: the pid)
PROC_PID_TEXT = (
    r"\(([A-Za-z]\w*(?: rank=\d+| PP\d+(?:_TP\d+)?| TP\d+)?) pid=(\d+)(?:, ip=[\w.:-]+)?\)"
)
PROC_PID = re.compile(PROC_PID_TEXT)
PROC_PID_SNIFF = re.compile(PROC_PID_TEXT.encode())
# SGLang's own marks in an excerpt that has none of its log lines (sniffed in the first MiB): its
# package paths in traceback frames, the scheduler's crash line, its argument dump's class, the
# launcher's SIGQUIT line ("Received sigquit from a child process. It usually means one child failed."),
# the 2024 TP worker's "Exception in run_tp_server".
SGL_OWN_SNIFF = fast_bytes(  # literals only: RE2's DFA scans the MiB several times faster
    rb"sglang/srt/|Scheduler hit an exception|ServerArgs\(|It usually means one child failed|Exception in run_tp_server"
    # argument names only SGLang's dump prints as name=value (a fragment cut from the middle of it)
    rb"|schedule_conservativeness=|enable_priority_scheduling=|disable_radix_cache=|cuda_graph_max_bs="
)
VLLM_OWN_SNIFF = re.compile(rb"/vllm/(?:v1|engine|worker|executor|model_executor|entrypoints)/")
# (group 1: the rank tags, " DP0 TP3")
SGL_PREFIX_SNIFF = re.compile(
    rb"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?((?: (?:DP|TP|EP|PP)\d+)+)\] "
)
# The rank parts of those tags: "_TP3" in Worker_TP3, " TP3" / " PP1" / "_TP3" in VllmWorker TP3 /
# VllmWorker PP1_TP3 (0.10.0-0.10.1), "rank=1" in VllmWorker rank=1 (a world rank).
VLLM_PROC_RANKS = re.compile(r"[_ ](DP|PP|TP|EP)(\d+)|VllmWorker rank=(\d+)")
RANKTAG = re.compile(r"^\[rank\d+\]:\s*")
# SGLang: [2025-03-27 21:33:30 TP0] / [2025-03-27 21:33:30.123 DP1 TP3 EP3] (all versions)
# 2024 (0.2/0.3): "[23:17:01 TP7] " (time only, always with a rank tag)
SGL_PREFIX = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?|\d\d:\d\d:\d\d(?= (?:DP|TP)\d))"
    r"((?: (?:DP|TP|EP|PP|CP|ATTN_CP|MOE_DP)\d+)*)\] ?"
)
SGL_RANKS = re.compile(r"(DP|TP|EP|PP)(\d+)")
# SGLang 0.5.9+: "[2026-03-02 22:23:32] INFO server_args.py:1970: "
SGL_LEVEL = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w./-]+\.py:\d+: ")
# vLLM: "INFO 05-02 10:11:12 [file.py:N] " (0.8+) / "INFO 05-02 10:11:12 file.py:N] " (older)
VLLM_PREFIX = re.compile(
    r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+(?::\d+)?\] "
)
# Python logging default-ish: "2025-03-18 10:24:07,565 - name - INFO - "
PYLOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ - [\w.]+ - [A-Z]+ - ")
OLD_SGL = re.compile(r"^(?:\[gpu=\d+\] |Rank \d+: )")
# A line that starts a new record (anything else after an error line may be its wrapped tail).
RECORD_START = re.compile(
    r"^(?:\[\d{4}-|\[rank\d|\(\w+ pid=|\((?:VllmWorker|EngineCore)|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b"
    r"|\d{4}-\d\d-\d\d[ T]|Traceback|\s+File \"|\s{2,}|[A-Z][a-z]{2} [ \d]\d \d\d:"
    # the other servers' records (an error's evidence never runs into the next line): a C/C++
    # function's tag (llama.cpp/ggml "alloc_tensor_range: ...", "ggml_gallocr_reserve_n: ..."), the
    # llama.cpp server's "1.06.520.086 E " timestamps, Go's log "2024/01/05 10:38:07 ", ggml's
    # "current device: 0" and GGML_ASSERT, Rust's panic "note: run with `RUST_BACKTRACE=1`"
    r"|[a-z][a-z0-9]*_\w*: |\d+\.\d\d\.\d{3}\.\d{3} [DIWE] |\d{4}/\d\d/\d\d \d\d:"
    r"|current device: |GGML_ASSERT|note: run with)"
)
# rows a container's log squashed onto one line: a run of spaces, then the next record's level and
# time ("...environment-variables)                                ERROR 07-04 14:53:23 [engine.py:458]")
SQUASHED_RECORD = re.compile(r" {8,}(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:")

# --- arguments dumps ------------------------------------------------------------------
# SGLang up to 0.5.18: server_args=ServerArgs(model_path='...', ...)  (dataclass repr)
# SGLang 0.5.19+:      server_args={'model_path': '...', ...}         (dict)
SGL_ARGS = re.compile(r"server_args=(ServerArgs\(|\{)")
# vLLM up to 0.8: args: Namespace(...); 0.9+: non-default args: {...}
VLLM_NAMESPACE = re.compile(r"\bargs: (Namespace\()")
VLLM_NONDEFAULT = re.compile(r"non-default args: (\{)")
# vLLM engine config line (every version): "Initializing an LLM engine (v0.6.5) with config:
# model='...', ..., tensor_parallel_size=1, ..." / "Initializing a V1 LLM engine (v0.9.1) ..."
VLLM_ENGINE = re.compile(
    r"Initializing an? (?:V[01] )?LLM engine(?: \(v([\w.+-]+)\))? with config: (.*)"
)
VLLM_CONFIG_KV = re.compile(
    r"\b(model|tensor_parallel_size|pipeline_parallel_size|data_parallel_size|gpu_memory_utilization|enforce_eager|kv_cache_dtype|max_seq_len)=('(?:[^']*)'|[^,)\s]+)"
)

# --- versions -------------------------------------------------------------------------
VLLM_VERSION = re.compile(r"\bvLLM (?:API )?server version ([\w.+-]+)(?:, serving model (\S+))?")
VLLM_LOGO_VERSION = re.compile(r"\u2588\s+version\s+(\S+)")
VLLM_LOGO_MODEL = re.compile(r"\u2588\s+model\s+(\S+)")

# --- model, architecture, multimodal --------------------------------------------------
# SGLang: "Load weight begin. avail mem=F GB" / "Load weight end. [elapsed=F s, ]type=T,
# [dtype=D, ][quant=..., ]avail mem=F GB[, mem usage=F GB]." ; v0.1: "Rank N: load weight begin."
SGL_LOAD_BEGIN = re.compile(r"[Ll]oad weight begin\.(?: avail mem=([\d.]+) GB)?")
SGL_LOAD_END = re.compile(
    r"Load weight end\. (?:elapsed=[\d.]+ s, )?type=(\w+),.*?avail mem=([\d.]+) GB(?:, mem usage=([\d.]+) GB)?"
)
SGL_KV = re.compile(
    r"KV Cache is allocated\.(?: dtype: [\w.]+,)?(?: #tokens: (\d+),)? (?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)"
)
SGL_POOL_END = re.compile(r"Memory pool end\. avail mem=([\d.]+) GB")
SGL_GRAPH_END = re.compile(
    r"Capture (?:\w+ )*(?:cuda|CUDA|piecewise CUDA) graph end\. Time elapsed: ([\d.]+) s\.?(?: mem usage=(-?[\d.]+) GB\. avail mem=([\d.]+) GB)?"
)
SGL_GRAPH_FAILED = re.compile(r"Capture (?:cuda|CUDA) graph failed: (.*)")
SGL_SUMMARY = re.compile(
    r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), max_running_requests=(\d+), context_len=(\d+)(?:, available_gpu_mem=([\d.]+) GB)?"
)
SGL_READY = re.compile(r"The server is fired up and ready to roll!")
SGL_MM_REDUCE = re.compile(
    r"Automatically reduce --mem-fraction-static to ([\d.]+) because this is a multimodal model"
)
# SGLang configs/model_config.py (enable_multimodal unset): "Multimodal is disabled for gemma3. To enable it,
# set --enable-multimodal." (Gemma3/Llama4/Step3-VL run text-only by default), "Multimodal is disabled for
# this MiMoV2 checkpoint: ...". vLLM config: "`limit_mm_per_prompt` is only supported for multimodal
# models." (its registry treats the architecture as text-only). Either way the server serves text only.
SGL_MM_DISABLED = re.compile(r"Multimodal is disabled for ")
VLLM_MM_REFUSED = re.compile(r"limit_mm_per_prompt`? is only supported for multimodal models")
# SGLang's multimodal processor (multimodal/processors/base_processor.py, created only for a multimodal
# model), at start-up: "Multimodal preprocess cache enabled for %s: %d MiB total ...", "Multimodal data
# loading enabled with %d worker threads (%s).", "Multimodal processor concurrency enabled with %d isolated
# worker threads (%s)." (0.5.19)
SGL_MM_PROCESSOR = re.compile(
    r"Multimodal (?:preprocess cache enabled for \w+|data loading enabled with \d+ worker|processor concurrency enabled with \d+)"
)
# vLLM V1 gpu_model_runner `profile_run` (0.7+), printed only for a multimodal model about to profile its
# encoder: "Encoder cache will be initialized with a budget of %s tokens, and profiled with %s %s items of
# the maximum feature size." (group 3: the modality, image / video / audio)
VLLM_ENCODER_CACHE = re.compile(
    r"Encoder cache will be initialized with a budget of (\d+) tokens, and profiled with (\d+) (\w+) items"
)
# SGLang: "Attention backend not explicitly specified. Use X backend by default." (<=0.4.x),
# "Attention backend not set. Use X backend by default." (0.4.6-0.5.x), "not specified" (0.5.x+);
# "MLA optimization is turned on. Use triton backend." / "FlashInfer MLA optimization is
# turned on. Use flashinfer backend for DeepseekV3ForCausalLM."
SGL_USE_BACKEND = re.compile(r"\bUse (\w+) backend\b")
# vLLM: "Using XFormers backend." (V0 selector), "Using Flash Attention backend on V1 engine.",
# "Using FLASH_ATTN backend.", "Using AttentionBackendEnum.FLASH_ATTN backend.",
# "Using FLASH_ATTN attention backend out of potential backends: [...]"
VLLM_USING_BACKEND = re.compile(
    r"\bUsing (?:[A-Za-z_]+\.)?([A-Za-z][\w-]*(?: [A-Z][\w-]*)?) (?:attention )?backend\b(?! with)"
)
VLLM_TP_RANK = re.compile(
    r"rank \d+ in world size (\d+) is assigned as DP rank \d+, PP rank \d+, TP rank \d+"
)
VLLM_ARCH = re.compile(r"Resolved architecture: (\w+)")
VLLM_ARCH_V1 = re.compile(r"\['(\w+)'\] is not supported by the V1 Engine")
# vLLM V1 gpu_model_runner: "Starting to load model %s..."
VLLM_LOAD_MODEL = re.compile(r"Starting to load model (\S+?)\.\.\.")
VLLM_MM_PROFILE = re.compile(r"Starting profile run for multi-modal models")
# vLLM memory figures
# vLLM weights: "Loading model weights took X GB" (V0), "Model loading took X GiB" (V1), "model weights
# take X GiB" (0.6-0.8 profiling summary), vllm/utils memory profiling result (0.9+, DEBUG): "Memory
# profiling takes F seconds. Total non KV cache memory: XGiB; torch peak memory increase: XGiB; ...
# weights memory: XGiB."
VLLM_WEIGHTS = re.compile(
    r"(?:Loading model weights took|Model loading took|model weights take|; weights memory:) ([\d.]+) ?(GiB|GB)"
)
# vLLM V1 gpu_worker (DEBUG): "Initial free memory: F GiB; Requested memory: U (util), R GiB"
VLLM_REQUESTED = re.compile(r"Requested memory: ([\d.]+) \(util\), ([\d.]+) ?GiB")
VLLM_BLOCKS = re.compile(
    r"# (?:GPU|cuda|rocm) blocks: (\d+)(?:, # CPU blocks: (\d+))?"
)  # V0: "# rocm blocks" on ROCm
VLLM_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
VLLM_KV_MEM = re.compile(
    r"Available KV cache memory: (-?[\d.]+) GiB"
)  # negative when nothing is left
VLLM_BUDGET = re.compile(
    r"total_gpu_memory \(([\d.]+) ?GiB\) x gpu_memory_utilization \(([\d.]+)\) = ([\d.]+) ?GiB"
)
VLLM_KV_RESERVED = re.compile(r"the rest of the memory reserved for KV Cache is ([\d.]+) ?GiB")
VLLM_GRAPH_DONE = re.compile(r"Graph capturing finished in [\d.]+ secs?, took ([\d.]+) GiB")

# vLLM (0.1+): "Possibly too large swap space. %.2f GiB out of the %.2f GiB total CPU memory is
# allocated for the swap space." (a ValueError "Too large swap space. ..." above 70%)
VLLM_SWAP = re.compile(
    r"(?:Possibly too|Too) large swap space\. ([\d.]+) GiB out of the ([\d.]+) GiB total CPU memory"
)
# vLLM arg_utils: "The model has a long context length (%s). This may cause OOM errors during the
# initial memory profiling phase, or result in low performance due to small KV cache space. ..."
VLLM_LONG_CTX = re.compile(r"The model has a long context length \((\d+)\)\. This may cause OOM")

# --- image processor ------------------------------------------------------------------
# transformers: "Using a slow image processor as `use_fast` is unset and a slow processor was
# saved with this model. ..."
SLOW_PROCESSOR = re.compile(r"Using a slow image processor as `use_fast` is unset")
# SGLang: "Processor X does not have a slow version. Automatically use fast version"
FAST_ONLY_PROCESSOR = re.compile(r"does not have a slow version\. Automatically use fast version")

# --- CUDA IPC feature transport (SGLang 0.5.5+) ---------------------------------------
IPC_POOL_015 = re.compile(
    r"MmItemMemoryPool size per tokenizer worker: ([\d.]+) MiB \(budget ([\d.]+) MiB / (\d+) worker"
)
IPC_POOL_016 = re.compile(
    r"CUDA IPC multimodal feature pools reserve ([\d.]+) MiB total on GPU (\d+) \(([\d.]+) MiB per tokenizer worker \S (\d+); configured budget ([\d.]+) MiB\)"
)
IPC_USING_017 = re.compile(
    r"Using CUDA IPC for multimodal features: reserving up to (\d+) MiB on base GPU (\d+) across (\d+) tokenizer worker"
)
IPC_AUTO = re.compile(r"Multimodal feature transport auto-resolved to cuda_ipc")
IPC_POOL_FULL = re.compile(
    r"MmItemMemoryPool has no free chunk large enough for a ([\d.]+) MiB tensor \(pool size: ([\d.]+) MiB\)"
)

# --- failures -------------------------------------------------------------------------
# torch: "CUDA out of memory. Tried to allocate X. GPU N has a total capacity of X of which X
# is free. [Process P has X memory in use. ...]"; "CUDA error: out of memory"; flashinfer
# "CUDA Error: out of memory (2)"; "... failed with error out of memory".
# Other runtimes' wordings of the same failure: Triton's launcher "Triton Error [CUDA]: out of memory"
# (triton/backends/nvidia/driver.c), the CUDA driver API "CUDA_ERROR_OUT_OF_MEMORY" / torch's "CUDA driver
# error: out of memory", cuBLAS "CUBLAS_STATUS_ALLOC_FAILED", cuDNN "CUDNN_STATUS_ALLOC_FAILED", NCCL's
# "Cuda failure 'out of memory'" / "Cuda failure 2 'out of memory'" (NCCL WARN, DistBackendError "Last
# error:"), the CUDACHECK macro of vLLM's custom all-reduce "Failed: Cuda error <file>:<line> 'out of
# memory'", vLLM's CuMemAllocator "CUDA Error: out of memory at .../cumem_allocator.cpp".
CUDA_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError: CUDA|torch\.(?:cuda\.)?OutOfMemoryError"
    r"|failed with error out of memory|cudaErrorMemoryAllocation|Triton Error \[CUDA\]: out of memory"
    r"|CUDA_ERROR_OUT_OF_MEMORY|CUDA driver error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
    r"|'out of memory'"  # cudaGetErrorString quoted: NCCL "Cuda failure 2 'out of memory'", CUDACHECK
    # the same torch error on other devices: ROCm "HIP out of memory", Ascend (torch_npu) "NPU out of memory"
    r"|HIP out of memory|NPU out of memory|hipErrorOutOfMemory"
    # torch's cudaMallocAsync backend: "Allocation on device 0 would exceed allowed memory. (out of memory)"
    r"|would exceed allowed memory"
    # the other servers: ggml (llama.cpp, Ollama's runner) "... allocating 4480.00 MiB on device 0:
    # cudaMalloc failed: out of memory" (also under ROCm: ggml's HIP build keeps the name), the 2023 ggml
    # "CUDA error 2 at .../ggml-cuda.cu:9132: out of memory" (Ollama relays it as "llama.go:455: 2 at ...");
    # TensorRT-LLM "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(...): out of memory
    # (.../tllmBuffers.h:112)" (a terminal wrap may leave only "ream->get()): out of memory (...h:112)");
    # LMDeploy TurboMind "[TM][ERROR] CUDA runtime error: out of memory /lmdeploy/src/turbomind/...".
    r"|cudaMalloc\w* failed: out of memory|ggml-cuda\.cu:\d+: out of memory|CUDA runtime error\b[^\n]*?out of memory"
    r"|\): out of memory \(/\S+\.h:\d+\)",
    re.IGNORECASE,
)
# llama.cpp (ggml-backend): "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4480.00 MiB on device 0:
# cudaMalloc failed: out of memory"
GGML_ALLOC = re.compile(r"allocating ([\d.]+) MiB on device (\d+): cudaMalloc failed")
# The device an OOM message names (CUDA unless it says HIP or NPU).
OOM_DEVICE = re.compile(
    r"\b(HIP|NPU)(?: out of memory|ErrorOutOfMemory)|\bhip(?=ErrorOutOfMemory)", re.IGNORECASE
)
# torch before 2.1 and torch_npu: "Tried to allocate X (GPU 0; 23.69 GiB total capacity; 21.95 GiB already
# allocated; 2.94 MiB free; 22.01 GiB reserved in total by PyTorch)"
OOM_GPU_OLD = re.compile(
    r"\((?:GPU|NPU) (\d+); ([\d.]+ [KMGT]?i?B) total capacity; ([\d.]+ (?:[KMGT]?i?B|bytes)) already allocated;"
    r"(?: [\d.]+ (?:[KMGT]?i?B|bytes) current active;)? ([\d.]+ (?:[KMGT]?i?B|bytes)) free;"
)
OOM_ALLOCATED = re.compile(r"Of the allocated memory ([\d.]+ [KMGT]?i?B) is allocated by PyTorch")
OOM_TRIED = re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)")
OOM_GPU = re.compile(
    r"GPU (\d+) has a total capac?i?ty of ([\d.]+ [KMGT]?i?B) of which ([\d.]+ (?:[KMGT]?i?B|bytes)) is free"
)
OOM_PROCESS = re.compile(r"Process (\d+) has ([\d.]+ [KMGT]?i?B) memory in use")
OOM_THIS = re.compile(r"this process has ([\d.]+ [KMGT]?i?B) memory in use")
OOM_PRIVATE = re.compile(r"with ([\d.]+ (?:[KMGT]?i?B|bytes)) allocated in private pools")
OOM_RESERVED = re.compile(
    r"and ([\d.]+ (?:[KMGT]?i?B|bytes)) is reserved by PyTorch but unallocated"
)
# c10 format_size prints "N bytes" up to 1 KiB, then KiB / MiB / GiB with two decimals ("of which 0 bytes
# is free" is common). A per-process memory fraction (torch.cuda.set_per_process_memory_fraction) adds
# "X allowed; " to the caching allocator's message: torch 2.0 "(GPU 0; T total capacity; A already
# allocated; F free; X allowed; R reserved in total by PyTorch)", torch 2.2+ "... is free. [proc info]X
# allowed; Of the allocated memory ..." (c10/cuda/CUDACachingAllocator.cpp `allowed_info`).
OOM_ALLOWED = re.compile(r"([\d.]+ (?:[KMGT]?i?B|bytes)) allowed;")
# The last figure of the caching allocator's message (2.1+ "... is reserved by PyTorch but unallocated.",
# 2.0 "... reserved in total by PyTorch)"): a wrapped message is joined until it comes.
OOM_END = re.compile(r"reserved by PyTorch but unallocated|reserved in total by PyTorch\)")
# The cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; c10/cuda/
# CUDAMallocAsyncAllocator.cpp) prints its figures on the lines after the message, one per line:
# "Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : X
# \nRequested               : X\nDevice limit            : X\nFree (according to CUDA): X\nPyTorch limit
# (set by user-supplied memory fraction)\n                        : X". The limit line is printed always:
# without a fraction it is UINT64_MAX ("17179869184.00 GiB"). Group 1: the field, group 2: the size.
OOM_ASYNC = re.compile(r"would exceed allowed memory")
OOM_ASYNC_DEVICE = re.compile(r"Allocation on device (\d+) would exceed allowed memory")
OOM_ASYNC_FIELD = re.compile(
    r"^(Currently allocated|Requested|Device limit|Free \(according to \w+\)|PyTorch limit \(set by user-supplied memory fraction\))?"
    r"\s*(?::\s*([\d.]+ (?:[KMGT]?i?B|bytes)))?\s*$"
)
# Not CUDA OOMs:
SGL_RETRACT = re.compile(
    r"(Decode|Prefill) out of memory(?: happened)?\.?(?: #retracted_reqs: (\d+), #new_token_ratio: ([\d.]+) -> ([\d.]+))?"
)
SGL_NOT_ENOUGH = re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static")
SGL_REQ_SLOTS = re.compile(r"alloc_req_slots runs out of memory")
# SGLang model_runner.py (0.1 to 0.5.x; model_runner_kv_cache_mixin.py `_apply_token_constraints` in
# 0.5.18+): "max_total_tokens=%s is larger than the profiled value %s. Use the profiled value instead."
# A negative profiled value means the weights left no memory for the KV cache at all.
SGL_PROFILED = re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (-?\d+)")
VLLM_NO_KV = re.compile(r"No available memory for the cache blocks")
VLLM_MAX_SEQ = re.compile(
    r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the available KV cache memory \(([\d.]+) GiB\)"
)
# V1 kv_cache_utils.check_enough_kv_cache_memory's `estimated_msg` in the same message: "Based on the available
# memory, the estimated maximum model length is N." (the --max-model-len that fits)
VLLM_EST_MAX_LEN = re.compile(r"estimated maximum model length is (\d+)")
# vLLM V0 worker.raise_if_cache_size_invalid: "The model's max seq len (%d) is larger than the
# maximum number of tokens that can be stored in KV cache (%d). Try increasing ..."
VLLM_MAX_SEQ_V0 = re.compile(
    r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)"
)
# vLLM's start-up free-memory check. V1 gpu_worker.py (0.8-0.10): "Free memory on device (%s/%s GiB) on
# startup is less than desired GPU memory utilization (%s, %s GiB). Decrease GPU memory utilization or
# reduce GPU memory used by other processes."; 0.11+ (v1/worker/utils.py `request_memory`): "Free memory
# on device cuda:0 (%s/%s GiB) on startup is less than ..." (the device name added).
VLLM_FREE_LT = re.compile(
    r"Free memory on device (?:(\S+) )?\(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory"
    r" utilization(?: \(([\d.]+), ([\d.]+) GiB\))?"
)
# vLLM 0.11+ gpu_worker.py after KV/graph setup: "Free memory on device (%s/%s GiB) on startup. Desired GPU
# memory utilization is (%s, %s GiB). Actual usage is %s GiB for weight, %s GiB for peak activation, %s GiB
# for non-torch memory, and %s GiB for CUDAGraph memory. Replace gpu_memory_utilization config with
# `--kv-cache-memory=N` (%s GiB) to fit into requested memory, or `--kv-cache-memory=N` (%s GiB) to fully
# utilize gpu memory." (later: "... %s GiB for consumed memory (weights + non-torch), %s GiB for peak
# activation, and %s GiB for CUDAGraph memory ...", backticks dropped in some releases).
VLLM_FREE_STARTUP = re.compile(
    r"Free memory on device (?:\S+ )?\(([\d.]+)/([\d.]+) GiB\) on startup"
)
VLLM_DESIRED = re.compile(r"Desired GPU memory utilization is \(([\d.]+), ([\d.]+) GiB\)")
VLLM_KV_SUGGEST = re.compile(
    r"--kv-cache-memory=(-?\d+)`? \((-?[\d.]+) GiB\) to fit into requested memory"
    r"(?:, or `?--kv-cache-memory=(-?\d+)`? \((-?[\d.]+) GiB\) to fully utilize)?"
)
# vLLM 0.21+ gpu_worker.py: "CUDA graph memory profiling is enabled (default since v0.21.0). The current
# --gpu-memory-utilization=%.4f is equivalent to --gpu-memory-utilization=%.4f without CUDA graph memory
# profiling. ..." (the first value is the configured one).
VLLM_UTIL_EQUIV = re.compile(
    r"The current --gpu-memory-utilization=([\d.]+) is equivalent to --gpu-memory-utilization=([\d.]+)"
)
VLLM_NOT_ENOUGH_LOAD = re.compile(r"Failed to load model - not enough GPU memory")
TRITON_SMEM = re.compile(
    r"out of resource: shared memory(?:, Required: (\d+), Hardware limit: (\d+))?"
)
RAY_OOM = re.compile(
    r"ray\.exceptions\.OutOfMemoryError: Task was killed due to the node running low on memory"
)

# --- crashes: KV-pool allocation failures, host-RAM OOM, SIGKILL, vLLM death lines ----------------
# SGLang's KV token pool could not give a batch its slots: fatal in every version (the scheduler's
# admission and retraction checks are meant to make it impossible). 0.1.x `print("Prefill out of
# memory. This should never happen.")` + exit(); 2024 (0.2-0.3) logger.error("{Prefill|Decode} out of
# memory. Try to lower your batch size.\nTry to allocate N tokens.\nAvaliable tokens: N\n") + exit(1);
# 0.3-0.5 schedule_batch.py `alloc_token_slots` / `alloc_paged_token_slots_extend` / `..._decode`:
# logger.error(msg) then raise RuntimeError(msg) with "Available tokens: N (available_size=X +
# evictable_size=Y)"; 0.5.x mem_cache/common.py `alloc_token_slots`: "Out of memory. Try to lower your
# batch size." (no phase), hybrid pools print "Available full tokens: N (full_available_size=X +
# full_evictable_size=Y)" / "Available swa tokens: N (...)" / "Available swa: N (available_size=X +
# component_evictable_size_=Y)". Group 1: the phase (None for the phase-less wording).
SGL_KV_ALLOC_FAIL = re.compile(
    r"\b(?:(Prefill|Decode) out of memory\. (?:Try to lower your batch size|This should never happen)"
    r"|Out of memory\. Try to lower your batch size)"
)
SGL_KV_ALLOC_TRY = re.compile(r"Try to allocate (\d+) tokens")
SGL_KV_ALLOC_AVAIL = re.compile(
    r"\bAva(?:il|li)able(?: (?!tokens)(\w+))?(?: tokens)?: ?(\d+)(?: \(([^)]*)\))?"  # "Avaliable": 2024's typo
)
# early 2025 (sglang PR #5081's excerpt): "self.token_to_kv_pool_allocator.available_size()=5120" and
# "self.tree_cache.evictable_size()=0" on their own lines after "Avaliable tokens: N"
SGL_KV_ALLOC_SIZE_CALL = re.compile(r"\b(available|evictable)_size\(\)=(\d+)")
SGL_KV_ALLOC_EVICTABLE = re.compile(r"^Evictable tokens: (\d+)")
SGL_KV_ALLOC_FIELD = re.compile(r"(\w+?)_?=(\d+)")
# SGLang 0.4+ retraction (not a crash): "KV cache pool is full. Retract requests. #retracted_reqs: N[,
# #new_tokens_gained: N][, #mamba_num_gained: N][, #new_token_ratio: A -> B]" (logger.info, later warning).
SGL_RETRACT_POOL_FULL = re.compile(
    r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)(?:, #new_tokens_gained: (\d+))?"
    r"(?:, #mamba_num_gained: \d+)?(?:, #new_token_ratio: ([\d.]+) -> ([\d.]+))?"
)
# Host RAM exhausted. PyTorch c10/core/impl/alloc_cpu.cpp (CAFFE_ENFORCE, "[enforce fail at
# alloc_cpu.cpp:N] ..."): Linux posix_memalign "DefaultCPUAllocator: can't allocate memory: you tried to
# allocate N bytes. Error code 12 (Cannot allocate memory)"; Windows/Android "DefaultCPUAllocator: not
# enough memory: you tried to allocate N bytes."; 2019-2020 "... you tried to allocate %dGB. Buy new RAM!".
CPU_ALLOC_OOM = re.compile(
    r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate (\d+) ?(bytes|GB)"
)
# Python's own: a bare "MemoryError" (the last line of a traceback), numpy's "_ArrayMemoryError: Unable
# to allocate 3.73 GiB for an array with shape ..."
PY_MEMORY_ERROR = re.compile(
    r"^(?:builtins\.)?MemoryError\b(?::|$)|_ArrayMemoryError: Unable to allocate ([\d.]+ [KMGTP]?i?B)"
)
# The Linux OOM killer (dmesg / journalctl -k): "Out of memory: Killed process N (NAME) total-vm:..."
# (older kernels "Out of memory: Kill process N (NAME) score S or sacrifice child"), cgroup limit
# "Memory cgroup out of memory: Killed process N (NAME)", "oom-kill:constraint=...,task=NAME,pid=N";
# Kubernetes "Reason: OOMKilled" / docker inspect "OOMKilled": true.
KERNEL_OOM_KILL = re.compile(
    r"(Memory cgroup )?[Oo]ut of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)"
    r"|oom-kill:constraint=(\w+).*?task=([^,\s]+), ?pid=(\d+)|\bOOMKilled\b"
)
# A process killed by SIGKILL (signal 9) with no text of its own: on Linux most often the OOM killer.
# bash "Killed" / "./run.sh: line 3:  4242 Killed    python3 -m ..."; docker "exited with code 137"; kubectl
# "command terminated with exit code 137"; systemd "Main process exited, code=killed, status=9/KILL";
# torch elastic "Signal 9 (SIGKILL) received by PID N" / "exitcode  : -9 (pid: N)"; SGLang's SIGCHLD
# handler "Child process unexpectedly failed with exitcode=9. pid=N" (a waitpid status: 9 = signal 9).
SIGKILL_LINE = re.compile(
    r"^Killed$|^\S+: line \d+: +\d+ Killed\b|exit(?:ed with)? code 137\b|Signal 9 \(SIGKILL\) received by PID (\d+)"
    r"|code=killed, status=9/KILL\b"
    r"|exitcode +: -9\b|unexpectedly failed with exitcode=9\. pid=(\d+)"
)
# vLLM's death lines (crash lines, like "hit an exception"): v1/engine/core.py `run_engine_core`
# logger.exception("EngineCore failed to start.") / ("EngineCore encountered a fatal error."),
# v1/executor/multiproc_executor.py logger.exception("WorkerProc failed to start.") and "Worker proc %s
# died unexpectedly, shutting down executor.", v1/engine/utils.py wait_for_engine_startup "Engine core
# initialization failed. See root cause above.[ Failed core proc(s): {NAME: EXITCODE}]", core_client
# "Engine core proc %s died unexpectedly, shutting down client.", "WorkerProc initialization failed due
# to an exception in a background process. See stack trace for root cause."
VLLM_CRASH = re.compile(
    r"\b(EngineCore|WorkerProc) failed to start\.|\b(EngineCore) encountered a fatal error\."
    r"|\b(Engine core) initialization failed\. See root cause above|\b(WorkerProc) initialization failed due to"
    r"|\b(?:Worker|Engine core) proc (\S+) died unexpectedly"
    # vLLM 0.6-0.8 (V0 MQLLMEngine, api_server.py): "Engine process failed to start[. See stack trace for
    # the root cause.]"
    r"|\b(Engine process) failed to start\b"
    # SGLang's launcher (engine.py `_launch_subprocesses`, every version since 2024): "Rank N scheduler is
    # dead. Please check if there are relevant logs." then "Exit code: C" (-9: killed by SIGKILL)
    r"|\bRank \d+ (scheduler) is dead\. Please check"
    # vLLM V0 (to 0.10): multiproc_worker_utils "Exception in worker %s while processing method %s.",
    # worker_base `execute_method` "Error executing method %r. This might cause deadlock in distributed
    # execution." (Ray workers)
    r"|\bException in worker (\S+) while processing method"
    # (0.4-0.6 print the method unquoted, f"Error executing method {method}. ...")
    r"|\b(Error executing method) '?\w+'?\. This might cause deadlock"
)
SGL_EXIT_CODE = re.compile(r"^Exit code: (-?\d+)$")
VLLM_FAILED_PROCS = re.compile(r"Failed core proc\(s\): \{([^}]*)\}")
VLLM_FAILED_PROC = re.compile(r"'([^']+)': (-?\d+)")
# Mooncake transfer engine (SGLang PD disaggregation), glog format:
# "E0529 23:22:59.553362 67580 rdma_context.cpp:203] Failed to register memory 0x7c1cda000000: Bad address [14]"
RDMA_REGISTER = re.compile(r"Failed to register memory (0x[0-9a-f]+)(?:: (.*))?")
MM_CPU_RETRY = re.compile(
    r"Multimodal preprocessing ran out of GPU memory on (.*?); retrying on CPU"
)

# --- KV self-check (SGLang) -----------------------------------------------------------
# up to 0.5.9: "token_to_kv_pool_allocator memory leak detected! self.max_total_num_tokens=N,
# available_size=N, evictable_size=N, protected_size=N" (field order varies; 0.4.6 puts
# available_size first); "req_to_token_pool memory leak detected!available_size=N, total_size=N";
# 0.5.12+: "pool memory leak detected! [full] total=N, available=N, evictable=N, protected=N, ...";
# busy: "Mem Leak Detected! total_tokens=N vs self.max_total_num_tokens=N" (0.5.12+: "Full Pool
# Mem Leak Detected! ..."); early 2024: "KV cache pool leak detected!" after a UserWarning
# "Warning: available_size=N, max_total_num_token=N".
LEAK = re.compile(
    r"(token_to_kv_pool(?:_allocator)? memory leak detected!|req_to_token_pool memory leak detected!"
    r"|pool memory leak detected!|(?:Full Pool |SWA Pool |Mamba Pool )?Mem Leak Detected!|KV cache pool leak detected!"
    r"|memory leak detected!)"
)
# hybrid (full + mamba) models, SGLang 0.5.x:
# "... memory leak detected! full_available_size=N, full_evictable_size=N,
#  self.token_to_kv_pool_allocator.size=N, self.tree_cache.full_protected_size()=N"
# "mamba_available_size=N, mamba_evictable_size=N, self.req_to_token_pool.mamba_pool.size=N,
#  self.tree_cache.mamba_protected_size()=N, leaked_full_pages=..., leaked_mamba_pages={...}"
LEAK_HYBRID = re.compile(
    r"(full|mamba)_available_size=(\d+), \1_evictable_size=(\d+), self\.[\w.]+?\.size=(\d+), "
    r"self\.tree_cache\.\1_protected_size\(\)=(\d+)"
)
LEAK_PAGES = re.compile(r"leaked_(full|mamba)_pages=(\{[^}]*\}|None)")
# SGLang 0.5.12+ invariant checker (`_check_pool_invariant`): one "[pool] total=N, available=N, evictable=N,
# protected=N, session_held=N, uncached=N" part per pool (full, swa, mamba), joined by newlines after
# "pool memory leak detected! "; the busy check prints one pool after "Mem Leak Detected! ".
# A line of Python source quoted by a traceback (`assert not leak, f"Mem Leak Detected! {msg}"`),
# not a message the server printed.
SOURCE_LINE = re.compile(r"^\s*(?:assert |raise |msg = |f\")|\{\w+(?:=)?\}")
LEAK_POOL = re.compile(r"\[(\w+)\]\s+((?:\w+=-?\d+(?:, )?)+)")
LEAK_POOL_FIELD = re.compile(r"(\w+)=(-?\d+)")
LEAK_FIELD = re.compile(
    r"\b(max_total_num_tokens?|available_size|evictable_size|protected_size|total_size|total_tokens|full_available_size|mamba_available_size|total|available|evictable|protected|session_held|uncached)=(\d+)"
)

# --- traceback frames: which phase of the server's life an error hit -------------------
# Only the frames of the error's own traceback count (never the startup lines printed before it).
# Context markers: the innermost one wins (graph capture inside warm-up is graph capture). The
# frames vLLM and SGLang run in each phase: vLLM V0/V1 worker `determine_num_available_blocks` /
# `determine_available_memory` -> `profile_run`; `compile_or_warm_up_model` -> `_dummy_run`,
# `capture_model`, `_dummy_sampler_run`; SGLang `ModelRunner.init_memory_pool`, `CudaGraphRunner.capture`.
PHASE_MARKERS: tuple[tuple[str, Any], ...] = (
    (
        "cuda_graph",
        _fast(
            r"torch\.cuda\.graph\(|capture_end\(|capture_begin\(|capture_model|capture_one_batch_size|_capture_cudagraphs"
            r"|Capture (?:cuda|CUDA) graph failed|CudaGraphRunner\("
            # by the FUNCTION a frame runs, never its file (cuda_graph_runner.py also replays while serving):
            # capture, capture_one_batch_size, capture_one_shape, _capture_graph, _capture_all, _capture_one
            # (SGLang runners), capture_model, _capture_cudagraphs, capture_graph(s), _capture_full_graph,
            # _capture_piecewise_graph (vLLM V0/V1/model runner v2); a graph runner's constructor (its
            # buffers, then the capture) and SGLang's init_cuda_graphs / init_device_graphs
            r'|, in _?capture(?:_\w+)?\b|graph_runner\.py", line \d+, in (?:__init__|run_once)\b'
            r"|, in init_(?:cuda|device)_graphs\b|, in init_cuda_graph_state\b"
        ),
    ),
    (
        "profiling",
        _fast(
            r"profile_run|determine_num_available_blocks|determine_available_memory|profile_max_batched"
        ),
    ),
    (
        "kv_cache_alloc",
        _fast(
            r"init_cache_engine|allocate_(?:cpu|gpu)_cache|_allocate_kv_cache|initialize_kv_cache_tensors|init_memory_pool|_create_buffers|\b_init_cache\b|TokenToKVPool\b.*__init__|in _init_cache\b"
        ),
    ),
    (
        "weight_load",
        _fast(
            r"\bload_model\b|load_weights|load_single_module|create_weights|_create_weight\b|_initialize_model|\binitialize_model\b|weight_loader|[Ll]oad weight begin"
        ),
    ),
    ("warmup", _fast(r"compile_or_warm_up_model|_warmup|warm_up|kernel_warmup")),
    # Distributed / NCCL start-up, before any weight or KV allocation: SGLang ModelRunner
    # `init_torch_distributed` -> `init_distributed_environment` / `initialize_model_parallel` ->
    # `init_model_parallel_group`; vLLM Worker `init_device` -> `init_worker_distributed_environment` ->
    # `ensure_model_parallel_initialized` -> GroupCoordinator -> `PyNcclCommunicator(` (pynccl.py __init__:
    # `ncclCommInitRank`, a warm-up all_reduce), torch `init_process_group`. Never a bare pynccl.py frame:
    # its all_reduce also runs in every forward pass while serving.
    (
        "distributed_init",
        _fast(
            r"init_torch_distributed|init_(?:worker_)?distributed_environment|initialize_model_parallel"
            r"|ensure_model_parallel_initialized|init_model_parallel_group|PyNcclCommunicator\(|ncclCommInitRank"
            r'|init_process_group|pynccl\.py", line \d+, in __init__|, in init_device\b'
        ),
    ),
    # Multimodal preprocessing: SGLang's tokenizer process (`tokenizer_manager` ->
    # `process_mm_data(_async)` of a multimodal processor, then a transformers fast image processor
    # `image_processing_*_fast.py` running torchvision on the GPU), or the scheduler materialising a
    # request's inputs (`_process_and_broadcast_mm_inputs`); a torchvision transform frame (the fast
    # processors' resize / normalize, a model's own torchvision preprocessing) is preprocessing too.
    (
        "preprocessing",
        _fast(
            r"process_mm_data|_process_and_broadcast_mm_inputs|image_processing_\w+_fast\.py"
            r"|torchvision/transforms/"
        ),
    ),
    # SGLang's scheduler being constructed (Scheduler.__init__ -> init_model_worker -> TpModelWorker):
    # start-up; the outermost marker, so a deeper one (weight load, KV pool, graphs) wins
    ("startup", _fast(r"init_model_worker|init_tp_model_worker|= Scheduler\(|TpModelWorker\(")),
)
# Weaker markers, used only when no context marker is in the traceback: vLLM's dummy passes run in
# warm-up (`compile_or_warm_up_model` calls them; inside `profile_run` the context marker wins).
WARMUP_LEAF = _fast(r"_dummy_sampler_run|_dummy_run\b|_dummy_pooler_run|warming up sampler")
SAMPLER_WARMUP = _fast(r"_dummy_sampler_run|warming up sampler")
# A vision encoder or the merge of its embeddings in the frames: the prefill of a request with images
# (vLLM `_merge_multimodal_embeddings` / `merge_multimodal_embeddings`, `_execute_mm_encoder`,
# `get_multimodal_embeddings` / `embed_multimodal`, `_process_image_input`, `get_image_features`, the
# `visual` / `vision_tower` / `vision_model` modules; SGLang `embed_mm_inputs` (called only when the
# batch has multimodal inputs), `get_image_feature`).
MM_FRAMES = _fast(
    r"_?merge_multimodal_embeddings|_execute_mm_encoder|get_multimodal_embeddings|embed_multimodal"
    r"|_process_(?:image|video|audio)_input"
    r"|get_image_features?\b|embed_mm_inputs|self\.visual\(|self\.vision_tower\(|self\.vision_model\("
    r"|/vision_encoder|VisionTransformer"
)
# Frames only a multimodal model runs (every request of it, images or not): the log is multimodal.
MM_MODEL_FRAMES = _fast(r"general_mm_embed_routine|" + MM_FRAMES.pattern)
FORWARD_MARKERS: tuple[tuple[str, Any], ...] = (
    ("decode", _fast(r"forward_decode|ForwardMode\.DECODE|decode_wrapper|BatchDecode")),
    (
        "prefill",
        _fast(r"forward_extend|forward_prefill|ForwardMode\.EXTEND|prefill_wrapper|BatchPrefill"),
    ),
)
# A CUDA graph REPLAY frame (serving, not capture): SGLang's runners `replay` / `replay_prepare`. The
# runner's file says the phase: the decode runners (cuda_graph_runner.py, cuda_graph_runner/decode_runner.py,
# the EAGLE draft / draft-extend runners of speculative decoding, npu/cpu_graph_runner.py) replay decode
# batches; the piecewise, breakable and prefill runners (piecewise_cuda_graph_runner.py,
# breakable_cuda_graph_runner.py, cuda_graph_runner/prefill_runner.py) replay extend (prefill) batches.
# Group 1: the runner file's name.
REPLAY_FRAME = _fast(r'(\w*runner)\.py", line \d+, in (?:replay|replay_prepare)\b')
REPLAY_PREFILL_FILES = ("piecewise", "breakable", "prefill")
# Serving a batch of requests, phase not shown (the weakest marker: any forward, replay, multimodal or
# dummy-pass frame says more): vLLM's worker / model runner `execute_model` (V0, V1, model runner v2; the
# EngineCore's `self.model_executor.execute_model(...)`), `sample_tokens` (0.11+ async scheduling);
# SGLang's scheduler loop (`event_loop_normal` / `event_loop_overlap` / `event_loop_pp`), `run_batch`,
# `forward_batch_generation`.
SERVING_FRAMES = _fast(
    r", in (?:execute_model|sample_tokens|event_loop_\w+|run_batch|forward_batch_generation)\b"
    r"|\.execute_model\("
)
CONTEXT_PHASES = tuple(name for name, _ in PHASE_MARKERS)
# Substrings without which no multimodal frame can match (a cheap gate before MM_FRAMES).
MM_HINTS = ("multimodal", "mm_", "image", "video", "audio", "visual", "vision", "Vision")
# The last line of a Python traceback: "ValueError: ...", "torch.OutOfMemoryError: ...", "KeyboardInterrupt".
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b(?::|$)")
TRACEBACK = "Traceback (most recent call last)"
TRACEBACK_BYTES = TRACEBACK.encode()
MODEL_FILE = _fast(r"/models/(\w+)\.py")

# --- multimodal architectures, model files and names ----------------------------------
# Multimodal architecture classes, checked against vLLM's registry (model_executor/models/registry.py
# `_MULTIMODAL_MODELS`, and the multimodal entries of `_EMBEDDING_MODELS`) and SGLang's models: every
# `...ForConditionalGeneration` there is multimodal except the text-only ones in TEXT_CONDGEN (see
# `is_mm_arch`); the multimodal `...ForCausalLM` / `...Model` classes are named here (DeepseekOCRForCausalLM,
# DotsOCRForCausalLM, MoonshotKimiaForCausalLM, MiDashengLMModel, SkyworkR1VChatModel, CLIPModel, ...).
# Gemma3nForCausalLM is the text-only Gemma 3n (vLLM `_TEXT_GENERATION_MODELS`): only the conditional-
# generation class is multimodal.
MM_ARCH = re.compile(
    r"VL|Qwen3_5|Vision|Llava|LLaVA|Mllama|MiniCPMV|MiniCPMO|InternVL|Gemma3ForConditionalGeneration"
    r"|Gemma3nForConditionalGeneration"
    r"|Pixtral|Idefics|PaliGemma|Paligemma|Phi3V|Phi4MM|Phi4Multimodal|Molmo|Janus|MultiModal|DeepseekVL"
    r"|KimiVL|Glm4v|GLM4V|Mistral3ForConditionalGeneration|Llama4ForConditionalGeneration|Omni"
    r"|Blip|Chameleon|Fuyu|Aria|Ovis|NVLM|H2OVL|Florence|Qwen2Audio|Ultravox|Whisper|Step3VL|Dots\.?OCR|DotsVLM"
    r"|OCR|Kimia|MiDashengLM|SkyworkR1V|CLIPModel|SiglipModel|Emu3|Bagel|Terratorch|PrithviGeoSpatial"
    r"|Tarsier|Voxtral|GraniteSpeech|AudioFlamingo|GlmAsr|InternS1|Keye|POINTSV"
)
# `...ForConditionalGeneration` classes that are text-only (vLLM registers ChatGLMForConditionalGeneration as
# a text model; Bart/MBart/T5-style encoder-decoders are text): anything else of that name is multimodal.
TEXT_CONDGEN = re.compile(
    r"^(?:ChatGLM|Bart|MBart|T5|MT5|UMT5|LongT5|Marian|Pegasus|PegasusX|Blenderbot|BlenderbotSmall|LED"
    r"|ProphetNet|FSMT|M2M100|NllbMoe|BigBirdPegasus|SwitchTransformers|Plbart|PLBart)ForConditionalGeneration$"
)
# Audio-only multimodal models: no image processor at all (the fast-image-processor fact stays unknown).
AUDIO_ONLY_ARCH = re.compile(
    r"Qwen2Audio|Ultravox|Whisper|Voxtral|GraniteSpeech|MiDashengLM|Kimia|AudioFlamingo|GlmAsr"
)
AUDIO_ONLY_NAME = re.compile(
    r"audio|ultravox|whisper|voxtral|granite-speech|dashenglm|-asr\b", re.IGNORECASE
)
MM_MODEL_FILE = re.compile(
    r"(?:^|_)vl\d?(?:_|$)|vision|llava|mllama|minicpm[vo]|intern_?vl|gemma3_mm|gemma3n|pixtral|idefics"
    r"|paligemma|phi3v|phi4mm|molmo|janus|deepseek_vl|kimi_vl|glm4v|mistral3|omni|blip|chameleon|fuyu|aria"
    r"|ovis|nvlm|clip|siglip|llama4|multimodal"
)
# Model names that only multimodal releases carry (positive evidence only: a name never proves text-only,
# a family name covers VLM releases: Mistral-Small 3.1/3.2, Magistral-Small-2509, gemma-3n, Ministral 3,
# DeepSeek-OCR are all vision models without "VL" in the name; Qwen2-Audio is audio).
MM_NAME = re.compile(
    r"-vl\b|-vl-|_vl\b|vl-\d|vision|llava|janus|mllama|minicpm-?[vo]|internvl|pixtral|idefics|paligemma"
    r"|molmo|qwen\d(?:\.\d)?-?vl|gemma-?3-(?!1b|270m)\d|llama-?4|phi-\d(?:\.\d)?-vision|multimodal|kimi-vl"
    r"|qwen3\.5|qwen3_5|glm-?4\.?\d?v|deepseek-vl|olmocr|ui-tars|cogvlm|smolvlm|florence|-omni|nvlm|ovis|dots\.ocr"
    r"|gemma-?3n|mistral-small-3\.[12]\b|magistral-small-(?:2509|1\.2)|ministral-3-\d|ocr(?![a-z])"
    # vision releases of text families whose names say neither VL nor vision: MedGemma
    # 4b/27b (Gemma 3 image+text; medgemma-27b-text-it is text-only), QVQ (Qwen2-VL), Llama Guard 4
    # (Llama 4, image+text), ShieldGemma 2 (Gemma 3 image classifier), Mistral Large 3, Kimi K2.5,
    # Cosmos-Reason (Qwen2.5-VL); and from vLLM's multimodal list (docs/models/supported_models.md),
    # the names a text family's pattern would otherwise claim: Gemma 4, Intern-S1 (org internlm),
    # MiniCPM-Llama3-V, BLIP-2 (blip2-opt-2.7b), Cosmos3, Kimi-K3
    r"|medgemma(?![\w.-]*text)|qvq|llama-?guard-?4|shieldgemma-?2|mistral-large-3\b|kimi-k2\.5"
    r"|cosmos-reason|gemma-?4-|intern-?s\d|minicpm-llama3-v|blip|cosmos-?3|kimi-k3"
    r"|" + AUDIO_ONLY_NAME.pattern,
    re.IGNORECASE,
)
# Names of text-only model families: read last (after MM_NAME, which names their vision releases).
TEXT_NAME = re.compile(
    r"llama|mistral|mixtral|qwen|\bopt\b|opt-\d|deepseek|gpt|phi-?\d|gemma|falcon|baichuan|chatglm"
    r"|internlm|nemotron|granite|yi-\d|command-r|vicuna|starcoder|codellama|e5-|bge-",
    re.IGNORECASE,
)
# Text-only architecture classes (vLLM `_TEXT_GENERATION_MODELS` / text `_EMBEDDING_MODELS`, SGLang's
# `Load weight end. type=LlamaForCausalLM`): consulted only after MM_ARCH / `is_mm_arch` said no, since
# some multimodal classes end in ForCausalLM (DeepseekOCRForCausalLM, Phi3VForCausalLM) or Model.
TEXT_ARCH = re.compile(
    r"For(?:CausalLM|SequenceClassification|TokenClassification|Embedding|RewardModel|ProcessRewardModel"
    r"|MaskedLM)$|Model$|LMHeadModel$|^Eagle|Eagle3?$"
)


def is_mm_arch(arch: str) -> bool:
    """A multimodal architecture class (MM_ARCH, or any ...ForConditionalGeneration not in TEXT_CONDGEN)."""
    if MM_ARCH.search(arch):
        return True
    return arch.endswith("ForConditionalGeneration") and not TEXT_CONDGEN.match(arch)


# The attention backend a traceback runs through (a fallback when no line names it).
TRACE_BACKEND = _fast(
    r"layers/attention/(\w+?)_backend\.py|init_flashinfer_args|BatchDecodeWithPagedKVCache|BatchPrefillWithPagedKVCache"
)


# --- echo: request/response logs echo user text --------------------------------------------
# Servers that log requests print the user's prompt and the model's answer inside one line (the text
# is repr'd: its newlines are escaped). Nothing in such a line is a server event or fact. The marks,
# each at the start of the line's message (after the process/rank/timestamp prefix):
# vLLM entrypoints/logger.py RequestLogger "Received request %s: prompt: %r, params: ..." (0.5-0.10),
# "Received request %s: params: %s, ..." (0.11+, the prompt at DEBUG in "Request %s details: prompt:
# %r, ..."), "Generated response %s%s: output: %r, ..."; V0 async_llm_engine (0.2-0.4) "Received
# request %s: prompt: %r, sampling_params: ..."; V0/V1 "Added request %s." (the id may come from the
# client's X-Request-Id header). SGLang --log-requests (tokenizer_manager, utils/request_logger.py):
# "Receive: obj=GenerateReqInput(...)", "Receive OpenAI: obj={...}", "Finish: obj=..., out={...}",
# 2024 (0.2-0.3) "in=GenerateReqInput(...), out={...}", and --log-requests-format json's
# "request.received" / "request.received.openai" / "request.finished" records.
ECHO_HEAD = 256  # the mark must start within the line's first characters (its prefix is shorter)
ECHO_MARKS = (
    "Received request ",
    "Receive: obj=",
    "Receive OpenAI: obj=",
    "Generated response ",
    "Finish: obj=",
    " details: prompt: ",
    "Added request ",
    '"request.received',
    '"request.finished"',
    "Received raw HTTP request ",
    "in=GenerateReqInput(",
    "in=EmbeddingReqInput(",
)
# Every mark holds one of these (" details: prompt: " follows "Request <id>"): four bounded finds decide
# for the (many) lines that are no echo.
ECHO_GATES = ("quest", "obj=", "esponse ", "ReqInput(")


# A whole request-echo line in raw bytes (the mark within its first ECHO_HEAD characters), for the
# first-MiB sniff: the tags and prefixes quoted in a prompt are user text, not the server's.
ECHO_MARK_BYTES = tuple(m.encode() for m in ECHO_MARKS)
ECHO_LINE = fast_bytes(
    rb"(?m)^[^\n]{0,%d}(?:" % (ECHO_HEAD - 1)
    + b"|".join(re.escape(m) for m in ECHO_MARK_BYTES)
    + rb")[^\n]*"
)


def without_echo_lines(head: bytes) -> bytes:
    """`head` with its request-echo lines blanked (kept as empty lines); the bytes as they are when
    no echo mark occurs (the usual case: one find per mark)."""
    if not any(m in head for m in ECHO_MARK_BYTES):
        return head
    out: bytes = ECHO_LINE.sub(b"", head)
    return out


def request_echo(t: str) -> int:
    """Where a logged request or response starts in line `t` (vLLM's RequestLogger, SGLang's
    --log-requests; see ECHO_MARKS), -1 when `t` is not one: the text from there is user data.
    Bounded `str.find`s over the line's head only (a pure function of the text: memoisable)."""
    for gate in ECHO_GATES:
        if t.find(gate, 0, ECHO_HEAD) >= 0:
            break
    else:
        return -1
    found = [i for i in (t.find(m, 0, ECHO_HEAD) for m in ECHO_MARKS) if i >= 0]
    return min(found) if found else -1


# --- the other servers' lines, the newer vLLM / SGLang lines, platform failures ---------------------
# llama.cpp (ggml-org/llama.cpp, builds 2023-2025). Load: "llama_model_load_from_file_impl: using device CUDA0
# (Tesla M60) - 8040 MiB free"; "load_tensors:        CUDA0 model buffer size = 7317.01 MiB" (CPU_Mapped /
# CPU buffers are host RAM); "llama_context: n_ctx         = 131072" (llama_new_context_with_model in 2023);
# "llama_kv_cache_unified:        CPU KV buffer size = 16384.00 MiB" (CPU: --no-kv-offload), "llama_context:
# CUDA0 compute buffer size =   396.75 MiB"; "build: 5572 (7675c555) with cc ..."; 2023: "llm_load_tensors:
# VRAM used: 17891.45 MB", "llama_kv_cache_init: VRAM kv self = 1482.19 MB", JSON lines '"build":1492'.
LCPP_FREE = re.compile(r"using device (\w+) \([^)]*\) - (\d+) MiB free")
LCPP_BUFFER = re.compile(
    r"^\s*(\w+?)(?:_Mapped|_Host)? +(model|KV|compute|output) buffer size = +([\d.]+) MiB"
)
LCPP_NCTX = re.compile(r"\bn_ctx +(?:= +)?(\d+)")
LCPP_VRAM_OLD = re.compile(r"VRAM (used|kv self)(?: =|:) ([\d.]+) MB")
LCPP_BUILD = re.compile(r"^build: (\d+) \(|\"build\":(\d+)")
LCPP_EXIT = re.compile(r"main: exiting due to (.*)")
# what llama.cpp was allocating when cudaMalloc failed, from the lines after it
LCPP_WHAT = (
    ("kv_cache_alloc", re.compile(r"buffer for kv cache|kv cache", re.I)),
    ("compute_buffer", re.compile(r"compute (?:pp )?buffers?|ggml_gallocr_reserve|graph_reserve")),
    ("weight_load", re.compile(r"error loading model|unable to allocate \w+ buffer|load_tensors")),
)
# TGI (2023-2025): the shard's Python error relayed by the launcher ("Method Warmup encountered an error."),
# the router's panic "Unable to warmup model: Generation(\"...\")" and error "Request failed during
# generation: Server error: ...", the warm-up budget check "Not enough memory to handle N prefill tokens. You
# need to decrease `--max-batch-prefill-tokens`" (flash_causal_lm.py warmup); "Serving revision R of model M".
TGI_METHOD = re.compile(r"Method (Warmup|Prefill|Decode|FilterBatch|Health) encountered an error")
TGI_WEBSERVER = re.compile(r"Webserver Crashed|Error: WebserverFailed|Error: Warmup\(")
TGI_PREFILL_BUDGET = re.compile(r"Not enough memory to handle (\d+) prefill tokens")
TGI_MODEL = re.compile(r"Serving revision \S+ of model (\S+)")
# TensorRT-LLM C++ runtime (trtGptModelInflightBatching, kvCacheManager): "Memory usage when calculating max
# tokens in paged kv cache: total: 22.19 GiB, available: 0.11 GiB"; "Max tokens in paged KV cache: 117760.
# Allocating 54022635520 bytes."; "Allocate 14575206400 bytes for k/v cache."; "Using 35584 total tokens in
# paged KV cache, ..."; "Number of blocks in KV cache primary pool: 18"; the Triton backend's
# "kv_cache_free_gpu_mem_fraction is not specified, will use default value of 0.9 ..."; "TensorRT-LLM version: X".
TRT_KV_MEM = re.compile(
    r"calculating max tokens in paged kv cache: total: ([\d.]+) GiB, available: ([\d.]+) GiB"
)
TRT_KV_ALLOC = re.compile(
    r"Max tokens in paged KV cache: (\d+)\. Allocating (\d+) bytes|Allocate (\d+) bytes for k/v cache"
)
TRT_KV_TOKENS = re.compile(r"Using (\d+) total tokens in paged KV cache")
TRT_KV_BLOCKS = re.compile(r"Number of blocks in KV cache primary pool: (\d+)")
TRT_KV_DEFAULT = re.compile(
    r"kv_cache_free_gpu_mem_fraction is not specified, will use default value of ([\d.]+)"
)
TRT_VERSION = re.compile(r"TensorRT-LLM version: ([\w.+-]+)")
TRT_CREATE_FAILED = re.compile(r"Failed to create instance")
# LMDeploy: "input backend=turbomind, backend_config=TurbomindEngineConfig(... tp=2, session_len=None,
# max_batch_size=1, cache_max_entry_count=0.1, ...)" (also PytorchEngineConfig)
LMD_ENGINE = re.compile(r"(Turbomind|Pytorch)EngineConfig\(")
# Ollama (Go): "llama runner process has terminated" (0.1-0.5), "error starting llama runner", the runner's Go
# crash dump ("goroutine 1 [running]:", register lines "rip    0x...", "rflags 0x246"), "Listening on
# 127.0.0.1:11434 (version 0.3.6)".
OLLAMA_RUNNER_DIED = re.compile(r"llama runner process (?:has terminated|no longer running)[^\n]*")
GO_CRASH = re.compile(
    r"^(?:rflags|rip) +0x[0-9a-f]+$|^goroutine \d+ \[running\]:$|^SIG(?:ABRT|SEGV): "
)
OLLAMA_VERSION = re.compile(r"Listening on \S+ \(version ([\w.+-]+)\)")
# vLLM 0.18+ gpu_model_runner / gpu_worker (NOTES.md §6): "Profiling CUDA graph memory: PIECEWISE=51
# (largest=512), FULL=35 (largest=256)"; "Estimated CUDA graph memory: 0.36 GiB total"; the hint lines:
# estimate on (0.21+ "CUDA graph memory profiling is enabled (default since v0.21.0). The current
# --gpu-memory-utilization=U ..."; 0.18 "... is enabled (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1). This will
# become the default in v0.19."), estimate off (0.18-0.20 "In v0.19, CUDA graph memory profiling will be enabled
# by default ... increase --gpu-memory-utilization from U to V ..."; 0.21+ WARNING "CUDA graph memory profiling is
# disabled (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). ... increasing --gpu-memory-utilization from U to V.").
VLLM_GRAPH_PROFILE = re.compile(
    r"Profiling CUDA graph memory: ((?:\w+=\d+ \(largest=\d+\)(?:, )?)+)"
)
VLLM_GRAPH_PROFILE_PART = re.compile(r"(\w+)=(\d+) \(largest=(\d+)\)")
VLLM_GRAPH_ESTIMATE = re.compile(r"Estimated CUDA graph memory: ([\d.]+) GiB total")
VLLM_GRAPH_ESTIMATE_ON = re.compile(r"CUDA graph memory profiling is enabled")
VLLM_GRAPH_ESTIMATE_OFF = re.compile(
    r"CUDA graph memory profiling will be enabled by default|CUDA graph memory profiling is disabled"
)
VLLM_UTIL_FROM = re.compile(r"increas(?:e|ing) --gpu-memory-utilization from ([\d.]+) to ([\d.]+)")
VLLM_SKIPPED_PROFILING = re.compile(
    r"reserved ([\d.]+) GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling"
)
VLLM_PLATFORM = re.compile(r"Automatically detected platform (\w+)")
VLLM_CLI_ERROR = re.compile(
    r"\b(vllm serve|api_server\.py|launch_server\.py|sglang serve): error: (.*)"
)
# SGLang 0.5.18+ (mem_cache/kv_cache_configurator.py): "Reserving %.2f GB of the KV budget for post-sizing
# multimodal allocations (feature-transport pools + embedding cache)."
SGL_MM_RESERVE = re.compile(
    r"Reserving ([\d.]+) GB of the KV budget for post-sizing multimodal allocations"
)
# SGLang's CUDA IPC feature transport failing to open a handle (utils/cuda_ipc_transport_utils.py), on ROCm
# "(HIP error: invalid device pointer)"; the transport's own frame proves it was on.
SGL_IPC_FAILED = re.compile(
    r"Failed to deserialize from CUDA IPC handle(?: \((\w+) error: ([^)]*)\))?"
)
SGL_IPC_FRAME = re.compile(r"cuda_ipc_transport_utils\.py")
# ROCm's HSA runtime on a GPU page fault: "Memory access fault by GPU node-2 (Agent handle: 0x...) on address
# 0x.... Reason: Unknown."
GPU_MEMORY_FAULT = re.compile(r"Memory access fault by GPU node-(\d+)[^\n]*?(?:Reason: ([^.]*))?")
# known non-memory errors with their own lever (the server-crash finding names them)
KERNEL_IMAGE_INVALID = re.compile(
    r"device kernel image is invalid|no kernel image is available for execution"
)
# a traceback frame of torch.compile (inductor, dynamo) or of the Triton JIT / autotuner
INDUCTOR_FRAME = re.compile(r"torch/_inductor/|torch/_dynamo/|InductorError|BackendCompilerFailed")
TRITON_JIT_FRAME = re.compile(r"triton/runtime/(?:jit|autotuner)\.py")

# --- Ray, TensorRT-LLM, Ollama, llama.cpp's retry, TGI, environment lines, the safety net -------
# Ray's memory monitor (ray/_private/memory_monitor, raylet): "Memory on the node (IP: ...) where the
# task (actor ID: ..., name=RayWorkerVllm.__init__, pid=308, memory used=11.15GB) was running was
# 12.49GB / 13.15GB (0.950003), which exceeds the memory usage threshold of 0.95. Ray killed this worker"
RAY_KILLED = re.compile(
    r"was ([\d.]+)GB / ([\d.]+)GB \(([\d.]+)\), which exceeds the memory usage threshold of (\d+(?:\.\d+)?)"
    r"|Ray killed this worker"
)
RAY_TASK_NAME = re.compile(r"\bname=([\w.]+), pid=(\d+), memory used=([\d.]+)GB")
# TensorRT-LLM's PyTorch executor (_torch/pyexecutor/py_executor_creator.py, _ExecutorMemoryMonitor):
# "Executor creation failed due to insufficient GPU memory." then, one per line, "The following
# component could not be created: <stage>", "Total GPU memory (GiB): 140.06", "Free GPU memory before
# component creation attempt (GiB): 108.86" and the components created before ("Model: 139.55 / 110.70")
TRT_EXECUTOR_OOM = re.compile(
    r"Executor creation failed (?:due to insufficient GPU memory|with an error which might indicate insufficient GPU memory)"
)
TRT_COMPONENT = re.compile(r"The following component could not be created: (.+?)\s*$")
TRT_TOTAL = re.compile(r"^Total GPU memory \(GiB\): ([\d.]+)")
TRT_FREE_BEFORE = re.compile(
    r"^Free GPU memory before component creation attempt \(GiB\): ([\d.]+)"
)
TRT_CREATED = re.compile(
    r"^(Model|Sampler|Drafter|Initial KV cache[^:]*|KV cache|Additional executor resources[^:]*|Draft model[^:]*): ([\d.]+) / ([\d.]+)\s*$"
)
# Ollama's scheduler refusing a model before it loads (server.go / sched.go): msg="model request too
# large for system" requested="5.5 GiB" available="3.4 GiB" total= free= swap=, and the load error
# error="model requires more system memory (5.5 GiB) than is available (3.4 GiB)"
OLLAMA_TOO_LARGE = re.compile(
    r'model request too large for system"?(?: requested="([\d.]+ [KMGT]?i?B)")?(?: available="([\d.]+ [KMGT]?i?B)")?'
)
OLLAMA_SYSTEM_MEMORY = re.compile(
    r"model requires more system memory \(([\d.]+ [KMGT]?i?B)\) than is available \(([\d.]+ [KMGT]?i?B)\)"
)
# llama.cpp (PR #16748, 2025-10): a compute buffer that failed with pipeline parallelism is retried
# without it: "<func>: compute buffer allocation failed, retrying without pipeline parallelism"
LCPP_RETRY_NO_PP = re.compile(
    r"compute buffer allocation failed, retrying without pipeline parallelism"
)
# what a llama.cpp start-up prints once the context exists (the retry worked)
LCPP_CONTEXT_READY = re.compile(
    r"compute buffer size =|load_model: initializing|server is listening|model loaded|n_slots = \d"
)
LCPP_PP_COPIES = re.compile(r"pipeline parallelism enabled \(n_copies=(\d+)\)")
# TGI's launcher when a shard dies while loading the model ("Error: ShardCannotStart", "Shard 0 failed to start")
TGI_SHARD_START = re.compile(r"ShardCannotStart|Shard \d+ failed to start")
# an environment assignment on its own line ("export VLLM_DP_SIZE=2", "CUDA_VISIBLE_DEVICES=0,1")
ENV_EXPORT = re.compile(
    r"^\s*(?:export\s+)?([A-Z][A-Z0-9_]*(?:VISIBLE_DEVICES|_DP_SIZE))=(\S+)\s*$"
)
# a generic memory failure line (the safety net: a log never refused while it holds one), lowercase
# fragments found with bytes.find on the lowered text (a case-insensitive regex is 20x slower)
# a row that starts a shell command of its own (a README's next command, not a wrapped tail)
STARTS_COMMAND = re.compile(
    r"^\s*(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
    r"(?:python3?|vramdoctor|docker|sglang|vllm|text-generation-launcher|lmdeploy|torchrun)\s"
)

# What makes a line quoting a memory failure a log's line, not prose about one (a README that
# says "out of memory after N requests" is not a server log): an exception's name, a log level,
# a time of day or a kernel timestamp, an errno, or the kernel's OOM killer.
LOG_LINE_MARK = re.compile(
    rb"\b[A-Z]\w*(?:Error|Exception|Exceeded)\b|\b(?:ERROR|WARN(?:ING)?|CRITICAL|FATAL|INFO|DEBUG)\b"
    rb"|\b\d{1,2}:\d{2}:\d{2}\b|^\s*\[\s*\d+\.\d+\]|\[Errno \d+\]|\b[EWF]\d{4} "
    rb"|\b(?:oom-kill|Killed process|oom_reaper|Traceback)\b"
)

ANY_MEMORY_FAILURE = (
    b"out of memory",
    b"outofmemoryerror",
    b"insufficient gpu memory",
    b"insufficient memory",
    b"more system memory",
    b"too large for system",
    b"exceeds the memory usage threshold",
    b"cannot allocate memory",
)
