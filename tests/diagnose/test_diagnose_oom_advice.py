"""OOM phase and advice: NCCL / distributed start-up, SGLang's fast image processor, the memory share.

Cases 04, 07, 12, 12b are the files in tests/fixtures/logs/review12b/. Variants follow the
servers' own frames and wordings: SGLang ModelRunner `init_torch_distributed` -> `initialize_model_parallel`
-> `init_model_parallel_group` (torch's `NCCL error in: ...ProcessGroupNCCL.cpp ... unhandled cuda error`
with "Last error:\\nCuda failure 'out of memory'"); vLLM Worker `init_device` ->
`init_worker_distributed_environment` -> pynccl.py `PyNcclCommunicator.__init__` (`RuntimeError: NCCL
error: unhandled cuda error`) with NCCL's own WARN line, which NCCL prints when the failure happens, i.e.
before the traceback; SGLang's tokenizer manager -> `process_mm_data` -> transformers
`image_processing_qwen2_vl_fast.py`; vLLM V1 `check_enough_kv_cache_memory` ("... the estimated maximum
model length is N.").
"""

from __future__ import annotations

from pathlib import Path

from vramdoctor.diagnose import Diagnosis, diagnose
from vramdoctor.diagnose.findings import Finding

CASES = Path(__file__).parents[1] / "fixtures" / "logs" / "review12b"
CASE_04 = CASES / "04-vllm-kv-budget-contradictory-utilization-advice.log"
CASE_07 = CASES / "07-sglang-tokenizer-fast-image-processor-oom-phase-unknown.log"
CASE_12 = CASES / "12-sglang-nccl-init-oom-told-lower-mem-fraction.log"
CASE_12B = CASES / "12b-vllm-nccl-init-oom-told-lower-utilization.log"


def one(d: Diagnosis, rule: str) -> Finding:
    found = [f for f in d.findings if f.id == rule]
    assert len(found) == 1, [f.id for f in d.findings]
    return found[0]


def oom_phase(d: Diagnosis) -> str | None:
    evs = [e for e in d.events if e.kind == "cuda_oom"]
    assert len(evs) == 1
    return evs[0].phase


def write(tmp_path: Path, text: str) -> Diagnosis:
    p = tmp_path / "server.log"
    p.write_text(text)
    return diagnose([p])


# --- an OOM during NCCL / distributed start-up -------------------------------------------------


def _assert_startup_full_gpu(f: Finding, fraction_flag: str) -> None:
    text = f.title + " " + f.explanation + " " + f.fix
    assert "NCCL" in f.title and "before any weights or KV cache" in f.title
    assert "already (nearly) full when the server started" in f.explanation
    assert "leftover server" in f.explanation and "two ranks mapped to one GPU" in f.explanation
    assert (
        "nvidia-smi" in f.fix and "vramdoctor census" in f.fix and "CUDA_VISIBLE_DEVICES" in f.fix
    )
    # never "lower the share": the server had reserved nothing yet
    assert f"{fraction_flag} cannot help" in f.fix
    assert f"lower {fraction_flag}" not in text.lower().replace("lower --", "lower --")
    assert f"Lower {fraction_flag}" not in text
    # NCCL's message has no figures: nothing was cut off
    assert "cut off" not in text
    assert "carries no figures" in f.explanation


def test_sglang_nccl_init_oom_is_distributed_init_not_mem_fraction() -> None:
    d = diagnose([CASE_12])
    assert oom_phase(d) == "distributed_init"
    f = one(d, "cuda-oom")
    _assert_startup_full_gpu(f, "--mem-fraction-static")
    assert "--tp-size" in f.fix and "--gpu-memory-utilization" not in f.fix


def test_vllm_pynccl_init_oom_is_distributed_init_not_utilization() -> None:
    d = diagnose([CASE_12B])
    assert oom_phase(d) == "distributed_init"
    f = one(d, "cuda-oom")
    _assert_startup_full_gpu(f, "--gpu-memory-utilization")
    assert "--tensor-parallel-size" in f.fix and "--mem-fraction-static" not in f.fix


def test_nccl_warn_line_before_its_traceback_takes_the_traceback_below(tmp_path: Path) -> None:
    """NCCL prints its WARN when cudaMalloc fails, before Python raises: the traceback after it is the
    WARN's own (its exception line is NCCL's)."""
    lines = CASE_12B.read_text().splitlines()
    warn = lines.pop(15)
    assert "NCCL WARN" in warn
    lines.insert(2, warn)
    d = write(tmp_path, "\n".join(lines) + "\n")
    assert oom_phase(d) == "distributed_init"


