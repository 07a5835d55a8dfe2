"""The phase of an OOM from the frames' FUNCTION names (a CUDA graph
replay while serving is not a capture; vLLM's execute_model is serving), the server's own CUDA contexts
never called "another process" (vLLM's start-up free-memory check, a sibling TP rank in another GPU's
OOM message), the worst GPU when several ranks fail the start-up check, and PyTorch's per-process
memory-fraction OOM (the cudaMallocAsync message with its figures on the following lines, the caching
allocator's "X allowed;").

The cases are the files in tests/fixtures/logs/review12/; the other texts
are built from the servers' and PyTorch's own format strings: SGLang model_executor/cuda_graph_runner.py
(`capture`, `capture_one_batch_size`, `replay_prepare`, `replay`), cuda_graph_runner/decode_runner.py
and prefill_runner.py, piecewise_cuda_graph_runner.py; vLLM v1/worker/gpu_model_runner.py
(`capture_model`, `_capture_cudagraphs`, `_dummy_run`, `execute_model`), compilation/cuda_graph.py
(`CUDAGraphWrapper.__call__`); PyTorch c10/cuda/CUDACachingAllocator.cpp (`allowed_info`) and
c10/cuda/CUDAMallocAsyncAllocator.cpp ("Allocation on device N would exceed allowed memory.").
Every test here fails on the code before the review-12 change (see each test's comment).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vramdoctor.diagnose import Diagnosis, diagnose
from vramdoctor.diagnose.rules._common import SGLANG_ONLY_FLAGS, VLLM_ONLY_FLAGS

CASES = Path(__file__).parents[1] / "fixtures" / "logs" / "review12"


def case(prefix: str) -> Diagnosis:
    return diagnose([next(CASES.glob(prefix + "-*.log"))])


def run(tmp_path: Path, text: str) -> Diagnosis:
    p = tmp_path / "server.log"
    p.write_text(text)
    return diagnose([p])


def finding(d: Diagnosis, rule: str):
    return next(f for f in d.findings if f.id == rule)


def oom(d: Diagnosis):
    return d.events_of("cuda_oom")[0]


OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 605.88 MiB is free. Including non-PyTorch memory, this process has 78.56 GiB memory in "
    "use. Of the allocated memory 75.21 GiB is allocated by PyTorch, and 210 MiB is reserved by PyTorch but "
    "unallocated.\n"
)
SGL = "/sgl-workspace/sglang/python/sglang/srt"


def sgl_frames(*frames: tuple[str, str]) -> str:
    out = (
        "[2025-09-14 03:25:10 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    )
    for path, func in frames:
        out += f'  File "{SGL}/{path}", line 100, in {func}\n    x = y()\n'
    return out + OOM


VLLM_TAG = "(Worker_TP0 pid=510) ERROR 11-02 10:02:00 [multiproc_executor.py:671] "
VLLM_PKG = "/usr/local/lib/python3.12/dist-packages/vllm"


def vllm_frames(*frames: tuple[str, str]) -> str:
    out = (
        VLLM_TAG
        + "WorkerProc hit an exception.\n"
        + VLLM_TAG
        + "Traceback (most recent call last):\n"
    )
    for path, func in frames:
        out += VLLM_TAG + f'  File "{VLLM_PKG}/{path}", line 100, in {func}\n'
        out += VLLM_TAG + "    x = y()\n"
    return out + VLLM_TAG + OOM


# --- a CUDA graph replay while serving is decode (or prefill), not capture ----------------------


def test_sglang_decode_oom_in_graph_replay_is_decode() -> None:
    # old code: phase "cuda_graph" from the file name cuda_graph_runner.py; title "during CUDA graph capture"
    d = case("09")
    assert oom(d).phase == "decode"
    f = finding(d, "cuda-oom")
    assert "capture" not in f.title and "decode" in f.title
    assert "--disable-cuda-graph" not in f.fix and "Graph capture" not in f.fix


@pytest.mark.parametrize(
    ("runner", "phase"),
    [
        ("model_executor/cuda_graph_runner.py", "decode"),
        ("model_executor/cuda_graph_runner/decode_runner.py", "decode"),
        ("speculative/eagle_draft_extend_cuda_graph_runner.py", "decode"),
        ("model_executor/piecewise_cuda_graph_runner.py", "prefill"),
        ("model_executor/breakable_cuda_graph_runner.py", "prefill"),
        ("model_executor/cuda_graph_runner/prefill_runner.py", "prefill"),
    ],
)
def test_replay_frames_tell_decode_or_prefill(tmp_path: Path, runner: str, phase: str) -> None:
    # old code: every one of these was "cuda_graph" (file name) or null (the new runner files)
    text = sgl_frames(
        ("managers/scheduler.py", "event_loop_overlap"),
        ("model_executor/model_runner.py", "_forward_raw"),
        (runner, "replay"),
        (runner, "replay_prepare"),
        ("layers/attention/flashinfer_backend.py", "init_forward_metadata_replay_cuda_graph"),
    )
    assert oom(run(tmp_path, text)).phase == phase


@pytest.mark.parametrize(
    "frames",
    [
        # SGLang up to 0.5.x: ModelRunner.init_cuda_graphs -> CudaGraphRunner.__init__ -> capture -> ...
        (
            ("model_executor/model_runner.py", "init_cuda_graphs"),
            ("model_executor/cuda_graph_runner.py", "__init__"),
            ("model_executor/cuda_graph_runner.py", "capture"),
            ("model_executor/cuda_graph_runner.py", "capture_one_batch_size"),
            ("model_executor/cuda_graph_runner.py", "run_once"),
        ),
        # an excerpt that keeps only the innermost capture frames
        (
            ("model_executor/cuda_graph_runner.py", "capture_one_batch_size"),
            ("model_executor/cuda_graph_runner.py", "run_once"),
        ),
        # the 2026 runners: capture_one_shape / _capture_graph; a recapture while serving is a capture
        (
            ("managers/scheduler.py", "event_loop_normal"),
            ("model_executor/cuda_graph_runner/decode_runner.py", "replay_prepare"),
            ("model_executor/cuda_graph_runner/decode_runner.py", "recapture_if_needed"),
            ("model_executor/cuda_graph_runner/decode_runner.py", "capture"),
            ("model_executor/cuda_graph_runner/decode_runner.py", "capture_one_shape"),
        ),
        # a graph runner's constructor allocating its buffers before the capture
        (
            ("model_executor/model_runner.py", "init_device_graphs"),
            ("model_executor/piecewise_cuda_graph_runner.py", "__init__"),
        ),
    ],
)
def test_capture_frames_stay_capture(tmp_path: Path, frames: tuple[tuple[str, str], ...]) -> None:
    assert oom(run(tmp_path, sgl_frames(*frames))).phase == "cuda_graph"


def test_vllm_capture_through_cuda_graph_wrapper_is_capture(tmp_path: Path) -> None:
    text = vllm_frames(
        ("v1/worker/gpu_worker.py", "compile_or_warm_up_model"),
        ("v1/worker/gpu_model_runner.py", "capture_model"),
        ("v1/worker/gpu_model_runner.py", "_capture_cudagraphs"),
        ("v1/worker/gpu_model_runner.py", "_dummy_run"),
        ("compilation/cuda_graph.py", "__call__"),
    )
    d = run(tmp_path, text)
    assert oom(d).phase == "cuda_graph"
    assert "--enforce-eager" in finding(d, "cuda-oom").fix


# --- vLLM's execute_model (and SGLang's event loop) is serving a batch --------------------------


def test_vllm_execute_model_oom_is_serving() -> None:
    # old code: phase null, "at a point the traceback does not show"
    d = case("10")
    assert oom(d).phase == "serving"
    f = finding(d, "cuda-oom")
    assert "serving a batch" in f.title and "does not show" not in f.title
    assert "--max-num-batched-tokens" in f.fix and "--max-num-seqs" in f.fix
    assert not any(x in f.fix for x in SGLANG_ONLY_FLAGS)


def test_sglang_event_loop_without_finer_frame_is_serving(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        sgl_frames(
            ("managers/scheduler.py", "event_loop_normal"),
            ("managers/scheduler.py", "run_batch"),
            ("layers/sampler.py", "forward"),
        ),
    )
    assert oom(d).phase == "serving"
    f = finding(d, "cuda-oom")
    assert "--max-running-requests" in f.fix and not any(x in f.fix for x in VLLM_ONLY_FLAGS)


def test_finer_frames_beat_serving(tmp_path: Path) -> None:
    # forward_extend inside the event loop is a prefill; a dummy pass alone stays warm-up
    d = run(
        tmp_path,
        sgl_frames(
            ("managers/scheduler.py", "event_loop_overlap"),
            ("model_executor/model_runner.py", "forward_extend"),
        ),
    )
    assert oom(d).phase == "prefill"
    d = run(
        tmp_path,
        vllm_frames(
            ("v1/worker/gpu_worker.py", "determine_available_memory"),
            ("v1/worker/gpu_model_runner.py", "profile_run"),
            ("v1/worker/gpu_model_runner.py", "execute_model"),
        ),
    )
    assert oom(d).phase == "profiling"  # vLLM V0 profile_run calls execute_model: the context wins


# --- the start-up check's used memory within the server's own CUDA context --------------------


def test_free_memory_check_own_context_only_blames_the_utilization() -> None:
    # old code: "Another process holds GPU memory ..." and "something else holds about 502 MiB"
    d = case("06")
    f = finding(d, "kv-budget-error")
    assert "Another process" not in f.title and "too high" in f.title
    assert "something else" not in f.explanation and "another process" not in f.explanation.lower()
    assert "502 MiB in use" in f.explanation and "own CUDA context" in f.explanation
    assert "below free/total = 0.989" in f.fix and "stop it" not in f.fix


def test_free_memory_check_beyond_the_contexts_is_another_process(tmp_path: Path) -> None:
    line = (
        "(EngineCore_DP0 pid=2311) ERROR 09-14 03:22:10 [core.py:700] ValueError: Free memory on device cuda:0 "
        "(40.00/44.39 GiB) on startup is less than desired GPU memory utilization (0.95, 42.17 GiB). Decrease GPU "
        "memory utilization or reduce GPU memory used by other processes.\n"
    )
    f = finding(run(tmp_path, line), "kv-budget-error")
    assert "Another process" in f.title and "another process" in f.explanation
    assert "~3.39 GiB on cuda:0" in f.fix and "stop it" in f.fix


def test_free_memory_check_on_a_tp_host_allows_sibling_contexts(tmp_path: Path) -> None:
    # 1.6 GiB in use on a TP=2 host: this rank's context plus, at most, the other rank's
    text = (
        "(APIServer pid=1) INFO 09-14 03:22:00 [api_server.py:1] args: Namespace(model='m', "
        "tensor_parallel_size=2, gpu_memory_utilization=0.98)\n"
        "(Worker_TP0 pid=4242) ERROR 09-14 03:22:10 [multiproc_executor.py:597] ValueError: Free memory on "
        "device cuda:0 (77.59/79.19 GiB) on startup is less than desired GPU memory utilization (0.98, 77.61 "
        "GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n"
    )
    f = finding(run(tmp_path, text), "kv-budget-error")
    assert "Another process" not in f.title
    assert "other ranks' contexts" in f.explanation


# --- several ranks fail the check: the worst GPU sizes the fix --------------------------------


def test_free_memory_check_uses_the_worst_gpu() -> None:
    # old code: only cuda:0 ("below free/total = 0.885 (e.g. 0.87)"), cuda:1 (12.00/79.19 GiB) ignored
    f = finding(case("12"), "kv-budget-error")
    assert "cuda:0: 70.10 GiB of 79.19 GiB free" in f.explanation
    assert "cuda:1: 12.00 GiB of 79.19 GiB free" in f.explanation
    assert "0.885" not in f.fix and "0.87" not in f.fix
    assert "lowest free/total = 0.152 (cuda:1" in f.fix and "e.g. 0.14" in f.fix
    assert "~66.19 GiB on cuda:1" in f.fix and "~8.09 GiB on cuda:0" in f.fix
    assert f.evidence[0].line == 2  # the worst GPU's line first


def test_worst_gpu_among_many_ranks_leads_the_evidence(tmp_path: Path) -> None:
    free = {0: 70.1, 1: 70.0, 2: 69.9, 3: 70.2, 4: 69.8, 5: 12.0, 6: 70.0, 7: 70.3}
    text = "".join(
        f"(Worker_TP{r} pid={4242 + r}) ERROR 09-14 03:22:10 [multiproc_executor.py:597] ValueError: Free memory "
        f"on device cuda:{r} ({v:.2f}/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, "
        "71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n"
        for r, v in free.items()
    )
    f = finding(run(tmp_path, text), "kv-budget-error")
    assert f.evidence[0].line == 6 and "cuda:5" in f.evidence[0].text
    assert "lowest free/total = 0.152 (cuda:5" in f.fix
    assert all(f"cuda:{r}: " in f.explanation for r in free)


# --- a pid another GPU's OOM shows as its failing rank is the server's own --------------------


def test_sibling_tp_rank_in_another_gpus_oom_is_the_servers_own() -> None:
    # old code: "Another process holds memory on this GPU" for pid 3311 (530 MiB on GPU 0)
    d = case("07")
    f = finding(d, "cuda-oom")
    assert "Another process holds memory" not in f.explanation
    assert "Process 3311 (the rank on GPU 1, 530 MiB) is the server's own" in f.explanation
    procs = {p["pid"]: p for p in d.events_of("cuda_oom")[0].data["processes"]}
    assert procs[3311]["server_process"] == "the rank on GPU 1"
    assert "server_process" not in procs[3310]  # the failing process of GPU 0 itself


def test_a_small_pid_no_oom_owns_is_still_another_process(tmp_path: Path) -> None:
    def line(gpu: int, procs: str) -> str:
        return (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total "
            f"capacity of 79.19 GiB of which 1.2 GiB is free. {procs}Of the allocated memory 74.10 GiB is "
            "allocated by PyTorch, and 1.37 GiB is reserved by PyTorch but unallocated.\n"
        )

    text = line(
        0,
        "Process 3310 has 77.45 GiB memory in use. Process 9999 has 530.00 MiB memory in use. ",
    ) + line(
        1, "Process 3311 has 77.45 GiB memory in use. Process 3310 has 530.00 MiB memory in use. "
    )
    d = run(tmp_path, text)
    f = finding(d, "cuda-oom")
    assert "Another process holds memory on this GPU" in f.explanation and "9999" in f.explanation
    gpu1 = {p["pid"]: p for p in d.events_of("cuda_oom")[1].data["processes"]}
    assert gpu1[3310]["server_process"] == "the rank on GPU 0"


def test_a_big_pid_next_to_this_process_is_not_a_rank(tmp_path: Path) -> None:
    # "this process has X" names the failing process: a big pid listed besides it is another program,
    # and its small context on another GPU stays "another process" too
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
        "79.19 GiB of which 1.2 GiB is free. Including non-PyTorch memory, this process has 30.00 GiB memory in "
        "use. Process 7777 has 47.00 GiB memory in use. Of the allocated memory 28.10 GiB is allocated by "
        "PyTorch, and 1.37 GiB is reserved by PyTorch but unallocated.\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 1.2 GiB is free. Process 3310 has 77.45 GiB memory in use. Process 7777 has 530.00 "
        "MiB memory in use. Of the allocated memory 74.10 GiB is allocated by PyTorch, and 1.37 GiB is reserved "
        "by PyTorch but unallocated.\n"
    )
    d = run(tmp_path, text)
    gpu0 = {p["pid"]: p for p in d.events_of("cuda_oom")[1].data["processes"]}
    assert "server_process" not in gpu0[7777]


# --- PyTorch's per-process memory fraction --------------------------------------------------


def test_cuda_malloc_async_fraction_oom_reads_the_following_lines() -> None:
    # old code: "figures cut off in the log", the 72 GiB limit and 7 GiB free missed
    d = case("13")
    e = oom(d)
    assert e.data["allowed_mib"] == 72 * 1024 and e.data["free_mib"] == 7 * 1024
    assert e.data["requested_mib"] == 2048 and e.data["total_mib"] == 81090.56
    f = finding(d, "cuda-oom")
    assert "cut off" not in f.explanation
    assert "per-process memory limit" in f.title
    assert "72.00 GiB of the GPU's 79.19 GiB" in f.explanation
    assert "The limit, not the GPU, refused the allocation" in f.explanation
    assert "set_per_process_memory_fraction" in f.fix
    assert d.facts.total_gpu_mib == 81090.56


def test_cuda_malloc_async_fraction_oom_under_vllm_process_tags(tmp_path: Path) -> None:
    tag = "(EngineCore_DP0 pid=2311) ERROR 09-14 03:22:10 [core.py:700] "
    text = "".join(
        tag + x + "\n"
        for x in (
            "torch.OutOfMemoryError: Allocation on device 1 would exceed allowed memory. (out of memory)",
            "Currently allocated     : 30.00 GiB",
            "Requested               : 512.00 MiB",
            "Device limit            : 79.19 GiB",
            "Free (according to CUDA): 48.00 GiB",
            "PyTorch limit (set by user-supplied memory fraction)",
            "                        : 30.25 GiB",
        )
    )
    e = oom(run(tmp_path, text))
    assert e.data["gpu"] == 1 and e.data["allowed_mib"] == 30.25 * 1024
    assert e.data["allocated_mib"] == 30 * 1024 and e.data["free_mib"] == 48 * 1024


def test_cuda_malloc_async_without_a_fraction_is_a_full_device(tmp_path: Path) -> None:
    # the limit line is printed always; UINT64_MAX ("17179869184.00 GiB") means no fraction was set
    text = (
        "torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)\n"
        "Currently allocated     : 22.43 GiB\n"
        "Requested               : 4.07 GiB\n"
        "Device limit            : 23.99 GiB\n"
        "Free (according to CUDA): 0 bytes\n"
        "PyTorch limit (set by user-supplied memory fraction)\n"
        "                        : 17179869184.00 GiB\n"
    )
    d = run(tmp_path, text)
    e = oom(d)
    assert "allowed_mib" not in e.data and e.data["free_mib"] == 0.0
    f = finding(d, "cuda-oom")
    assert "per-process" not in f.title and "set_per_process_memory_fraction" not in f.fix
    assert "0 MiB free of 23.99 GiB on GPU 0" in f.explanation


@pytest.mark.parametrize(
    "message",
    [
        # torch 2.2+ caching allocator: "... is free. [proc info]X allowed; Of the allocated memory ..."
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 7.00 GiB is free. Including non-PyTorch memory, this process has 72.10 GiB memory in "
        "use. 72.00 GiB allowed; Of the allocated memory 70.00 GiB is allocated by PyTorch, and 1.50 GiB is "
        "reserved by PyTorch but unallocated.",
        # torch 2.0: "(GPU 0; T total capacity; A already allocated; F free; X allowed; R reserved ...)"
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.19 GiB total "
        "capacity; 70.00 GiB already allocated; 7.00 GiB free; 72.00 GiB allowed; 71.50 GiB reserved in total by "
        "PyTorch)",
    ],
)
def test_caching_allocator_allowed_is_the_fraction(tmp_path: Path, message: str) -> None:
    d = run(tmp_path, message + "\n")
    assert oom(d).data["allowed_mib"] == 72 * 1024
    f = finding(d, "cuda-oom")
    assert "per-process memory limit" in f.title
    assert "7.00 GiB was still free" in f.explanation


def test_zero_bytes_free_is_read(tmp_path: Path) -> None:
    # torch's format_size prints "0 bytes" up to 1 KiB; old code lost GPU, total and free
    d = run(
        tmp_path,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity "
        "of 23.68 GiB of which 0 bytes is free. Including non-PyTorch memory, this process has 23.67 GiB memory "
        "in use. Of the allocated memory 23.20 GiB is allocated by PyTorch, and 512 bytes is reserved by "
        "PyTorch but unallocated.\n",
    )
    e = oom(d)
    assert e.data["gpu"] == 3 and e.data["free_mib"] == 0.0 and e.data["total_mib"] == 24248.32
    assert e.data["reserved_unallocated_mib"] == round(512 / 1048576, 2)
    # the figures as the message prints them ("0 bytes", never re-rounded to "0 MiB")
    assert "0 bytes free of 23.68 GiB on GPU 3" in finding(d, "cuda-oom").explanation


WRAPPED = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 7.00 GiB is free. Process 3310 has 530.00 MiB memory in use. Including non-PyTorch "
    "memory, this process has 72.10 GiB memory in use. 72.00 GiB allowed; Of the allocated memory 70.00 GiB is "
    "allocated by PyTorch, with 1.00 GiB allocated in private pools (e.g., CUDA Graphs), and 1.50 GiB is reserved "
    "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
FIGURES = {
    "requested_mib": 2048.0,
    "gpu": 0,
    "total_mib": 81090.56,
    "free_mib": 7168.0,
    "processes": [{"pid": 3310, "mib": 530.0}],
    "this_process_mib": 73830.4,
    "allowed_mib": 73728.0,
    "allocated_mib": 71680.0,
    "private_pools_mib": 1024.0,
    "reserved_unallocated_mib": 1536.0,
}


@pytest.mark.parametrize("width", [47, 80, 100, 117, 131, 200])
@pytest.mark.parametrize("how", ["words", "columns"])
def test_a_wrapped_oom_message_keeps_every_figure(tmp_path: Path, width: int, how: str) -> None:
    # a pasted issue wraps at words (a row may end at a sentence's "."), a terminal at its column count
    # (mid-word); old code stopped at the first row ending in "." and glued soft-wrapped rows ("ofwhich")
    import textwrap

    rows = (
        textwrap.wrap(WRAPPED, width)
        if how == "words"
        else [WRAPPED[i : i + width] for i in range(0, len(WRAPPED), width)]
    )
    d = run(tmp_path, "\n".join(rows) + "\n[2025-01-01 00:00:00] next record\n")
    data = dict(oom(d).data)
    data.pop("shown", None)  # (the figures' own text, for quoting them)
    assert data == FIGURES


def test_an_enginecore_copy_of_a_placed_worker_oom_adds_no_serving_finding(tmp_path: Path) -> None:
    worker = vllm_frames(
        ("v1/worker/gpu_model_runner.py", "execute_model"),
        ("v1/worker/gpu_model_runner.py", "_execute_mm_encoder"),
    )
    core = (
        "(EngineCore_DP0 pid=300) ERROR 11-02 10:02:01 [core.py:700] EngineCore encountered a fatal error.\n"
        "(EngineCore_DP0 pid=300) ERROR 11-02 10:02:01 [core.py:700] Traceback (most recent call last):\n"
        f'(EngineCore_DP0 pid=300) ERROR 11-02 10:02:01 [core.py:700]   File "{VLLM_PKG}/v1/engine/core.py", '
        "line 300, in step\n"
        "(EngineCore_DP0 pid=300) ERROR 11-02 10:02:01 [core.py:700]     model_output = "
        "self.model_executor.execute_model(scheduler_output)\n"
        "(EngineCore_DP0 pid=300) ERROR 11-02 10:02:01 [core.py:700] RuntimeError: Worker failed with error "
        "'CUDA out of memory. Tried to allocate 1.74 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
        "605.88 MiB is free.', please check the stack trace above for the root cause\n"
    )
    d = run(tmp_path, worker + core)
    assert {e.phase for e in d.events_of("cuda_oom")} == {"prefill", "serving"}
    titles = [f.title for f in d.findings if f.id == "cuda-oom"]
    assert len(titles) == 1 and "multimodal request" in titles[0]
