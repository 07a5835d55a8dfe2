"""Launch commands pasted above a log (real ones, from the issues named) feed the facts."""

from __future__ import annotations

import json
from pathlib import Path

from vramdoctor.diagnose import Facts, diagnose


def named(f: Facts) -> bool | None:
    """What the model's name suggests about multimodality. Nothing is asserted from a name, so
    the fact stays unknown and the name is a hint (facts.hints), said as such."""
    assert f.multimodal is None, f.evidence.get("multimodal")
    hint = f.hints.get("multimodal")
    return None if hint is None else bool(hint["value"])


def run(tmp_path: Path, text: str):
    p = tmp_path / "pasted.log"
    p.write_text(text)
    return diagnose([p])


def test_sglang_one_line_command(tmp_path: Path) -> None:
    # sgl-project/sglang#6888, followed by its real self-check line.
    d = run(
        tmp_path,
        (
            "python -m sglang.launch_server --host 0.0.0.0 --port 30000 --dtype auto --mem-fraction-static 0.95 "
            "--tp-size 2 --max-running-requests 48 --trust-remote-code --enable-cache-report --log-level info "
            "--chunked-prefill-size 4096 --quantization fp8 --enable-torch-compile --cuda-graph-max-bs 64 "
            "--torch-compile-max-bs 32 --model-path Qwen2.5-7B-Instruct --attention-backend flashinfer "
            "--enable-mixed-chunk --log-requests --log-requests-level 2 --page-size 16\n"
            "ValueError: token_to_kv_pool_allocator memory leak detected! available_size=3189424, protected_size=0, "
            "self.max_total_num_tokens=3185200\n"
        ),
    )
    f = d.facts
    assert d.server == "sglang"
    assert (f.model, f.tp_size, f.mem_fraction_static, f.max_running_requests) == (
        "Qwen2.5-7B-Instruct",
        2,
        0.95,
        48,
    )
    assert (f.chunked_prefill_size, f.cuda_graph_max_bs, f.attention_backend) == (
        4096,
        64,
        "flashinfer",
    )
    assert named(f) is False


def test_backslash_continued_commands(tmp_path: Path) -> None:
    # sgl-project/sglang#13940 (SGLang) and vllm-project/vllm#16570 (vLLM), as pasted.
    d = run(
        tmp_path,
        (
            "python -m sglang.launch_server \\\n"
            "  --model-path Qwen/Qwen3-VL-8B-Instruct-FP8 \\\n"
            "  --tp-size 1 \\\n"
            "  --mem-fraction-static 0.7 \\\n"
            "  --context-length 8192 \\\n"
            "  --max-running-requests 128 \\\n"
            "  --host 0.0.0.0 \\\n"
            "  --port 7860 \\\n"
            "  --enable-metrics\n"
        ),
    )
    f = d.facts
    assert (d.server, f.model, f.tp_size, f.mem_fraction_static, f.context_length) == (
        "sglang",
        "Qwen/Qwen3-VL-8B-Instruct-FP8",
        1,
        0.7,
        8192,
    )
    assert named(f) is True and f.fast_image_processor is None  # no flag, no version: unknown
    d = run(
        tmp_path,
        (
            "VLLM_WORKER_MULTIPROC_METHOD=spawn python -m vllm.entrypoints.openai.api_server \\\n"
            "--dtype auto \\\n--port 8009 \\\n--trust-remote-code \\\n--served-model-name qwen2vl \\\n"
            "--model /home/ps/data/pretrained_model/Qwen/Qwen2.5-VL-72B-Instruct/ \\\n--tensor-parallel-size 4 \\\n"
            "--gpu_memory_utilization 0.95 \\\n--max_num_seqs 2 \\\n--max_model_len 8192 \\\n"
            '--mm_processor_kwargs \'{"max_pixels":1280, "min_pixels":256}\'\n'
        ),
    )
    f = d.facts
    assert (
        d.server,
        f.tp_size,
        f.gpu_memory_utilization,
        f.max_model_len,
        f.max_running_requests,
    ) == ("vllm", 4, 0.95, 8192, 2)
    assert (
        f.model == "/home/ps/data/pretrained_model/Qwen/Qwen2.5-VL-72B-Instruct/"
        and named(f) is True
    )


def test_dump_wins_over_command_and_flags_set_the_processor(tmp_path: Path) -> None:
    cmd = (
        "SGLANG_USE_CUDA_IPC_TRANSPORT=1 python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-VL-7B-Instruct "
        "--tp 2 --mem-fraction-static 0.8 --disable-fast-image-processor\n"
    )
    d = run(
        tmp_path,
        cmd
        + "[2025-05-07 10:02:11] server_args=ServerArgs(model_path='Qwen/Qwen2.5-VL-7B-Instruct', "
        "mem_fraction_static=0.75, tp_size=2)\n",
    )
    assert d.facts.mem_fraction_static == 0.75  # the server's resolved value
    assert d.facts.fast_image_processor is False and d.facts.cuda_ipc_transport is True
    assert "sglang-cuda-ipc-tp" in {f.id for f in d.findings}


def test_api_key_in_command_is_blanked(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        "vllm serve meta-llama/Llama-3.1-8B --api-key s3cr3t-value-123 --gpu-memory-utilization 0.9\n"
        "ERROR 01-01 00:00:00 [core.py:1] ValueError: No available memory for the cache blocks. Try "
        "increasing gpu_memory_utilization when initializing the engine.\n",
    )
    assert d.facts.model == "meta-llama/Llama-3.1-8B" and d.facts.gpu_memory_utilization == 0.9
    assert "s3cr3t-value-123" not in json.dumps(d.to_json())
