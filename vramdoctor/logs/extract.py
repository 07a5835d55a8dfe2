"""Read facts and events off one log's candidate lines.

One `FileExtractor` per input file is fed the reader's hits in order. Each handler is guarded
by a cheap substring test before its regex runs, so the cost is per candidate line, not per
pattern. Facts carry a priority: a runtime line ("Use triton backend") outranks the argument
dump it contradicts, an effective value ("Automatically reduce --mem-fraction-static to
0.630") outranks the configured one.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any

from ..redact import REDACTED, redact_text
from . import patterns as P
from .args import balanced_end, parse_dump
from .model import MAX_EVENTS_PER_KIND, Event, Evidence
from .normalize import clean, is_continuation, strip_noise
from .reader import Hit

GIB = 1024.0
# Argument names whose values are secrets (api_key, hf_token, admin_api_key, ssl_keyfile_password).
SECRET_ARG = re.compile(r"^(?:\w+_)?(?:api_key|token|password|passwd|secret|secret_key|access_key)$")
MAX_DUMP_CHARS = 2 << 20  # an argument dump longer than this is parsed as far as it goes
EVIDENCE_CHARS = 600
# Lowercase fragments of every line _memory handles (a cheap gate before its regexes).
MEMORY_KEYS = (
    "out of memory", "outofmemoryerror", "cudaerrormemoryallocation", "memory pool end",
    "total_gpu_memory", "no available memory", "max seq len", "free memory on device",
    "not enough memory", "alloc_req_slots", "out of resource", "ran out of gpu memory",
    "mmitemmemorypool", "not enough gpu memory", "failed to register memory",
)
MAX_DUMPS = 8  # argument dumps parsed per file
MAX_TRACEBACKS = 64  # tracebacks read for model files and backend per file

# Facts whose later value wins at equal priority (the last runtime line is the one in force).
LAST_WINS = {"attention_backend"}

# Priorities: 1 = inferred (traceback paths, rank tags), 2 = argument dump, 3 = runtime line,
# 4 = effective value the server says it switched to.
INFERRED, ARGS, RUNTIME, EFFECTIVE = 1, 2, 3, 4

_VLLM_BACKEND_NAMES = {
    "flash attention": "FLASH_ATTN",
    "flashattention": "FLASH_ATTN",
    "flash_attn": "FLASH_ATTN",
    "xformers": "XFORMERS",
    "flashinfer": "FLASHINFER",
    "torch sdpa": "TORCH_SDPA",
    "torch_sdpa": "TORCH_SDPA",
    "rocmflashattention": "ROCM_FLASH",
    "rocm flash attention": "ROCM_FLASH",
    "triton": "TRITON_ATTN",
    "pallas": "PALLAS",
}


def size_mib(text: str) -> float | None:
    """'3.43 GiB' / '112.00 MiB' / '2.25 GB' -> MiB (the servers' GB means GiB)."""
    try:
        num, unit = text.split()
        v = float(num)
    except ValueError:
        return None
    unit = unit.upper().replace("I", "")
    scale = {"B": 1 / 1048576, "KB": 1 / 1024, "MB": 1.0, "GB": GIB, "TB": GIB * 1024}.get(unit)
    return None if scale is None else round(v * scale, 2)


def gb(text: str | None) -> float | None:
    return None if text is None else round(float(text) * GIB, 1)


@dataclass
class FileExtractor:
    """Facts and events of one input file."""

    name: str
    facts: dict[str, tuple[int, Any, Evidence]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    event_counts: dict[str, int] = field(default_factory=dict)
    votes: dict[str, int] = field(default_factory=lambda: {"sglang": 0, "vllm": 0})
    version: tuple[str, Evidence] | None = None
    ranks: dict[str, set[int]] = field(default_factory=dict)
    stage: str | None = None
    model_files: set[str] = field(default_factory=set)
    slow_processor: Evidence | None = None
    fast_only_processor: Evidence | None = None
    mm_evidence: Evidence | None = None
    dumps_parsed: int = 0
    secrets: set[str] = field(default_factory=set)  # values to blank in every output
    tracebacks_read: int = 0

    # -- helpers -----------------------------------------------------------------------
    def ev(self, hit: Hit, text: str | None = None) -> Evidence:
        t = text if text is not None else clean(hit.text).text
        if self.secrets:  # blank before cutting, so no partial secret survives the cut
            t = redact_text(t, self.secrets)
        return Evidence(self.name, hit.lineno, t[:EVIDENCE_CHARS])

    def put(self, name: str, value: Any, prio: int, evidence: Evidence) -> None:
        if value is None:
            return
        cur = self.facts.get(name)
        if cur is None or prio > cur[0] or (prio == cur[0] and name in LAST_WINS):
            self.facts[name] = (prio, value, evidence)

    def add_event(self, event: Event) -> None:
        n = self.event_counts.get(event.kind, 0)
        self.event_counts[event.kind] = n + 1
        if n < MAX_EVENTS_PER_KIND:
            self.events.append(event)

    # -- the dispatcher ----------------------------------------------------------------
    def feed(self, hit: Hit) -> None:
        t = hit.text
        if "TP" in t[:80] or "DP" in t[:80]:
            for kind, rank in clean(t).ranks:
                self.ranks.setdefault(kind, set()).add(rank)
        if "_args=" in t or "args: " in t:
            self._args(hit, t)
        if "LLM engine" in t:
            self._vllm_engine(hit, t)
        if "ersion" in t:
            self._versions(hit, t)
        if "\u2588" in t:
            m = P.VLLM_LOGO_MODEL.search(strip_noise(t))
            if m:
                self.put("model", m.group(1), RUNTIME, self.ev(hit))
                self.votes["vllm"] += 5
        if "oad weight" in t:
            self._sgl_load(hit, t)
        if "KV Cache" in t or "KV cache" in t:
            self._kv(hit, t)
        if "aptur" in t:
            self._graphs(hit, t)
        frame = 'File "' in t  # a traceback frame: only its path matters, read via lookback
        if "backend" in t and not frame and ("Use " in t or "Using " in t):
            self._backend(hit, t)
        if "image processor" in t and P.SLOW_PROCESSOR.search(t):
            self.slow_processor = self.slow_processor or self.ev(hit)
            self.mm_evidence = self.mm_evidence or self.ev(hit)
        if "IPC" in t or "transport" in t:
            self._ipc(hit, t)
        if "world size" in t:
            m = P.VLLM_TP_RANK.search(t)
            if m:
                self.put("world_size", int(m.group(1)), INFERRED, self.ev(hit))
        if "ultimodal" in t or "ulti-modal" in t:
            self._multimodal(hit, t)
        if "blocks:" in t:
            m = P.VLLM_BLOCKS.search(t)
            if m:
                self.put("gpu_blocks", int(m.group(1)), RUNTIME, self.ev(hit))
                self.votes["vllm"] += 2
                self.stage = "kv_cache_alloc"
        if "max_total_num_tokens" in t:
            self._sgl_summary(hit, t)
        if "weights t" in t or "loading took" in t:
            m = P.VLLM_WEIGHTS.search(t)
            if m:
                self.put("weights_mib", gb(m.group(1)), RUNTIME, self.ev(hit))
                self.stage = "profiling"
        if "rchitecture" in t or "V1 Engine" in t:
            m = P.VLLM_ARCH.search(t) or P.VLLM_ARCH_V1.search(t)
            if m:
                self.put("architecture", m.group(1), RUNTIME, self.ev(hit))
        if "load model" in t:
            m = P.VLLM_LOAD_MODEL.search(t)
            if m:
                self.put("model", m.group(1), INFERRED + 1, self.ev(hit))
                self.votes["vllm"] += 3
                self.stage = "weight_load"
        if "swap space" in t:
            m = P.VLLM_SWAP.search(t)
            if m:
                e = self.ev(hit)
                self.put("swap_space_mib", gb(m.group(1)), RUNTIME, e)
                self.put("host_memory_mib", gb(m.group(2)), RUNTIME, e)
        if "long context length" in t:
            m = P.VLLM_LONG_CTX.search(t)
            if m:
                self.put("long_context_length", int(m.group(1)), RUNTIME, self.ev(hit))
        if "hit an exception" in t:
            self._exception(hit, t)
        if "fired up" in t and P.SGL_READY.search(t):
            self.stage = "serving"
            self.votes["sglang"] += 5
        if "eak d" in t or "eak D" in t:
            self._leak(hit, t)
        if ("emory" in t or "out of resource" in t or "max seq len" in t) and not frame:
            self._memory(hit, t)

    # -- arguments ---------------------------------------------------------------------
    def _dump(self, hit: Hit, t: str, opener_at: int) -> dict[str, Any]:
        text = t
        if balanced_end(text, opener_at, text[opener_at]) < 0:
            for nxt in hit.after(400):
                text += strip_noise(nxt)  # a terminal wrap splits anywhere: join as is
                if len(text) > MAX_DUMP_CHARS or balanced_end(text, opener_at, text[opener_at]) > 0:
                    break
        args, _complete = parse_dump(text, opener_at)
        for key, value in args.items():
            if SECRET_ARG.match(key) and value not in (None, "", [], REDACTED):
                values = value if isinstance(value, (list, tuple)) else [value]
                self.secrets.update(str(v) for v in values if v is not None and len(str(v)) >= 4)
                args[key] = REDACTED
        return args

    def _args(self, hit: Hit, t: str) -> None:
        if self.dumps_parsed >= MAX_DUMPS:
            return  # restarts repeat the same dump; the first ones carry the facts
        t = strip_noise(t)
        m = P.SGL_ARGS.search(t)
        if m:
            args = self._dump(hit, t, m.end() - 1)
            if args:
                self.dumps_parsed += 1
                self.votes["sglang"] += 10
                self._apply_sglang_args(args, self.ev(hit))
            return
        m = P.VLLM_NONDEFAULT.search(t) or P.VLLM_NAMESPACE.search(t)
        if m:
            args = self._dump(hit, t, m.end() - 1)
            if args:
                self.dumps_parsed += 1
                self.votes["vllm"] += 10
                self._apply_vllm_args(args, self.ev(hit))

    def _apply_sglang_args(self, a: dict[str, Any], e: Evidence) -> None:
        self.put("server_args", a, ARGS, e)
        self.put("model", a.get("model_path"), ARGS, e)
        for key, fact in (
            ("tp_size", "tp_size"),
            ("dp_size", "dp_size"),
            ("pp_size", "pp_size"),
            ("tokenizer_worker_num", "tokenizer_worker_num"),
            ("cuda_graph_max_bs", "cuda_graph_max_bs"),
            ("chunked_prefill_size", "chunked_prefill_size"),
            ("max_running_requests", "max_running_requests"),
            ("max_total_tokens", "max_total_tokens"),
            ("context_length", "context_length"),
        ):
            v = a.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                self.put(fact, v, ARGS, e)
        v = a.get("mem_fraction_static")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            self.put("mem_fraction_static", float(v), ARGS, e)
        v = a.get("attention_backend")
        if isinstance(v, str) and v:
            self.put("attention_backend", v, ARGS, e)
        if isinstance(a.get("disable_cuda_graph"), bool):
            self.put("disable_cuda_graph", a["disable_cuda_graph"], ARGS, e)
        if a.get("mm_feature_transport") is not None:
            self.put("cuda_ipc_transport", a["mm_feature_transport"] == "cuda_ipc", ARGS, e)

    def _apply_vllm_args(self, a: dict[str, Any], e: Evidence) -> None:
        self.put("server_args", a, ARGS, e)
        model = a.get("model_tag") or a.get("model")
        if isinstance(model, str):
            self.put("model", model, ARGS, e)
        for key, fact in (
            ("tensor_parallel_size", "tp_size"),
            ("data_parallel_size", "dp_size"),
            ("pipeline_parallel_size", "pp_size"),
            ("max_model_len", "max_model_len"),
            ("max_num_seqs", "max_running_requests"),
        ):
            v = a.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                self.put(fact, v, ARGS, e)
        v = a.get("gpu_memory_utilization")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            self.put("gpu_memory_utilization", float(v), ARGS, e)
        if isinstance(a.get("enforce_eager"), bool):
            self.put("disable_cuda_graph", a["enforce_eager"], ARGS, e)
        v = a.get("attention_backend")
        if isinstance(v, str) and v:
            self.put("attention_backend", v.upper(), ARGS, e)

    def _vllm_engine(self, hit: Hit, t: str) -> None:
        m = P.VLLM_ENGINE.search(t)
        if not m:
            return
        e = self.ev(hit)
        self.votes["vllm"] += 10
        if m.group(1) and self.version is None:
            self.version = (m.group(1), e)
        cfg = dict(P.VLLM_CONFIG_KV.findall(m.group(2)))
        if "model" in cfg:
            self.put("model", cfg["model"].strip("'"), RUNTIME, e)
        for key, fact in (
            ("tensor_parallel_size", "tp_size"),
            ("pipeline_parallel_size", "pp_size"),
            ("data_parallel_size", "dp_size"),
            ("max_seq_len", "max_model_len"),
        ):
            if cfg.get(key, "").isdigit():
                self.put(fact, int(cfg[key]), RUNTIME, e)
        with contextlib.suppress(KeyError, ValueError):
            self.put("gpu_memory_utilization", float(cfg["gpu_memory_utilization"]), RUNTIME, e)
        if cfg.get("enforce_eager") in ("True", "False"):
            self.put("disable_cuda_graph", cfg["enforce_eager"] == "True", RUNTIME, e)
        self.stage = self.stage or "weight_load"

    def _versions(self, hit: Hit, t: str) -> None:
        m = P.VLLM_VERSION.search(t)
        if m:
            self.votes["vllm"] += 10
            if self.version is None:
                self.version = (m.group(1), self.ev(hit))
            if m.group(2):
                self.put("model", m.group(2), RUNTIME, self.ev(hit))
            return
        if "\u2588" in t:
            m = P.VLLM_LOGO_VERSION.search(strip_noise(t))
            if m:
                self.votes["vllm"] += 10
                if self.version is None:
                    self.version = (m.group(1), self.ev(hit))
            return
        if P.FAST_ONLY_PROCESSOR.search(t):
            self.fast_only_processor = self.fast_only_processor or self.ev(hit)

    # -- SGLang startup ----------------------------------------------------------------
    def _sgl_load(self, hit: Hit, t: str) -> None:
        m = P.SGL_LOAD_END.search(t)
        if m:
            e = self.ev(hit)
            self.votes["sglang"] += 5
            self.put("architecture", m.group(1), RUNTIME, e)
            self.put("avail_after_load_mib", gb(m.group(2)), RUNTIME, e)
            if m.group(3):
                self.put("weights_mib", gb(m.group(3)), RUNTIME, e)
            elif "avail_before_load_mib" in self.facts:
                before = self.facts["avail_before_load_mib"][1]
                self.put("weights_mib", round(before - gb(m.group(2)), 1), INFERRED, e)
            self.stage = "kv_cache_alloc"
            return
        m = P.SGL_LOAD_BEGIN.search(t)
        if m:
            self.votes["sglang"] += 3
            if m.group(1):
                self.put("avail_before_load_mib", gb(m.group(1)), RUNTIME, self.ev(hit))
            mr = P.OLD_SGL.match(strip_noise(t))
            if mr and mr.group().startswith("Rank "):
                self.ranks.setdefault("TP", set()).add(int(mr.group().split()[1].rstrip(":")))
            self.stage = "weight_load"

    def _kv(self, hit: Hit, t: str) -> None:
        m = P.SGL_KV.search(t)
        if m:
            e = self.ev(hit)
            if m.group(1):
                self.put("kv_tokens", int(m.group(1)), RUNTIME, e)
            if m.group(2):
                self.put("kv_cache_mib", round(gb(m.group(2)) + gb(m.group(3)), 1), RUNTIME, e)
            elif m.group(4):
                self.put("kv_cache_mib", gb(m.group(4)), RUNTIME, e)
            self.stage = "pool_done"
            return
        m = P.VLLM_KV_TOKENS.search(t)
        if m:
            self.put("kv_tokens", int(m.group(1).replace(",", "")), RUNTIME, self.ev(hit))
            return
        m = P.VLLM_KV_MEM.search(t) or P.VLLM_KV_RESERVED.search(t)
        if m:
            self.put("kv_cache_mib", gb(m.group(1)), RUNTIME, self.ev(hit))

    def _sgl_summary(self, hit: Hit, t: str) -> None:
        m = P.SGL_SUMMARY.search(t)
        if not m:
            return
        e = self.ev(hit)
        self.votes["sglang"] += 5
        self.put("kv_tokens", int(m.group(1)), RUNTIME, e)
        self.put("chunked_prefill_size", int(m.group(2)), RUNTIME, e)
        self.put("max_running_requests", int(m.group(4)), RUNTIME, e)
        self.put("context_length", int(m.group(5)), RUNTIME, e)

    def _graphs(self, hit: Hit, t: str) -> None:
        m = P.SGL_GRAPH_END.search(t)
        if m:
            e = self.ev(hit)
            if m.group(2):
                self.put("cuda_graph_mib", gb(m.group(2)), RUNTIME, e)
                self.put("avail_after_graph_mib", gb(m.group(3)), RUNTIME, e)
            self.stage = "graph_done"
            return
        m = P.SGL_GRAPH_BEGIN.search(t)
        if m:
            self.stage = "cuda_graph"
            return
        m = P.SGL_GRAPH_FAILED.search(t)
        if m:
            self.add_event(
                Event("cuda_graph_capture_failed", self.name, hit.lineno, self.ev(hit).text,
                      "cuda_graph", {"cause": m.group(1)[:300]})
            )
            return
        m = P.VLLM_GRAPH_DONE.search(t)
        if m:
            self.put("cuda_graph_mib", gb(m.group(1)), RUNTIME, self.ev(hit))
            self.stage = "graph_done"
            return
        if P.VLLM_GRAPH_BEGIN.search(t):
            self.stage = "cuda_graph"

    def _backend(self, hit: Hit, t: str) -> None:
        s = clean(t).text
        m = P.SGL_USE_BACKEND.search(s)
        if m:
            self.put("attention_backend", m.group(1), RUNTIME, self.ev(hit))
            return
        m = P.VLLM_USING_BACKEND.search(s)
        if m and "JIT" not in m.group(1):
            name = m.group(1)
            norm = _VLLM_BACKEND_NAMES.get(name.lower(), name.upper().replace(" ", "_"))
            self.put("attention_backend", norm, RUNTIME, self.ev(hit))

    def _multimodal(self, hit: Hit, t: str) -> None:
        m = P.SGL_MM_REDUCE.search(t)
        if m:
            e = self.ev(hit)
            self.put("mem_fraction_static", float(m.group(1)), EFFECTIVE, e)
            self.mm_evidence = self.mm_evidence or e
            self.votes["sglang"] += 5
            return
        if P.VLLM_MM_PROFILE.search(t):
            self.mm_evidence = self.mm_evidence or self.ev(hit)
            self.stage = "profiling"

    def _ipc(self, hit: Hit, t: str) -> None:
        e = self.ev(hit)
        m = P.IPC_USING_017.search(t)
        if m:
            self.put("cuda_ipc_transport", True, RUNTIME, e)
            self.put("mm_feature_cache_mb", float(m.group(1)), RUNTIME, e)
            self.put("tokenizer_worker_num", int(m.group(3)), RUNTIME, e)
            return
        m = P.IPC_POOL_016.search(t)
        if m:
            self.put("cuda_ipc_transport", True, RUNTIME, e)
            self.put("mm_feature_cache_mb", float(m.group(5)), RUNTIME, e)
            self.put("tokenizer_worker_num", int(m.group(4)), RUNTIME, e)
            self.put("ipc_pool_total_mib", float(m.group(1)), RUNTIME, e)
            return
        m = P.IPC_POOL_015.search(t)
        if m:
            self.put("cuda_ipc_transport", True, RUNTIME, e)
            self.put("mm_feature_cache_mb", float(m.group(2)), RUNTIME, e)
            self.put("tokenizer_worker_num", int(m.group(3)), RUNTIME, e)
            self.put("ipc_pool_total_mib", float(m.group(1)) * int(m.group(3)), RUNTIME, e)
            return
        if P.IPC_AUTO.search(t):
            self.put("cuda_ipc_transport", True, RUNTIME, e)
            return
        m = P.IPC_POOL_FULL.search(t)
        if m:
            self.put("cuda_ipc_transport", True, RUNTIME, e)
            self.add_event(Event("mm_feature_pool_full", self.name, hit.lineno, e.text, None,
                                 {"tensor_mib": float(m.group(1)), "pool_mib": float(m.group(2))}))

    # -- failures ----------------------------------------------------------------------
    def _exception(self, hit: Hit, t: str) -> None:
        if "Scheduler hit" in t or "TpModelWorkerClient hit" in t:
            self.votes["sglang"] += 3
        elif "EngineCore hit" in t:
            self.votes["vllm"] += 3
        if self.tracebacks_read < MAX_TRACEBACKS:
            self.tracebacks_read += 1
            self._frames("\n".join(hit.after(150)))

    def _frames(self, text: str) -> None:
        """Model files and attention backend read off traceback paths (lowest priority)."""
        for f in P.MODEL_FILE.findall(text):
            self.model_files.add(f)
        if not text:
            return
        m = P.TRACE_BACKEND.search(text)
        if m:
            name = m.group(1) or "flashinfer"
            self.put("attention_backend", name, INFERRED,
                     Evidence(self.name, 0, "traceback: " + m.group(0)))

    def _region(self, hit: Hit) -> str:
        before = hit.before(48 << 10)
        i = before.rfind(P.TRACEBACK)
        return before[i:] if i >= 0 else ""

    def _phase(self, region: str, line: str) -> str | None:
        text = region + "\n" + line
        best: tuple[int, str] | None = None
        for name, rx in P.PHASE_MARKERS:
            for m in rx.finditer(text):
                if best is None or m.start() >= best[0]:
                    best = (m.start(), name)
        if best is None:
            for name, rx in P.FORWARD_MARKERS:
                for m in rx.finditer(text):
                    if best is None or m.start() >= best[0]:
                        best = (m.start(), name)
            if best is not None and self.stage == "graph_done":
                return "warmup"  # a forward pass after graph capture, before "ready"
        if best is not None:
            return best[1]
        return {
            "weight_load": "weight_load",
            "kv_cache_alloc": "kv_cache_alloc",
            "cuda_graph": "cuda_graph",
            "profiling": "profiling",
            "graph_done": "warmup",
        }.get(self.stage or "")

    def _message(self, hit: Hit, text: str) -> str:
        """The error message plus its terminal-wrapped tail (up to 3 lines).

        A line is joined only while the message stops mid-sentence (not after '.', ')' ...)
        and the next line does not start a new record.
        """
        out = text
        for nxt in hit.after(3):
            if not out or out[-1] in ".)]:!?" or not is_continuation(nxt):
                break
            out += strip_noise(nxt).rstrip()
        return out

    def _memory(self, hit: Hit, t: str) -> None:
        low = t.lower()
        if not any(k in low for k in MEMORY_KEYS):
            return  # a line that merely mentions memory: no regex needed
        text = clean(t).text
        if P.CUDA_OOM.search(text) or P.VLLM_NOT_ENOUGH_LOAD.search(text):
            self._oom(hit, text)
            return
        kind: str | None = None
        data: dict[str, Any] = {}
        phase: str | None = None
        if "Memory pool end" in text:
            m = P.SGL_POOL_END.search(text)
            if m:
                self.put("avail_after_pool_mib", gb(m.group(1)), RUNTIME, self.ev(hit))
                self.votes["sglang"] += 3
            return
        if "total_gpu_memory" in text:
            m = P.VLLM_BUDGET.search(text)
            if m:
                e = self.ev(hit)
                self.put("total_gpu_mib", gb(m.group(1)), RUNTIME, e)
                self.put("gpu_memory_utilization", float(m.group(2)), RUNTIME, e)
            return
        if (m := P.SGL_RETRACT.search(text)) and ("retracted" in text or "Try to lower" in text):
            kind, phase = "retraction", m.group(1).lower()
            if m.group(2):
                data = {"retracted_reqs": int(m.group(2)), "new_token_ratio_from": float(m.group(3)),
                        "new_token_ratio_to": float(m.group(4))}
            self.votes["sglang"] += 3
        elif P.VLLM_NO_KV.search(text):
            kind, phase = "kv_budget_error", "kv_cache_alloc"
            data = {"reason": "no_memory_for_cache_blocks"}
        elif m := P.VLLM_MAX_SEQ.search(text):
            kind, phase = "kv_budget_error", "kv_cache_alloc"
            data = {"reason": "max_seq_len_exceeds_kv_cache", "max_seq_len": int(m.group(1)),
                    "needed_mib": gb(m.group(2)), "available_mib": gb(m.group(3))}
        elif m := P.VLLM_MAX_SEQ_V0.search(text):
            kind, phase = "kv_budget_error", "kv_cache_alloc"
            data = {"reason": "max_seq_len_exceeds_kv_cache", "max_seq_len": int(m.group(1)),
                    "kv_cache_tokens": int(m.group(2))}
        elif m := P.VLLM_FREE_LT.search(text):
            kind, phase = "kv_budget_error", "startup"
            data = {"reason": "free_memory_below_utilization", "free_mib": gb(m.group(1)),
                    "total_mib": gb(m.group(2))}
        elif P.SGL_NOT_ENOUGH.search(text):
            kind, phase = "kv_budget_error", "kv_cache_alloc"
            data = {"reason": "sglang_not_enough_memory_for_kv_pool"}
        elif P.SGL_REQ_SLOTS.search(text):
            kind = "req_slots_exhausted"
        elif m := P.TRITON_SMEM.search(text):
            kind = "triton_shared_memory"
            if m.group(1):
                data = {"required_bytes": int(m.group(1)), "limit_bytes": int(m.group(2))}
        elif P.RAY_OOM.search(text):
            kind = "host_oom"
            data = {"killer": "ray memory monitor"}
        elif m := P.RDMA_REGISTER.search(text):
            kind = "rdma_registration_failed"
            data = {"address": m.group(1), "error": (m.group(2) or "").strip()}
        elif m := P.MM_CPU_RETRY.search(text):
            kind, phase = "mm_preprocess_gpu_oom", "preprocessing"
        elif "MmItemMemoryPool" in text:
            self._ipc(hit, t)
            return
        if kind is None:
            return
        self.add_event(Event(kind, self.name, hit.lineno, self._message(hit, text)[:EVIDENCE_CHARS],
                             phase, data))

    def _oom(self, hit: Hit, text: str) -> None:
        if self.event_counts.get("cuda_oom", 0) >= MAX_EVENTS_PER_KIND:
            self.event_counts["cuda_oom"] += 1  # counted; the first ones carry the detail
            return
        msg = self._message(hit, text)
        region = self._region(hit)
        self._frames(region)
        data: dict[str, Any] = {}
        if m := P.OOM_TRIED.search(msg):
            data["requested_mib"] = size_mib(m.group(1))
        if m := P.OOM_GPU.search(msg):
            data["gpu"] = int(m.group(1))
            data["total_mib"] = size_mib(m.group(2))
            data["free_mib"] = size_mib(m.group(3))
            self.put("total_gpu_mib", data["total_mib"], INFERRED, self.ev(hit))
        procs = [{"pid": int(p), "mib": size_mib(s)} for p, s in P.OOM_PROCESS.findall(msg)]
        if procs:
            data["processes"] = procs
        if m := P.OOM_THIS.search(msg):
            data["this_process_mib"] = size_mib(m.group(1))
        if m := P.OOM_PRIVATE.search(msg):
            data["private_pools_mib"] = size_mib(m.group(1))
        if m := P.OOM_RESERVED.search(msg):
            data["reserved_unallocated_mib"] = size_mib(m.group(1))
        phase = self._phase(region, msg)
        if P.VLLM_NOT_ENOUGH_LOAD.search(text):
            phase = "weight_load"
        self.add_event(Event("cuda_oom", self.name, hit.lineno, msg[:EVIDENCE_CHARS], phase, data))

    def _leak(self, hit: Hit, t: str) -> None:
        if self.event_counts.get("kv_leak_selfcheck", 0) >= MAX_EVENTS_PER_KIND and P.LEAK.search(t):
            self.event_counts["kv_leak_selfcheck"] += 1
            return
        text = clean(t).text
        m = P.LEAK.search(text)
        if not m:
            return
        self.votes["sglang"] += 5
        wording = m.group(1)
        body = text
        for nxt in hit.after(6):
            s = strip_noise(nxt).strip()
            if P.LEAK_FIELD.search(s) and not P.LEAK.search(s) and not s.startswith("self."):
                body += " " + s
            else:
                break
        if wording.startswith("KV cache pool leak"):
            prev = hit.before(4096).rstrip("\n").rsplit("\n", 1)[-1]
            body = prev + " " + body
        fields: dict[str, int] = {}
        pool = "token"
        for key, val in P.LEAK_FIELD.findall(body):
            fields.setdefault(key, int(val))
        if wording.startswith("req_to_token"):
            pool = "req"
        elif "Mem Leak Detected" in wording:
            pool = "busy"
        elif "[swa]" in body and "[full]" not in body:
            pool = "swa"
        total = fields.get("total") or fields.get("max_total_num_tokens") or fields.get(
            "max_total_num_token") or fields.get("total_size")
        avail = fields.get("available", fields.get("available_size", fields.get("full_available_size")))
        evict = fields.get("evictable", fields.get("evictable_size", 0))
        prot = fields.get("protected", fields.get("protected_size", 0))
        held = fields.get("session_held", 0) + fields.get("uncached", 0)
        data: dict[str, Any] = {"pool": pool, "wording": wording, "fields": fields}
        if total is not None and avail is not None:
            data.update(total=total, available=avail, evictable=evict, protected=prot,
                        leaked=total - avail - evict - prot - held, double_free=avail > total)
        self.add_event(Event("kv_leak_selfcheck", self.name, hit.lineno, body[:EVIDENCE_CHARS], None, data))
