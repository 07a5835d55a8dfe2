"""The diagnose data: evidence lines, facts, events, findings, and the whole diagnosis.

A fact that the log does not show stays None: rules and the report must never guess.
Sizes are MiB floats like the rest of vramdoctor (the servers print GB meaning GiB).

Every claim says what it rests on (schema `vramdoctor.diagnose/2`):
- `Evidence.kind`: "read" (the line at `line` says it) or "derived" (arithmetic or an inference
  over read lines; `text` says how, `line` is 0 when no single line carries it);
- `Finding.basis`: "read" (the cause is stated by the evidence lines), "derived" (the cause is
  computed from read figures: `Finding.derived` shows the arithmetic) or "unknown" (the log does
  not show the cause: the finding says what is missing).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
EvidenceKind = Literal["read", "derived"]
Basis = Literal["read", "derived", "unknown"]
SEVERITY_RANK: dict[str, int] = {"critical": 0, "warning": 1, "info": 2}
SCHEMA = "vramdoctor.diagnose/2"
MAX_EVENTS_PER_KIND = 50  # the first ones are kept in full, the rest only counted
EVIDENCE_CHARS = 600  # characters of a line kept as evidence
# Fact priorities: a later source of higher priority replaces an earlier value.
# 1 inferred (traceback paths, rank tags), 1.5 pasted launch command, 2 argument dump, 3 runtime line, 4 effective value the
# server says it switched to ("Automatically reduce --mem-fraction-static to 0.630").
INFERRED, CMDLINE, ARGS, RUNTIME, EFFECTIVE = 1, 1.5, 2, 3, 4


@dataclass(frozen=True)
class Evidence:
    """A line of the log (`line` from 1, `text` as printed, prefixes stripped), or a derivation
    (`kind` "derived": `text` says what it was computed from; `line` 0 when no one line holds it)."""

    file: str
    line: int
    text: str
    kind: EvidenceKind | None = None  # None: "read" when line > 0, else "derived"

    @property
    def basis(self) -> EvidenceKind:
        if self.kind is not None:
            return self.kind
        return "read" if self.line > 0 else "derived"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text, "kind": self.basis}


@dataclass
class LogEvent:
    """One thing a server log says happened: a CUDA OOM, a KV self-check failure, a retraction...

    (Not `vramdoctor.samples.Event`, the protocol mark in a run file.)"""

    kind: str
    file: str
    line: int
    text: str
    phase: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def evidence(self) -> Evidence:
        return Evidence(self.file, self.line, self.text)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "phase": self.phase,
            "file": self.file,
            "line": self.line,
            "text": self.text,
        }
        out.update({k: v for k, v in self.data.items() if k not in out})
        return out


@dataclass
class Facts:
    """What the log says about the server and its settings; None = not shown."""

    model: str | None = None
    architecture: str | None = None
    multimodal: bool | None = None
    tp_size: int | None = None
    # True when tp_size is only a lower bound read off rank tags (the ranks that printed something),
    # False when an argument dump, the engine config or a world-size line states it, None when unknown.
    tp_size_is_lower_bound: bool | None = None
    # The TP size the rank tags prove at least (highest TP rank seen + 1), also when some ranks are missing.
    tp_size_at_least: int | None = None
    dp_size: int | None = None
    pp_size: int | None = None
    mem_fraction_static: float | None = None
    gpu_memory_utilization: float | None = None
    attention_backend: str | None = None
    fast_image_processor: bool | None = None
    # "cuda", "rocm", "npu": the platform a line names (vLLM's detected platform, HIP errors, ...)
    platform: str | None = None
    # a fork or wrapper of the server its own marks name ("LoRAX" for TGI, "vLLM-Ascend")
    variant: str | None = None
    cuda_ipc_transport: bool | None = None
    tokenizer_worker_num: int | None = None
    mm_feature_cache_mb: float | None = None
    ipc_pool_total_mib: float | None = None
    # the oldest SGLang version whose wording the CUDA IPC pool line has ("0.5.17" for "Using CUDA IPC ...")
    ipc_min_version: str | None = None
    # the oldest server version whose format a line has, when no version line is printed ("0.5.19": SGLang
    # printed its arguments as server_args={...}, a dict, which 0.5.18 and older never do)
    version_at_least: str | None = None
    cuda_graph_max_bs: int | None = None
    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    context_length: int | None = None
    max_model_len: int | None = None
    disable_cuda_graph: bool | None = None
    # startup memory (MiB)
    avail_before_load_mib: float | None = None
    avail_after_load_mib: float | None = None
    weights_mib: float | None = None
    kv_cache_mib: float | None = None
    kv_tokens: int | None = None
    gpu_blocks: int | None = None
    avail_after_pool_mib: float | None = None
    cuda_graph_mib: float | None = None
    avail_after_graph_mib: float | None = None
    total_gpu_mib: float | None = None
    free_before_load_mib: float | None = None  # free memory the server saw on its device at load
    # vLLM 0.18+: "Estimated CUDA graph memory: X GiB total"; whether the KV budget subtracted it
    # ("CUDA graph memory profiling is enabled" / "... will be enabled by default" in 0.18-0.20)
    cuda_graph_estimate_mib: float | None = None
    cuda_graph_estimate_applied: bool | None = None
    cuda_graph_capture_sizes: int | None = (
        None  # graphs vLLM profiles ("PIECEWISE=51 (largest=512)")
    )
    cuda_graph_largest_batch: int | None = None
    kv_share: float | None = (
        None  # TRT-LLM kv_cache_free_gpu_mem_fraction, LMDeploy cache_max_entry_count
    )
    kv_available_mib: float | None = None  # memory left for the KV cache after the engine (TRT-LLM)
    kv_on_cpu: bool | None = None  # llama.cpp "CPU KV buffer size" (--no-kv-offload)
    compute_buffer_mib: float | None = None  # llama.cpp's compute buffer on the GPU
    mm_reserved_mib: float | None = (
        None  # SGLang 0.5.18+ "Reserving X GB of the KV budget for ... multimodal"
    )
    torch_compile: bool | None = None  # SGLang enable_torch_compile / vLLM compilation in the log
    # llama.cpp's "pipeline parallelism enabled (n_copies=N)"; the devices an
    # `export X_VISIBLE_DEVICES=a,b` line lists; vLLM's `export VLLM_DP_SIZE=N`
    pipeline_copies: int | None = None
    visible_devices: int | None = None
    dp_env_size: int | None = None
    swap_space_mib: float | None = None  # vLLM CPU swap space (pinned host memory)
    host_memory_mib: float | None = None  # total CPU memory as vLLM reports it
    long_context_length: int | None = None  # vLLM's long-context warning fired for this length
    server_args: dict[str, Any] | None = None  # the parsed dump, as printed
    # what a name or a path suggests where no line says it (never a fact): fact name -> {"value": ...,
    # "rests_on": "the model name 'X' is that of a multimodal release (a name, not a line of the log)"}
    hints: dict[str, dict[str, Any]] = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)  # fact name -> line

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["server_args"] = _jsonable(self.server_args)
        out.pop("evidence")
        out["evidence"] = {k: v.to_json() for k, v in self.evidence.items()}
        return out


def _jsonable(v: Any) -> Any:
    """Argument values are Python literals: make them plain JSON (no sets, bytes, inf)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    return repr(v)


