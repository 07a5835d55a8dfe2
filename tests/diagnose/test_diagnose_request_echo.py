"""Request echoes, vLLM V0's unquoted crash line, inductor's
autotune skips and a SIGKILL after a graceful stop.

Cases 01, 02, 03, 03b, 08, 08b, 10 and 14 are the files in tests/fixtures/logs/review12b/.
The other lines follow the servers' own format strings: vLLM entrypoints/logger.py RequestLogger
("Received request %s: prompt: %r, params: %s, ..." to 0.10, "Received request %s: params: %s, ..."
from 0.11, "Generated response %s%s: output: %r, ..."), SGLang's request logger ("Receive: obj=%s",
"Receive OpenAI: obj=%s", "Finish: obj=%s, out=%s", 2024's "in=%s, out=%s", the json format's
"request.received" record), torch/_inductor/select_algorithm.py ("Runtime error during autotuning:
\\n%s. \\nIgnoring this choice.", log.warning(OutOfResources)), triton's OutOfResources message,
uvicorn's shutdown lines and vLLM V0 worker_base.py (0.4-0.6) "Error executing method {method}. This
might cause deadlock in distributed execution." (method unquoted).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import vd as _vd

from vramdoctor.diagnose import diagnose
from vramdoctor.diagnose.diagnosis import extract_file

CASES = Path(__file__).parents[1] / "fixtures" / "logs" / "review12b"
CASE_01 = CASES / "01-vllm-healthy-prompt-echo-oom-text.log"
CASE_02 = CASES / "02-sglang-healthy-request-log-oom-and-oomkilled-text.log"
CASE_03 = CASES / "03-vllm-graceful-docker-stop-137-called-oom-killer.log"
CASE_03B = CASES / "03b-sglang-ctrl-c-shutdown-killed-called-oom-killer.log"
CASE_08 = CASES / "08-sglang-healthy-request-log-echo-kv-pool-exhausted-and-leak.log"
CASE_08B = CASES / "08b-vllm-healthy-request-log-echo-bogus-events.log"
CASE_10 = CASES / "10-sglang-torch-compile-autotune-ignored-choice-called-critical.log"
CASE_14 = CASES / "14-vllm-v0-error-executing-method-unquoted-crash-called-healthy.log"

VLLM_HEAD = (
    "(APIServer pid=2211) INFO 09-14 03:22:13 [api_server.py:1805] vLLM API server version 0.10.1.1\n"
    "(APIServer pid=2211) INFO 09-14 03:22:13 [utils.py:326] non-default args: {'model': "
    "'Qwen/Qwen2.5-7B-Instruct', 'gpu_memory_utilization': 0.85, 'enable_log_requests': True}\n"
)
SGL_HEAD = (
    "[2025-09-14 03:22:10] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', "
    "mem_fraction_static=0.85, tp_size=1, log_requests=True, log_requests_level=2)\n"
    "[2025-09-14 03:22:20 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail "
    "mem=63.40 GB, mem usage=15.10 GB.\n"
    "[2025-09-14 03:22:34] The server is fired up and ready to roll!\n"
)
# user text that quotes every kind of event the tool reads
QUOTED = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
    "of 79.19 GiB of which 1.06 GiB is free. Then: Out of memory: Killed process 4242 (python3), "
    "OOMKilled, Prefill out of memory. Try to lower your batch size., token_to_kv_pool_allocator memory "
    "leak detected! available_size=10, protected_size=0, self.max_total_num_tokens=500, KV cache pool is "
    "full. Retract requests. #retracted_reqs: 3, EngineCore failed to start., DefaultCPUAllocator: "
    "can't allocate memory: you tried to allocate 1073741824 bytes., out of resource: shared memory, "
    "Required: 110592, Hardware limit: 101376, Scheduler hit an exception"
)
# one echo line per logger wording (vLLM 0.5-0.10, 0.11+, responses; SGLang text, OpenAI, finish, 2024,
# json format); every one quotes QUOTED
ECHO_LINES = {
    "vllm-prompt": "(APIServer pid=2211) INFO 09-14 03:25:11 [logger.py:40] Received request "
    "chatcmpl-1: prompt: '<|im_start|>user\\n{q}<|im_end|>\\n', params: SamplingParams(n=1), "
    "prompt_token_ids: None, lora_request: None.",
    "vllm-params": "(APIServer pid=2211) INFO 11-02 10:00:00 [logger.py:52] Received request "
    "cmpl-2: params: SamplingParams(n=1, stop=['{q}']), lora_request: None.",
    "vllm-debug-prompt": "(APIServer pid=2211) DEBUG 11-02 10:00:00 [logger.py:40] Request cmpl-2 "
    "details: prompt: '{q}', prompt_token_ids: [1, 2], prompt_embeds shape: None.",
    "vllm-output": "(APIServer pid=2211) INFO 09-14 03:25:13 [logger.py:73] Generated response "
    "chatcmpl-1: output: '{q}', output_token_ids: [1, 2], finish_reason: stop",
    "vllm-v0": "INFO 03-01 10:00:00 async_llm_engine.py:379] Received request cmpl-3: prompt: '{q}', "
    "sampling_params: SamplingParams(n=1), prompt_token_ids: [1, 2], lora_request: None.",
    "sglang-receive": "[2025-09-14 03:25:01] Receive: obj=GenerateReqInput(text='{q}', "
    "sampling_params={{'max_new_tokens': 256}}, rid='a1b2')",
    "sglang-openai": "[2026-03-01 10:00:00] Receive OpenAI: obj={{'messages': [{{'role': 'user', "
    "'content': '{q}'}}], 'model': 'default'}}",
    "sglang-finish": "[2025-09-14 03:25:03] Finish: obj=GenerateReqInput(text='hi', rid='a1b2'), "
    "out={{'text': '{q}', 'meta_info': {{'id': 'a1b2'}}}}",
    "sglang-2024": "[2024-08-01 10:00:00] in=GenerateReqInput(text='{q}', rid='a1'), "
    "out={{'text': 'ok', 'meta_info': {{'id': 'a1'}}}}",
    "sglang-json": '{{"timestamp": "2026-03-01T10:00:00", "event": "request.received", "rid": "a1", '
    '"obj": {{"text": "{q}"}}}}',
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return _vd("diagnose", *args, env={"COLUMNS": "200"})


def write(tmp_path: Path, text: str, name: str = "server.log") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --- echoed requests and responses --------------------------------------------------------


@pytest.mark.parametrize("case", [CASE_01, CASE_02, CASE_08, CASE_08B])
def test_reviewer_echo_cases_are_healthy_with_no_events(case: Path) -> None:
    r = run(str(case), "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    out = json.loads(r.stdout)
    assert out["events"] == [] and out["event_counts"] == {}
    assert out["findings"] == []


@pytest.mark.parametrize("wording", sorted(ECHO_LINES))
def test_no_event_from_any_request_logger_wording(tmp_path: Path, wording: str) -> None:
    head = SGL_HEAD if wording.startswith("sglang") else VLLM_HEAD
    line = ECHO_LINES[wording].format(q=QUOTED)
    d = diagnose([write(tmp_path, head + line + "\n")])
    assert d.events == [] and d.findings == [], [(e.kind, e.text) for e in d.events]


def test_echo_keeps_its_rank_tags_but_not_tags_in_user_text(tmp_path: Path) -> None:
    # past the first MiB (which diagnose.py's prefix sniffing reads whole): only the line handlers run
    health = '[2025-09-14 03:24:00] INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
    text = (
        SGL_HEAD
        + health * ((1200 << 10) // len(health))
        + "[2025-09-14 03:25:01 TP3] Receive: obj=GenerateReqInput(text='(VllmWorker TP7 pid=999) out of memory', "
        "rid='a')\n"
    )
    ex, _ = extract_file(write(tmp_path, text))
    assert 3 in ex.ranks.get("TP", set())  # the line's own prefix is read
    assert 7 not in ex.ranks.get("TP", set()) and 999 not in ex.pids  # the user's text is not


def test_real_oom_right_after_an_echo_is_found_without_the_echoed_frames(tmp_path: Path) -> None:
    echo = (
        "(APIServer pid=2211) INFO 09-14 03:25:11 [logger.py:40] Received request chatcmpl-9: prompt: "
        '\'Why? Traceback (most recent call last):\\n  File "/x/vllm/v1/worker/gpu_model_runner.py", '
        "line 2400, in profile_run\\n    self._dummy_run()\\ntorch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 9.00 GiB.', params: SamplingParams(n=1), lora_request: None.\n"
    )
    real = (
        "(EngineCore_0 pid=2301) ERROR 09-14 03:25:12 [core.py:700] torch.OutOfMemoryError: CUDA out of "
        "memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is "
        "free. Including non-PyTorch memory, this process has 78.10 GiB memory in use.\n"
    )
    d = diagnose([write(tmp_path, VLLM_HEAD + echo + real)])
    ooms = d.events_of("cuda_oom")
    assert len(ooms) == 1 and ooms[0].line == 4
    assert ooms[0].data["requested_mib"] == 2048.0
    assert ooms[0].phase is None  # the echoed "profile_run" frame is not this OOM's traceback
    assert "Received request" not in ooms[0].text
    assert [f.id for f in d.findings] == ["cuda-oom"]


def test_real_sglang_kv_pool_crash_after_an_echo_is_found(tmp_path: Path) -> None:
    text = (
        SGL_HEAD
        + ECHO_LINES["sglang-receive"].format(q=QUOTED)
        + "\n"
        + "[2025-09-14 03:25:02 TP0] Prefill out of memory. Try to lower your batch size.\n"
        "Try to allocate 8192 tokens.\n"
        "Avaliable tokens: 1024\n"
    )
    d = diagnose([write(tmp_path, text)])
    assert [e.kind for e in d.events] == ["kv_pool_exhausted"]
    assert d.events[0].line == 5 and d.events[0].data.get("requested_tokens") == 8192


# --- vLLM V0's unquoted "Error executing method X." -------------------------------------------


def test_v0_unquoted_error_executing_method_is_a_crash_line() -> None:
    d = diagnose([CASE_14])
    crashes = d.events_of("server_crash")
    assert len(crashes) == 1 and crashes[0].line == 3
    assert "SafetensorError" in crashes[0].data.get("error", "")
    assert [f.id for f in d.findings] == ["server-crash-unexplained"]


# --- inductor's autotuner skipping a config ---------------------------------------------------


def test_autotune_ignored_choice_is_not_a_triton_finding() -> None:
    r = run(str(CASE_10), "--json")
    assert r.returncode == 0, r.stdout[-2000:]
    out = json.loads(r.stdout)
    assert "triton_shared_memory" not in out["event_counts"]
    assert not [f for f in out["findings"] if f["id"] == "triton-shared-memory"]


def test_autotune_warning_of_select_algorithm_one_line_is_not_a_finding(tmp_path: Path) -> None:
    text = SGL_HEAD + (
        "[rank0]:W0705 15:48:23.150000 434379 torch/_inductor/select_algorithm.py:1930] [8/6] out of "
        "resource: shared memory, Required: 110592, Hardware limit: 101376. Reducing block sizes or "
        "`num_stages` may help.\n"
    )
    d = diagnose([write(tmp_path, text)])
    assert d.events_of("triton_shared_memory") == [] and d.findings == []


def test_a_real_triton_shared_memory_crash_is_still_critical(tmp_path: Path) -> None:
    text = SGL_HEAD + (
        "[2025-07-05 15:48:23 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/layers/attention/triton_ops/extend_attention.py",'
        " line 400, in extend_attention_fwd\n"
        "    _fwd_kernel[grid](\n"
        "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 106496, Hardware "
        "limit: 101376. Reducing block sizes or `num_stages` may help.\n"
    )
    d = diagnose([write(tmp_path, text)])
    evs = d.events_of("triton_shared_memory")
    assert len(evs) == 1 and evs[0].data["required_bytes"] == 106496
    assert [(f.id, f.severity) for f in d.findings] == [("triton-shared-memory", "critical")]


# --- SIGKILL after a graceful stop -------------------------------------------------------------


@pytest.mark.parametrize("case", [CASE_03, CASE_03B])
def test_sigkill_after_graceful_stop_is_a_stop_timeout_not_the_oom_killer(case: Path) -> None:
    r = run(str(case), "--json")
    assert r.returncode == 0, r.stdout[-3000:]
    out = json.loads(r.stdout)
    assert [(f["id"], f["severity"]) for f in out["findings"]] == [("host-oom", "info")]
    text = out["findings"][0]["title"] + out["findings"][0]["explanation"]
    assert "stop timeout" in text and "most often the Linux OOM killer" not in text
    assert all(e.get("after_shutdown") for e in out["events"] if e["kind"] == "sigkill")


def test_sigkill_after_a_stop_and_a_restart_still_warns(tmp_path: Path) -> None:
    text = SGL_HEAD + (
        "^C[2025-09-14 05:00:00] INFO:     Shutting down\n"
        "[2025-09-14 05:00:00] INFO:     Application shutdown complete.\n" + SGL_HEAD + "Killed\n"
    )
    d = diagnose([write(tmp_path, text)])
    assert [(f.id, f.severity) for f in d.findings] == [("host-oom", "warning")]
    assert not d.events_of("sigkill")[0].data.get("after_shutdown")


def test_shutdown_words_in_a_request_echo_are_not_a_stop(tmp_path: Path) -> None:
    echo = (
        "[2025-09-14 03:25:01] Receive: obj=GenerateReqInput(text='uvicorn printed INFO:     Shutting "
        "down, Application shutdown complete. and KeyboardInterrupt', rid='a')\n"
    )
    d = diagnose([write(tmp_path, SGL_HEAD + echo + "Killed\n")])
    assert [(f.id, f.severity) for f in d.findings] == [("host-oom", "warning")]
    assert [e.kind for e in d.events] == ["sigkill"]


def test_an_unprefixed_echo_after_a_real_oom_is_not_its_wrapped_tail(tmp_path: Path) -> None:
    # SGLang's request logger (utils/request_logger.py) prints "%(message)s": no timestamp, no rank
    text = SGL_HEAD + (
        "[2025-09-14 03:25:02 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2797, in '
        "run_scheduler_process\n"
        "    scheduler.event_loop_overlap()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
        "Receive: obj=GenerateReqInput(text='GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB "
        "is free. Of the allocated memory 70.00 GiB is allocated by PyTorch', rid='z')\n"
    )
    d = diagnose([write(tmp_path, text)])
    ooms = d.events_of("cuda_oom")
    assert len(ooms) == 1 and ooms[0].line == 7
    assert ooms[0].data["requested_mib"] == 2048.0
    assert "total_mib" not in ooms[0].data and "free_mib" not in ooms[0].data
    assert "Receive" not in ooms[0].text


def test_tags_quoted_in_a_logged_prompt_are_not_the_servers(tmp_path: Path) -> None:
    """The first-MiB sniff reads process tags and rank prefixes anywhere in a line: one quoted in a
    logged prompt made tp 'at least 8' and a foreign pid the server's own (third review)."""
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total"
        " capacity of 79.19 GiB of which 1.06 GiB is free. Process 5 has 0.50 GiB memory in use."
        " Including non-PyTorch memory, this process has 77.60 GiB memory in use."
    )
    vllm = tmp_path / "vllm.log"
    vllm.write_text(
        "INFO 05-01 10:00:00 [logger.py:43] Received request cmpl-1: prompt: 'what is"
        " (VllmWorker TP7 pid=5)?', params: SamplingParams(n=1), prompt_token_ids: None\n"
        f"ERROR 05-01 10:00:01 [core.py:700] {oom}\n"
    )
    d = diagnose([vllm])
    assert d.facts.tp_size is None and d.facts.tp_size_at_least is None
    assert not any(
        p.get("server_process")
        for e in d.events_of("cuda_oom")
        for p in e.data.get("processes", ())
    )
    sgl = tmp_path / "sglang.log"
    sgl.write_text(
        "[2025-05-01 10:00:00] Receive: obj=GenerateReqInput(text='see [2025-05-01 10:00:00 TP7] in"
        " the log', sampling_params={})\n"
        "[2025-05-01 10:00:02] Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0\n"
    )
    d = diagnose([sgl])
    assert d.facts.tp_size is None and d.facts.tp_size_at_least is None
