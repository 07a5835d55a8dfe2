"""The 2025-2026 lines diagnose reads that no real excerpt shows (tests/fixtures/logs/wild/SOURCES.md:
"Gaps"): each line is built from the server's own format string, quoted in the comment with the
file it is printed from (research notes servers/NOTES.md section 6, read in the released wheels),
and says so. What the real excerpts cover is tested in test_diagnose_wild.py."""

from __future__ import annotations

import json
from pathlib import Path

from vramdoctor.diagnose import Diagnosis, diagnose

WILD = Path(__file__).parents[1] / "fixtures" / "logs" / "wild"
VLLM = "(EngineCore_DP0 pid=7) INFO 11-01 10:00:{s:02d} [gpu_worker.py:300] "
SGL = "[2026-11-01 10:00:{s:02d} TP0] "


def run(tmp_path: Path, *lines: str) -> Diagnosis:
    p = tmp_path / "server.log"
    p.write_text("".join(line + "\n" for line in lines))
    return diagnose([p])


def test_sglang_multimodal_kv_reservation_line(tmp_path: Path) -> None:
    # sglang 0.5.18+ mem_cache/kv_cache_configurator.py: "Reserving %.2f GB of the KV budget for post-sizing
    # multimodal allocations (feature-transport pools + embedding cache)." (logged for a multimodal model only)
    d = run(
        tmp_path,
        SGL.format(s=1)
        + "Reserving 1.10 GB of the KV budget for post-sizing multimodal allocations "
        "(feature-transport pools + embedding cache).",
    )
    assert d.server == "sglang"
    assert d.facts.mm_reserved_mib == 1126.4
    assert d.facts.multimodal is True and d.facts.evidence["multimodal"].line == 1
    assert d.facts.evidence["multimodal"].basis == "read"


def test_vllm_startup_without_memory_profiling_then_oom(tmp_path: Path) -> None:
    # vllm gpu_worker.py (--kv-cache-memory-bytes set): "Initial free memory %s GiB, reserved %s GiB memory for
    # KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling. This does not
    # respect the gpu_memory_utilization config. ..."; then torch's OOM during the CUDA graph capture
    d = run(
        tmp_path,
        VLLM.format(s=1)
        + "Initial free memory 78.50 GiB, reserved 70.00 GiB memory for KV Cache as specified "
        "by kv_cache_memory_bytes config and skipped memory profiling. This does not respect the "
        "gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control of "
        "KV cache memory size.",
        "(EngineCore_DP0 pid=7) Traceback (most recent call last):",
        '(EngineCore_DP0 pid=7)   File "/usr/lib/python3/site-packages/vllm/v1/worker/gpu_model_runner.py", '
        "line 3000, in capture_model",
        "(EngineCore_DP0 pid=7)     self._capture_cudagraphs(",
        "(EngineCore_DP0 pid=7) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
        "a total capacity of 79.19 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has "
        "78.15 GiB memory in use. Of the allocated memory 76.90 GiB is allocated by PyTorch, and 310.00 MiB is "
        "reserved by PyTorch but unallocated.",
    )
    assert d.server == "vllm" and d.facts.kv_cache_mib == 71680.0
    assert d.events_of("kv_profiling_skipped")
    f = next(x for x in d.findings if x.id == "cuda-oom")
    assert (
        "skipped its memory profiling" in f.explanation
        and "was sized by --kv-cache-memory-bytes" in f.explanation
    )
    assert f.fix.startswith("Lower --kv-cache-memory-bytes")