@dataclass
class Finding:
    """One cause and its fix. `basis`: what the cause rests on ("read", "derived", "unknown";
    None: "read" when every evidence line is read, else "derived"); `derived`: the arithmetic
    over read figures the explanation uses, one statement each ("12.95 GiB asked < 18.55 GiB free")."""

    id: str
    severity: Severity
    title: str
    explanation: str
    fix: str
    evidence: list[Evidence] = field(default_factory=list)
    basis: Basis | None = None
    derived: list[str] = field(default_factory=list)

    @property
    def rests_on(self) -> Basis:
        if self.basis is not None:
            return self.basis
        if self.derived or any(e.basis == "derived" for e in self.evidence):
            return "derived"
        return "read" if self.evidence else "unknown"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "basis": self.rests_on,
            "evidence": [e.to_json() for e in self.evidence],
            "derived": list(self.derived),
            "explanation": self.explanation,
            "fix": self.fix,
        }


@dataclass
class FileSummary:
    file: str
    bytes: int
    lines: int
    server: str | None
    recognised: bool
    notes: list[str] = field(default_factory=list)


@dataclass
class Diagnosis:
    files: list[FileSummary]
    server: str | None
    version: str | None
    facts: Facts
    events: list[LogEvent]
    event_counts: dict[str, int]
    findings: list[Finding] = field(default_factory=list)
    version_evidence: Evidence | None = None
    # Logs of different servers given together: one diagnosis per server, never merged (then the
    # top level has server None and empty facts, and gathers the groups' events and findings).
    groups: list[Diagnosis] = field(default_factory=list)

    def events_of(self, *kinds: str) -> list[LogEvent]:
        return [e for e in self.events if e.kind in kinds]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "files": [asdict(f) for f in self.files],
            "server": self.server,
            "version": self.version,
            "facts": self.facts.to_json(),
            "events": [e.to_json() for e in self.events],
            "event_counts": dict(self.event_counts),
            "findings": [f.to_json() for f in self.findings],
            "groups": [
                {
                    "server": g.server,
                    "version": g.version,
                    "files": [f.file for f in g.files],
                    "facts": g.facts.to_json(),
                    "findings": [f.to_json() for f in g.findings],
                }
                for g in self.groups
            ],
        }
