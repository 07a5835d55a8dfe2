"""Multimodal and fast-image-processor facts from evidence, never from absence.

Cases 03, 04, 08 are the files in tests/fixtures/logs/review12/; the others follow the servers'
own format strings: vLLM `non-default args: {...}` (0.9+), `args: Namespace(...)` (up to 0.8),
`Resolved architecture: X`, the `limit_mm_per_prompt` refusal in vllm/config; SGLang
`server_args=ServerArgs(...)` (up to 0.5.18) and `server_args={...}` (0.5.19+, engine.py
`server_args.resolved_dict()`), `Load weight end. type=X`, configs/model_config.py "Multimodal is
disabled for gemma3. To enable it, set --enable-multimodal.".
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import cli_env

from vramdoctor.diagnose import Diagnosis, Facts, diagnose


def named(f: Facts) -> bool | None:
    """What the model's name suggests about multimodality. Nothing is asserted from a name, so
    the fact stays unknown and the name is a hint (facts.hints), said as such."""
    assert f.multimodal is None, f.evidence.get("multimodal")
    hint = f.hints.get("multimodal")
    return None if hint is None else bool(hint["value"])


CASES = Path(__file__).parents[1] / "fixtures" / "logs" / "review12"
CASE_03 = CASES / "03-vllm-mistral-small-3.1-vlm-called-text-only.log"
CASE_04 = CASES / "04-sglang-gemma3n-called-text-only.log"
CASE_08 = CASES / "08-sglang-0.5.19-dict-args-fast-image-processor-warns-upgrade.log"

VLLM_BANNER = "INFO 09-14 03:22:00 [api_server.py:1896] vLLM API server version 0.10.1\n"
SGL_LOAD_END = "[2025-09-14 03:22:10] Load weight end. type={arch}, dtype=torch.bfloat16, avail mem=60.12 GB, mem usage=16.05 GB.\n"


def run(tmp_path: Path, text: str) -> Diagnosis:
    p = tmp_path / "server.log"
    p.write_text(text)
    return diagnose([p])


def vllm_args(args: str) -> str:
    return VLLM_BANNER + f"INFO 09-14 03:22:00 [utils.py:326] non-default args: {{{args}}}\n"


def sgl_dump(args: str) -> str:
    return f"[2025-09-14 03:22:00] server_args=ServerArgs({args})\n"


def finding_ids(d: Diagnosis) -> set[str]:
    return {f.id for f in d.findings}


# --- vision models called text-only from their name -----------------------------------------------


def test_case_03_limit_mm_per_prompt_on_the_same_line_is_multimodal() -> None:
    d = diagnose([CASE_03])
    f = d.facts
    assert f.multimodal is True
    ev = f.evidence["multimodal"]
    assert ev.line == 2 and "limit_mm_per_prompt" in ev.text and "'image': 10" in ev.text
    # vLLM has no fast image processor fact to give: unknown, never "no"
    assert f.fast_image_processor is None


def test_case_04_gemma_3n_is_multimodal_and_the_processor_unknown() -> None:
    d = diagnose([CASE_04])
    assert named(d.facts) is True
    assert d.facts.fast_image_processor is None  # the dump fragment has no processor flag


@pytest.mark.parametrize(
    "model",
    [
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
        "mistralai/Magistral-Small-2509",
        "deepseek-ai/DeepSeek-OCR",
        "Qwen/Qwen2-Audio-7B-Instruct",
        "google/gemma-3n-E4B-it",
    ],
)
def test_multimodal_releases_with_family_names_are_never_text_only(
    tmp_path: Path, model: str
) -> None:
    d = run(tmp_path, vllm_args(f"'model': '{model}', 'gpu_memory_utilization': 0.9"))
    assert named(d.facts) is True, model
    assert d.facts.fast_image_processor is None


@pytest.mark.parametrize(
    "model", ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "/models/mistral-7b"]
)
def test_a_text_models_own_name_says_text_only(tmp_path: Path, model: str) -> None:
    """The last resort, after every multimodal sign and the names of the vision releases of text
    families (the test above): a text model's own name (the corpus labels say "no" for these)."""
    d = run(tmp_path, vllm_args(f"'model': '{model}', 'gpu_memory_utilization': 0.9"))
    assert named(d.facts) is False and d.facts.fast_image_processor is None
    d = run(
        tmp_path, sgl_dump(f"model_path='{model}', tp_size=1, disable_fast_image_processor=False")
    )
    assert d.server == "sglang"
    assert named(d.facts) is False
    # and a sign of multimodality outranks the name
    d = run(
        tmp_path,
        vllm_args(f"'model': '{model}', 'limit_mm_per_prompt': {{'image': 4}}"),
    )
    assert d.facts.multimodal is True


