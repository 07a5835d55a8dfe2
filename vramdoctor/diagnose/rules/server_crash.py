"""The server crashed, and the log shows no memory error that explains it (an excerpt cut short)."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding, LogEvent
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence

# Every event kind that is (or names) the cause of a crash; with one of them the crash is explained.
CAUSES = ("server_crash",)
# Events that never explain a crash: SGLang's retraction (it handled a full pool and kept running),
# a capped KV budget at start-up, a bare SIGKILL sign (SGLang and vLLM SIGKILL their other processes
# after one died; the host-oom rule reports a SIGKILL that nothing else explains).
NOT_CAUSES = ("retraction", "kv_budget_capped", "sigkill")


def _explains(e: LogEvent) -> bool:
    """Whether an event other than a crash line is the crash's cause."""
    return e.kind not in CAUSES and e.kind not in NOT_CAUSES


def check(d: Diagnosis) -> list[Finding]:
    crashes = d.events_of("server_crash")
    if not crashes or any(_explains(e) for e in d.events):
        return []  # no crash, or another event (an OOM, a self-check failure...) is its cause
    n = d.event_counts.get("server_crash", len(crashes))
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
    return [
        Finding(
            RULE.id,
            "info",
            "The server crashed; the log does not show why",
            explanation=(
                f"{n} crash line(s) (an exception ended a server process) and no out-of-memory error, KV "
                "self-check failure or other memory error in the log: the exception's own last line, which "
                "says what it was, is not in the text read (an excerpt cut before it, or another file)."
            ),
            fix=(
                "Add the end of the traceback (the line after the last 'File ...' frame) or the whole log, "
                "and diagnose again."
            ),
            evidence=first_evidence(crashes, 2),
        )
    ]


RULE = Rule(
    id="server-crash-unexplained",
    severity="info",
    title="Server crashed, cause not in the log",
    fires_when=(
        "a crash line (SGLang '[... TP0] Scheduler hit an exception', 2024 'Exception in run_tp_server', vLLM "
        "'... hit an exception', 'EngineCore failed to start.', 'WorkerProc failed to start.', 'EngineCore "
        "encountered a fatal error.', 'Engine core initialization failed', '... died unexpectedly', SGLang 'Rank N "
        "scheduler is dead', vLLM V0 'Exception in worker X while processing method', 'Error executing method') and no "
        "memory "
        "event in the log; the exception's own last line quoted when the log has it"
    ),
    fix="add the end of the traceback or the whole log",
    check=check,
)
