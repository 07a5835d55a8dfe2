"""Real logs of six servers on three platforms (tests/fixtures/logs/wild): every claim holds.

Each excerpt's claims (claims.json, from SOURCES.md's "good answer" and "must not" lines) are
checked on the library's diagnosis and, for the exit code, through the CLI. On top of them, the
vocabulary check: no fix names a flag of a server other than the one diagnosed, nor an option
the detected platform does not have.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.procs import cli_env, run_cli

from vramdoctor.diagnose import Diagnosis, diagnose
from vramdoctor.diagnose.levers import foreign_flags, platform_forbidden

WILD = Path(__file__).parents[1] / "fixtures" / "logs" / "wild"
CLAIMS: list[dict[str, Any]] = json.loads((WILD / "claims.json").read_text())


def _paths(c: dict[str, Any]) -> list[Path]:
    return [WILD / f for f in (c["files"] if "files" in c else [c["file"]])]


def _id(c: dict[str, Any]) -> str:
    return (c.get("file") or c["files"][0])[:24]


def _texts(d: Diagnosis) -> tuple[str, str]:
    """(every finding's title + explanation + fix, every fix), one string each."""
    allt = "\n".join(f"{f.title}\n{f.explanation}\n{f.fix}" for f in d.findings)
    fixes = "\n".join(f.fix for f in d.findings)
    return allt, fixes


def _exit(d: Diagnosis) -> int:
    if not any(f.recognised for f in d.files):
        return 2
    return 1 if any(f.severity in ("warning", "critical") for f in d.findings) else 0


def check(c: dict[str, Any], d: Diagnosis) -> list[str]:
    """Every claim of `c` that `d` breaks, in words (empty: all hold)."""
    bad: list[str] = []
    got_exit = _exit(d)
    if got_exit != c.get("exit", got_exit):
        bad.append(f"exit {got_exit}, want {c['exit']}")
    if got_exit == 2:
        return bad
    f = d.facts
    if "server" in c and d.server != c["server"]:
        bad.append(f"server {d.server!r}, want {c['server']!r}")
    for key in ("variant", "platform"):
        if key in c and getattr(f, key) != c[key]:
            bad.append(f"{key} {getattr(f, key)!r}, want {c[key]!r}")
    if "version" in c and d.version != c["version"]:
        bad.append(f"version {d.version!r}, want {c['version']!r}")
    ids = {x.id for x in d.findings}
    bad += [
        f"finding {r} missing (have {sorted(ids)})" for r in c.get("findings", []) if r not in ids
    ]
    bad += [f"finding {r} must not fire" for r in c.get("no_findings", []) if r in ids]
    allt, fixes = _texts(d)
    for rx in c.get("says", []):
        if not re.search(rx, allt, re.I):
            bad.append(f"no finding says /{rx}/")
    for rx in c.get("fix_says", []):
        if not re.search(rx, fixes, re.I):
            bad.append(f"no fix says /{rx}/")
    for rx in c.get("never", []):
        if m := re.search(rx, allt, re.I):
            bad.append(f"a finding says /{rx}/: {allt[max(0, m.start() - 60) : m.end() + 60]!r}")
    for rx in c.get("fix_never", []):
        if m := re.search(rx, fixes, re.I):
            bad.append(f"a fix says /{rx}/: {fixes[max(0, m.start() - 60) : m.end() + 60]!r}")
    for name, want in c.get("facts", {}).items():
        if getattr(f, name) != want:
            bad.append(f"fact {name} = {getattr(f, name)!r}, want {want!r}")
    for name, want in c.get("facts_approx", {}).items():
        v = getattr(f, name)
        if v is None or abs(v - want) > 0.01 * abs(want):
            bad.append(f"fact {name} = {v!r}, want about {want!r}")
    for name in c.get("null_facts", []):
        if getattr(f, name) is not None:
            bad.append(f"fact {name} must be unknown, is {getattr(f, name)!r}")
    kinds = {e.kind for e in d.events}
    bad += [f"event {k} missing" for k in c.get("events", []) if k not in kinds]
    bad += [f"event {k} must not be read" for k in c.get("no_events", []) if k in kinds]
    # the vocabulary: the diagnosed server's own flags only, the platform's own options only
    for x in d.findings:
        if hits := foreign_flags(d.server, x.fix):
            bad.append(f"{x.id}: fix names other servers' flags {hits}: {x.fix!r}")
        if hits := platform_forbidden(f.platform, x.fix):
            bad.append(f"{x.id}: fix names {hits}, which {f.platform} does not have: {x.fix!r}")
    return bad


@pytest.mark.parametrize("claim", CLAIMS, ids=[_id(c) for c in CLAIMS])
def test_claims_hold(claim: dict[str, Any]) -> None:
    d = diagnose(_paths(claim))
    bad = check(claim, d)
    assert not bad, f"{_id(claim)}:\n  " + "\n  ".join(bad)


def test_corpus_is_complete_and_sourced() -> None:
    named = {n for c in CLAIMS for n in (c["files"] if "files" in c else [c["file"]])}
    assert named == {p.name for p in WILD.glob("*.log")}
    assert len(named) >= 25
    assert all(c["source"].startswith("https://github.com/") for c in CLAIMS)
    # every kind diagnose reads is covered: other servers, ROCm, NPU, summarised pastes
    servers = {c.get("server") for c in CLAIMS}
    assert {"tgi", "trtllm", "llamacpp", "ollama", "lmdeploy", "sglang", "vllm"} <= servers
    assert {"rocm", "npu", "cuda"} <= {c.get("platform") for c in CLAIMS}


@pytest.mark.parametrize(
    "name",
    [
        "09_llamacpp",  # llama.cpp's cudaMalloc failure: exit 1, not "not a server log"
        "28_lorax",  # a TGI fork's warm-up budget error
        "40_pytorch",  # not a server: exit 2 with one line
        "48_ollama",  # Ollama's 'CUDA error 2 ... out of memory'
    ],
)
def test_exit_codes_through_the_cli(name: str) -> None:
    claim = next(c for c in CLAIMS if (c.get("file") or "").startswith(name))
    r = run_cli("diagnose", str(WILD / claim["file"]), env=cli_env())
    assert r.returncode == claim["exit"], r.stdout + r.stderr
    if claim["exit"] == 2:
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and not r.stdout