@pytest.mark.parametrize(
    ("arch", "multimodal"),
    [
        ("LlamaForCausalLM", False),
        ("Qwen2ForCausalLM", False),
        ("MistralForCausalLM", False),
        ("Gemma3nForCausalLM", False),  # vLLM registers the language-only Gemma 3n as a text model
        ("ChatGLMForConditionalGeneration", False),  # text in vLLM's registry despite the suffix
        ("DeepseekOCRForCausalLM", True),  # multimodal although it ends in ForCausalLM
        ("MoonshotKimiaForCausalLM", True),
        ("Mistral3ForConditionalGeneration", True),
        ("Gemma3nForConditionalGeneration", True),
        ("Qwen2AudioForConditionalGeneration", True),
        ("InternS1ForConditionalGeneration", True),  # any other ...ForConditionalGeneration
        ("MiDashengLMModel", True),
    ],
)
def test_architecture_class_decides(tmp_path: Path, arch: str, multimodal: bool) -> None:
    # The name says "Llama" / "Qwen2": only the class the server printed counts.
    d = run(
        tmp_path,
        VLLM_BANNER
        + "INFO 09-14 03:22:00 [utils.py:326] non-default args: {'model': '/models/llama-qwen2-ckpt'}\n"
        + f"INFO 09-14 03:22:01 [model.py:547] Resolved architecture: {arch}\n",
    )
    assert d.facts.architecture == arch
    assert d.facts.multimodal is multimodal, arch


def test_sglang_text_only_class_keeps_no_fast_processor(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        sgl_dump(
            "model_path='meta-llama/Llama-3.1-8B-Instruct', tp_size=1, disable_fast_image_processor=False"
        )
        + SGL_LOAD_END.format(arch="LlamaForCausalLM"),
    )
    f = d.facts
    assert f.multimodal is False and f.evidence["multimodal"].text.startswith("Load weight end.")
    # a text-only class has no image processor at all: "no", with the class line as evidence
    assert f.fast_image_processor is False and f.evidence["fast_image_processor"].line == 2


@pytest.mark.parametrize(
    "dump",
    [
        # vLLM 0.9+ non-default args (0.11+ per-modality options too)
        "non-default args: {'model': '/m/ckpt', 'limit_mm_per_prompt': {'image': 2, 'video': 0}}",
        "non-default args: {'model': '/m/ckpt', 'limit_mm_per_prompt': {'image': {'count': 5, 'width': 512}}}",
        # up to 0.8: Namespace(...)
        "args: Namespace(model='/m/ckpt', tensor_parallel_size=1, limit_mm_per_prompt={'image': 4})",
    ],
)
def test_limit_mm_per_prompt_in_the_argument_dumps(tmp_path: Path, dump: str) -> None:
    d = run(tmp_path, VLLM_BANNER + f"INFO 09-14 03:22:00 [utils.py:326] {dump}\n")
    assert d.facts.multimodal is True
    assert "limit_mm_per_prompt" in d.facts.evidence["multimodal"].text


@pytest.mark.parametrize(
    "flag", ["--limit-mm-per-prompt image=4", "--limit-mm-per-prompt '{\"image\": 4}'"]
)
def test_limit_mm_per_prompt_in_a_pasted_command(tmp_path: Path, flag: str) -> None:
    d = run(tmp_path, f"vllm serve /data/models/ckpt --gpu-memory-utilization 0.95 {flag}\n")
    assert d.server == "vllm" and d.facts.multimodal is True
    # and the multimodal headroom rule can now speak
    assert "mem-fraction-high-multimodal" in finding_ids(d)


