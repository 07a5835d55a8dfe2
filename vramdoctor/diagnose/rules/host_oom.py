"""Host RAM exhausted: not GPU memory.

The signs, strongest first: Ray's memory monitor killing a worker, PyTorch's CPU allocator failing
(`[enforce fail at alloc_cpu.cpp:N] ... DefaultCPUAllocator: can't allocate memory` / `not enough
memory: you tried to allocate N bytes.`), Python's `MemoryError`, the Linux OOM killer's own line
(`Out of memory: Killed process N (NAME)`, `oom-kill:...`, Kubernetes `OOMKilled`). A bare SIGKILL
(the shell's `Killed`, exit code -9 or 137) is weaker: most often the OOM killer, but also a
supervisor, an operator or the server's own cleanup after another process died, so it is reported
only when nothing else in the log explains the death.
"""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding, LogEvent
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, words
from vramdoctor.units import format_bytes, format_mib

_WHILE = {
    "weight_load": " while loading weights",
    "startup": " during start-up",
    "kv_cache_alloc": " while allocating the KV cache",
    "profiling": " during memory profiling",
    "warmup": " during warm-up",
    "cuda_graph": " during CUDA graph capture",
    "prefill": " while serving (prefill)",
    "decode": " while serving (decode)",
    "serving": " while serving",
}
# Kinds a bare SIGKILL never outranks: when one of these is in the log, it explains the death.
_WEAK_COMPANIONS = ("sigkill", "server_crash", "retraction", "kv_budget_capped")

_MORE_RAM = (
    "give the node/container more RAM (docker --memory, the pod's memory limit) and /dev/shm "
    "(docker --shm-size), load safetensors checkpoints (mapped and read piecewise, not whole), or run "
    "fewer server processes per node"
)
_SOAK = "; watch host memory with `vramdoctor soak` (it samples each process's RSS)."


def _what(e: LogEvent) -> str:
    """What killed it, in words, from one strong event."""
    k = e.data.get("killer")
    if k == "ray memory monitor":
        d = e.data
        task = (
            f" ({d['task']}, pid {d['task_pid']}, {d['task_used_gb']} GB)" if d.get("task") else ""
        )
        node = (
            f": the node used {d['node_used_gb']} GB of {d['node_total_gb']} GB RAM "
            f"({d['node_fraction']:.0%}), above its kill threshold {d['threshold']}"
            if d.get("node_total_gb")
            else ""
        )
        return f"Ray's memory monitor killed a worker{task}{node}"
    if k == "ollama memory check":
        avail = e.data.get("available")
        return (
            f"Ollama refused to load the model: it needs {e.data.get('requested')} of system memory"
            + (
                f", {avail} is available"
                if avail
                else " (the figure available is cut off in the log)"
            )
        )
    if k == "torch DefaultCPUAllocator":
        n = e.data.get("requested_bytes")
        size = format_bytes(n) if n else "memory"
        return f"PyTorch's CPU allocator could not get {size} of host RAM"
    if k == "python MemoryError":
        mib = e.data.get("requested_mib")
        size = f" ({format_mib(mib)} asked)" if mib else ""
        return f"Python raised MemoryError{size}"
    if k == "linux oom killer":
        who = (
            f"process {e.data['pid']} ({e.data.get('process')})"
            if e.data.get("pid")
            else "a process"
        )
        limit = " at the container's (cgroup) memory limit" if e.data.get("cgroup") else ""
        return f"the Linux OOM killer killed {who}{limit}"
    return "a host allocation failed"


def _strong(d: Diagnosis, evs: list[LogEvent]) -> Finding:
    e = evs[0]
    phase = next((x.phase for x in evs if x.phase), None)
    during = _WHILE.get(phase or "", "")
    what = _what(e)
    loading = (
        " Loading weights goes through host RAM in every worker process (one per GPU with tensor "
        "parallelism): a .bin/.pt checkpoint is read whole, safetensors shards are mapped."
        if phase == "weight_load"
        else ""
    )
    if e.data.get("killer") == "ollama memory check":
        return _ollama(d, evs, what)
    return Finding(
        RULE.id,
        "critical",
        f"Host RAM exhausted{during}: {what} (not a CUDA OOM)",
        explanation=(
            f"`{e.text[:200]}`: {what}{during}. This is the machine's (or container's) RAM, not GPU "
            f"memory.{loading} Pinned CPU swap space, CPU offload, /dev/shm (tensors shared between "
            "processes) and the container's memory limit all count against it."
        ),
        fix=words(d).first(
            "Lower host-side caches ({host_cache} keep KV in host RAM), " + _MORE_RAM + _SOAK,
            "Lower {swap} (vLLM V0 pins it per GPU) and {cpu_offload}, " + _MORE_RAM + _SOAK,
        )
        or _MORE_RAM[0].upper() + _MORE_RAM[1:] + _SOAK,
        evidence=first_evidence(evs),
    )


