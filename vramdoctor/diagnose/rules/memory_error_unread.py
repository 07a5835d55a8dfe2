"""A memory failure line in a wording no other rule reads: quoted, never refused or called healthy."""

from __future__ import annotations

from vramdoctor.diagnose.findings import Diagnosis, Finding
from vramdoctor.diagnose.rules import Rule
from vramdoctor.diagnose.rules._common import first_evidence, server_name


def check(d: Diagnosis) -> list[Finding]:
    evs = d.events_of("memory_error_unread")
    if not evs:
        return []
    e = evs[0]
    return [
        Finding(
            RULE.id,
            "warning",
            "A memory failure line diagnose does not read in detail",
            explanation=(
                f"`{e.text[:240]}`: this line reports a memory failure ('{e.data.get('matched')}'), in a "
                f"wording none of diagnose's readers knows, so nothing about {server_name(d)}'s settings "
                "or the failing step is derived from it. Read the line itself for what ran out (GPU "
                "memory or host RAM) and where."
            ),
            fix=(
                "Start from the line: if it names GPU memory, `vramdoctor census` shows every process's "
                "memory on each GPU; if host RAM, the node's memory and the server's worker count. "
                "Give diagnose the lines around it (the start-up settings and the full error) for a "
                "cause."
            ),
            evidence=first_evidence(evs, 1),
            basis="read",
        )
    ]


RULE = Rule(
    id="memory-error-unread",
    severity="warning",
    title="A memory failure line in a wording diagnose does not read",
    fires_when=(
        "no event was read from a file, but its first MiB holds 'out of memory' / OutOfMemoryError / "
        "'insufficient (GPU) memory' / 'more system memory' / 'too large for system' / 'exceeds the memory "
        "usage threshold' / 'cannot allocate memory' outside request echoes: the file is never refused as "
        "not a server log, nor reported healthy"
    ),
    fix="the line quoted; census for GPU memory, host RAM otherwise; more of the log for a cause",
    check=check,
)
