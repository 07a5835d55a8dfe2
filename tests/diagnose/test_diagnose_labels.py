"""Every label of the real log corpus (tests/fixtures/logs and extra/) must come out right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramdoctor.diagnose import Diagnosis, diagnose

FIXTURES = Path(__file__).parents[1] / "fixtures" / "logs"
CORPORA = [FIXTURES, FIXTURES / "extra"]
FIELDS = [
    "server",
    "version",
    "model",
    "vlm",
    "fast_image_processor_in_use",
    "oom",
    "oom_phase",
    "other_memory_error",
    "leak_selfcheck_error",
    "tp_size",
    "mem_fraction_static",
    "gpu_memory_utilization",
    "attention_backend",
]


def _cases() -> list[tuple[Path, dict]]:
    out = []
    for base in CORPORA:
        for label in json.loads((base / "labels.json").read_text()):
            out.append((base / label["file"], label))
    return out


CASES = _cases()


def _yn(v: bool | None) -> str:
    return "unknown" if v is None else ("yes" if v else "no")


def observed(d: Diagnosis) -> dict[str, str]:
    """The diagnosis expressed in the labels' vocabulary."""
    f = d.facts
    ooms = d.events_of("cuda_oom")
    phase = next((e.phase for e in ooms if e.phase), None)
    return {
        "server": d.server or "unknown",
        "version": d.version or "unknown",
        "model": f.model or "unknown",
        "vlm": _yn(f.multimodal),
        "fast_image_processor_in_use": _yn(f.fast_image_processor),
        "oom": "yes" if ooms else "no",
        "oom_phase": (phase or "unknown") if ooms else "n/a",
        "other_memory_error": "yes" if d.events_of("kv_budget_error", "host_oom") else "no",
        "leak_selfcheck_error": "yes" if d.events_of("kv_leak_selfcheck") else "no",
        "tp_size": "unknown" if f.tp_size is None else str(f.tp_size),
        "mem_fraction_static": "n/a (vllm)"
        if d.server == "vllm"
        else ("unknown" if f.mem_fraction_static is None else repr(f.mem_fraction_static)),
        "gpu_memory_utilization": "n/a (sglang)"
        if d.server == "sglang"
        else ("unknown" if f.gpu_memory_utilization is None else repr(f.gpu_memory_utilization)),
        "attention_backend": f.attention_backend or "unknown",
    }


def _expected(field: str, label: str) -> str:
    """Labels may carry an explanation in parentheses after the value."""
    if label.startswith("n/a") or field in ("server", "version", "vlm", "oom"):
        return label
    return label.split(" (")[0]


def _same(field: str, got: str, want: str) -> bool:
    if (
        field in ("mem_fraction_static", "gpu_memory_utilization")
        and want not in ("unknown",)
        and not want.startswith("n/a")
    ):
        try:
            return float(got) == float(want)
        except ValueError:
            return False
    if field == "attention_backend":
        return got.lower() == want.lower()
    return got == want


@pytest.mark.parametrize(("path", "label"), CASES, ids=[p.name[:40] for p, _ in CASES])
def test_labels(path: Path, label: dict) -> None:
    got = observed(diagnose([path]))
    wrong = {
        f: (got[f], _expected(f, label[f]))
        for f in FIELDS
        if not _same(f, got[f], _expected(f, label[f]))
    }
    assert not wrong, f"{path.name}: got vs label: {wrong}"


def test_corpus_is_complete() -> None:
    names = {p.name for p, _ in CASES}
    on_disk = {p.name for base in CORPORA for p in base.glob("*.log")}
    assert names == on_disk
    assert len(CASES) >= 26


def test_evidence_points_at_real_lines() -> None:
    for path, _ in CASES:
        d = diagnose([path])
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        for f in d.findings:
            for e in f.evidence:
                if e.line:
                    assert 1 <= e.line <= len(lines), (path.name, e)
        for e in d.events:
            assert 1 <= e.line <= len(lines)
