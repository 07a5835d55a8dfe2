"""Which image processor to load for `--model`, resolved offline.

Order: a local directory (its config.json / preprocessor_config.json), then the local Hugging
Face cache (a snapshot of that repo id), then the model family named in the id, whose
processor class is built with default settings (and we say so). Pure file reads: no network,
no transformers import, so it is tested in CI.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vramdoctor.errors import InputError

# model_type -> patterns that name the family in a model id. One row per family.
FAMILIES: dict[str, tuple[str, ...]] = {
    "qwen3_vl": (r"qwen3[-_.]?vl",),
    "qwen2_5_vl": (r"qwen2\.?5[-_.]?vl",),
    "qwen2_vl": (r"qwen2[-_.]?vl", r"qvq"),
    "glm4v": (r"glm[-_.]?4(\.1)?v", r"glm[-_.]?4\.5v"),
    "gemma3": (r"gemma[-_.]?3",),
    "llava_onevision": (r"llava[-_.]?onevision",),
    "llava_next": (r"llava[-_.]?(v1\.6|next)",),
    "llava": (r"llava",),
    "mllama": (r"llama[-_.]?3\.2.*vision", r"mllama"),
    "pixtral": (r"pixtral",),
    "idefics3": (r"idefics3", r"smolvlm"),
    "idefics2": (r"idefics2",),
    "internvl": (r"internvl",),
}

# model_type values whose processor is the same as another family's (config.json says these).
ALIASES = {"qwen3_5": "qwen3_vl", "qwen2_5_omni": "qwen2_vl", "glm46v": "glm4v"}


@dataclass(frozen=True)
class ModelChoice:
    """How the processor will be loaded."""

    requested: str
    model_type: str
    # "local" (a directory), "hf-cache" (a cached snapshot) or "family" (default settings).
    source: str
    path: str | None = None

    @property
    def note(self) -> str:
        if self.source == "family":
            return (
                f"{self.requested} is not available offline (no local path, not in the Hugging Face "
                f"cache): using the {self.model_type} family's image processor with default settings"
            )
        return f"{self.requested}: {self.model_type} image processor from {self.path}"

    def to_dict(self) -> dict[str, Any]:
        """The fields, as the worker rebuilds them with ModelChoice(**d)."""
        return asdict(self)


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache directory, honouring HF_HUB_CACHE and HF_HOME."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(home) / "hub"


def _model_type_of(directory: Path) -> str | None:
    for name in ("config.json", "preprocessor_config.json"):
        f = directory / name
        if not f.is_file():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        model_type = data.get("model_type") if isinstance(data, dict) else None
        if isinstance(model_type, str):
            return model_type
    return None


def cached_snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The newest local snapshot directory of `repo_id` in the hub cache, if any."""
    cache = cache or hf_hub_cache()
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = (
        sorted((repo_dir / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
        if (repo_dir / "snapshots").is_dir()
        else []
    )
    return snaps[-1] if snaps else None


def family_of(name: str) -> str | None:
    """The model_type a model id names (e.g. 'Qwen/Qwen2.5-VL-7B-Instruct' -> qwen2_5_vl)."""
    lowered = name.lower()
    if lowered in FAMILIES:
        return lowered
    if lowered in ALIASES:
        return ALIASES[lowered]
    for model_type, patterns in FAMILIES.items():
        if any(re.search(p, lowered) for p in patterns):
            return model_type
    return None


def supported() -> str:
    """The model families ab-test can load offline, comma-separated ("qwen2_vl, qwen2_5_vl, ...")."""
    return ", ".join(FAMILIES)


def resolve_model(model: str, *, cache: Path | None = None) -> ModelChoice:
    """Resolve `--model` offline; InputError listing the families when it cannot."""
    if not model.strip():
        raise InputError("--model is empty")
    local = Path(model).expanduser()
    if local.is_dir():
        model_type = _model_type_of(local)
        if model_type is None:
            raise InputError(f"--model {model}: directory has no config.json with a model_type")
        return ModelChoice(model, ALIASES.get(model_type, model_type), "local", str(local))
    snapshot = cached_snapshot(model, cache) if "/" in model else None
    if snapshot is not None:
        model_type = _model_type_of(snapshot)
        if model_type is not None:
            return ModelChoice(
                model, ALIASES.get(model_type, model_type), "hf-cache", str(snapshot)
            )
    family = family_of(model)
    if family is not None:
        return ModelChoice(model, family, "family")
    raise InputError(
        f"--model {model}: not a local model directory, not in the Hugging Face cache, and not a "
        f"family vramdoctor knows; it can test: {supported()} "
        "(give a model id naming one, e.g. Qwen/Qwen2.5-VL-7B-Instruct, or a local directory)"
    )