def test_zero_limits_or_a_refusal_are_not_multimodal_evidence(tmp_path: Path) -> None:
    d = run(
        tmp_path, vllm_args("'model': '/m/ckpt', 'limit_mm_per_prompt': {'image': 0, 'video': 0}")
    )
    assert d.facts.multimodal is None
    refused = (
        "ERROR 09-14 03:22:01 [core.py:700] ValueError: `limit_mm_per_prompt` is only supported for "
        "multimodal models.\n"
    )
    d = run(
        tmp_path, vllm_args("'model': '/m/ckpt', 'limit_mm_per_prompt': {'image': 4}") + refused
    )
    assert d.facts.multimodal is False  # vLLM itself treated the model as text-only
    assert "only supported for multimodal models" in d.facts.evidence["multimodal"].text


def test_sglang_multimodal_disabled_serves_text_only(tmp_path: Path) -> None:
    # SGLang runs Gemma 3 text-only unless --enable-multimodal: no image processor, no encoder.
    d = run(
        tmp_path,
        sgl_dump(
            "model_path='google/gemma-3-27b-it', tp_size=1, mem_fraction_static=0.9, disable_fast_image_processor=False"
        )
        + "[2025-09-14 03:22:01] Multimodal is disabled for gemma3. To enable it, set --enable-multimodal.\n"
        + SGL_LOAD_END.format(arch="Gemma3ForConditionalGeneration"),
    )
    f = d.facts
    assert f.multimodal is False and f.fast_image_processor is False
    assert "Multimodal is disabled" in f.evidence["multimodal"].text
    assert not {"sglang-fast-image-processor", "mem-fraction-high-multimodal"} & finding_ids(d)


def test_audio_only_model_has_no_image_processor_fact(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        sgl_dump(
            "model_path='Qwen/Qwen2-Audio-7B-Instruct', tp_size=1, disable_fast_image_processor=False"
        )
        + SGL_LOAD_END.format(arch="Qwen2AudioForConditionalGeneration"),
    )
    assert d.facts.multimodal is True
    assert d.facts.fast_image_processor is None
    assert "sglang-fast-image-processor" not in finding_ids(d)


@pytest.mark.parametrize(
    "text",
    [
        vllm_args(
            "'model': 'mistralai/Mistral-Small-3.1-24B-Instruct-2503', 'gpu_memory_utilization': 0.95"
        ),
        vllm_args("'model': 'mistralai/Magistral-Small-2509', 'gpu_memory_utilization': 0.95"),
        sgl_dump("model_path='google/gemma-3n-E4B-it', tp_size=1, mem_fraction_static=0.9"),
    ],
)
def test_mem_fraction_rule_fires_for_vlms_once_called_text_only(tmp_path: Path, text: str) -> None:
    d = run(tmp_path, text)
    assert named(d.facts) is True
    assert "mem-fraction-high-multimodal" in finding_ids(d)


# --- the 0.5.19+ dict dump and image_processor_backend='auto' --------------------------------------


def test_case_08_dict_dump_dates_the_server_and_auto_proves_nothing() -> None:
    d = diagnose([CASE_08])
    f = d.facts
    assert d.version is None and f.version_at_least == "0.5.19"
    assert f.evidence["version_at_least"].line == 1
    assert named(f) is True  # (the name only)
    assert f.fast_image_processor is None  # 'auto': transformers picks the backend
    assert "sglang-fast-image-processor" not in finding_ids(d)


def test_case_08_text_output_says_the_version_floor() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "diagnose", str(CASE_08)],
        capture_output=True,
        text=True,
        env=cli_env(COLUMNS="200"),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "0.5.19 or later" in r.stdout
    assert "upgrade to SGLang" not in r.stdout


