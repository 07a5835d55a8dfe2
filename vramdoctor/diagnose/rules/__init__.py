"""The rule registry: every module in this package defines one `RULE`; adding a rule is one file.

A rule is pure: it reads a `Diagnosis` (facts and events, no I/O) and returns findings. The
registry discovers the modules, so the docs table (`python -m vramdoctor.diagnose.rules
--markdown`) and the evaluation can never miss one.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from vramdoctor.diagnose.findings import SEVERITY_RANK, Diagnosis, Finding, Severity


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity  # the most severe level it reports
    title: str
    fires_when: str  # documentation: what in the log fires it
    fix: str  # documentation: the fix it proposes
    check: Callable[[Diagnosis], list[Finding]]


@cache
def all_rules() -> tuple[Rule, ...]:
    """Every RULE defined in this package, ordered by id."""
    found: list[Rule] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        rule = getattr(mod, "RULE", None)
        if isinstance(rule, Rule):
            found.append(rule)
    ids = [r.id for r in found]
    if len(ids) != len(set(ids)):
        raise RuntimeError(f"duplicate rule ids: {sorted(ids)}")
    return tuple(sorted(found, key=lambda r: r.id))


def evaluate(d: Diagnosis) -> list[Finding]:
    """All findings, most severe first (then by rule id, for a stable report)."""
    out: list[Finding] = []
    for rule in all_rules():
        out.extend(rule.check(d))
    for f in out:  # the same line quoted once (one line can carry several facts a rule cites)
        f.evidence = list(dict.fromkeys(f.evidence))
    return sorted(out, key=lambda f: (SEVERITY_RANK[f.severity], f.id))


def markdown() -> str:
    """The docs/rules.md table, generated from the registry."""
    lines = [
        "# diagnose rules",
        "",
        "Generated from the rule registry by `python -m vramdoctor.diagnose.rules --markdown > docs/rules.md`;",
        "do not edit by hand (a test checks that this file matches the registry).",
        "",
        "| id | severity | title | fires when | fix |",
        "|---|---|---|---|---|",
    ]
    for r in all_rules():
        cells = [f"`{r.id}`", r.severity, r.title, r.fires_when, r.fix]
        lines.append(
            "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
        )
    return "\n".join(lines) + "\n" + levers_markdown()


def levers_markdown() -> str:
    """The fix vocabulary: each lever and each server kind's own setting for it (a blank cell: the
    server has no such setting, and no fix names one), from the registry's `levers` sections."""
    from vramdoctor import servers
    from vramdoctor.diagnose.levers import LEVER_NAMES

    kinds = [k for k in servers.kinds() if k.levers]
    lines = [
        "",
        "## Levers",
        "",
        "Every fix names the diagnosed server's own setting for a lever (vramdoctor/servers/<kind>.py, "
        "section `levers`),",
        "on the detected platform; a server without the lever is told none. Options that exist on one "
        "platform or from one",
        "version on are marked so.",
        "",
        "| lever | what it changes | " + " | ".join(k.display_name for k in kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for name, what in LEVER_NAMES.items():
        cells = [f"`{name}`", what]
        for k in kinds:
            opts = k.levers.get(name, ())
            shown = []
            for o in opts:
                tag = []
                if o.platforms:
                    tag.append("/".join(o.platforms))
                if o.since:
                    tag.append(f"{o.since}+")
                if o.until:
                    tag.append(f"before {o.until}")
                shown.append(o.text + (f" ({', '.join(tag)})" if tag else ""))
            cells.append("; ".join(shown))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
