"""Format generations the real corpus does not cover, built from the servers' format strings.

Each case names the version that prints it; the text follows the source's format string with
plausible values (these are NOT captured logs, the real ones are in tests/fixtures/logs).
"""

from __future__ import annotations

from pathlib import Path

from vramdoctor.diagnose import Facts, diagnose


def named(f: Facts) -> bool | None:
    """What the model's name suggests about multimodality. Nothing is asserted from a name, so
    the fact stays unknown and the name is a hint (facts.hints), said as such."""
    assert f.multimodal is None, f.evidence.get("multimodal")
    hint = f.hints.get("multimodal")
    return None if hint is None else bool(hint["value"])


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "server.log"
    p.write_text(text)
    return p


def test_sglang_0519_dict_args_and_0518_backend_flag(tmp_path: Path) -> None:
    # 0.5.19+: server_args={...}; 0.5.18+: --image-processor-backend; 0.5.x Load weight end with elapsed.
    p = write(
        tmp_path,
        (
            "[2026-03-02 22:23:32] INFO server_args.py:1970: Attention backend not specified. Use fa3 backend by default.\n"
            "[2026-03-02 22:23:32] INFO engine.py:157: server_args={'model_path': 'Qwen/Qwen3-VL-8B-Instruct', "
            "'tp_size': 2, 'dp_size': 1, 'mem_fraction_static': 0.7835956249999999, 'image_processor_backend': 'auto', "
            "'mm_feature_transport': 'cpu', 'tokenizer_worker_num': 1}\n"
            "[2026-03-02 22:23:40 TP0] Load weight end. elapsed=12.31 s, type=Qwen3VLForConditionalGeneration, "
            "avail mem=62.10 GB, mem usage=16.52 GB.\n"
        ),
    )
    d = diagnose([p])
    f = d.facts
    assert (d.server, f.model, f.tp_size, f.mem_fraction_static) == (
        "sglang",
        "Qwen/Qwen3-VL-8B-Instruct",
        2,
        0.7835956249999999,
    )
    # 'auto' lets transformers pick the backend (fast or slow): not shown; and the dict dump is 0.5.19+,
    # which has the request-scoped pool, so the fast-processor warning has nothing to say
    assert f.multimodal is True and f.fast_image_processor is None and f.cuda_ipc_transport is False
    assert f.version_at_least == "0.5.19"
    assert f.attention_backend == "fa3" and f.weights_mib == round(16.52 * 1024, 1)
    assert "sglang-fast-image-processor" not in {x.id for x in d.findings}


def test_sglang_dump_wrapped_by_a_terminal(tmp_path: Path) -> None:
    dump = (
        "[2025-02-09 20:33:04] server_args=ServerArgs(model_path='llava-hf/llava-1.5-7b-hf', tp_size=1, "
        "mem_fraction_static=0.9, attention_backend='flashinfer', disable_fast_image_processor=False, "
        "chunked_prefill_size=8192)"
    )
    wrapped = "\n".join(dump[i : i + 80] for i in range(0, len(dump), 80))
    d = diagnose([write(tmp_path, wrapped + "\n")])
    # only the model's name (llava) says multimodal, so the processor fact stays unknown
    assert d.facts.chunked_prefill_size == 8192 and d.facts.fast_image_processor is None
    assert named(d.facts) is True
    assert d.facts.mem_fraction_static == 0.9
    assert "mem-fraction-high-multimodal" in {x.id for x in d.findings}


def test_vllm_nondefault_args_and_logo(tmp_path: Path) -> None:
    # vLLM 0.9+: "non-default args: {...}"; newer: the ASCII logo with ANSI colours.
    p = write(
        tmp_path,
        (
            "(APIServer pid=1) INFO 09-01 10:00:00 [utils.py:326] \n"
            "(APIServer pid=1) INFO 09-01 10:00:00 [utils.py:326]        \x1b[97;1m\u2588     \u2588     \u2588\u2584   \u2584\u2588\x1b[0m\n"
            "(APIServer pid=1) INFO 09-01 10:00:00 [utils.py:326]  \x1b[93m\u2584\u2584\x1b[0m \x1b[94m\u2584\u2588\x1b[0m "
            "\x1b[97;1m\u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588\x1b[0m  version \x1b[97;1m0.11.2\x1b[0m\n"
            "(APIServer pid=1) INFO 09-01 10:00:00 [utils.py:326]   \x1b[93m\u2588\x1b[0m\x1b[94m\u2584\u2588\u2580\x1b[0m "
            "\x1b[97;1m\u2588     \u2588     \u2588     \u2588\x1b[0m  model   \x1b[97;1mQwen/Qwen2.5-VL-7B-Instruct\x1b[0m\n"
            "(APIServer pid=1) INFO 09-01 10:00:00 [api_server.py:1] non-default args: {'model_tag': "
            "'Qwen/Qwen2.5-VL-7B-Instruct', 'tensor_parallel_size': 2, 'gpu_memory_utilization': 0.95, "
            "'max_model_len': 32768}\n"
        ),
    )
    d = diagnose([p])
    f = d.facts
    assert (d.server, d.version, f.model) == ("vllm", "0.11.2", "Qwen/Qwen2.5-VL-7B-Instruct")
    assert (f.tp_size, f.gpu_memory_utilization, f.max_model_len, named(f)) == (
        2,
        0.95,
        32768,
        True,
    )
    assert "mem-fraction-high-multimodal" in {x.id for x in d.findings}


