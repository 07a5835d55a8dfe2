"""The 2025-2026 log formats of vLLM and SGLang, and no false claims.

Each kind is tested with lines built from the servers' own format strings, one case
per format generation (the version that prints it is named); these are NOT captured logs. Real
excerpts of the same kinds are in tests/fixtures/logs/extra (07-12) and checked by their labels in
test_diagnose_labels.py. Sources of the format strings: vLLM v1/worker/gpu_worker.py,
v1/worker/utils.py `request_memory`, v1/engine/core.py, v1/executor/multiproc_executor.py
(`setup_proc_title_and_log_prefix`); SGLang model_runner.py / model_runner_kv_cache_mixin.py
(`_apply_token_constraints`), scheduler_components/invariant_checker.py (0.5.18+), torch's
CUDACachingAllocator OOM message, Triton's launcher, NCCL and cuBLAS error strings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vramdoctor.diagnose import Diagnosis, diagnose
from vramdoctor.diagnose.findings import Facts, LogEvent
from vramdoctor.diagnose.levers import foreign_flags, platform_forbidden
from vramdoctor.diagnose.rules import all_rules, evaluate
from vramdoctor.diagnose.rules._common import SGLANG_ONLY_FLAGS, VLLM_ONLY_FLAGS

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples" / "logs"


def run(tmp_path: Path, text: str, name: str = "server.log") -> Diagnosis:
    p = tmp_path / name
    p.write_text(text)
    return diagnose([p])


def finding(d: Diagnosis, rule: str):
    return next(f for f in d.findings if f.id == rule)


# --- vLLM's start-up free-memory check ------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        # 0.11+ (v1/worker/utils.py request_memory): the device name is printed
        "(EngineCore_DP0 pid=812) ERROR 02-11 10:03:17 [core.py:941] ValueError: Free memory on device cuda:0 "
        "(2.10/44.39 GiB) on startup is less than desired GPU memory utilization (0.9, 39.95 GiB). Decrease GPU "
        "memory utilization or reduce GPU memory used by other processes.",
        # 0.8-0.10 (v1/worker/gpu_worker.py init_device): no device name
        "(VllmWorker rank=0 pid=77) ERROR 06-30 13:53:19 [multiproc_executor.py:492] ValueError: Free memory on "
        "device (2.10/44.39 GiB) on startup is less than desired GPU memory utilization (0.9, 39.95 GiB). Decrease "
        "GPU memory utilization or reduce GPU memory used by other processes.",
    ],
)
def test_free_memory_check_every_wording(tmp_path: Path, line: str) -> None:
    d = run(tmp_path, line + "\n")
    assert d.server == "vllm" and d.facts.gpu_memory_utilization == 0.9
    f = finding(d, "kv-budget-error")
    assert f.severity == "critical"
    assert "2.10 GiB of 44.39 GiB" in f.explanation and "42.29 GiB" in f.explanation
    assert "stop it" in f.fix and "below free/total = 0.047" in f.fix
    assert not d.events_of("cuda_oom")


# --- other runtimes' wordings of a CUDA OOM --------------------------------------------------

VLLM_TAG = "(Worker_DP1_EP1 pid=2210) ERROR 05-02 08:11:40 [multiproc_executor.py:971] "
SGL_TAG = "[2026-03-01 10:00:00 TP1] "


@pytest.mark.parametrize(("prefix", "server"), [(VLLM_TAG, "vllm"), (SGL_TAG, "sglang")])
@pytest.mark.parametrize(
    "message",
    [
        "RuntimeError: Triton Error [CUDA]: out of memory",  # triton/backends/nvidia/driver.c
        "RuntimeError: CUDA driver error: out of memory",  # torch over the driver API
        "triton.runtime.errors.OutOfResources: CUDA_ERROR_OUT_OF_MEMORY",  # driver API enum name
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "NCCL WARN Cuda failure 'out of memory'",  # NCCL <= 2.18
        "NCCL WARN Cuda failure 2 'out of memory'",  # NCCL 2.19+ prints the code
        "RuntimeError: CUDA error: cudaErrorMemoryAllocation",
        "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:307 'out of memory'",  # vLLM CUDACHECK
    ],
)
def test_runtime_oom_wordings(tmp_path: Path, prefix: str, server: str, message: str) -> None:
    d = run(tmp_path, prefix + message + "\n")  # one line: the file is accepted by its prefix
    assert d.server == server
    assert [e.kind for e in d.events] == ["cuda_oom"]
    assert finding(d, "cuda-oom").severity == "critical"


def test_not_every_triton_cuda_error_is_an_oom(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        VLLM_TAG + "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered\n",
    )
    assert not d.events_of("cuda_oom")


# --- vLLM's newer memory lines, and logs made only of vLLM's process tags --------------------

DESIRED_022 = (  # 0.11-0.21: "... for weight, ... for non-torch memory, and ... for CUDAGraph memory", backticks
    "(Worker_TP0 pid=903) INFO 07-21 14:05:11 [gpu_worker.py:789] Free memory on device (78.52/79.19 GiB) on "
    "startup. Desired GPU memory utilization is (0.9, 71.27 GiB). Actual usage is 62.10 GiB for weight, 4.02 GiB "
    "for peak activation, 4.70 GiB for non-torch memory, and 1.10 GiB for CUDAGraph memory. Replace "
    "gpu_memory_utilization config with `--kv-cache-memory={kv}` ({kvg} GiB) to fit into requested memory, or "
    "`--kv-cache-memory=7023491072` (6.54 GiB) to fully utilize gpu memory. Current kv cache memory in use is 0.12 GiB."
)
DESIRED_030 = (  # later: "consumed memory (weights + non-torch)", no backticks
    "(Worker_TP0 pid=903) INFO 07-21 14:05:11 [gpu_worker.py:789] Free memory on device (78.52/79.19 GiB) on "
    "startup. Desired GPU memory utilization is (0.9, 71.27 GiB). Actual usage is 66.80 GiB for consumed memory "
    "(weights + non-torch), 4.02 GiB for peak activation, and 1.10 GiB for CUDAGraph memory. Replace "
    "gpu_memory_utilization config with --kv-cache-memory={kv} ({kvg} GiB) to fit into requested memory, or "
    "--kv-cache-memory=7023491072 (6.54 GiB) to fully utilize gpu memory."
)


@pytest.mark.parametrize("template", [DESIRED_022, DESIRED_030])
def test_desired_utilization_line_and_negative_kv_budget(tmp_path: Path, template: str) -> None:
    d = run(tmp_path, template.format(kv=-676331929, kvg=-0.63) + "\n")
    assert d.server == "vllm" and d.facts.gpu_memory_utilization == 0.9
    f = finding(d, "kv-budget-shortfall")
    assert f.severity == "warning" and "negative" in f.explanation
    assert "--gpu-memory-utilization" in f.fix and "--mem-fraction-static" not in f.fix
    healthy = run(tmp_path, template.format(kv=4536913634, kvg=4.23) + "\n", "ok.log")
    assert healthy.facts.gpu_memory_utilization == 0.9
    assert not healthy.findings


def test_negative_available_kv_cache_memory(tmp_path: Path) -> None:
    # vLLM V1 gpu_worker "Available KV cache memory: %.2f GiB" (negative when the share is used up)
    d = run(
        tmp_path,
        "(EngineCore pid=187) INFO 05-01 19:17:45 [gpu_worker.py:440] Available KV cache memory: "
        "-3.31 GiB\n",
    )
    assert d.server == "vllm" and d.facts.kv_cache_mib is None
    f = finding(d, "kv-budget-shortfall")
    assert "-3.31 GiB" in f.explanation and f.severity == "warning"


def test_vllm_memory_profiling_debug_lines(tmp_path: Path) -> None:
    # vllm/utils memory profiling result and v1 gpu_worker's requested-memory line (DEBUG level)
    d = run(
        tmp_path,
        (
            "(EngineCore_DP0 pid=9) DEBUG 02-03 04:41:31 [v1/worker/gpu_worker.py:387] Initial free memory: 47.03 GiB; "
            "Requested memory: 0.90 (util), 42.64 GiB\n"
            "(EngineCore_DP0 pid=9) DEBUG 02-03 04:41:31 [v1/worker/gpu_worker.py:399] Memory profiling takes 24.71 "
            "seconds. Total non KV cache memory: 16.70GiB; torch peak memory increase: 1.40GiB; non-torch forward "
            "increase memory: 0.24GiB; weights memory: 15.27GiB.\n"
        ),
    )
    assert d.server == "vllm" and d.facts.gpu_memory_utilization == 0.9
    assert d.facts.weights_mib == round(15.27 * 1024, 1)


def test_cuda_graph_profiling_line_gives_the_configured_utilization(tmp_path: Path) -> None:
    # vLLM 0.21+: the first value is the configured one, the second the derived equivalent
    d = run(
        tmp_path,
        (
            "(Worker_TP2 pid=77) INFO 06-03 09:12:40 [gpu_worker.py:475] CUDA graph memory profiling is enabled "
            "(default since v0.21.0). The current --gpu-memory-utilization=0.8800 is equivalent to "
            "--gpu-memory-utilization=0.8731 without CUDA graph memory profiling. To maintain the same effective KV "
            "cache size as before, increase --gpu-memory-utilization to 0.8869.\n"
        ),
    )
    assert d.server == "vllm" and d.facts.gpu_memory_utilization == 0.88


@pytest.mark.parametrize(
    "tag",
    ["(Worker_TP{r} pid=90{r})", "(VllmWorker rank={r} pid=90{r})", "(EngineCore_DP{r} pid=90{r})"],
)
def test_log_of_vllm_process_tags_only_is_a_vllm_log(tmp_path: Path, tag: str) -> None:
    lines = [
        f"{tag.format(r=r)} INFO 07-21 14:05:1{r} [parallel_state.py:1208] worker ready, waiting for tasks"
        for r in range(4)
    ]
    d = run(tmp_path, "\n".join(lines) + "\n")
    assert d.files[0].recognised and d.server == "vllm"
    assert not d.findings


# --- tp_size from rank sets --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "tp", "whole"),
    [
        # vLLM 0.10.2+ worker tags Worker[_DPn][_PPn][_TPn][_EPn]
        (
            [
                f"(Worker_TP{r} pid={100 + r}) INFO 07-21 14:05:11 [gpu_worker.py:1] Available KV cache memory: 19.06 GiB"
                for r in range(4)
            ],
            4,
            True,
        ),
        # vLLM 0.8-0.10 "VllmWorker rank=N" (a world rank: TP only without pipeline parallelism)
        (
            [
                f"(VllmWorker rank={r} pid={100 + r}) INFO 03-20 03:14:59 [gpu_model_runner.py:1] Model loading took "
                f"9.1 GiB and 4.2 seconds"
                for r in range(2)
            ],
            2,
            True,
        ),
        # SGLang with DP attention: [DPn TPn]
        (
            [
                f"[2025-06-18 13:28:31 DP{r} TP{r}] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
                f"avail mem=20.1 GB, mem usage=60.2 GB."
                for r in range(8)
            ],
            8,
            True,
        ),
        # only some ranks print: a lower bound, not the size
        (
            [
                f"[2025-04-09 17:19:56 TP{r}] Load weight end. type=LlamaForCausalLM, avail mem=20.1 GB, mem usage=6.2 GB."
                for r in (5, 6)
            ],
            7,
            False,
        ),
    ],
)
def test_tp_size_from_rank_sets(tmp_path: Path, lines: list[str], tp: int, whole: bool) -> None:
    d = run(tmp_path, "\n".join(lines) + "\n")
    assert d.facts.tp_size_at_least == tp
    assert d.facts.tp_size == (tp if whole else None)
    assert d.facts.tp_size_is_lower_bound is (True if whole else None)
    j = d.to_json()["facts"]
    assert j["tp_size_at_least"] == tp and "tp_size_is_lower_bound" in j
    assert f">= {tp}" in j["evidence"]["tp_size_at_least"]["text"]


def test_tp_size_from_arguments_is_not_a_lower_bound(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='m', tp_size=8)\n"
        "[2026-01-01 00:00:01 TP0] Load weight begin. avail mem=78.2 GB\n",
    )
    assert (d.facts.tp_size, d.facts.tp_size_is_lower_bound) == (8, False)


# --- SGLang KV-budget failures -------------------------------------------------------------------


def test_sglang_negative_profiled_budget(tmp_path: Path) -> None:
    # model_runner.py "max_total_tokens=%s is larger than the profiled value %s. Use the profiled value instead."
    d = run(
        tmp_path,
        "[2025-09-14 03:22:10 DP0 TP0] max_total_tokens=65536 is larger than the profiled value "
        "-120544. Use the profiled value instead.\n",
    )
    assert d.server == "sglang"
    f = finding(d, "kv-budget-shortfall")
    assert f.severity == "critical" and "no KV cache" in f.explanation
    for lever in ("--mem-fraction-static", "--tp-size", "quantized"):
        assert lever in f.fix
    assert "--gpu-memory-utilization" not in f.fix
    capped = run(
        tmp_path,
        "[2025-09-14 03:22:10 TP0] max_total_tokens=65536 is larger than the profiled value "
        "50756. Use the profiled value instead.\n",
        "capped.log",
    )
    assert [(x.id, x.severity) for x in capped.findings] == [("kv-budget-shortfall", "info")]


def test_req_slots_line_alone_is_an_sglang_log(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        "RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for "
        "`--max-running-requests`. self.req_to_token_pool.available_size()=0, num_reqs=1, "
        "reqs_in_batch=1\n",
    )
    assert d.server == "sglang" and "sglang-req-slots-exhausted" in {f.id for f in d.findings}


# --- SGLang's multi-pool leak check (0.5.12+ / 0.5.18+ invariant_checker) -----------------------


def test_every_pool_of_the_leak_check_is_read(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        (
            "[2026-08-23 09:11:04 TP0] ValueError: pool memory leak detected! [full] total=4096, available=1024, "
            "evictable=3072, protected=0, session_held=0, uncached=0\n"
            "[swa] total=2048, available=512, evictable=1000, protected=24, session_held=0, uncached=0\n"
            "[mamba] total=64, available=60, evictable=1, protected=0, session_held=0, uncached=0, "
            "leaked_full_pages=None, leaked_mamba_pages={7, 9}\n"
            "[2026-08-23 09:11:04 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        ),
    )
    e = d.events_of("kv_leak_selfcheck")[0]
    pools = e.data["pools"]
    assert {k: v["leaked"] for k, v in pools.items()} == {"full": 0, "swa": 512, "mamba": 3}
    assert e.data["pool"] == "swa" and e.data["leaked"] == 512
    f = finding(d, "sglang-kv-selfcheck-leak")
    assert "[full]" in f.explanation and "balanced" in f.explanation
    assert "[swa]" in f.explanation and "512 slot(s) unaccounted for" in f.explanation
    assert "3 slot(s) unaccounted for (leaked pages {7, 9})" in f.explanation


# --- OOM phase from the traceback's own frames --------------------------------------------------

TB = "(Worker_TP0 pid=5) ERROR 07-21 14:05:11 [multiproc_executor.py:671] "


def frames(*names: str) -> str:
    out = [TB + "Traceback (most recent call last):"]
    for n in names:
        out.append(
            TB
            + f'  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 1, in {n}'
        )
        out.append(TB + f"    self.{n}()")
    return "\n".join(out) + "\n"


OOM = (
    TB
    + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.10 GiB is free. Process 4411 has 78.08 GiB memory in use. Of the allocated memory 76.20 "
    "GiB is allocated by PyTorch, and 1.05 GiB is reserved by PyTorch but unallocated.\n"
)
SAMPLER = (
    TB
    + "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please "
    "try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.\n"
)


@pytest.mark.parametrize(
    ("text", "phase", "flag"),
    [
        (
            frames("compile_or_warm_up_model", "_dummy_sampler_run") + OOM,
            "warmup",
            "--max-num-seqs",
        ),
        (
            frames("compile_or_warm_up_model", "_dummy_sampler_run") + SAMPLER,
            "warmup",
            "--max-num-seqs",
        ),
        (frames("execute_dummy_batch", "_dummy_run") + OOM, "warmup", None),
        (
            frames("determine_available_memory", "profile_run", "_dummy_run") + OOM,
            "profiling",
            None,
        ),
        (
            frames("determine_available_memory", "profile_run", "_dummy_sampler_run") + SAMPLER,
            "profiling",
            "--max-num-seqs",
        ),
        (
            frames("compile_or_warm_up_model", "capture_model", "_dummy_run") + OOM,
            "cuda_graph",
            "--enforce-eager",
        ),
    ],
)
def test_oom_phase_from_frames(tmp_path: Path, text: str, phase: str, flag: str | None) -> None:
    d = run(tmp_path, text)
    e = d.events_of("cuda_oom")[0]
    assert e.phase == phase
    f = finding(d, "cuda-oom")
    if flag:
        assert flag in f.fix
    assert not any(x in f.fix for x in SGLANG_ONLY_FLAGS)


def test_multimodal_merge_frame_is_a_multimodal_prefill(tmp_path: Path) -> None:
    text = frames("execute_model", "_preprocess", "_merge_multimodal_embeddings") + OOM
    d = run(tmp_path, text)
    assert d.events_of("cuda_oom")[0].phase == "prefill"
    assert d.facts.multimodal is True
    f = finding(d, "cuda-oom")
    assert "multimodal request" in f.title and "--limit-mm-per-prompt" in f.fix


def test_vision_frames_in_a_shared_helper_file(tmp_path: Path) -> None:
    # the shape of vllm#38257 (0.1x, DCP): _merge_multimodal_embeddings lives in models/utils.py
    tag = "(Worker_TP7_DCP1_EP7 pid=641) ERROR 03-26 21:14:47 [multiproc_executor.py:949] "
    d = run(
        tmp_path,
        (
            tag
            + "WorkerProc hit an exception.\n"
            + tag
            + "Traceback (most recent call last):\n"
            + tag
            + '  File "/app/.venv/lib/python3.12/site-packages/vllm/model_executor/models/utils.py", line 476, in '
            "_merge_multimodal_embeddings\n"
            + tag
            + "    inputs_embeds.masked_scatter_(\n"
            + tag
            + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 48.00 MiB. GPU 7 has a total capacity "
            "of 79.19 GiB of which 43.00 MiB is free. Including non-PyTorch memory, this process has 79.13 GiB memory in "
            "use. Of the allocated memory 72.09 GiB is allocated by PyTorch.\n"
        ),
    )
    e = d.events_of("cuda_oom")[0]
    assert (e.phase, e.data.get("multimodal_frames")) == ("prefill", True)
    assert d.facts.multimodal is True and d.facts.tp_size_at_least == 8
    assert (
        "Another process" not in finding(d, "cuda-oom").explanation
    )  # only "this process" is listed


def test_every_multimodal_frame_pattern_has_a_hint() -> None:
    from vramdoctor.diagnose import patterns as P

    for alt in P.MM_FRAMES.pattern.split("|"):
        literal = re.sub(r"\\(.)", r"\1", alt)
        assert any(h in literal for h in P.MM_HINTS), alt  # the cheap gate must let it through


def test_no_phase_from_lines_printed_before(tmp_path: Path) -> None:
    # torch.compile / weight-loading lines minutes before an OOM without a traceback of its own
    d = run(
        tmp_path,
        (
            "(EngineCore_DP0 pid=9) INFO 07-21 14:00:01 [gpu_model_runner.py:2] Model loading took 15.2 GiB and 30.1 seconds\n"
            "(EngineCore_DP0 pid=9) INFO 07-21 14:00:40 [monitor.py:34] torch.compile takes 12.3 s in total\n"
            "(EngineCore_DP0 pid=9) INFO 07-21 14:00:41 [monitor.py:81] Initial profiling/warmup run took 0.45 s\n"
            "(EngineCore_DP0 pid=9) ERROR 07-21 15:12:00 [core.py:9] torch.OutOfMemoryError: CUDA out of memory. Tried "
            "to allocate 1.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 0.50 GiB is free.\n"
        ),
    )
    assert d.events_of("cuda_oom")[0].phase is None
    assert "does not show" in finding(d, "cuda-oom").title


def test_an_older_traceback_is_not_this_errors(tmp_path: Path) -> None:
    old = frames("determine_available_memory", "profile_run")
    filler = "".join(TB.replace("ERROR", "INFO") + f"step {i}\n" for i in range(20))
    d = run(tmp_path, old + TB + "RuntimeError: something else\n" + filler + OOM)
    assert d.events_of("cuda_oom")[0].phase is None


# --- no false "another process holds memory" ----------------------------------------------------


def oom_line(gpu: int, procs: str, allocated: str = "22.50 GiB") -> str:
    return (
        f"[2025-05-01 10:00:00 TP{gpu}] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. "
        f"GPU {gpu} has a total capacity of 23.55 GiB of which 300.00 MiB is free. {procs}Of the allocated "
        f"memory {allocated} is allocated by PyTorch, and 200.00 MiB is reserved by PyTorch but unallocated."
    )


def test_one_process_per_gpu_is_the_servers_own_ranks(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        oom_line(0, "Process 133267 has 22.97 GiB memory in use. ")
        + "\n"
        + oom_line(1, "Process 133288 has 22.97 GiB memory in use. ")
        + "\n",
    )
    f = finding(d, "cuda-oom")
    assert (
        "Another process" not in f.explanation
        and "another process" not in f.explanation.lower().replace("not another program", "")
    )
    assert "failing rank itself" in f.explanation


@pytest.mark.parametrize(
    ("procs", "allocated", "why"),
    [
        (
            "Process 133267 has 20.00 GiB memory in use. Process 90001 has 2.90 GiB memory in use. ",
            "19.50 GiB",
            "2 processes hold memory on GPU 0",
        ),
        (
            "Process 90001 has 2.90 GiB memory in use. Including non-PyTorch memory, this process has 20.00 GiB "
            "memory in use. ",
            "19.50 GiB",
            "also holds memory of process(es) 90001",
        ),
        (
            "Process 90001 has 6.00 GiB memory in use. ",
            "16.50 GiB",
            "less than PyTorch alone reserved",
        ),
    ],
)
def test_another_process_only_when_the_message_proves_it(
    tmp_path: Path, procs: str, allocated: str, why: str
) -> None:
    d = run(tmp_path, oom_line(0, procs, allocated) + "\n")
    f = finding(d, "cuda-oom")
    assert "Another process holds memory on this GPU" in f.explanation and why in f.explanation


def test_shipped_vllm_example_makes_no_false_claim() -> None:
    d = diagnose([EXAMPLES / "vllm_llama3.2-11b-vision-tp2_mm-profiling-oom.log"])
    f = finding(d, "cuda-oom")
    assert "Another process holds" not in f.explanation
    assert "failing rank itself" in f.explanation


# --- no assertion from absence ------------------------------------------------------------------


def test_helper_model_file_says_nothing_about_multimodality(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        (
            "[2025-05-01 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/sgl-workspace/sglang/python/sglang/srt/models/utils.py", line 80, in apply_qk_norm\n'
            "    q = q_norm(q)\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 0.50 GiB is free.\n"
        ),
    )
    assert d.facts.multimodal is None and d.facts.fast_image_processor is None
    text_only = run(
        tmp_path,
        d.files[0].file
        and Path(d.files[0].file).read_text().replace("models/utils.py", "models/llama.py"),
        "llama.log",
    )
    # a language-model file does not tell either: VLMs run their LM there (Llava in llama.py)
    assert text_only.facts.multimodal is None and text_only.facts.fast_image_processor is None


# --- every rule's fix in the server's own flags -------------------------------------------------

FACTS = dict(
    model="Qwen/Qwen2.5-VL-7B-Instruct",
    architecture="Qwen2_5_VLForConditionalGeneration",
    multimodal=True,
    tp_size=4,
    mem_fraction_static=0.9,
    gpu_memory_utilization=0.95,
    fast_image_processor=True,
    cuda_ipc_transport=True,
    tokenizer_worker_num=2,
    avail_after_graph_mib=500.0,
    cuda_graph_mib=2048.0,
    cuda_graph_max_bs=160,
    swap_space_mib=40960.0,
    host_memory_mib=65536.0,
    long_context_length=131072,
    weights_mib=15000.0,
)
OOM_DATA = {
    "requested_mib": 1024.0,
    "gpu": 0,
    "total_mib": 81920.0,
    "free_mib": 300.0,
    "allocated_mib": 70000.0,
    "processes": [{"pid": 1, "mib": 70000.0}, {"pid": 2, "mib": 900.0}],
    "reserved_unallocated_mib": 2048.0,
}
EVENTS: list[tuple[str, str | None, dict]] = [
    *[
        ("cuda_oom", ph, OOM_DATA)
        for ph in (
            "weight_load",
            "kv_cache_alloc",
            "cuda_graph",
            "profiling",
            "mm_profiling",
            "warmup",
            "prefill",
            "decode",
            None,
        )
    ],
    ("cuda_oom", "warmup", {**OOM_DATA, "sampler": True}),
    ("cuda_oom", "prefill", {**OOM_DATA, "multimodal_frames": True}),
    *[
        ("kv_budget_error", "kv_cache_alloc", {"reason": r})
        for r in ("no_memory_for_cache_blocks", "sglang_not_enough_memory_for_kv_pool")
    ],
    (
        "kv_budget_error",
        "kv_cache_alloc",
        {
            "reason": "max_seq_len_exceeds_kv_cache",
            "max_seq_len": 131072,
            "needed_mib": 16384.0,
            "available_mib": 9000.0,
        },
    ),
    (
        "kv_budget_error",
        "startup",
        {
            "reason": "free_memory_below_utilization",
            "free_mib": 2150.4,
            "total_mib": 45455.4,
            "gpu_memory_utilization": 0.9,
        },
    ),
    (
        "kv_budget_negative",
        "kv_cache_alloc",
        {
            "reason": "sglang_profiled_tokens_negative",
            "max_total_tokens": 65536,
            "profiled_tokens": -120544,
        },
    ),
    (
        "kv_budget_negative",
        "startup",
        {
            "reason": "vllm_kv_cache_memory_negative",
            "kv_cache_memory_mib": -645.0,
            "gpu_memory_utilization": 0.9,
            "requested_mib": 72980.0,
        },
    ),
    (
        "kv_budget_capped",
        "kv_cache_alloc",
        {
            "reason": "sglang_max_total_tokens_capped",
            "max_total_tokens": 65536,
            "profiled_tokens": 50756,
        },
    ),
    (
        "kv_leak_selfcheck",
        None,
        {
            "pool": "token",
            "total": 100,
            "available": 90,
            "evictable": 5,
            "protected": 0,
            "leaked": 5,
            "double_free": False,
        },
    ),
    ("retraction", "decode", {"retracted_reqs": 3}),
    ("triton_shared_memory", None, {"required_bytes": 163840, "limit_bytes": 101376}),
    ("host_oom", None, {"killer": "ray memory monitor"}),
    ("cuda_graph_capture_failed", "cuda_graph", {"cause": "AssertionError: draft model mismatch"}),
    ("mm_feature_pool_full", None, {"tensor_mib": 37.5, "pool_mib": 1024.0}),
    ("req_slots_exhausted", None, {}),
    ("rdma_registration_failed", None, {"address": "0x7c1cda000000", "error": "Bad address [14]"}),
    ("mm_preprocess_gpu_oom", "preprocessing", {}),
    ("server_crash", None, {"process": "Scheduler"}),
    ("kv_pool_exhausted", "prefill", {"fatal": True, "requested_tokens": 8192}),
    # the other servers' events and the new causes
    *[
        ("cuda_oom", ph, {**OOM_DATA, "free_mib": 4096.0})  # a request smaller than the free memory
        for ph in ("weight_load", "prefill")
    ],
    ("cuda_oom", "decode", {**OOM_DATA, "requested_mib": 30000.0, "free_mib": 100.0}),  # outsized
    *[
        ("cuda_oom", ph, {"requested_mib": 4480.0, "gpu": 0})
        for ph in ("compute_buffer", "startup", "distributed_init", "preprocessing", "serving")
    ],
    ("kv_budget_error", "warmup", {"reason": "tgi_prefill_tokens", "prefill_tokens": 4096}),
    (
        "triton_shared_memory",
        None,
        {"required_bytes": 196608, "limit_bytes": 65536, "inductor": True},
    ),
    ("ipc_transport_failed", None, {"runtime": "HIP", "error": "invalid device pointer"}),
    ("gpu_memory_fault", None, {"node": 2, "reason": "Unknown"}),
    ("memory_error_unread", None, {"matched": "out of memory"}),
    ("host_oom", None, {"killer": "ollama memory check", "requested": "5.5 GiB"}),
    (
        "cuda_oom",
        "kv_cache_alloc",
        {"trt_executor": True, "component": "KV cache", "free_mib": 1024.0, "total_mib": 8192.0},
    ),
    (
        "cuda_oom",
        "compute_buffer",
        {
            "requested_mib": 100.0,
            "retried": "r",
            "retried_line": 2,
            "recovered": "ok",
            "recovered_line": 3,
        },
    ),
    ("cli_error", None, {"program": "vllm serve", "error": "argument --limit-mm-per-prompt: x"}),
    ("trtllm_kv_default_fraction", None, {"kv_share": 0.9}),
    (
        "traceback_cut",
        "weight_load",
        {"frames": ["turbomind.py in _create_weight"], "inductor": False},
    ),
    ("traceback_cut", None, {"frames": ["compile_fx.py in codegen_and_compile"], "inductor": True}),
    (
        "kernel_image_invalid",
        None,
        {"error": "RuntimeError: Triton Error [CUDA]: device kernel image is invalid"},
    ),
]


def _diagnosis(
    server: str | None, kind: str, phase: str | None, data: dict, platform: str | None = None
) -> Diagnosis:
    n = 25 if kind == "retraction" else 1
    events = [
        LogEvent(kind, "server.log", i + 1, f"{kind} line", phase, dict(data)) for i in range(n)
    ]
    if kind == "kernel_image_invalid":
        events.append(LogEvent("server_crash", "server.log", 9, "crash", None, {"report": True}))
    facts = Facts(**FACTS, platform=platform)
    if server == "trtllm":
        facts.kv_available_mib, facts.total_gpu_mib = (
            112.6,
            22722.6,
        )  # TensorRT-LLM's tiny-KV figures
    if server == "lmdeploy":
        facts.kv_share = 0.99  # LMDeploy's --cache-max-entry-count 0.99
    return Diagnosis([], server, None, facts, events, {kind: n})


def _has(text: str, flags: tuple[str, ...]) -> list[str]:
    return [f for f in flags if re.search(re.escape(f) + r"(?![\w-])", text)]


SERVERS = ("sglang", "vllm", "tgi", "trtllm", "llamacpp", "ollama", "lmdeploy", None)
PLATFORMS = ("cuda", "rocm", "npu", None)


def test_every_rule_fixes_in_its_servers_flags_and_platforms_options() -> None:
    """Rule x server x platform: every fix names only the diagnosed server's own flags (for an
    unknown server: SGLang's and vLLM's, labelled, or neither) and no option another platform alone has."""
    fired: set[str] = set()
    for kind, phase, data in EVENTS:
        for server in SERVERS:
            for platform in PLATFORMS:
                for f in evaluate(_diagnosis(server, kind, phase, data, platform)):
                    fired.add(f.id)
                    where = f"{f.id} ({kind}/{phase}) on {server}/{platform}: {f.fix}"
                    sgl, vll = _has(f.fix, SGLANG_ONLY_FLAGS), _has(f.fix, VLLM_ONLY_FLAGS)
                    if server == "sglang":
                        assert not vll, where
                    elif server == "vllm":
                        assert not sgl, where
                    elif server is None:
                        assert bool(sgl) == bool(vll) or not (sgl or vll), where
                    assert not foreign_flags(server, f.fix), (foreign_flags(server, f.fix), where)
                    assert not platform_forbidden(platform, f.fix), (
                        platform_forbidden(platform, f.fix),
                        where,
                    )
    assert fired == {r.id for r in all_rules()}, "every rule must fire at least once in this test"


def test_real_multi_pool_excerpts() -> None:
    extra = ROOT / "tests" / "fixtures" / "logs" / "extra"
    d = diagnose(
        [next(extra.glob("07_*.log"))]
    )  # sglang#36081, 0.5.18: the deficit is in the SWA pool
    e = d.events_of("kv_leak_selfcheck")[0]
    assert {k: v["leaked"] for k, v in e.data["pools"].items()} == {"full": 0, "swa": 256}
    assert "[swa]" in finding(d, "sglang-kv-selfcheck-leak").explanation
    d = diagnose(
        [next(extra.glob("08_*.log"))]
    )  # sglang#27789: busy SWA check counting one page twice
    assert [x.data["leaked"] for x in d.events_of("kv_leak_selfcheck")] == [-256]
    assert "256 slot(s) counted twice" in finding(d, "sglang-kv-selfcheck-leak").explanation


def test_real_own_rank_and_sampler_excerpts() -> None:
    extra = ROOT / "tests" / "fixtures" / "logs" / "extra"
    d = diagnose([next(extra.glob("13_*.log"))])  # vllm#15105: the failing rank's own memory, GPU 1
    f = finding(d, "cuda-oom")
    assert "Another process" not in f.explanation and "failing rank itself" in f.explanation
    d = diagnose([next(extra.glob("14_*.log"))])  # vllm#17939: sampler warm-up, ranks 0-1
    assert "--max-num-seqs" in finding(d, "cuda-oom").fix and d.facts.tp_size_is_lower_bound is True
    d = diagnose([next(extra.glob("15_*.log"))])  # vllm#14452: ranks 0, 2, 7 only
    assert (d.facts.tp_size, d.facts.tp_size_at_least) == (None, 8)


def test_enginecore_numbered_tag_of_vllm_0_10(tmp_path: Path) -> None:
    lines = [
        f"(EngineCore_0 pid=2739080) INFO 09-08 19:01:0{i} [core.py:700] step {i}" for i in range(3)
    ]
    d = run(tmp_path, "\n".join(lines) + "\n")
    assert d.server == "vllm" and d.files[0].recognised