@pytest.mark.parametrize(
    ("dump", "fast", "warns"),
    [
        # 0.5.18 (dataclass repr, backend flag present): 'auto' is transformers' choice
        ("image_processor_backend='auto', disable_fast_image_processor=False", None, False),
        ("image_processor_backend='torchvision', disable_fast_image_processor=False", True, True),
        ("image_processor_backend='pil', disable_fast_image_processor=False", False, False),
        ("image_processor_backend='auto', disable_fast_image_processor=True", False, False),
        # up to 0.5.17: no backend field, the flag asked transformers for the fast class
        ("disable_fast_image_processor=False", True, True),
    ],
)
def test_fast_processor_from_the_dataclass_dump(
    tmp_path: Path, dump: str, fast: bool | None, warns: bool
) -> None:
    d = run(
        tmp_path,
        sgl_dump(f"model_path='Qwen/Qwen2.5-VL-7B-Instruct', tp_size=1, {dump}")
        + SGL_LOAD_END.format(arch="Qwen2_5_VLForConditionalGeneration"),
    )
    assert d.facts.version_at_least is None
    assert d.facts.fast_image_processor is fast
    assert ("sglang-fast-image-processor" in finding_ids(d)) is warns


def test_auto_with_sglangs_fast_only_line_is_fast(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        sgl_dump(
            "model_path='Qwen/Qwen2.5-VL-7B-Instruct', tp_size=1, image_processor_backend='auto'"
        )
        + "[2025-09-14 03:22:05] Processor Qwen2VLImageProcessor does not have a slow version. "
        "Automatically use fast version\n",
    )
    assert d.facts.fast_image_processor is True
    assert "sglang-fast-image-processor" in finding_ids(d)


def test_dict_dump_with_torchvision_is_fast_but_has_the_pool(tmp_path: Path) -> None:
    d = run(
        tmp_path,
        "[2026-03-02 22:23:32] INFO engine.py:157: server_args={'model_path': 'Qwen/Qwen2.5-VL-7B-Instruct', "
        "'tp_size': 1, 'image_processor_backend': 'torchvision', 'disable_fast_image_processor': False}\n",
    )
    # only the model's name says it is multimodal, so whether a fast image processor runs is
    # unknown (the torchvision flag sets the processor's backend, if the model has one)
    assert d.facts.fast_image_processor is None and d.facts.version_at_least == "0.5.19"
    assert named(d.facts) is True
    assert "sglang-fast-image-processor" not in finding_ids(d)


def test_vllm_encoder_cache_budget_line_is_multimodal(tmp_path: Path) -> None:
    # vLLM V1 gpu_model_runner profile_run, printed only for a multimodal model
    d = run(
        tmp_path,
        VLLM_BANNER
        + "(EngineCore pid=284) INFO 05-30 07:44:00 [gpu_model_runner.py:6136] Encoder cache will be "
        "initialized with a budget of 32768 tokens, and profiled with 2 image items of the maximum "
        "feature size.\n",
    )
    assert d.server == "vllm"
    assert d.facts.multimodal is True and "Encoder cache" in d.facts.evidence["multimodal"].text


def test_the_class_the_server_runs_outranks_the_name(tmp_path: Path) -> None:
    # a text-only conversion of a vision checkpoint: SGLang loads MistralForCausalLM
    d = run(
        tmp_path,
        sgl_dump("model_path='/ckpt/Mistral-Small-3.1-24B-Instruct-2503-text', tp_size=1")
        + SGL_LOAD_END.format(arch="MistralForCausalLM"),
    )
    assert d.facts.multimodal is False and d.facts.evidence["multimodal"].line == 2


def test_sglang_multimodal_processor_lines_are_multimodal(tmp_path: Path) -> None:
    # SGLang 0.5.19 base_processor.py: printed only when a multimodal processor is built
    for line in (
        "Multimodal preprocess cache enabled for QwenVLImageProcessor: 1024 MiB total (1024 MiB per "
        "tokenizer worker), at most 8192 entries; caller content hashes are trusted.",
        "Multimodal processor concurrency enabled with 2 isolated worker threads (auto).",
    ):
        d = run(
            tmp_path,
            sgl_dump("model_path='/ckpt/my-model', tp_size=1") + f"[2026-03-02 22:23:35] {line}\n",
        )
        assert d.facts.multimodal is True and d.facts.evidence["multimodal"].line == 2
