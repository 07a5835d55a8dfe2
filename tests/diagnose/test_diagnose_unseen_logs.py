"""The findings of an independent review of `diagnose` on logs it had never seen.

Each test reads the real excerpt (or a file constructed from the servers' real formats, labelled as
such in tests/fixtures/logs/extra/README.md) that showed a wrong claim, and checks the kind of
mistake, not the one line: different servers never merged, backbone model files never proving
text-only, an empty capture cause, the server's own pids, HIP/NPU OOMs, phases from frames, exact
rank wording, SGLang excerpts recognised by their own marks, and the minor wording slips.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from vramdoctor.diagnose import Diagnosis, Facts, diagnose
from vramdoctor.diagnose.report import verdict
from vramdoctor.diagnose.rules._common import SGLANG_ONLY_FLAGS, VLLM_ONLY_FLAGS


def named(f: Facts) -> bool | None:
    """What the model's name suggests about multimodality. Nothing is asserted from a name, so
    the fact stays unknown and the name is a hint (facts.hints), said as such."""
    assert f.multimodal is None, f.evidence.get("multimodal")
    hint = f.hints.get("multimodal")
    return None if hint is None else bool(hint["value"])


LOGS = Path(__file__).parents[1] / "fixtures" / "logs"
EXTRA = LOGS / "extra"


def one(name: str) -> Diagnosis:
    path = next(EXTRA.glob(name + "*.log"))
    return diagnose([path])


def finding(d: Diagnosis, rule: str):  # type: ignore[no-untyped-def]
    found = [f for f in d.findings if f.id == rule]
    assert found, f"no {rule} finding: {[f.id for f in d.findings]}"
    return found[0]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vramdoctor", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )


# --- 1. logs of different servers are never merged -------------------------------------------


def _check_separate(d: Diagnosis) -> None:
    assert d.server is None and len(d.groups) == 2
    by_server = {g.server: g for g in d.groups}
    assert set(by_server) == {"sglang", "vllm"}
    files = {g.server: {f.file for f in g.files} for g in d.groups}
    for f in d.findings:
        owners = {
            srv
            for srv, names in files.items()
            if all(e.file in names for e in f.evidence if e.line)
        }
        assert len(owners) == 1, f"{f.id} cites both servers' files"
        other = VLLM_ONLY_FLAGS if owners == {"sglang"} else SGLANG_ONLY_FLAGS
        assert not any(flag in f.fix for flag in other), (
            f"{f.id} ({owners}) names the other server's flags: {f.fix}"
        )
    # no fact or version of one server's file in the other's group
    assert (
        by_server["sglang"].version is None
        or by_server["sglang"].version != by_server["vllm"].version
    )
    for g in d.groups:
        for ev in g.facts.evidence.values():
            assert not ev.line or ev.file in files[g.server]


def test_real_sglang_and_vllm_logs_are_diagnosed_apart() -> None:
    sgl = LOGS / "02_sglang_llama3-8b_oom-prefill.log"
    vll = LOGS / "17_vllm_e5-mistral-bnb-v1_oom-cuda-graph-capture.log"
    d = diagnose([sgl, vll])
    _check_separate(d)
    text, _ = verdict(d)
    assert "different servers" in text and "SGLang:" in text and "vLLM" in text


def test_constructed_pair_keeps_versions_and_flags_apart() -> None:
    d = diagnose([next(EXTRA.glob("30_*.log")), next(EXTRA.glob("16_*.log"))])
    _check_separate(d)
    text, _ = verdict(d)
    assert "SGLang 0.11.0" not in text  # vLLM's version never lands on the SGLang file
    sgl = next(g for g in d.groups if g.server == "sglang")
    assert sgl.version is None and sgl.facts.model == "meta-llama/Llama-3.1-8B-Instruct"
    vll = next(g for g in d.groups if g.server == "vllm")
    assert vll.version == "0.11.0" and named(vll.facts) is True and vll.facts.tp_size == 2


def test_mixed_servers_json_and_text() -> None:
    a, b = str(next(EXTRA.glob("30_*.log"))), str(next(EXTRA.glob("16_*.log")))
    out = cli("--json", a, b)
    assert out.returncode == 1, out.stderr
    js = json.loads(out.stdout)
    assert js["server"] is None and [g["server"] for g in js["groups"]] == ["sglang", "vllm"]
    text = cli(a, b).stdout
    assert "different servers" in text and "(SGLang)" in text and "(vLLM)" in text


# --- 2. multimodal: backbone files never prove text-only; vision frames always count ----------


def test_lm_backbone_file_leaves_multimodal_unknown() -> None:
    d = one("17_")  # Qwen2.5-VL excerpt with only models/qwen2.py frames
    assert d.facts.multimodal is None and d.facts.fast_image_processor is None


def test_vision_frames_without_traceback_header_mark_multimodal() -> None:
    for name in (
        "23_",
        "26_",
        "27_",
        "29_",
    ):  # qwen2_5_vl.py, _execute_mm_encoder, _process_video_input, get_multimodal_embeddings
        d = one(name)
        assert d.facts.multimodal is True, name
        assert "traceback frame" in d.facts.evidence["multimodal"].text


def test_qwen35_architecture_is_multimodal(tmp_path: Path) -> None:
    log = tmp_path / "qwen35.log"
    log.write_text(
        "[2026-03-06 00:30:00 TP0] Load weight end. elapsed=40.1 s, type=Qwen3_5MoeForConditionalGeneration, "
        "avail mem=40.00 GB, mem usage=30.00 GB.\n"
    )
    assert diagnose([log]).facts.multimodal is True


# --- 3. an empty capture cause is unknown, not "other than memory" ----------------------------


def test_empty_capture_cause_is_not_called_non_memory() -> None:
    f = finding(one("20_"), "sglang-graph-capture-failed")
    assert "other than memory" not in f.title
    assert "does not give the cause" in f.title
    assert "not an allocation failure" not in f.explanation


# --- 4. a pid the log's own tags name is the server's own rank --------------------------------


def test_own_rank_pid_is_not_another_process() -> None:
    f = finding(one("16_"), "cuda-oom")
    assert "Another process" not in f.explanation
    assert "4243 (Worker_TP1" in f.explanation and "server's own" in f.explanation


def test_unknown_pid_is_still_another_process() -> None:
    f = finding(one("30_"), "cuda-oom")
    assert "Another process holds memory" in f.explanation and "990" in f.explanation


# --- 5. HIP / NPU OOMs named by their device; an allocation larger than the GPU ---------------


def test_hip_oom_larger_than_the_gpu() -> None:
    d = one("23_")
    f = finding(d, "cuda-oom")
    assert f.title.startswith("HIP out of memory") and "larger than the whole GPU" in f.title
    assert "CUDA out of memory" not in f.explanation
    assert "--gpu-memory-utilization" not in f.fix and "max_pixels" in f.fix


def test_npu_oom_old_message_format() -> None:
    d = one("28_")
    f = finding(d, "cuda-oom")
    assert f.title.startswith("NPU out of memory")
    e = d.events_of("cuda_oom")[0]
    assert e.data["device"] == "NPU" and e.data["gpu"] == 3
    assert round(e.data["free_mib"]) == round(5.36 * 1024) and round(e.data["total_mib"]) == round(
        60.96 * 1024
    )


# --- 6. the OOM phase from frames -------------------------------------------------------------


def test_graph_capture_frames_without_header() -> None:
    d = one("22_")
    assert d.events_of("cuda_oom")[0].phase == "cuda_graph"
    assert "--enforce-eager" in finding(d, "cuda-oom").fix


def test_chained_scheduler_init_traceback_is_startup() -> None:
    d = one("19_")
    assert d.events_of("cuda_oom")[0].phase == "startup"
    fix = finding(d, "cuda-oom").fix
    assert "--mem-fraction-static" in fix and not any(flag in fix for flag in VLLM_ONLY_FLAGS)


# --- 7. exact rank wording --------------------------------------------------------------------


def test_rank_evidence_names_only_the_ranks_seen() -> None:
    for name, rank, bound in (
        ("20_", 7, 8),
        ("22_", 3, 4),
        ("32_", 7, 8),
    ):  # 32_: tags on frame lines only
        d = one(name)
        assert d.facts.tp_size_at_least == bound
        text = d.facts.evidence["tp_size_at_least"].text
        assert f"rank {rank} appears" in text and f">= {bound}" in text, text
        assert not re.search(r"ranks 0\.\.", text), text


# --- 8. SGLang crash excerpts accepted by SGLang's own lines ----------------------------------


def test_sglang_excerpts_recognised() -> None:
    for name in ("24_", "25_"):
        path = str(next(EXTRA.glob(name + "*.log")))
        out = cli("--json", path)
        assert out.returncode == 0, (name, out.stderr)
        js = json.loads(out.stdout)
        assert js["server"] == "sglang" and js["files"][0]["recognised"]
        assert any("lacks" in n for n in js["files"][0]["notes"])


def test_2024_time_only_prefixes_give_ranks() -> None:
    d = one("21_")
    assert d.server == "sglang" and d.facts.tp_size_at_least == 8


# --- 9. minor wording ---------------------------------------------------------------------------


def test_no_fragmentation_hint_when_it_could_not_have_held_the_request() -> None:
    d = one("18_")
    assert "fragmentation" not in finding(d, "cuda-oom").explanation


def test_ipc_wording_of_0517_rules_out_older_advice() -> None:
    f = finding(one("18_"), "sglang-cuda-ipc-tp")
    assert "0.5.5-0.5.16" not in f.fix and "before 0.5.15" not in f.explanation


def test_evidence_lines_listed_once() -> None:
    for path in sorted(EXTRA.glob("*.log")) + sorted(LOGS.glob("*.log")):
        for f in diagnose([path]).findings:
            assert len(f.evidence) == len(set(f.evidence)), (path.name, f.id)


# --- 10. a launch command wrapped mid-word by the terminal --------------------------------------


def test_terminal_wrapped_serve_command() -> None:
    d = one("31_")
    f = d.facts
    assert (f.tp_size, f.gpu_memory_utilization, f.max_running_requests, f.max_model_len) == (
        4,
        0.95,
        2,
        4096,
    )


def test_short_command_is_not_glued_to_the_next_line(tmp_path: Path) -> None:
    log = tmp_path / "cmd.log"
    log.write_text(  # a command narrower than a terminal row ends where it ends
        "vllm serve Qwen/Qwen2.5-7B-Instruct --tensor-parallel-size 2\n"
        "Automatically detected platform cuda.\n"
        "INFO 04-16 11:08:33 [api_server.py:1034] vLLM API server version 0.8.4\n"
    )
    assert diagnose([log]).facts.tp_size == 2


# --- crash lines: an event; unexplained only when no memory event and no error line ----------


def test_crash_excerpt_says_the_cause_is_missing() -> None:
    for name in ("21_", "25_"):  # 2024 "Exception in run_tp_server", "Scheduler hit an exception"
        d = one(name)
        assert d.events_of("server_crash"), name
        f = finding(d, "server-crash-unexplained")
        assert f.severity == "info" and "does not show why" in f.title


def test_crash_with_its_error_line_quotes_it(tmp_path: Path) -> None:
    log = tmp_path / "crash.log"
    log.write_text(
        "[2025-10-31 10:40:43 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2797, in run_scheduler_process\n'
        "    scheduler.event_loop_normal()\n"
        "KeyError: 'rid'\n"
    )
    f = finding(diagnose([log]), "server-crash-unexplained")
    assert "not a memory error" in f.title and "KeyError: 'rid'" in f.explanation


def test_crash_with_an_oom_is_explained_by_the_oom() -> None:
    d = diagnose(
        [next(LOGS.glob("05_*.log"))]
    )  # two "Scheduler hit an exception" lines after a CUDA OOM
    assert d.events_of("server_crash") and d.events_of("cuda_oom")
    assert not [f for f in d.findings if f.id == "server-crash-unexplained"]


def test_a_file_without_clear_server_joins_the_other(tmp_path: Path) -> None:
    bare = tmp_path / "rank1.log"  # one rank's bare OOM line: no server of its own
    bare.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 1 has a total "
        "capacity of 79.19 GiB of which 0.50 GiB is free.\n"
    )
    d = diagnose([LOGS / "02_sglang_llama3-8b_oom-prefill.log", bare])
    assert d.server == "sglang" and not d.groups
    assert len({e.file for e in d.events_of("cuda_oom")}) == 2