def test_vllm_graph_estimate_hints_every_wording(tmp_path: Path) -> None:
    # vllm 0.21+ gpu_worker.py, estimate off: WARNING "CUDA graph memory profiling is disabled
    # (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). Without it, ... Consider re-enabling it (the default as of
    # v0.21.0) and increasing --gpu-memory-utilization from %.4f to %.4f."
    d = run(
        tmp_path,
        VLLM.format(s=1) + "Estimated CUDA graph memory: 0.80 GiB total",
        VLLM.format(s=2).replace("INFO", "WARNING") + "CUDA graph memory profiling is disabled "
        "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). Without it, CUDA graph memory is not accounted for during "
        "KV cache allocation, which may require lowering --gpu-memory-utilization to avoid OOM. Consider "
        "re-enabling it (the default as of v0.21.0) and increasing --gpu-memory-utilization from 0.8500 to 0.8700.",
    )
    f = d.facts
    assert (f.gpu_memory_utilization, f.cuda_graph_estimate_applied, f.cuda_graph_estimate_mib) == (
        0.85,
        False,
        819.2,
    )
    assert not d.findings
    # vllm 0.18 estimate on: "CUDA graph memory profiling is enabled (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1).
    # This will become the default in v0.19. The current --gpu-memory-utilization=%.4f is equivalent to
    # --gpu-memory-utilization=%.4f without CUDA graph memory profiling. ..."
    d = run(
        tmp_path,
        VLLM.format(s=3)
        + "CUDA graph memory profiling is enabled (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1). "
        "This will become the default in v0.19. The current --gpu-memory-utilization=0.9000 is equivalent to "
        "--gpu-memory-utilization=0.8950 without CUDA graph memory profiling. To maintain the same effective KV "
        "cache size as before, increase --gpu-memory-utilization to 0.9050.",
    )
    assert (d.facts.gpu_memory_utilization, d.facts.cuda_graph_estimate_applied) == (0.9, True)


def test_vllm_0_33_kv_capacity_line(tmp_path: Path) -> None:
    # vllm 0.33 v1/core/kv_cache_utils.py: "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per
    # request: %.2fx" (thousands separators)
    d = run(
        tmp_path,
        VLLM.format(s=1).replace("gpu_worker.py:300", "kv_cache_utils.py:1"),
    )
    d = run(
        tmp_path,
        VLLM.format(s=1)
        + "GPU KV cache size: 1,234,560 tokens, Maximum concurrency for 131,072 tokens per "
        "request: 9.42x",
    )
    assert d.facts.kv_tokens == 1234560


def test_json_says_what_each_claim_rests_on() -> None:
    # a real excerpt (wild/23, Lemonade's ROCm vLLM): the cause is derived from two read figures
    d = diagnose([next(WILD.glob("23_*.log"))])
    doc = json.loads(json.dumps(d.to_json()))
    assert doc["schema"] == "vramdoctor.diagnose/2"
    f = next(x for x in doc["findings"] if x["id"] == "cuda-oom")
    assert f["basis"] == "derived" and f["derived"] == [
        "12.95 GiB asked < 18.55 GiB free (the message reports)"
    ]
    assert all(e["kind"] == "read" and e["line"] > 0 for e in f["evidence"])
    assert doc["facts"]["platform"] == "rocm"
    assert doc["facts"]["evidence"]["platform"]["kind"] == "read"
    # a rank bound read off rank tags is derived, and says from what
    d = diagnose([next(WILD.glob("20_*.log"))])
    ev = d.to_json()["facts"]["evidence"]["tp_size_at_least"]
    assert ev["kind"] == "derived" and ev["line"] == 0 and "rank" in ev["text"]
    # a cause the log does not show is unknown
    d = diagnose([next(WILD.glob("17_*.log"))])
    (crash,) = [x for x in d.to_json()["findings"] if x["id"] == "server-crash-unexplained"]
    assert crash["basis"] == "unknown"


def test_a_model_path_alone_asserts_nothing(tmp_path: Path) -> None:
    # never "multimodal: no" and "fast image processor: no" from a model path alone
    # (/data/mistralhf-gptq), cited to the argument dump (an SGLang dump built from its format)
    d = run(
        tmp_path,
        "[2025-05-07 10:02:11] server_args=ServerArgs(model_path='/data/mistralhf-gptq', tp_size=1, "
        "mem_fraction_static=0.88, disable_fast_image_processor=False)",
    )
    f = d.facts
    assert f.multimodal is None and f.fast_image_processor is None
    assert "multimodal" not in f.evidence and "fast_image_processor" not in f.evidence
    assert (
        f.hints["multimodal"]["value"] is False
        and "a name, not a line" in f.hints["multimodal"]["rests_on"]
    )