def test_warn_line_before_an_unrelated_traceback_stays_unplaced(tmp_path: Path) -> None:
    lines = CASE_12B.read_text().splitlines()
    warn = lines.pop(15)
    assert lines[-1].endswith(
        "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
    )
    lines[-1] = lines[-1].split("RuntimeError:")[0] + "ValueError: bad value"
    lines.insert(2, warn)
    d = write(tmp_path, "\n".join(lines) + "\n")
    assert oom_phase(d) is None


def test_torch_oom_in_init_device_names_the_other_process(tmp_path: Path) -> None:
    """A torch OOM with figures during vLLM's init_device: the phase and the listed process."""
    text = (
        "(APIServer pid=100) INFO 10-20 09:00:00 [api_server.py:1896] vLLM API server version 0.11.0\n"
        "(EngineCore_DP0 pid=200) ERROR 10-20 09:00:20 [core.py:708] EngineCore failed to start.\n"
        "(EngineCore_DP0 pid=200) ERROR 10-20 09:00:20 [core.py:708] Traceback (most recent call last):\n"
        '(EngineCore_DP0 pid=200) ERROR 10-20 09:00:20 [core.py:708]   File "/usr/lib/vllm/v1/worker/gpu_worker.py", line 179, in init_device\n'
        "(EngineCore_DP0 pid=200) ERROR 10-20 09:00:20 [core.py:708]     init_worker_distributed_environment(self.vllm_config, self.rank,\n"
        '(EngineCore_DP0 pid=200) ERROR 10-20 09:00:20 [core.py:708]   File "/usr/lib/vllm/distributed/parallel_state.py", line 1120, in init_distributed_environment\n'
        "(EngineCore_DP0 pid=200) ERROR 10-20 09:00:20 [core.py:708]     torch.distributed.init_process_group(\n"
        "(EngineCore_DP0 pid=200) ERROR 10-20 09:00:20 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 12.00 MiB is free. "
        "Process 4242 has 78.60 GiB memory in use. Including non-PyTorch memory, this process has 520.00 MiB "
        "memory in use. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by "
        "PyTorch but unallocated.\n"
    )
    d = write(tmp_path, text)
    assert oom_phase(d) == "distributed_init"
    f = one(d, "cuda-oom")
    assert "process 4242 held 78.60 GiB" in f.explanation
    assert "Another process holds memory" in f.explanation
    assert "cut off" not in f.explanation and "carries no figures" not in f.explanation


def test_pynccl_all_reduce_while_serving_is_not_distributed_init(tmp_path: Path) -> None:
    """pynccl.py's all_reduce runs in every forward pass: only its constructor is start-up."""
    text = (
        "[2025-09-14 03:22:20 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 900, in event_loop_normal\n'
        "    result = self.run_batch(batch)\n"
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1500, in forward_extend\n'
        "    return self.model.forward(\n"
        '  File "/sgl/python/sglang/srt/distributed/device_communicators/pynccl.py", line 140, in all_reduce\n'
        "    self.nccl.ncclAllReduce(\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.19 GiB of which 1.00 GiB is free.\n"
    )
    assert oom_phase(write(tmp_path, text)) == "prefill"


# --- OOM in SGLang's fast image processor (tokenizer process) -----------------------------------


def test_tokenizer_fast_image_processor_oom_is_preprocessing_in_the_tokenizer() -> None:
    d = diagnose([CASE_07])
    assert oom_phase(d) == "preprocessing"
    ev = next(e for e in d.events if e.kind == "cuda_oom")
    assert ev.data["preprocess_process"] == "tokenizer"
    f = one(d, "cuda-oom")
    assert "multimodal preprocessing" in f.title
    # the 75 GiB process is the server's own scheduler, not another program
    assert "process 5555 (75.10 GiB) is that scheduler" in f.explanation
    assert "Another process holds memory" not in f.explanation
    assert "tokenizer process" in f.explanation
    assert "--disable-fast-image-processor" in f.fix
    assert "--image-processor-backend pil" in f.fix and "0.5.19" in f.fix
    assert "the traceback does not show the phase" not in f.fix


