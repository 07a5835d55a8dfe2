"""The server crashed, and the log shows no memory error that explains it (an excerpt cut short).

Three cases, strongest first: an error with a known non-memory cause (a GPU binary built for
another GPU or toolchain), the crash's own exception quoted (not a memory error), or no exception
at all (the excerpt stops before it: the finding says what to add, and, when the frames or the
server say where it failed, what the error line would decide and the levers if it was memory).
"""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding, LogEvent
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, server_name, words

# Every event kind that is (or names) the cause of a crash; with one of them the crash is explained.
CAUSES = ("server_crash",)
# Events that never explain a crash: SGLang's retraction (it handled a full pool and kept running),
# a capped KV budget at start-up, a bare SIGKILL sign (SGLang and vLLM SIGKILL their other processes
# after one died; the host-oom rule reports a SIGKILL that nothing else explains), start-up notes, a
# traceback whose error is missing, a Go crash dump (the runner's death itself), a known error this
# rule names.
NOT_CAUSES = (
    "retraction",
    "kv_budget_capped",
    "sigkill",
    "traceback_cut",
    "go_crash",
    "kv_profiling_skipped",
    "trtllm_kv_default_fraction",
    "kernel_image_invalid",
    "cli_error",
)


def _explains(e: LogEvent) -> bool:
    """Whether an event other than a crash line is the crash's cause."""
    return e.kind not in CAUSES and e.kind not in NOT_CAUSES


def _known(d: Diagnosis, n: int) -> Finding | None:
    evs = d.events_of("kernel_image_invalid")
    if not evs:
        return None
    v = words(d)
    avoid = v.join(
        "without torch.compile ({compile_off})", "without CUDA graphs ({graph_off})", sep=" or "
    )
    return Finding(
        RULE.id,
        "info",
        "The server crashed: its GPU code was built for another GPU or toolchain (not a memory error)",
        explanation=(
            f"{n} crash line(s); the error is `{evs[0].data['error'][:200]}`: the GPU has no kernel image in the "
            "binary it was asked to run (the torch/Triton/CUDA build does not match this GPU's architecture or "
            "the driver), here in code compiled at start-up. Not a GPU-memory setting."
        ),
        fix=(
            "Install builds of torch, Triton and the server that match the driver and this GPU (the same CUDA "
            "major version throughout)"
            + (f"; or run {avoid} to avoid the compiled kernels" if avoid else "")
            + "."
        ),
        evidence=[evs[0].evidence, *first_evidence(d.events_of("server_crash"), 1)],
    )


def _unexplained(d: Diagnosis, crashes: list[LogEvent], n: int) -> Finding:
    """No exception in the text: say what is missing, and where it failed when the log shows it."""
    cut = next(iter(d.events_of("traceback_cut")), None)
    tgi = next((e for e in crashes if e.data.get("tgi_method")), None)
    expl = (
        f"{n} crash line(s) (an exception ended a server process) and no out-of-memory error, KV "
        "self-check failure or other memory error in the log: the exception's own last line, which "
        "says what it was, is not in the text read (an excerpt cut before it, or another file)."
    )
    fix = "Add the end of the traceback (the line after the last 'File ...' frame) or the whole log, and diagnose again."
    if tgi is not None:
        from vramdoctor.diagnose.rules.cuda_oom import _fix

        method = str(tgi.data["tgi_method"]).lower()
        expl += (
            f" {server_name(d)}'s shard failed in its {method} (`Method {tgi.data['tgi_method']} encountered an "
            "error.`)"
            + (
                f"; the frames end in {cut.data['frames'][-1]}"
                if cut is not None and cut.data.get("frames")
                else ""
            )
            + ". At warm-up that error is most often the memory for the warm-up batch, but the error line "
            "decides."
        )
        phase = {"warmup": "warmup", "prefill": "prefill", "decode": "decode"}.get(method)
        if phase is not None:
            fix += " If it is an out-of-memory error: " + _fix(phase, d, tgi)
    elif cut is not None and cut.data.get("frames"):
        expl += f" The traceback in the log ends in {', '.join(cut.data['frames'][-2:])}."
    return Finding(
        RULE.id,
        "info",
        "The server crashed; the log does not show why",
        explanation=expl,
        fix=fix,
        evidence=first_evidence(crashes, 2),
        basis="unknown",
    )


def check(d: Diagnosis) -> list[Finding]:
    crashes = d.events_of("server_crash")
    if not crashes or any(_explains(e) for e in d.events):
        return []  # no crash, or another event (an OOM, a self-check failure...) is its cause
    n = d.event_counts.get("server_crash", len(crashes))
    known = _known(d, n)
    if known is not None:
        return [known]
    shown = next((e for e in crashes if e.data.get("error")), None)
    killed = [e for e in d.events_of("sigkill") if not e.data.get("cleanup")]
    if shown is None and killed and all(e.data.get("report") for e in crashes):
        return []  # a process killed by SIGKILL, no exception anywhere: the host-oom rule says so
    if shown is not None:
        err = shown.data["error"]
        return [
            Finding(
                RULE.id,
                "info",
                "The server crashed with an error that is not a memory error",
                explanation=(
                    f"{n} crash line(s); the exception is `{err[:200]}`, and the log has no out-of-memory error, "
                    "KV self-check failure or other memory error: none of diagnose's memory causes explains it."
                ),
                fix="Look up that error for this model and version; it is not a GPU-memory setting.",
                evidence=[shown.evidence],
            )
        ]
    return [_unexplained(d, crashes, n)]


RULE = Rule(
    id="server-crash-unexplained",
    severity="info",
    title="Server crashed, cause not in the log",
    fires_when=(
        "a crash line (SGLang '[... TP0] Scheduler hit an exception', 2024 'Exception in run_tp_server', vLLM "
        "'... hit an exception', 'EngineCore failed to start.', 'WorkerProc failed to start.', 'EngineCore "
        "encountered a fatal error.', 'Engine core initialization failed', '... died unexpectedly', SGLang 'Rank N "
        "scheduler is dead', vLLM V0 'Exception in worker X while processing method', 'Error executing method'; "
        "TGI 'Method Warmup/Prefill/Decode encountered an error.', 'Webserver Crashed'; llama.cpp 'main: exiting "
        "due to ...'; Ollama 'llama runner process has terminated' and a Go crash dump; Triton 'Failed to "
        "create instance') and no memory event in the log; the exception's own last line quoted when the log "
        "has it; 'device kernel image is invalid' named as a build/GPU mismatch"
    ),
    fix=(
        "add the end of the traceback or the whole log (with the levers to try if the error at that point is "
        "memory); for a kernel image mismatch, matching builds or no compiled kernels"
    ),
    check=check,
)
