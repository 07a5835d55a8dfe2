"""Each rule fires on real excerpts that show its cause and stays quiet on ones that do not.

Where no real excerpt exists (CUDA IPC lines, graph-capture headroom figures, the feature-pool
message), the lines are built from SGLang's own format strings and marked so; the fast-image-
processor positive case uses the constructed example log (examples/logs/README.md says why).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vramdoctor.diagnose import diagnose
from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.rules import all_rules, markdown

ROOT = Path(__file__).parents[2]
FIX = ROOT / "tests" / "fixtures" / "logs"
EXAMPLE = ROOT / "examples" / "logs" / "sglang_qwen2.5-vl-7b-tp2_fast-image-processor_gpu0-oom.log"


def fix(prefix: str) -> Path:
    return next(FIX.glob(prefix + "_*.log"))


def ids(path: Path | list[Path]) -> list[str]:
    paths = path if isinstance(path, list) else [path]
    return [f.id for f in diagnose(paths).findings]


FIRES = {
    "cuda-oom": ["01", "02", "03", "04", "05", "16", "17", "18", "19"],
    "kv-budget-error": ["21"],
    "host-oom": ["20"],
    "triton-shared-memory": ["08"],
    "sglang-kv-selfcheck-leak": ["14", "15"],
    "sglang-retraction": ["06", "07"],
    "sglang-graph-capture-failed": ["09"],
    "mem-fraction-high-multimodal": ["12"],
    "rdma-registration-failed": ["10"],
}
QUIET = {
    "cuda-oom": ["06", "07", "08", "09", "10", "20", "21", "22", "23", "24"],
    "kv-budget-error": ["17", "22", "25"],
    "host-oom": ["16", "18", "21"],
    "triton-shared-memory": ["05", "10"],
    "sglang-kv-selfcheck-leak": ["06", "07", "10"],
    "sglang-retraction": ["02", "03", "05"],
    "sglang-graph-capture-failed": ["08", "11", "17"],
    "mem-fraction-high-multimodal": ["08", "11", "22", "23", "24"],
    "sglang-fast-image-processor": ["10", "12", "13", "05", "22", "23"],
    "sglang-cuda-ipc-tp": ["09", "11", "10"],
    "cuda-graph-budget": ["08", "10", "11"],
    "rdma-registration-failed": ["08", "11", "17"],
}


@pytest.mark.parametrize(("rule", "prefix"), [(r, p) for r, ps in FIRES.items() for p in ps])
def test_rule_fires_on_real_excerpt(rule: str, prefix: str) -> None:
    assert rule in ids(fix(prefix))


@pytest.mark.parametrize(("rule", "prefix"), [(r, p) for r, ps in QUIET.items() for p in ps])
def test_rule_quiet_on_real_excerpt(rule: str, prefix: str) -> None:
    assert rule not in ids(fix(prefix))


def test_oom_phase_and_figures() -> None:
    d = diagnose([fix("17")])
    f = next(x for x in d.findings if x.id == "cuda-oom")
    assert "CUDA graph capture" in f.title
    assert (
        "asked for 112.00 MiB" in f.explanation and "process 1747225 held 7.29 GiB" in f.explanation
    )
    assert "Another process holds memory" in f.explanation
    assert "--enforce-eager" in f.fix
    d = diagnose([fix("01")])
    assert "weights" in d.findings[0].title and "quantized" in d.findings[0].fix


def test_real_sglang_oom_line_names_other_processes(tmp_path: Path) -> None:
    # Verbatim line from sgl-project/sglang#6082 (qwen2.5vl-72b-awq, 4x RTX 4090, sglang 0.4.6.post1).
    line = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 38.00 MiB. GPU 0 has a total capacity "
        "of 23.65 GiB of which 39.44 MiB is free. Process 20909 has 1.81 GiB memory in use. Process 21069 has "
        "1.87 GiB memory in use. Process 21071 has 1.87 GiB memory in use. Process 21068 has 16.12 GiB memory in "
        "use. Process 21070 has 1.91 GiB memory in use. Of the allocated memory 1.22 GiB is allocated by PyTorch, "
        "and 220.57 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    p = tmp_path / "6082.log"
    p.write_text(line + "\n")
    d = diagnose([p])
    e = d.events_of("cuda_oom")[0]
    assert [x["pid"] for x in e.data["processes"]] == [20909, 21069, 21071, 21068, 21070]
    assert e.data["free_mib"] == 39.44 and e.data["requested_mib"] == 38.0
    assert d.server is None  # one torch line does not say which server printed it
    f = next(x for x in d.findings if x.id == "cuda-oom")
    assert (
        "5 processes hold memory on GPU 0" in f.explanation and "20909 (1.81 GiB)" in f.explanation
    )
    assert "21068" not in f.explanation.split("the small ones")[1].split(")")[0]


def test_leak_numbers_and_double_free(tmp_path: Path) -> None:
    d = diagnose([fix("15")])
    ev = d.events_of("kv_leak_selfcheck")
    assert ev[0].data["leaked"] == 7 and ev[1].data["pool"] == "req" and ev[1].data["leaked"] == 1
    # 0.5.12+ wording, built from SGLang's format string (no real excerpt with a double free).
    p = tmp_path / "df.log"
    p.write_text(
        "[2026-01-01 00:00:00] ValueError: pool memory leak detected! [full] total=82482, "
        "available=82490, evictable=0, protected=0, session_held=0, uncached=0\n"
    )
    d = diagnose([p])
    f = next(x for x in d.findings if x.id == "sglang-kv-selfcheck-leak")
    assert f.severity == "critical" and "double free" in f.explanation


def test_fast_image_processor_on_example() -> None:
    d = diagnose([EXAMPLE])
    f = next(x for x in d.findings if x.id == "sglang-fast-image-processor")
    assert f.severity == "warning"
    assert "vramdoctor ab-test --model Qwen/Qwen2.5-VL-7B-Instruct" in f.fix
    assert "--disable-fast-image-processor" in f.fix
    assert any("disable_fast_image_processor=False" in e.text for e in f.evidence)


def test_fast_image_processor_respects_fixed_version_and_pil(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    p = tmp_path / "pil.log"
    p.write_text(
        text.replace("disable_fast_image_processor=False", "image_processor_backend='pil'")
    )
    assert "sglang-fast-image-processor" not in ids(p)
    p.write_text(
        text.replace("disable_fast_image_processor=False", "disable_fast_image_processor=True")
    )
    assert "sglang-fast-image-processor" not in ids(p)


def test_cuda_ipc_cost(tmp_path: Path) -> None:
    # Built from SGLang 0.5.16's format string "CUDA IPC multimodal feature pools reserve %.0f MiB total on
    # GPU %d (%.0f MiB per tokenizer worker × %d; configured budget %.0f MiB)." plus a tp_size=4 args dump.
    p = tmp_path / "ipc.log"
    p.write_text(
        "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-VL-72B-Instruct', tp_size=4, "
        "tokenizer_worker_num=2)\n"
        "[2026-01-01 00:00:05] CUDA IPC multimodal feature pools reserve 1024 MiB total on GPU 0 "
        "(512 MiB per tokenizer worker × 2; configured budget 1024 MiB).\n"
    )
    f = next(x for x in diagnose([p]).findings if x.id == "sglang-cuda-ipc-tp")
    assert "2.46 GiB" in f.title  # 3 extra contexts x 500 MiB + 1024 MiB pool
    p.write_text(
        p.read_text()
        .replace("tp_size=4", "tp_size=1")
        .replace("tokenizer_worker_num=2", "tokenizer_worker_num=1")
        .replace("× 2", "× 1")
    )
    assert "sglang-cuda-ipc-tp" not in ids(p)


def test_cuda_graph_budget(tmp_path: Path) -> None:
    # Built from SGLang's "Capture cuda graph end. Time elapsed: %.2f s. mem usage=%.2f GB. avail mem=%.2f GB."
    p = tmp_path / "g.log"
    p.write_text(
        "[2026-01-01 00:00:00 TP0] Capture cuda graph end. Time elapsed: 30.10 s. mem usage=3.20 GB. avail mem=0.41 GB.\n"
        "[2026-01-01 00:00:01] The server is fired up and ready to roll!\n"
    )
    assert "cuda-graph-budget" in ids(p)


def test_every_pattern_has_an_anchor() -> None:
    """The prefilter only sees lines with an anchor: every event regex must contain one."""
    anchors = [a.decode("utf-8") for a in P.ANCHORS]
    for name in (
        "SGL_ARGS",
        "VLLM_ENGINE",
        "VLLM_VERSION",
        "SGL_LOAD_END",
        "SGL_KV",
        "SGL_POOL_END",
        "SGL_GRAPH_END",
        "SGL_SUMMARY",
        "SGL_MM_REDUCE",
        "SLOW_PROCESSOR",
        "IPC_POOL_016",
        "IPC_USING_017",
        "IPC_POOL_FULL",
        "SGL_RETRACT",
        "VLLM_NO_KV",
        "VLLM_MAX_SEQ",
        "TRITON_SMEM",
        "RAY_OOM",
        "VLLM_WEIGHTS",
        "VLLM_BLOCKS",
        "VLLM_BUDGET",
        "VLLM_TP_RANK",
        "VLLM_LOAD_MODEL",
    ):
        src = re.sub(r"\\(.)", r"\1", getattr(P, name).pattern)
        assert any(a in src for a in anchors), name


def test_registry_and_generated_docs() -> None:
    rules = all_rules()
    assert len(rules) >= 10 and len({r.id for r in rules}) == len(rules)
    for r in rules:
        assert r.severity in ("info", "warning", "critical") and r.fires_when and r.fix and r.title
    committed = (ROOT / "docs" / "rules.md").read_text()
    assert committed == markdown(), (
        "docs/rules.md is stale: python -m vramdoctor.diagnose.rules --markdown > docs/rules.md"
    )


@pytest.mark.parametrize(
    ("line", "backend"),
    [
        # vLLM format strings across generations: V0 selector, V1 "on V1 engine", enum repr, and
        # "Using %s attention backend out of potential backends: %s" (0.11+), with the prefixes
        # docker-compose, journald and log shippers add.
        (
            "functionary  | INFO 05-11 08:17:50 selector.py:28] Using FlashAttention backend.",
            "FLASH_ATTN",
        ),
        (
            "INFO 05-13 21:09:39 [cuda.py:221] Using Flash Attention backend on V1 engine.",
            "FLASH_ATTN",
        ),
        (
            "(EngineCore pid=1) INFO 01-01 00:00:00 [cuda.py:1] Using AttentionBackendEnum.FLASHINFER backend.",
            "FLASHINFER",
        ),
        (
            "Aug 25 14:58:34 sys0 vllm[17578]: (EngineCore pid=17578) INFO 08-25 14:58:34 [cuda.py:482] Using "
            "FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER'].",
            "FLASH_ATTN",
        ),
        (
            "2026-05-01 21:55:54.036 | (EngineCore pid=187) INFO 05-01 19:55:54 [cuda.py:368] Using FLASHINFER "
            "attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN'].",
            "FLASHINFER",
        ),
    ],
)
def test_vllm_backend_lines(tmp_path: Path, line: str, backend: str) -> None:
    p = tmp_path / "b.log"
    p.write_text(
        "INFO 05-11 08:17:49 llm_engine.py:98] Initializing an LLM engine (v0.4.1) with config: "
        "model='m', tensor_parallel_size=1\n" + line + "\n"
        "INFO 01-01 00:00:00 [x.py:1] Using 'MARLIN' WNA16 MoE backend.\n"
        "INFO 01-01 00:00:00 [x.py:1] Using FLASH_ATTN MLA prefill backend.\n"
        "INFO 01-01 00:00:00 [x.py:1] Using FlashInfer for top-p & top-k sampling.\n"
    )
    assert diagnose([p]).facts.attention_backend == backend


def test_swap_space_and_long_context(tmp_path: Path) -> None:
    assert "vllm-swap-space" in ids(fix("20"))
    assert "vllm-swap-space" not in ids(fix("25"))
    # A real vLLM 0.6 line (arg_utils warning) followed by the engine line of file 25.
    p = tmp_path / "lc.log"
    p.write_text(
        "WARNING 06-21 08:32:55 arg_utils.py:1145] The model has a long context length (131072). This may "
        "cause OOM errors during the initial memory profiling phase, or result in low performance due to small "
        "KV cache space. Consider setting --max-model-len to a smaller value.\n"
    )
    d = diagnose([p])
    f = next(x for x in d.findings if x.id == "vllm-long-context")
    assert f.severity == "info" and "131072" in f.title


def test_real_leak_wordings_numbers() -> None:
    extra = FIX / "extra"
    d = diagnose([next(extra.glob("04_*.log"))])  # sglang#6888: available counts free + evictable
    e = d.events_of("kv_leak_selfcheck")[0]
    assert (e.data["total"], e.data["available"], e.data["leaked"], e.data["double_free"]) == (
        3185200,
        3189424,
        -4224,
        True,
    )
    assert "double free" in d.findings[0].explanation
    d = diagnose([next(extra.glob("05_*.log"))])  # sglang#11970, backtick-wrapped
    assert d.events_of("kv_leak_selfcheck")[0].data["leaked"] == 59
    d = diagnose(
        [next(extra.glob("06_*.log"))]
    )  # hybrid wording: full pool fine, one mamba slot leaked
    e = d.events_of("kv_leak_selfcheck")[0]
    assert (
        e.data["pool"] == "mamba"
        and e.data["pools"]["full"]["leaked"] == 0
        and e.data["leaked"] == 1
    )
    assert "leaked pages {191}" in d.findings[0].explanation