def test_scheduler_materialising_mm_inputs_is_preprocessing_in_the_scheduler(
    tmp_path: Path,
) -> None:
    text = (
        "[2025-09-14 03:22:10] server_args=ServerArgs(model_path='Qwen/Qwen2.5-VL-7B-Instruct', tp_size=1)\n"
        "[2025-09-14 03:22:20 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 1200, in handle_generate_request\n'
        "    image_inputs = self._process_and_broadcast_mm_inputs(recv_req.mm_inputs)\n"
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 1100, in _process_and_broadcast_mm_inputs\n'
        "    image_inputs = MultimodalInputs.from_dict(raw_mm_inputs)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity "
        "of 79.19 GiB of which 100.00 MiB is free.\n"
    )
    d = write(tmp_path, text)
    assert oom_phase(d) == "preprocessing"
    ev = next(e for e in d.events if e.kind == "cuda_oom")
    assert ev.data["preprocess_process"] == "scheduler"
    assert "scheduler materialising" in one(d, "cuda-oom").explanation


# --- one direction for the memory share ---------------------------------------------------------


def test_kv_budget_leads_with_the_max_model_len_vllm_names_and_never_raises_the_share() -> None:
    d = diagnose([CASE_04])
    kv = one(d, "kv-budget-error")
    mm = one(d, "mem-fraction-high-multimodal")
    assert kv.fix.startswith("Set --max-model-len 16624 or lower")
    assert "Raise --gpu-memory-utilization" not in kv.fix
    assert "raise --gpu-memory-utilization" not in kv.fix.replace("not raise", "")
    assert "Lower --gpu-memory-utilization" in mm.fix
    # the trade-off is said once, in the KV-budget finding
    assert "trades KV cache for encoder headroom" in kv.fix
    assert "trades" not in mm.fix


def test_kv_budget_without_multimodal_pressure_still_may_raise(tmp_path: Path) -> None:
    """A text model: leading with the fitting length, raising the share stays a lever."""
    text = CASE_04.read_text().replace("Qwen2.5-VL-32B-Instruct", "Qwen2.5-32B-Instruct")
    text = "\n".join(x for x in text.splitlines() if "Encoder cache" not in x) + "\n"
    d = write(tmp_path, text)
    assert not [f for f in d.findings if f.id == "mem-fraction-high-multimodal"]
    kv = one(d, "kv-budget-error")
    assert kv.fix.startswith("Set --max-model-len 16624 or lower")
    assert "raise --gpu-memory-utilization" in kv.fix


def test_kv_budget_v0_message_names_the_fitting_length(tmp_path: Path) -> None:
    text = (
        "INFO 06-01 10:00:00 api_server.py:600] vLLM API server version 0.6.3\n"
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
        "stored in KV cache (12000). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.\n"
    )
    kv = one(write(tmp_path, text), "kv-budget-error")
    assert kv.fix.startswith("Set --max-model-len 12000 or lower")


def test_kv_budget_sglang_not_enough_memory_with_high_multimodal_fraction_never_raises(
    tmp_path: Path,
) -> None:
    text = (
        "[2025-05-20 10:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-VL-72B-Instruct', "
        "mem_fraction_static=0.9, tp_size=2)\n"
        "[2025-05-20 10:00:20 TP0] Load weight end. type=Qwen2_5_VLForConditionalGeneration, "
        "dtype=torch.bfloat16, avail mem=3.10 GB, mem usage=68.20 GB.\n"
        "[2025-05-20 10:00:21 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1100, in init_memory_pool\n'
        "    raise RuntimeError(\n"
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    )
    d = write(tmp_path, text)
    kv = one(d, "kv-budget-error")
    assert "Lower --mem-fraction-static" in one(d, "mem-fraction-high-multimodal").fix
    assert "Raise --mem-fraction-static" not in kv.fix
    assert "do not raise --mem-fraction-static" in kv.fix


def test_torchvision_transform_frames_in_the_tokenizer_are_preprocessing(tmp_path: Path) -> None:
    text = (
        "[2025-05-20 11:00:00] Exception in ASGI application\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/sglang/srt/managers/tokenizer_manager.py", line 470, in _tokenize_one_request\n'
        "    mm_inputs = await self.mm_data_processor.process(\n"
        '  File "/usr/lib/torchvision/transforms/v2/functional/_geometry.py", line 260, in resize_image\n'
        "    image = interpolate(image, size=size, mode=interpolation.value)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity "
        "of 79.19 GiB of which 1.00 GiB is free.\n"
    )
    assert oom_phase(write(tmp_path, text)) == "preprocessing"
