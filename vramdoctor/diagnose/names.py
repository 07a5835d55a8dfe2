"""How users name each server kind, for the report and the rules' wording (no dependencies: the
rules name the server without importing the terminal report)."""

from __future__ import annotations

# How users name each server kind (the registry's display names, in the words of a log reader).
DISPLAY_NAMES = {
    "sglang": "SGLang",
    "vllm": "vLLM",
    "tgi": "TGI",
    "trtllm": "TensorRT-LLM",
    "llamacpp": "llama.cpp server",
    "ollama": "Ollama",
    "lmdeploy": "LMDeploy",
}
_VARIANT_OF = {
    "LoRAX": "a TGI fork",
    "vLLM-Ascend": "vLLM's Ascend plugin",
    "vLLM-Omni": "a vLLM fork",
}


KNOWN_SERVERS = "SGLang, vLLM, TGI, TensorRT-LLM, llama.cpp, Ollama, LMDeploy"


def display_name(server: str | None, variant: str | None = None) -> str:
    """ "TGI (LoRAX, a TGI fork)", "vLLM", "unknown server"."""
    name = DISPLAY_NAMES.get(server or "", server or "unknown server")
    if variant:
        name += f" ({variant}, {_VARIANT_OF.get(variant, 'a variant')})"
    return name