def test_vllm_logo_disabled_form(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "INFO 09-01 10:00:00 [api_server.py:1] vLLM server version 0.12.0, serving model meta-llama/Llama-3.1-8B\n",
    )
    d = diagnose([p])
    assert (d.version, d.facts.model, named(d.facts)) == (
        "0.12.0",
        "meta-llama/Llama-3.1-8B",
        False,
    )


def test_vllm_kv_budget_wordings(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        (
            "ERROR 09-01 10:00:00 [core.py:1] ValueError: To serve at least one request with the models's max seq len "
            "(131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.12 GiB). "
            "Based on the available memory, the estimated maximum model length is 74576. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n"
        ),
    )
    d = diagnose([p])
    e = d.events_of("kv_budget_error")[0]
    assert e.data["max_seq_len"] == 131072 and e.data["needed_mib"] == 16384.0
    assert not d.events_of("cuda_oom")


def test_sglang_cuda_ipc_017_and_pool_full(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        (
            "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-VL-72B-Instruct', tp_size=4)\n"
            "[2026-01-01 00:00:01] Multimodal feature transport auto-resolved to cuda_ipc (single-node CUDA).\n"
            "[2026-01-01 00:00:01] Using CUDA IPC for multimodal features: reserving up to 1024 MiB on base GPU 0 "
            "across 1 tokenizer worker(s). This reduces KV cache headroom; a full pool falls back to CPU transport.\n"
            "[2026-01-01 00:10:00] MmItemMemoryPool has no free chunk large enough for a 37.50 MiB tensor (pool size: "
            "1024.00 MiB); falling back to non-IPC transport. Consider increasing SGLANG_MM_FEATURE_CACHE_MB.\n"
        ),
    )
    d = diagnose([p])
    ids = {x.id for x in d.findings}
    assert d.facts.cuda_ipc_transport is True and d.facts.mm_feature_cache_mb == 1024
    assert {"sglang-cuda-ipc-tp", "sglang-mm-feature-pool-full"} <= ids
    ipc = next(x for x in d.findings if x.id == "sglang-cuda-ipc-tp")
    assert "2.46 GiB" in ipc.title  # 3 x 500 MiB contexts + 1024 MiB pool (one worker)
    # the pool-full line names "IPC" and "MmItemMemoryPool": one event, not one per route
    assert len(d.events_of("mm_feature_pool_full")) == 1


def test_sglang_busy_and_hybrid_leak_wordings(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        (
            "[2025-06-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            "AssertionError: Mem Leak Detected! total_tokens=812 vs self.max_total_num_tokens=800\n"
            "[2025-06-01 00:00:00 TP0] ValueError: token_to_kv_pool_allocator memory leak detected! "
            "self.max_total_num_tokens=1000, available_size=1004, evictable_size=0, protected_size=0\n"
        ),
    )
    d = diagnose([p])
    ev = d.events_of("kv_leak_selfcheck")
    assert [e.data["pool"] for e in ev] == ["busy", "token"]
    assert ev[1].data["double_free"] is True and ev[1].data["leaked"] == -4


def test_sglang_preprocess_retry_and_req_slots(tmp_path: Path) -> None:
    # SGLang 0.5.23 format string "Multimodal preprocessing ran out of GPU memory on %s; retrying on CPU"
    # and "alloc_req_slots runs out of memory" (both from the source; no real excerpt found).
    p = write(
        tmp_path,
        (
            "[2026-05-01 10:00:00] Multimodal preprocessing ran out of GPU memory on Qwen2VLImageProcessorFast; retrying on CPU\n"
            "[2026-05-01 10:00:01 TP0] RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for `--max-running-requests`.\n"
        ),
    )
    d = diagnose([p])
    ids = {x.id for x in d.findings}
    assert {"sglang-mm-preprocess-gpu-oom", "sglang-req-slots-exhausted"} <= ids
    assert not d.events_of("cuda_oom")