def _ollama(d: Diagnosis, evs: list[LogEvent], what: str) -> Finding:
    """Ollama's scheduler refused a model before loading it: the system RAM (plus swap) it found
    free is less than its estimate for the part of the model and its context kept in RAM."""
    v = words(d)
    return Finding(
        RULE.id,
        "critical",
        f"Host RAM: {what}",
        explanation=(
            f"`{evs[0].text[:200]}`: {what}. Ollama checks, before it starts a runner, that the layers "
            "it keeps on the CPU plus the context fit the system memory free (and swap); this is the "
            "machine's RAM, not GPU memory, and nothing was loaded."
        ),
        fix=(
            v.first(
                "Ask for less: a smaller context ({context_length}) and fewer parallel requests "
                "({parallel}) shrink the estimate; or a smaller model or quantization; or free RAM / "
                "add swap on the host."
            )
            or "A smaller context, fewer parallel requests, a smaller model, or more free RAM/swap."
        ),
        evidence=first_evidence(evs),
    )


def _sigkill(d: Diagnosis, evs: list[LogEvent]) -> Finding:
    n = d.event_counts.get("sigkill", len(evs))
    return Finding(
        RULE.id,
        "warning",
        "A server process was killed by SIGKILL: most often the Linux OOM killer (host RAM)",
        explanation=(
            f"`{evs[0].text[:200]}` ({n} line(s)): a process ended by signal 9 (exit code -9 or 137, the "
            "shell's 'Killed') prints no error of its own. On Linux that is most often the kernel's OOM "
            "killer, when host RAM or the container's memory limit ran out; it can also be a supervisor, "
            "an operator's `kill -9` or a Kubernetes restart. The log shows no other cause."
        ),
        fix=(
            "Check the kernel log: `dmesg -T | grep -i -E 'killed process|oom'` (or `journalctl -k`); in "
            "Docker `docker inspect --format '{{.State.OOMKilled}}' NAME`, in Kubernetes `kubectl "
            "describe pod` (Reason: OOMKilled). If it was the OOM killer: " + _MORE_RAM + _SOAK
        ),
        evidence=first_evidence(evs),
    )


def _stopped(d: Diagnosis, evs: list[LogEvent]) -> Finding:
    """Every SIGKILL came after a graceful stop had begun: the stop timeout, an info note."""
    e = evs[0]
    return Finding(
        RULE.id,
        "info",
        "A server process was killed by SIGKILL after a shutdown had begun: a stop timeout, not the OOM "
        "killer",
        explanation=(
            f"`{e.text[:200]}` came after `{str(e.data['after_shutdown'])[:120]}`: someone (an operator's "
            "Ctrl-C, `docker stop`, a Kubernetes rollout) asked the server to stop, and it was still "
            "shutting down when its supervisor sent SIGKILL (docker stop waits 10 s, Kubernetes the pod's "
            "terminationGracePeriodSeconds). The server did not start again in between. This is not a "
            "sign of the Linux OOM killer."
        ),
        fix=(
            "Nothing to fix for memory. To let the server exit on its own, give it a longer stop "
            "timeout (`docker stop -t 60`, compose `stop_grace_period`, the pod's "
            "terminationGracePeriodSeconds)."
        ),
        evidence=first_evidence(evs),
    )


def check(d: Diagnosis) -> list[Finding]:
    strong = d.events_of("host_oom")
    if strong:
        return [_strong(d, strong)]
    # Only SIGKILL signs: reported when nothing else explains the death (SGLang and vLLM SIGKILL
    # their other processes after one died of an exception or an OOM; SGLang's launcher kills its
    # own tree after "Received sigquit from a child process").
    evs = [e for e in d.events_of("sigkill") if not e.data.get("cleanup")]
    if not evs or any(e.kind not in _WEAK_COMPANIONS for e in d.events):
        return []
    if any(e.data.get("error") or not e.data.get("report") for e in d.events_of("server_crash")):
        return []  # a process died of an exception: the SIGKILL is the server's cleanup after it
    if all(e.data.get("after_shutdown") for e in evs):
        return [_stopped(d, evs)]  # a graceful stop, then the supervisor's kill
    return [_sigkill(d, [e for e in evs if not e.data.get("after_shutdown")])]


RULE = Rule(
    id="host-oom",
    severity="critical",
    title="Host memory exhausted (RAM, not GPU memory)",
    fires_when=(
        "'ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory', PyTorch "
        "'DefaultCPUAllocator: can't allocate memory' / 'not enough memory: you tried to allocate N bytes', "
        "Python 'MemoryError', the kernel's 'Out of memory: Killed process N' / 'oom-kill:' / 'OOMKilled' "
        "(critical); a bare SIGKILL ('Killed', exit code -9 / 137, vLLM 'Failed core proc(s): {...: -9}', "
        "SGLang 'exitcode=9') with no other cause in the log (warning); a SIGKILL after a graceful stop had begun "
        "(uvicorn 'Shutting down', 'Application shutdown complete.', Ctrl-C, SIGTERM) is a stop timeout (info)"
    ),
    fix="more host RAM and /dev/shm, safetensors, fewer workers per node, lower --swap-space / host caches",
    check=check,
)
