"""Triton 'out of resource: shared memory': a kernel's on-chip limit, not GPU memory.

The lever follows the code that launched the kernel (cause before class): torch.compile's generated
kernels (inductor frames above the error, or torch.compile on in the arguments) are avoided by
compiling less or not at all; a Triton kernel of the server itself (its attention backend) by
another backend that the platform has (levers.py: flashinfer and fa3 exist on CUDA only), or a
version whose kernel configs fit this GPU.
"""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, words


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("triton_shared_memory")
    if not evs:
        return []
    e = evs[0]
    need = e.data.get("required_bytes")
    lim = e.data.get("limit_bytes")
    figures = f" (the kernel needs {need} bytes, the GPU allows {lim} per block)" if need else ""
    backend = d.facts.attention_backend
    v = words(d)
    inductor = any(x.data.get("inductor") for x in evs)
    lds = (
        " 64 KiB is the per-workgroup limit (LDS) of AMD Instinct GPUs."
        if lim == 65536 and d.facts.platform == "rocm"
        else ""
    )
    expl = (
        f"A Triton kernel was launched with more on-chip shared memory than this GPU model has{figures}. "
        "It is a kernel configuration limit of this GPU, not VRAM exhaustion: lowering the memory fraction "
        "does not help." + lds
    )
    if inductor:
        expl += (
            " The frames above the error are torch.compile's (inductor compiling and autotuning a graph): "
            "the kernel is one torch.compile generated, not the attention backend's."
        )
        fix = (
            v.join(
                "Run without torch.compile ({compile_off})",
                "or compile fewer batch sizes ({compile_batch}) so the shape that needs this kernel is not compiled",
                sep=", ",
            )
            or "Run without torch.compile"
        )
        fix += "; or a torch/Triton build whose kernel configs fit this GPU's shared memory."
    else:
        if backend:
            expl += f" The attention backend in use is {backend}."
        fix = (
            v.say(
                "Use another attention backend ({attention_backend}), or a version whose Triton configs cover this GPU."
            )
            or "Use a version whose Triton configs cover this GPU."
        )
    return [
        Finding(
            RULE.id,
            "critical",
            "Triton kernel exceeds the GPU's shared memory (not an OOM)",
            explanation=expl,
            fix=fix,
            evidence=first_evidence(evs),
        )
    ]


RULE = Rule(
    id="triton-shared-memory",
    severity="critical",
    title="Triton shared-memory limit (not a CUDA OOM)",
    fires_when=(
        "'OutOfResources: out of resource: shared memory, Required: N, Hardware limit: M' (not inside torch "
        "inductor's 'Runtime error during autotuning: ... Ignoring this choice.': one skipped candidate); "
        "torch.compile's frames (torch/_inductor, dynamo) above it make torch.compile the cause"
    ),
    fix=(
        "torch.compile's kernel: run without torch.compile or compile fewer batch sizes; the server's kernel: "
        "another attention backend the platform has, or a version with Triton configs for this GPU"
    ),
    check=check,
)
