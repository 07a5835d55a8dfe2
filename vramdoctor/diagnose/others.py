"""Lines of the servers other than SGLang and vLLM, and the newer platform and vLLM/SGLang lines.

A mixin of `FileExtractor` (like events.py): each handler reads one family of lines into facts and
events. Servers: llama.cpp's server (and Ollama's runner, which prints the same lines), TGI and its
fork LoRAX, TensorRT-LLM (C++ runtime, Triton backend), LMDeploy, Ollama. Also: vLLM 0.18+'s
CUDA-graph estimate and utilization hints, its start-up without memory profiling, its detected
platform and argparse errors; SGLang 0.5.18+'s multimodal KV-budget reservation; SGLang's CUDA IPC
transport failing to open a handle; ROCm's GPU page fault. Formats: patterns.py (the block of
the other servers' lines).
"""

from __future__ import annotations

from typing import Any

from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.args import parse_dump
from vramdoctor.diagnose.findings import ARGS, INFERRED, RUNTIME, Evidence, LogEvent
from vramdoctor.diagnose.normalize import clean
from vramdoctor.diagnose.reader import Hit


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class OthersMixin:
    """Handlers of FileExtractor for the lines in this module's docstring."""

    name: str
    votes: dict[str, int]
    facts: dict[str, tuple[float, Any, Evidence]]
    mm_evidence: Evidence | None
    event_counts: dict[str, int]
    events: list[LogEvent]
    version: tuple[str, Evidence] | None
    gpu_buffers: dict[str, float]
    _stores: int

    def ev(self, hit: Hit, text: str | None = None) -> Evidence:
        raise NotImplementedError  # provided by FileExtractor

    def put(self, name: str, value: Any, prio: float, evidence: Evidence | Hit) -> None:
        raise NotImplementedError  # provided by FileExtractor

    def add_event(self, event: LogEvent) -> None:
        raise NotImplementedError  # provided by FileExtractor

    def cut(self, t: str) -> str:
        raise NotImplementedError  # provided by FileExtractor

    def _event(self, hit: Hit, kind: str, data: dict[str, Any], phase: str | None = None) -> None:
        self.add_event(LogEvent(kind, self.name, hit.lineno, self.ev(hit).text, phase, data))

    # -- llama.cpp (and Ollama's runner) ------------------------------------------------------
    def _llamacpp(self, hit: Hit, t: str) -> None:
        s = clean(t).text
        if m := P.LCPP_FREE.search(s):
            self.put("free_before_load_mib", float(m.group(2)), RUNTIME, hit)
            return
        if m := P.LCPP_BUFFER.search(s):
            device, what, size = m.group(1), m.group(2), float(m.group(3))
            on_gpu = not device.upper().startswith("CPU")
            if what == "model" and on_gpu:
                # one line per GPU: the weights on the GPUs are their sum (the first line's evidence)
                self.gpu_buffers[device] = size
                first = self.facts.get("weights_mib")
                e = first[2] if first and first[0] == RUNTIME else self.ev(hit)
                total = round(sum(self.gpu_buffers.values()), 2)
                self.facts["weights_mib"] = (RUNTIME, total, e)
                self._stores += 1
            elif what == "KV":
                self.put("kv_on_cpu", not on_gpu, RUNTIME, hit)
                if on_gpu:
                    self.put("kv_cache_mib", size, RUNTIME, hit)
            elif what == "compute" and on_gpu:
                self.put("compute_buffer_mib", size, RUNTIME, hit)
            return
        if m := P.LCPP_NCTX.search(s):
            self.put("context_length", int(m.group(1)), RUNTIME, hit)
            return
        if m := P.LCPP_VRAM_OLD.search(s):
            fact = "weights_mib" if m.group(1) == "used" else "kv_cache_mib"
            self.put(fact, float(m.group(2)), RUNTIME, hit)
            return
        if m := P.LCPP_BUILD.search(s):
            build = m.group(1) or m.group(2)
            if self.version is None:
                self.version = (f"b{build}", self.ev(hit))
            return
        if m := P.LCPP_EXIT.search(s):
            self.add_event(
                LogEvent(
                    "server_crash",
                    self.name,
                    hit.lineno,
                    self.ev(hit).text,
                    None,
                    {"process": "llama.cpp server", "report": True, "error": s[:300]},
                )
            )

    # -- TGI and LoRAX ---------------------------------------------------------------------------
    def _tgi(self, hit: Hit, t: str) -> None:
        s = clean(t).text
        if m := P.TGI_METHOD.search(s):
            data: dict[str, Any] = {
                "process": f"shard ({m.group(1).lower()})",
                "tgi_method": m.group(1),
            }
            for raw in hit.following(120):  # the exception at the end of the shard's traceback
                x = clean(raw).text
                if P.EXCEPTION_LINE.match(x):
                    data["error"] = x[:300]
                    break
            self.add_event(
                LogEvent("server_crash", self.name, hit.lineno, self.ev(hit).text, None, data)
            )
            return
        if P.TGI_WEBSERVER.search(s):
            self.add_event(
                LogEvent(
                    "server_crash",
                    self.name,
                    hit.lineno,
                    self.ev(hit).text,
                    None,
                    {"process": "router", "report": True},
                )
            )
            return
        if m := P.TGI_MODEL.search(s):
            self.put("model", m.group(1), RUNTIME, hit)

    def _tgi_budget(self, hit: Hit, t: str) -> None:
        """TGI's warm-up check: "Not enough memory to handle N prefill tokens. You need to decrease
        --max-batch-prefill-tokens" (a budget check in flash_causal_lm.py warmup, not a torch OOM)."""
        s = clean(t).text
        m = P.TGI_PREFILL_BUDGET.search(s)
        if m is None or self.event_counts.get("kv_budget_error", 0) >= 8:
            return
        for e in self.events_so_far("kv_budget_error"):
            if e.data.get("reason") == "tgi_prefill_tokens" and e.data.get("prefill_tokens") == int(
                m.group(1)
            ):
                return  # the same failure relayed by the client, the launcher and the panic
        self._event(
            hit,
            "kv_budget_error",
            {"reason": "tgi_prefill_tokens", "prefill_tokens": int(m.group(1))},
            "warmup",
        )

    def events_so_far(self, kind: str) -> list[LogEvent]:
        return [e for e in self.events if e.kind == kind]

    # -- TensorRT-LLM ------------------------------------------------------------------------
    def _trtllm(self, hit: Hit, t: str) -> None:
        s = clean(t).text
        if m := P.TRT_KV_MEM.search(s):
            total, avail = float(m.group(1)) * 1024, float(m.group(2)) * 1024
            self.put("total_gpu_mib", round(total, 1), RUNTIME, hit)
            self.put("kv_available_mib", round(avail, 1), RUNTIME, hit)
            return
        if m := P.TRT_KV_ALLOC.search(s):
            if m.group(1):
                self.put("kv_tokens", int(m.group(1)), RUNTIME, hit)
            nbytes = int(m.group(2) or m.group(3))
            self.put("kv_cache_mib", round(nbytes / 1048576, 1), RUNTIME, hit)
            return
        if m := P.TRT_KV_TOKENS.search(s):
            self.put("kv_tokens", int(m.group(1)), RUNTIME, hit)
            return
        if m := P.TRT_KV_BLOCKS.search(s):
            self.put("gpu_blocks", int(m.group(1)), RUNTIME, hit)
            return
        if m := P.TRT_KV_DEFAULT.search(s):
            share = float(m.group(1))
            self.put("kv_share", share, INFERRED, hit)  # the default the backend says it uses
            if not self.events_so_far("trtllm_kv_default_fraction"):
                self._event(hit, "trtllm_kv_default_fraction", {"kv_share": share})
            return
        if m := P.TRT_VERSION.search(s):
            if self.version is None:
                self.version = (m.group(1), self.ev(hit))
            return
        if P.TRT_CREATE_FAILED.search(s):
            self.add_event(
                LogEvent(
                    "server_crash",
                    self.name,
                    hit.lineno,
                    self.ev(hit).text,
                    None,
                    {"process": "Triton model instance", "error": s[:300]},
                )
            )

    # -- LMDeploy ------------------------------------------------------------------------------
    def _lmdeploy(self, hit: Hit, t: str) -> None:
        s = clean(t).text
        m = P.LMD_ENGINE.search(s)
        if m is None:
            return
        args, _ = parse_dump(s, m.end() - 1)
        e = self.ev(hit)
        for key, fact in (
            ("tp", "tp_size"),
            ("max_batch_size", "max_running_requests"),
            ("session_len", "context_length"),
        ):
            v = args.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                self.put(fact, v, ARGS, e)
        v = args.get("cache_max_entry_count")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            self.put("kv_share", float(v), ARGS, e)

    # -- Ollama --------------------------------------------------------------------------------
    def _ollama(self, hit: Hit, t: str) -> None:
        s = clean(t).text
        if m := P.OLLAMA_VERSION.search(s):
            if self.version is None:
                self.version = (m.group(1), self.ev(hit))
            return
        if m := P.OLLAMA_RUNNER_DIED.search(s):
            self.add_event(
                LogEvent(
                    "server_crash",
                    self.name,
                    hit.lineno,
                    self.ev(hit).text,
                    None,
                    {"process": "llama runner", "report": True},
                )
            )
            return
        if P.GO_CRASH.search(s.strip()) and not self.events_so_far("go_crash"):
            # a Go runtime crash dump (goroutines, registers): the process died; its error is above
            self._event(
                hit, "server_crash", {"process": "runner (Go runtime crash dump)", "report": True}
            )
            self.add_event(LogEvent("go_crash", self.name, hit.lineno, self.ev(hit).text, None, {}))

    def _ollama_memory(self, hit: Hit, t: str) -> None:
        """Ollama's scheduler refusing a model for system memory: "model request too
        large for system" requested= available= (a WARN) and the load error "model requires more
        system memory (X) than is available (Y)": host RAM, one event per figure asked."""
        s = clean(t).text
        m = P.OLLAMA_SYSTEM_MEMORY.search(s) or P.OLLAMA_TOO_LARGE.search(s)
        if m is None:
            return
        self.votes["ollama"] += 5
        requested, available = m.group(1), m.group(2)
        for e in self.events_so_far("host_oom"):
            if (
                e.data.get("killer") == "ollama memory check"
                and e.data.get("requested") == requested
            ):
                if available and not e.data.get("available"):
                    e.data["available"] = available  # the load error completes a cut WARN line
                return
        data: dict[str, Any] = {"killer": "ollama memory check", "requested": requested}
        if available:
            data["available"] = available
        self._event(hit, "host_oom", data)

    def _lcpp_pipeline(self, hit: Hit, t: str) -> None:
        """llama.cpp's "pipeline parallelism enabled (n_copies=N)": the compute buffers are N copies."""
        if m := P.LCPP_PP_COPIES.search(t):
            self.put("pipeline_copies", int(m.group(1)), RUNTIME, hit)

    def _env_export(self, hit: Hit, t: str) -> None:
        """An environment assignment on its own line ("export VLLM_DP_SIZE=2",
        "export ASCEND_RT_VISIBLE_DEVICES=0,1"): the devices visible and vLLM's DP size."""
        m = P.ENV_EXPORT.match(clean(t).text)
        if m is None:
            return
        name, value = m.group(1), m.group(2).strip("'\"")
        if name.endswith("VISIBLE_DEVICES"):
            n = len([x for x in value.split(",") if x.strip()])
            self.put("visible_devices", n, RUNTIME, hit)
        elif name == "VLLM_DP_SIZE" and value.isdigit():
            self.put("dp_env_size", int(value), RUNTIME, hit)

    # -- vLLM 0.18+: CUDA-graph estimate, hints, profiling skipped, platform, argparse ---------------
    def _vllm_graphs(self, hit: Hit, t: str) -> None:
        s = clean(t).text
        if m := P.VLLM_GRAPH_ESTIMATE.search(s):
            self.votes["vllm"] += 3
            self.put("cuda_graph_estimate_mib", round(float(m.group(1)) * 1024, 1), RUNTIME, hit)
            return
        if m := P.VLLM_GRAPH_PROFILE.search(s):
            parts = P.VLLM_GRAPH_PROFILE_PART.findall(m.group(1))
            self.put("cuda_graph_capture_sizes", sum(int(n) for _, n, _ in parts), RUNTIME, hit)
            self.put("cuda_graph_largest_batch", max(int(x) for _, _, x in parts), RUNTIME, hit)
            return
        if P.VLLM_GRAPH_ESTIMATE_ON.search(s):
            self.put("cuda_graph_estimate_applied", True, RUNTIME, hit)
        elif P.VLLM_GRAPH_ESTIMATE_OFF.search(s):
            self.put("cuda_graph_estimate_applied", False, RUNTIME, hit)
        if m := P.VLLM_UTIL_FROM.search(s):
            # "increase --gpu-memory-utilization from 0.7000 to 0.7021": the first value is the one set
            self.put("gpu_memory_utilization", float(m.group(1)), RUNTIME, hit)

    def _vllm_skipped_profiling(self, hit: Hit, t: str) -> None:
        m = P.VLLM_SKIPPED_PROFILING.search(clean(t).text)
        if m:
            self.votes["vllm"] += 3
            self.put("kv_cache_mib", round(float(m.group(1)) * 1024, 1), RUNTIME, hit)
            self._event(
                hit, "kv_profiling_skipped", {"kv_cache_mib": round(float(m.group(1)) * 1024, 1)}
            )

    def _platform_line(self, hit: Hit, t: str) -> None:
        m = P.VLLM_PLATFORM.search(clean(t).text)
        if m:
            name = {"rocm": "rocm", "cuda": "cuda", "npu": "npu", "ascend": "npu"}.get(
                m.group(1).lower()
            )
            if name:
                self.put("platform", name, RUNTIME, hit)

    def _cli_error(self, hit: Hit, t: str) -> None:
        s = clean(t).text.strip().strip('"')
        m = P.VLLM_CLI_ERROR.search(s)
        if m is None:
            return
        self.votes[
            "sglang" if "sglang" in m.group(1) or "launch_server" in m.group(1) else "vllm"
        ] += 5
        self._event(hit, "cli_error", {"program": m.group(1), "error": m.group(2)[:300]})

    # -- SGLang 0.5.18+: the multimodal reservation; the CUDA IPC transport failing -----------------
    def _sglang_reserve(self, hit: Hit, t: str) -> None:
        m = P.SGL_MM_RESERVE.search(clean(t).text)
        if m:
            self.votes["sglang"] += 5
            self.put("mm_reserved_mib", round(float(m.group(1)) * 1024, 1), RUNTIME, hit)
            self.mm_evidence = self.mm_evidence or self.ev(hit)

    def _ipc_failed(self, hit: Hit, t: str) -> None:
        s = clean(t).text
        m = P.SGL_IPC_FAILED.search(s)
        if m is None:
            return
        self.votes["sglang"] += 3
        e = self.ev(hit)
        self.put("cuda_ipc_transport", True, RUNTIME, e)
        runtime = (m.group(1) or "").upper() or None
        if runtime == "HIP":
            self.put("platform", "rocm", RUNTIME, e)
        if len(self.events_so_far("ipc_transport_failed")) < 8:
            self.add_event(
                LogEvent(
                    "ipc_transport_failed",
                    self.name,
                    hit.lineno,
                    e.text,
                    None,
                    {"runtime": runtime, "error": m.group(2)},
                )
            )

    def _ipc_frame(self, hit: Hit, t: str) -> None:
        """A frame of SGLang's CUDA IPC transport (utils/cuda_ipc_transport_utils.py): it was on."""
        self.put(
            "cuda_ipc_transport",
            True,
            RUNTIME,
            self.ev(hit, "traceback frame: " + clean(t).text[:200]),
        )
        self.votes["sglang"] += 1

    def _known_error(self, hit: Hit, t: str) -> None:
        """An error with a known non-memory cause ("device kernel image is invalid": the GPU code was
        built for another architecture or toolchain)."""
        s = clean(t).text
        if P.KERNEL_IMAGE_INVALID.search(s) and not self.events_so_far("kernel_image_invalid"):
            self._event(hit, "kernel_image_invalid", {"error": s[:300]})

    # -- ROCm: a GPU page fault --------------------------------------------------------------
    def _gpu_fault(self, hit: Hit, t: str) -> None:
        m = P.GPU_MEMORY_FAULT.search(clean(t).text)
        if m is None or self.events_so_far("gpu_memory_fault"):
            return
        self.put("platform", "rocm", RUNTIME, hit)
        self._event(
            hit, "gpu_memory_fault", {"node": int(m.group(1)), "reason": (m.group(2) or "").strip()}
        )
