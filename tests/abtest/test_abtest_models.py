"""Offline model resolution: local directory, Hugging Face cache, family fallback, errors."""

from __future__ import annotations

import json

import pytest

from vramdoctor.abtest.models import FAMILIES, cached_snapshot, family_of, resolve_model
from vramdoctor.errors import InputError


@pytest.mark.parametrize(
    ("name", "model_type"),
    [
        ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_5_vl"),
        ("Qwen/Qwen2-VL-2B-Instruct", "qwen2_vl"),
        ("Qwen/Qwen3-VL-235B-A22B-Instruct", "qwen3_vl"),
        ("THUDM/GLM-4.1V-9B-Thinking", "glm4v"),
        ("zai-org/GLM-4.5V", "glm4v"),
        ("google/gemma-3-27b-it", "gemma3"),
        ("llava-hf/llava-1.5-7b-hf", "llava"),
        ("llava-hf/llava-v1.6-mistral-7b-hf", "llava_next"),
        ("llava-hf/llava-onevision-qwen2-7b-ov-hf", "llava_onevision"),
        ("meta-llama/Llama-3.2-11B-Vision-Instruct", "mllama"),
        ("mistralai/Pixtral-12B-2409", "pixtral"),
        ("OpenGVLab/InternVL3-8B-hf", "internvl"),
        ("qwen2_vl", "qwen2_vl"),
    ],
)
def test_family_from_model_id(name: str, model_type: str) -> None:
    assert family_of(name) == model_type


def test_family_fallback_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    choice = resolve_model("Qwen/Qwen2.5-VL-7B-Instruct")
    assert (choice.source, choice.model_type, choice.path) == ("family", "qwen2_5_vl", None)
    assert "not available offline" in choice.note and "default settings" in choice.note


def test_local_directory_uses_its_config(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gemma3", "architectures": ["X"]})
    )
    choice = resolve_model(str(tmp_path))
    assert (choice.source, choice.model_type, choice.path) == ("local", "gemma3", str(tmp_path))


def test_local_directory_alias_and_missing_config(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "glm46v"}))
    assert resolve_model(str(tmp_path)).model_type == "glm4v"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"no config\.json"):
        resolve_model(str(empty))


def _cache_repo(cache, repo_id: str, model_type: str, commit: str = "abc123") -> None:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": model_type}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_hf_cache_snapshot_wins_over_the_name(tmp_path, monkeypatch) -> None:
    # The id says llava, the cached config says qwen2_5_vl: the cache is the truth.
    _cache_repo(tmp_path, "someone/llava-finetune", "qwen2_5_vl")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    choice = resolve_model("someone/llava-finetune")
    assert (choice.source, choice.model_type) == ("hf-cache", "qwen2_5_vl")
    assert choice.path == str(cached_snapshot("someone/llava-finetune"))
    assert choice.path.endswith("snapshots/abc123")


def test_hf_home_is_honoured(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    _cache_repo(tmp_path / "hub", "org/custom-model", "pixtral")
    assert resolve_model("org/custom-model").model_type == "pixtral"


def test_unknown_model_lists_what_it_can_do(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(InputError) as info:
        resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    message = str(info.value)
    assert all(family in message for family in FAMILIES)
    assert "\n" not in message


def test_local_directory_loads_the_gpu_processor_with_its_settings(tmp_path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    pytest.importorskip("transformers")
    from vramdoctor.abtest.processor import fast_class_name, load_processor

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Qwen2VLImageProcessor",
                "min_pixels": 3136,
                "max_pixels": 401408,
                "patch_size": 14,
                "temporal_patch_size": 2,
                "merge_size": 2,
            }
        )
    )
    proc, name = load_processor(resolve_model(str(tmp_path)))
    assert name == fast_class_name("qwen2_5_vl")
    assert proc.size["longest_edge"] == 401408  # the directory's settings, not the defaults


def test_family_fallback_builds_the_gpu_class() -> None:
    pytest.importorskip("torchvision")
    pytest.importorskip("transformers")
    from vramdoctor.abtest.models import ModelChoice
    from vramdoctor.abtest.processor import fast_class_name, load_processor

    for model_type in ("qwen2_vl", "gemma3", "llava"):
        proc, name = load_processor(ModelChoice(model_type, model_type, "family"))
        assert name == fast_class_name(model_type) == type(proc).__name__
