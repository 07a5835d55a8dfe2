"""The server did not start: its command line was rejected (argparse), not a memory problem."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("cli_error")
    if not evs:
        return []
    e = evs[0]
    err = str(e.data.get("error", ""))
    fix = "Fix the argument the message names and start again."
    if "--limit-mm-per-prompt" in err and "loads" in err:
        # vLLM 0.9+ parses the flag as JSON (json.loads): '{"image": 4}', not the older image=4 form
        fix += " This vLLM reads --limit-mm-per-prompt as JSON: --limit-mm-per-prompt '{\"image\": 4}'."
    return [
        Finding(
            RULE.id,
            "info",
            "The server did not start: a command-line argument was rejected (not memory)",
            explanation=(
                f"`{e.data.get('program')}: error: {err[:200]}`: the argument parser refused the command line, "
                "so the server never reached its model or memory set-up."
            ),
            fix=fix,
            evidence=first_evidence(evs, 1),
        )
    ]


RULE = Rule(
    id="cli-argument-error",
    severity="info",
    title="Command-line argument rejected (not memory)",
    fires_when="argparse's 'vllm serve: error: argument ...' / 'launch_server.py: error: ...'",
    fix="fix the argument the message names",
    check=check,
)
