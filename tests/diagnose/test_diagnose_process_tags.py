"""Process tags, excerpts of two servers, vision names and secrets (cases 05, 13, 09/09b/09c, 11).

- vLLM 0.10.0-0.10.1 tags its workers `(VllmWorker TP1 pid=N)` (WorkerProc: "VllmWorker" plus
  " PPn", " TPn" or " PPn_TPn", each only when that size is > 1), the engine relays them under its
  own tag (`(EngineCore_0 pid=715) (VllmWorker TP0 pid=720) `), Ray prefixes `(RayWorkerWrapper
  pid=N, ip=A)`. Every form's ranks, pids and prefix are read.
- a vLLM traceback excerpt (vLLM package paths, no SGLang mark) given with an SGLang log is
  diagnosed as vLLM, apart; a bare torch excerpt (no mark) still joins the SGLang log.
- vision releases of text families (MedGemma, QVQ, Llama Guard 4, ...) are multimodal from the
  name; medgemma-27b-text-it and gemma-3-270m are text-only.
- `curl -u user:password` and a quoted secret header with spaces are masked whole.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import cli_env

from vramdoctor.diagnose import Diagnosis, Facts, diagnose
from vramdoctor.diagnose.normalize import clean
from vramdoctor.redact import REDACTED, forget_secrets, redact_text


def named(f: Facts) -> bool | None:
    """What the model's name suggests about multimodality. Nothing is asserted from a name, so
    the fact stays unknown and the name is a hint (facts.hints), said as such."""
    assert f.multimodal is None, f.evidence.get("multimodal")
    hint = f.hints.get("multimodal")
    return None if hint is None else bool(hint["value"])


CASES = Path(__file__).parents[1] / "fixtures" / "logs" / "review12b"
CASE05 = CASES / "05-vllm-0.10-VllmWorker-TPn-tags-not-read-false-another-process.log"
CASE11 = CASES / "11-secrets-curl-basic-auth-and-quoted-header-with-spaces.log"
WORKER_TAG = re.compile(r"\(VllmWorker TP(\d) pid=(\d+)\)")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vramdoctor", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(COLUMNS="80"),
    )


# --- 4: vLLM's process tags, every form -------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "text", "ranks"),
    [
        ("(VllmWorker TP3 pid=4004) INFO 09-02 10:29:38 [gpu_worker.py:276] m", "m", (("TP", 3),)),
        ("(VllmWorker PP1 pid=4004) INFO 09-02 10:29:38 [gpu_worker.py:276] m", "m", (("PP", 1),)),
        (
            "(VllmWorker PP1_TP3 pid=4004) INFO 09-02 10:29:38 [gpu_worker.py:276] m",
            "m",
            (("PP", 1), ("TP", 3)),
        ),
        ("(VllmWorker pid=4004) INFO 09-02 10:29:38 [gpu_worker.py:276] m", "m", ()),
        (
            "(VllmWorker rank=5 pid=4004) INFO 09-02 10:29:38 [gpu_worker.py:276] m",
            "m",
            (("WORLD", 5),),
        ),
        (
            "(Worker_DP1_PP0_PCP0_TP3_DCP0_EP1 pid=9) INFO 11-02 10:29:38 [gpu_worker.py:276] m",
            "m",
            (("DP", 1), ("PP", 0), ("TP", 3), ("EP", 1)),
        ),
        (
            "(EngineCore_0 pid=715) (VllmWorker TP2 pid=720) ERROR 10-04 05:07:25 "
            "[multiproc_executor.py:596] WorkerProc hit an exception.",
            "WorkerProc hit an exception.",
            (("TP", 2),),
        ),
        (
            "(RayWorkerWrapper pid=263, ip=10.0.16.95) INFO 01-30 11:53:52 model_runner.py:1115] "
            "Loading model weights took 7.5100 GB",
            "Loading model weights took 7.5100 GB",
            (),
        ),
    ],
)
def test_every_vllm_tag_form_is_stripped_and_its_ranks_read(
    line: str, text: str, ranks: tuple[tuple[str, int], ...]
) -> None:
    c = clean(line)
    assert c.text == text
    assert c.ranks == ranks


def _variant(tmp_path: Path, name: str, repl: str) -> Path:
    """Case 05 with its worker tags rewritten (`repl` gets the TP rank and the pid)."""
    body = CASE05.read_text()
    out = tmp_path / name
    out.write_text(WORKER_TAG.sub(lambda m: repl.format(tp=m.group(1), pid=m.group(2)), body))
    return out


def _oom_processes(d: Diagnosis) -> list[dict[str, object]]:
    ooms = [e for e in d.events if e.kind == "cuda_oom"]
    assert len(ooms) == 1
    return list(ooms[0].data["processes"])


@pytest.mark.parametrize(
    ("name", "repl", "tag_of_4002"),
    [
        ("as-is.log", "(VllmWorker TP{tp} pid={pid})", "VllmWorker TP1"),
        ("pp.log", "(VllmWorker PP1_TP{tp} pid={pid})", "VllmWorker PP1_TP1"),
        ("nested.log", "(EngineCore_0 pid=3950) (VllmWorker TP{tp} pid={pid})", "VllmWorker TP1"),
        ("coloured.log", "\x1b[1;36m(VllmWorker TP{tp} pid={pid})\x1b[0;0m", "VllmWorker TP1"),
    ],
)
def test_vllm_010_worker_tags_give_tp_and_the_servers_own_ranks(
    tmp_path: Path, name: str, repl: str, tag_of_4002: str
) -> None:
    d = diagnose([_variant(tmp_path, name, repl)])
    assert d.server == "vllm"
    assert d.facts.tp_size_at_least == 4
    assert d.facts.tp_size == 4
    procs = {p["pid"]: p for p in _oom_processes(d)}
    assert set(procs) == {4001, 4002, 4003, 4004}
    assert procs[4002]["server_process"] == tag_of_4002
    assert all("server_process" in p for p in procs.values())
    text = " ".join(f.explanation for f in d.findings)
    assert "Another process holds memory" not in text
    assert "the server's own" in text
    # the failing process is the innermost tag's (the worker), not the engine relaying its line
    assert [e.data.get("pid") for e in d.events if e.kind == "cuda_oom"] == [4001]


def test_ray_worker_tags_name_the_servers_own_pids(tmp_path: Path) -> None:
    path = _variant(tmp_path, "ray.log", "(RayWorkerWrapper pid={pid}, ip=10.0.0.{tp})")
    d = diagnose([path])
    procs = {p["pid"]: p for p in _oom_processes(d)}
    assert {p.get("server_process") for p in procs.values()} == {"RayWorkerWrapper"}
    assert "Another process holds memory" not in " ".join(f.explanation for f in d.findings)


def test_case05_cli_says_tp4_and_no_other_program() -> None:
    r = _cli(str(CASE05), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["facts"]["tp_size_at_least"] == 4
    assert "Another process holds memory" not in r.stdout


# --- 5: a vLLM excerpt next to an SGLang log --------------------------------------------------

SGL13 = CASES / "13" / "sglang-qwen25vl-healthy.log"
VLLM13 = CASES / "13" / "vllm-oom-excerpt.log"


def test_vllm_excerpt_with_sglang_log_is_diagnosed_apart_with_vllm_flags() -> None:
    d = diagnose([SGL13, VLLM13])
    assert d.server is None
    assert d.groups is not None
    by_server = {g.server: g for g in d.groups}
    assert set(by_server) == {"sglang", "vllm"}
    assert by_server["sglang"].findings == []
    (oom,) = [f for f in by_server["vllm"].findings if f.id == "cuda-oom"]
    assert "--gpu-memory-utilization" in oom.fix
    assert "--mem-fraction-static" not in oom.fix
    assert "--chunked-prefill-size" not in oom.fix


def test_bare_torch_excerpt_still_joins_the_sglang_log(tmp_path: Path) -> None:
    bare = tmp_path / "oom.log"
    bare.write_text("".join(x for x in VLLM13.read_text().splitlines(True) if "/vllm/" not in x))
    d = diagnose([SGL13, bare])
    assert not d.groups
    assert d.server == "sglang"
    assert any(e.kind == "cuda_oom" for e in d.events)


def test_case13_cli_groups() -> None:
    r = _cli(str(SGL13), str(VLLM13), "--json")
    doc = json.loads(r.stdout)
    assert [g["server"] for g in doc["groups"]] == ["sglang", "vllm"]
    assert "--mem-fraction-static" not in json.dumps(doc["groups"][1])


# --- 13: vision releases named like text models -----------------------------------------------

CASE09 = CASES / "09-vllm-medgemma-4b-vlm-called-text-only.log"


@pytest.mark.parametrize(
    ("model", "multimodal"),
    [
        ("google/medgemma-4b-it", True),
        ("google/medgemma-27b-it", True),
        ("google/medgemma-4b-pt", True),
        ("Qwen/QVQ-72B-Preview", True),
        ("meta-llama/Llama-Guard-4-12B", True),
        ("google/shieldgemma-2-4b-it", True),
        ("mistralai/Mistral-Large-3-675B-Instruct-2512", True),
        ("nvidia/Cosmos-Reason1-7B", True),
        ("google/gemma-3-12b-it", True),
        ("google/gemma-4-E2B-it", True),
        ("internlm/Intern-S1-mini", True),
        ("openbmb/MiniCPM-Llama3-V-2_5", True),
        ("Salesforce/blip2-opt-2.7b", True),
        ("internlm/internlm2_5-7b-chat", False),
        ("facebook/opt-125m", False),
        ("google/medgemma-27b-text-it", False),
        ("google/gemma-3-270m-it", False),
        ("meta-llama/Llama-Guard-3-8B", False),
    ],
)
def test_model_name_multimodal(tmp_path: Path, model: str, multimodal: bool) -> None:
    text = CASE09.read_text().replace("google/medgemma-4b-it", model)
    assert model in text
    path = tmp_path / "args.log"
    path.write_text(text)
    d = diagnose([path])
    assert named(d.facts) is multimodal
    ids = {f.id for f in d.findings}
    assert ("mem-fraction-high-multimodal" in ids) is multimodal


@pytest.mark.parametrize(
    "case",
    [
        "09-vllm-medgemma-4b-vlm-called-text-only.log",
        "09b-vllm-QVQ-72B-vlm-called-text-only.log",
        "09c-vllm-Llama-Guard-4-vlm-called-text-only.log",
    ],
)
def test_reviewer_cases_09_are_multimodal(case: str) -> None:
    d = diagnose([CASES / case])
    assert named(d.facts) is True
    assert "mem-fraction-high-multimodal" in {f.id for f in d.findings}


# --- 14: curl credentials and quoted secret headers ------------------------------------------


@pytest.fixture(autouse=True)
def _no_registered_secrets() -> None:
    forget_secrets()


@pytest.mark.parametrize(
    ("text", "gone", "kept"),
    [
        ("curl -u admin:Sup3rS3cret https://h/", ["Sup3rS3cret"], ["curl -u admin:"]),
        ("curl --user admin:Sup3rS3cret https://h/", ["Sup3rS3cret"], ["--user admin:"]),
        ("curl --user=admin:Sup3rS3cret https://h/", ["Sup3rS3cret"], ["--user=admin:"]),
        ("curl -u 'admin:pass word here' https://h/", ["pass", "word here"], ["https://h/"]),
        ("curl -U proxy:Pr0xyPa55 https://h/", ["Pr0xyPa55"], ["-U proxy:"]),
        ("wget --user=bob --password=hunter2xx https://h/", ["hunter2xx"], ["--user=bob"]),
        ("wget --http-password hunter2xx https://h/", ["hunter2xx"], ["https://h/"]),
        ('curl -H "api-key: zebra crossing 9" https://h/', ["zebra", "crossing"], ['"api-key: ']),
        ("curl -H 'X-Api-Key: a b c' u", ["a b c"], ["X-Api-Key: "]),
        ('curl -H "Cookie: session=abc; theme=dark x" u', ["session=abc", "dark x"], ["Cookie: "]),
        ('curl -H "Authorization: Bearer tok en9" u', ["tok", "en9"], ["Authorization: Bearer "]),
        ('curl -H "Authorization: Digest user=x, nonce=y z" u', ["user=x", "y z"], ["Digest "]),
        ("curl --header=Cookie:session=abcdef0123456789 u", ["abcdef0123456789"], ["Cookie:"]),
        ("curl -H X-Api-Key:abcdef123 u", ["abcdef123"], ["X-Api-Key:"]),
        ('headers=["api-key: zebra crossing 9"]', ["zebra", "crossing"], ["headers="]),
        ('-H "api-key: a value cut off at the end', ["a value cut off"], ['"api-key: ']),
    ],
)
def test_credentials_and_secret_headers_are_masked_whole(
    text: str, gone: list[str], kept: list[str]
) -> None:
    out = redact_text(text)
    assert REDACTED in out
    for g in gone:
        assert g not in out, out
    for k in kept:
        assert k in out, out


@pytest.mark.parametrize(
    "text",
    [
        "docker run -u 1000:1000 image",
        "python3 -u -m vllm.entrypoints.openai.api_server --port 8000",
        'curl -H "Content-Type: application/json" u',
        '"key: see the docs"',
        'logged "token: 1234"',
    ],
)
def test_ordinary_text_is_kept(text: str) -> None:
    assert redact_text(text) == text


def test_case11_cli_shows_no_credential() -> None:
    for args in ((), ("--json",)):
        r = _cli(str(CASE11), *args)
        assert r.returncode in (0, 1), r.stderr
        for secret in ("Sup3rS3cret", "zebra crossing", "crossing 9", "abcdef0123456789"):
            assert secret not in r.stdout + r.stderr


def test_unmarked_excerpt_with_two_servers_is_its_own_group_not_dropped(tmp_path: Path) -> None:
    bare = tmp_path / "oom.log"
    bare.write_text("".join(x for x in VLLM13.read_text().splitlines(True) if "/vllm/" not in x))
    d = diagnose([SGL13, VLLM13, bare])
    assert d.groups is not None
    assert [g.server for g in d.groups] == ["sglang", "vllm", None]
    assert [f.file for f in d.groups[2].files] == [str(bare)]
    assert d.event_counts.get("cuda_oom") == 2  # the vLLM excerpt's and the bare one's
