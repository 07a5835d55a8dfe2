"""The line vocabulary: which fragments make a line worth reading, and which step reads it.

One table, `GATES`, is the source of both:
- the reader's prefilter (`ANCHORS`): the literal fragments RE2 looks for in each raw block; a line
  holding none of them is never decoded;
- the extractor's dispatch (`extract.dispatch`): for each line read, the steps (FileExtractor
  methods, by name) whose gate the line passes, in table order.

A gate passes when the line holds one of `any_of`, and (when given) one of `also`, none of
`unless`, and `regex` matches. `anchors` are the prefilter's fragments for the gate (by default
`any_of`); every gate's anchors are in `ANCHORS`, so a line a gate can pass always reaches it
(tests/diagnose/test_diagnose_vocabulary.py checks this on every format string's example).
Two steps are structural and not in the table: a request echo (user text: only its prefix's
rank tags are read) and the rank/process tags of a line's prefix (read on every line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.cmdline import LAUNCH


@dataclass(frozen=True)
class Gate:
    step: str  # the FileExtractor method that reads the line
    any_of: tuple[str, ...]
    also: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    regex: re.Pattern[str] | None = None
    anchors: tuple[str, ...] | None = None  # None: any_of

    def passes(self, t: str) -> bool:
        return any(f in t for f in self.any_of) and self.rest(t)

    def rest(self, t: str) -> bool:
        """The conditions after `any_of` (for a line known to hold one of `any_of`)."""
        return (
            (not self.also or any(f in t for f in self.also))
            and not any(f in t for f in self.unless)
            and (self.regex is None or self.regex.search(t) is not None)
        )

    @property
    def prefilter(self) -> tuple[str, ...]:
        return self.any_of if self.anchors is None else self.anchors


# Argument dumps and vLLM's engine-config line: long lines that name memory settings
# (gpu_memory_utilization=, mem_fraction_static=) but never report a memory event.
DUMP_MARKS = (
    "server_args=ServerArgs(",
    "server_args={",
    "non-default args: {",
    "args: Namespace(",
    " with config: ",
)

GATES: tuple[Gate, ...] = (
    # SGLang server_args=ServerArgs(...) / server_args={...}; vLLM "non-default args: {...}", "args: Namespace(...)"
    Gate("_args", ("_args=", "args: ")),
    # a pasted launch command: "python -m sglang.launch_server ...", "vllm serve MODEL", "... entrypoints.openai..."
    Gate(
        "_command",
        ("launch_server", " serve ", "entrypoints.", "text-generation-launcher "),
        regex=LAUNCH,
    ),
    Gate(
        "_vllm_engine", ("LLM engine",)
    ),  # vLLM "Initializing an LLM engine (v0.6.5) with config: ..."
    # vLLM version lines, the logo, SGLang's "does not have a slow version"
    Gate("_versions", ("ersion",)),
    Gate("_logo_model", ("\u2588",)),  # the block glyph of vLLM's logo ("model   X" line)
    Gate(
        "_sgl_load", ("oad weight",)
    ),  # SGLang "Load weight begin/end", old "Rank N: load weight begin."
    Gate("_kv", ("KV Cache", "KV cache")),
    Gate(
        "_graphs", ("aptur",)
    ),  # Capture cuda graph / Capturing CUDA graphs / Graph capturing finished
    Gate("_backend", ("backend",), also=("Use ", "Using ")),  # "Use X backend" / "Using X backend"
    Gate("_slow_processor", ("image processor",), regex=P.SLOW_PROCESSOR),
    Gate("_ipc", ("IPC", "transport", "MmItemMemoryPool"), anchors=("IPC", "transport")),
    Gate("_world_size", ("world size",)),
    Gate(
        "_multimodal",
        ("ultimodal", "ulti-modal"),
        anchors=("ultimodal", "ulti-modal", "mem-fraction"),
    ),
    Gate("_encoder_cache", ("ncoder cache",), regex=P.VLLM_ENCODER_CACHE),
    Gate("_blocks", ("blocks:",)),  # vLLM "# GPU blocks: N", "# cuda blocks: N", "# rocm blocks: N"
    Gate("_sgl_summary", ("max_total_num_tokens",)),
    Gate(
        "_weights",
        ("weights t", "loading took", "weights memory:", "Requested memory:"),
        anchors=("weights t", "loading took"),  # ("memory:" lines hold the "emory" anchor)
    ),
    Gate("_architecture", ("rchitecture", "V1 Engine")),
    Gate("_load_model", ("load model",)),  # vLLM V1 "Starting to load model X..."
    Gate("_swap", ("swap space",)),
    Gate("_long_context", ("long context length",)),
    # traceback frames only a multimodal model runs (vision model files, encoder calls): read even
    # without the traceback's header (an excerpt that starts mid-traceback)
    Gate("_mm_frame", tuple(a.decode() for a in P.MM_FRAME_ANCHORS)),
    Gate(
        "_exception",
        (
            "hit an exception",
            "run_tp_server",
            "failed to start",
            "initialization failed",
            "encountered a fatal error",
            "died unexpectedly",
            "scheduler is dead",
            "Exception in worker",
            "Error executing method",
        ),
    ),
    # the OOM killer / SIGKILL (host RAM, most often)
    Gate(
        "_killed",
        ("Kill", "KILL", "exitcode", "code 137", "oom-kill"),
        anchors=("Killed", "SIGKILL", "exitcode", "code 137", "9/KILL", "oom-kill"),
    ),
    Gate("_ready", ("fired up",), regex=P.SGL_READY),
    Gate("_leak", ("eak d", "eak D")),  # "... leak detected!", "Mem Leak Detected!"
    # the other servers, the newer lines, platform failures (others.py)
    Gate(
        "_llamacpp",
        ("buffer size =", "MiB free", "n_ctx ", "VRAM ", "build: ", "exiting due to", '"build":'),
        anchors=(
            "buffer size =",
            "MiB free",
            "n_ctx ",
            "VRAM ",
            "build: ",
            "exiting due to",
            '"build":',
        ),
    ),
    Gate("_tgi", ("encountered an error", "Webserver", "Serving revision")),
    Gate("_tgi_budget", ("prefill tokens",)),
    Gate(
        "_trtllm",
        (
            "kv cache",
            "KV cache",
            "k/v cache",
            "mem_fraction",
            "TensorRT-LLM version",
            "Failed to create instance",
        ),
        anchors=(
            "kv cache",
            "k/v cache",
            "mem_fraction",
            "TensorRT-LLM version",
            "Failed to create instance",
        ),
        also=(
            "paged",
            "k/v cache",
            "mem_fraction",
            "TensorRT-LLM version",
            "Failed to create instance",
            "primary pool",
        ),
        unless=DUMP_MARKS,
    ),
    Gate("_lmdeploy", ("EngineConfig(",)),
    Gate(
        "_ollama",
        ("runner process", "rflags ", "goroutine ", "(version "),
        anchors=(
            "runner process",
            "rflags ",
            "goroutine ",
        ),  # ("(version X)" holds the "ersion" anchor)
    ),
    Gate("_vllm_graphs", ("CUDA graph memory",)),
    # Ollama refusing a model for system memory, llama.cpp's retry without pipeline
    # parallelism, environment assignments on their own lines (device lists, vLLM's DP size)
    Gate(
        "_ollama_memory",
        ("too large for system", "more system memory"),
        anchors=("too large for system",),  # ("system memory" holds the "emory" anchor)
    ),
    Gate("_lcpp_pipeline", ("pipeline parallelism",), anchors=("pipeline parallelism",)),
    Gate("_env_export", ("VISIBLE_DEVICES=", "_DP_SIZE="), regex=P.ENV_EXPORT),
    Gate("_vllm_skipped_profiling", ("skipped memory profiling",), anchors=()),  # holds "emory"
    Gate("_platform_line", ("detected platform",)),
    Gate(
        "_cli_error",
        ("serve: error", "_server.py: error"),
        anchors=("serve: error", "_server.py: error"),
    ),
    Gate("_sglang_reserve", ("Reserving ",), also=("ultimodal",), anchors=()),  # holds "ultimodal"
    Gate("_ipc_failed", ("IPC handle",)),
    Gate("_ipc_frame", ("cuda_ipc_transport_utils",), anchors=("transport",)),
    Gate("_gpu_fault", ("Memory access fault",)),
    Gate(
        "_known_error", ("kernel image",)
    ),  # "Triton Error [CUDA]: device kernel image is invalid"
    # every memory line (its own fragments; memory_plan reads it): not an argument dump or engine config
    Gate(
        "_memory",
        (
            "emory",
            "out of resource",
            "max seq len",
            "profiled value",
            "Retract requests",
            "OUT_OF_MEMORY",
            "ALLOC_FAILED",
        ),
        unless=DUMP_MARKS,
        anchors=(
            "emory",
            "out of resource",
            "max seq len",
            "profiled value",
            "Retract requests",
            "OUT_OF_MEMORY",
            "ALLOC_FAILED",
            "gpu-memory-utilization=",
        ),
    ),
)


def _anchors() -> tuple[bytes, ...]:
    out: list[bytes] = []
    for g in GATES:
        for a in g.prefilter:
            b = a.encode("utf-8")
            if b not in out:
                out.append(b)
    return tuple(out)


# The prefilter's fragments (bytes), from the gates: RE2 finds the first of them in a block.
ANCHORS: tuple[bytes, ...] = _anchors()


def _openers() -> tuple[tuple[str, tuple[int, ...]], ...]:
    out: dict[str, list[int]] = {}
    for i, g in enumerate(GATES):
        for f in g.any_of:
            if i not in out.setdefault(f, []):
                out[f].append(i)
    return tuple((f, tuple(idx)) for f, idx in out.items())


# Each `any_of` fragment of the table once, with the gates it opens: one pass over the line for all
# of them (RE2's multi-pattern Set: which fragments occur, in one DFA scan), or one substring test per
# distinct fragment without RE2, instead of one generator per gate (dispatch runs on every distinct
# candidate line, and a log with a timestamp on each line has nothing but distinct lines).
_OPENERS = _openers()
try:
    from re2 import _re2

    _options = _re2.RE2.Options()
    _options.encoding = _re2.RE2.Options.Encoding.LATIN1  # (the fragments' UTF-8 bytes, as bytes)
    _FRAGMENTS: Any = _re2.Set(_re2.RE2.Anchor.UNANCHORED, _options)
    for _f, _idx in _OPENERS:
        _FRAGMENTS.Add(re.escape(_f.encode("utf-8")))
    _FRAGMENTS.Compile()
except (ImportError, AttributeError):  # pragma: no cover - RE2 is a dependency
    _FRAGMENTS = None


def passed(t: str) -> list[int]:
    """The indexes in GATES of the gates `t` passes, in table order (`Gate.passes` for each gate)."""
    opened: set[int] = set()
    if _FRAGMENTS is not None:
        # (a fragment occurs in the text exactly when its UTF-8 bytes occur in the text's)
        for j in _FRAGMENTS.Match(t.encode("utf-8", "surrogatepass")):
            opened.update(_OPENERS[j][1])
    else:
        for f, idx in _OPENERS:
            if f in t:
                opened.update(idx)
    return [i for i in sorted(opened) if GATES[i].rest(t)]
