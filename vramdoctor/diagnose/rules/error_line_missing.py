"""The excerpt ends inside a traceback: where it failed is shown, what failed is not.

Fires on a `traceback_cut` event (tail.py) when nothing else in the log explains the failure and
no crash line does (server-crash-unexplained reports those). The frames give the phase; the fix is
conditional: the line to add, and the levers if the error at that point is the usual one there.
torch.compile's frames (inductor) are a compilation failure, never called a memory error.
"""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, server_name, words
from vramdoctor.diagnose.rules.cuda_oom import PHASE_NAMES, _fix

_EXPLAINED_BY = ("server_crash",)
_QUIET = (
    "traceback_cut",
    "sigkill",
    "retraction",
    "kv_budget_capped",
    "trtllm_kv_default_fraction",
)


def check(d: Diagnosis) -> list[Finding]:
    cuts = d.events_of("traceback_cut")
    if not cuts or any(e.kind not in _QUIET for e in d.events):
        return []  # another event explains it (an OOM, a crash line with its own finding)
    e = cuts[-1]
    frames = e.data.get("frames") or []
    where = ", ".join(frames[-2:]) or "a frame"
    add = "Add the lines after the last 'File ...' frame (the exception and its message), or the whole log, and diagnose again."
    if e.data.get("inductor"):
        v = words(d)
        title = "The log ends inside torch.compile's traceback; the error line is not in it"
        expl = (
            f"The excerpt of {server_name(d)}'s log ends in a traceback of torch.compile (inductor: {where}), "
            "before its exception line. It failed while compiling a graph; what failed (a kernel that does not "
            "fit, a toolchain error) is on the missing line."
        )
        fix = add + (
            v.say(
                " To confirm it is the compilation, run once without torch.compile ({compile_off})."
            )
            or ""
        )
    else:
        phase = e.phase
        title = (
            f"The log ends inside a traceback {PHASE_NAMES[phase]}; the error line is not in it"
            if phase is not None
            else "The log ends inside a traceback; the error line is not in it"
        )
        expl = (
            f"The excerpt of {server_name(d)}'s log ends in a traceback ({where}) before its exception line, "
            "so what failed is not shown."
        )
        fix = add
        if phase is not None:
            expl += f" The frames show the server {PHASE_NAMES[phase]}."
            fix += " If the error is out of memory (the usual failure there): " + _fix(phase, d, e)
    return [
        Finding(
            RULE.id,
            "info",
            title,
            explanation=expl,
            fix=fix,
            evidence=first_evidence(cuts, 1),
            basis="unknown",
        )
    ]


RULE = Rule(
    id="error-line-missing",
    severity="info",
    title="The log ends inside a traceback; the error is not in it",
    fires_when=(
        "the input ends in traceback frames with no exception line after them, and nothing else in the log "
        "explains a failure (frames of torch.compile: a compilation failure; other frames: their phase)"
    ),
    fix="add the line after the last frame; the levers to try if the error at that point is memory",
    check=check,
)
