"""What a launched server's own log says about its start-up, beside the soak's verdict.

After `--launch`, the server's stdout and stderr are in the run folder; `server_log_facts`
runs `vramdoctor.diagnose` on that file and keeps the start-up facts that decide how memory
behaves: whether the fast (GPU) image processor runs in the tokenizer process, the memory
fraction (SGLang `mem_fraction_static`, vLLM `gpu_memory_utilization`), whether multimodal
features travel by CUDA IPC, and a few more, each with the log line it was read from (or
null: the log does not say). Findings of severity warning or critical come along by id and
title. The result is the data of the run file's `server_log` event, so `vramdoctor report`
shows the same lines offline. `startup_lines` words it for the terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["STARTUP_FACTS", "server_log_facts", "startup_lines"]

# Fact name -> how the report names it. The first three are always reported.
STARTUP_FACTS: dict[str, str] = {
    "fast_image_processor": "fast image processor",
    "mem_fraction_static": "memory fraction (mem_fraction_static)",
    "gpu_memory_utilization": "memory fraction (gpu_memory_utilization)",
    "cuda_ipc_transport": "CUDA IPC transport",
    "model": "model",
    "tp_size": "tensor parallel size",
    "attention_backend": "attention backend",
    "kv_tokens": "KV pool size (tokens)",
    "mm_feature_cache_mb": "multimodal feature cache (MB)",
    "disable_cuda_graph": "CUDA graphs disabled",
}
MAX_FINDINGS = 8


def server_log_facts(log_path: Path) -> dict[str, Any]:
    """The start-up facts of the server log at `log_path`: {"log", "server", "version",
    "facts": {name: {"value", "line", "text"}}, "findings": [{"id", "severity", "title"}],
    "error"}. A log that cannot be read or diagnosed gives empty facts and the reason in
    "error" (one line); this never raises."""
    out: dict[str, Any] = {
        "log": str(log_path),
        "server": None,
        "version": None,
        "facts": {},
        "findings": [],
        "error": None,
    }
    try:
        if not log_path.exists() or log_path.stat().st_size == 0:
            out["error"] = "the server wrote nothing to its log"
            return out
        from vramdoctor.diagnose import diagnose

        d = diagnose([log_path])
    except Exception as exc:  # diagnose must never cost the measurement
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return out
    facts = d.facts if not d.groups else d.groups[0].facts
    out["server"] = d.server if not d.groups else d.groups[0].server
    out["version"] = d.version if not d.groups else d.groups[0].version
    for name in STARTUP_FACTS:
        value = getattr(facts, name, None)
        if value is None:
            continue
        ev = facts.evidence.get(name)
        out["facts"][name] = {
            "value": value,
            "line": ev.line if ev is not None else None,
            "text": ev.text[:300] if ev is not None else None,
            "basis": ev.basis if ev is not None else "derived",
        }
    out["findings"] = [
        {"id": f.id, "severity": f.severity, "title": f.title}
        for f in d.findings
        if f.severity in ("warning", "critical")
    ][:MAX_FINDINGS]
    return out


def _value_text(name: str, value: Any) -> str:
    if name == "fast_image_processor":
        return "on (GPU, in the tokenizer process)" if value else "off (CPU)"
    if name == "cuda_ipc_transport":
        return "on (features shared through CUDA IPC)" if value else "off"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def startup_lines(data: Mapping[str, Any]) -> list[str]:
    """The `server_log` event's data in lines for the report: one per fact with the line it
    rests on, then the findings; the first three facts are always named (unknown when the log
    does not say them)."""
    facts = data.get("facts") or {}
    log = data.get("log") or "the server's log"
    lines: list[str] = []
    server = data.get("server")
    version = data.get("version")
    if server:
        lines.append(f"server: {server}" + (f" {version}" if version else ""))
    frac = "mem_fraction_static" in facts or "gpu_memory_utilization" in facts
    for name, shown in STARTUP_FACTS.items():
        fact = facts.get(name)
        if fact is None:
            if name in ("fast_image_processor", "cuda_ipc_transport") or (
                name == "mem_fraction_static" and not frac
            ):
                what = "memory fraction" if name == "mem_fraction_static" else shown
                lines.append(f"{what}: unknown (the log does not say)")
            continue
        where = f" (line {fact['line']})" if fact.get("line") else " (derived)"
        lines.append(f"{shown}: {_value_text(name, fact.get('value'))}{where}")
    for f in data.get("findings") or []:
        lines.append(f"{f.get('severity')}: {f.get('title')} [{f.get('id')}]")
    if data.get("error"):
        lines.append(f"not read: {data['error']}")
    if lines:
        lines.append(f"from {log}; more: vramdoctor diagnose {log}")
    return lines
