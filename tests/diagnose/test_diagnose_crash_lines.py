"""Crashes diagnose misread or missed.

Cases 01, 02, 11, 14, 15, 16 are the files in tests/fixtures/logs/review12/. The other lines
follow the servers' own format strings: SGLang `alloc_token_slots` / `alloc_paged_token_slots_*`
(schedule_batch.py, later mem_cache/common.py: logger.error(msg) then raise RuntimeError(msg), msg =
"{Prefill|Decode|''} out of memory. Try to lower your batch size.\\nTry to allocate N tokens.\\n"
+ `available_and_evictable_str`), 2024's exit(1) variant ("Avaliable tokens: N"), 0.1's "Prefill out
of memory. This should never happen."; the retraction lines ("Decode out of memory happened.
#retracted_reqs: N, ..." and "KV cache pool is full. Retract requests. #retracted_reqs: N, ...");
PyTorch c10/core/impl/alloc_cpu.cpp ("DefaultCPUAllocator: can't allocate memory: you tried to allocate
N bytes. Error code 12 (Cannot allocate memory)"); the kernel's OOM-killer line; vLLM v1 core.py /
multiproc_executor.py / utils.py death lines ("EngineCore failed to start.", "WorkerProc failed to
start.", "Engine core initialization failed. See root cause above. Failed core proc(s): {...}").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import vd as _vd

from vramdoctor.diagnose import Diagnosis, diagnose
from vramdoctor.diagnose.findings import Finding
from vramdoctor.errors import InputError

CASES = Path(__file__).parents[1] / "fixtures" / "logs" / "review12"
FIX = Path(__file__).parents[1] / "fixtures" / "logs"
CASE_01 = CASES / "01-sglang-prefill-oom-runtimeerror-crash.log"
CASE_02 = CASES / "02-sglang-token-pool-out-of-memory-crash.log"
CASE_11 = CASES / "11-vllm-host-ram-oom-defaultcpuallocator-healthy.log"
CASE_14_GOOD = CASES / "14-good.log"
CASE_14_EMPTY = CASES / "14-empty-rank.log"
CASE_15 = CASES / "15-evidence-text-joined-without-space.log"
CASE_16 = CASES / "16-vllm-enginecore-failed-to-start-not-a-crash.log"

VLLM_BANNER = "INFO 09-14 03:22:00 [api_server.py:1896] vLLM API server version 0.10.1\n"
SGL_TRACE = (
    "[2025-10-14 08:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2797, in run_scheduler_process\n'
    "    scheduler.event_loop_overlap()\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/schedule_batch.py", line 1402, in {fn}\n'
    "    raise RuntimeError(error_msg)\n"
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return _vd("diagnose", *args, env={"COLUMNS": "200"})


def write(tmp_path: Path, text: str, name: str = "server.log") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def ids(d: Diagnosis) -> list[str]:
    return [f.id for f in d.findings]


def finding(d: Diagnosis, rule: str) -> Finding:
    return next(f for f in d.findings if f.id == rule)


# --- 1, 2: SGLang's KV pool allocation failure is a crash, not a retraction ------------------------


def test_prefill_allocation_failure_is_a_fatal_kv_pool_crash() -> None:
    d = diagnose([CASE_01])
    assert "sglang-retraction" not in ids(d)  # not "retracted ... and re-queued"
    f = finding(d, "sglang-kv-pool-exhausted")
    assert f.severity == "critical" and "prefill" in f.title and "crashed" in f.title
    assert "8192 token slots" in f.explanation and "6342 were available" in f.explanation
    assert "Decode out of memory happened" not in f.explanation
    for flag in ("--chunked-prefill-size", "--max-running-requests", "--mem-fraction-static"):
        assert flag in f.fix
    e = d.events_of("kv_pool_exhausted")[0]
    assert e.phase == "prefill" and e.data["requested_tokens"] == 8192
    assert e.data["pools"]["token"]["available_tokens"] == 6342
    r = run(str(CASE_01))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CRITICAL" in r.stdout and "KV pool ran out" in r.stdout


def test_token_pool_out_of_memory_is_a_memory_error_that_killed_the_scheduler() -> None:
    d = diagnose([CASE_02])
    assert "server-crash-unexplained" not in ids(d)  # not "not a memory error"
    f = finding(d, "sglang-kv-pool-exhausted")
    assert f.severity == "critical" and "120 were available" in f.explanation
    assert not any("error message after the traceback" in n for n in d.files[0].notes)
    assert run(str(CASE_02)).returncode == 1


def test_decode_failure_logged_then_raised_is_one_failure(tmp_path: Path) -> None:
    # logger.error(msg) prints the message, then `raise RuntimeError(msg)` prints it again in the
    # scheduler's traceback: one failure, not two
    msg = (
        "Decode out of memory. Try to lower your batch size.\n"
        "Try to allocate 4 tokens.\n"
        "Available tokens: 3 (available_size=3 + evictable_size=0)\n"
        "\n"
    )
    log = write(
        tmp_path,
        "[2025-10-14 08:00:00 TP0] Decode batch. #running-req: 40, #token: 65532, token usage: 1.00, #queue-req: 7\n"
        "[2025-10-14 08:00:01 TP0] "
        + msg
        + SGL_TRACE.format(fn="alloc_paged_token_slots_decode")
        + "RuntimeError: "
        + msg,
    )
    d = diagnose([log])
    evs = d.events_of("kv_pool_exhausted")
    assert len(evs) == 1 and d.event_counts["kv_pool_exhausted"] == 1
    e = evs[0]
    assert e.phase == "decode" and e.data["raised"] is True
    assert e.data["pools"]["token"] == {
        "available_tokens": 3,
        "free_tokens": 3,
        "evictable_tokens": 0,
    }
    f = finding(d, "sglang-kv-pool-exhausted")
    assert "decode" in f.title and "(1 failure line(s))" in f.explanation
    assert "sglang-retraction" not in ids(d)


@pytest.mark.parametrize(
    ("text", "phase", "figure"),
    [
        # 2024 (0.2-0.3): logger.error then exit(1), no traceback; "Avaliable" is SGLang's typo
        (
            "[2024-08-01 10:00:00 TP0] Prefill out of memory. Try to lower your batch size.\n"
            "Try to allocate 1444 tokens.\nAvaliable tokens: 1200\n",
            "prefill",
            "1200 were available",
        ),
        # 0.1: print(...) then exit()
        ("Prefill out of memory. This should never happen.\n", "prefill", "does not show how many"),
        # 0.5 hybrid pools (sglang#34676): the mamba pool is the one short
        (
            SGL_TRACE.format(fn="alloc_paged_token_slots_extend")
            + "RuntimeError: Prefill out of memory. Try to lower your batch size.\n"
            "Try to allocate 8192 tokens.\n"
            "Available full tokens: 8070656 (full_available_size=7936 + full_evictable_size_=8062720)\n"
            "Available mamba: 760 (available_size=57 + component_evictable_size_=703)\n",
            "prefill",
            "the mamba pool is the one that ran short",
        ),
    ],
)
def test_every_generation_of_the_allocation_failure(
    tmp_path: Path, text: str, phase: str, figure: str
) -> None:
    d = diagnose([write(tmp_path, text)])
    assert d.server == "sglang"
    f = finding(d, "sglang-kv-pool-exhausted")
    assert f.severity == "critical" and figure in f.explanation
    assert d.events_of("kv_pool_exhausted")[0].phase == phase
    assert "sglang-retraction" not in ids(d)


@pytest.mark.parametrize(
    ("line", "reqs"),
    [
        (
            "[2024-08-01 10:00:00 TP0] Decode out of memory happened. #retracted_reqs: 3, #new_token_ratio: 0.4000 -> 0.7000\n",
            3,
        ),
        (
            "[2026-09-13 16:06:07] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
            "#new_tokens_gained: 646, #new_token_ratio: 0.0980 -> 0.3487\n",
            1,
        ),
    ],
)
def test_retraction_lines_stay_a_retraction(tmp_path: Path, line: str, reqs: int) -> None:
    d = diagnose([write(tmp_path, line)])
    assert ids(d) == ["sglang-retraction"]
    f = finding(d, "sglang-retraction")
    assert f.severity == "info" and f"({reqs} in the lines kept)" in f.explanation
    assert d.events_of("retraction")[0].phase == "decode"
    assert run(str(tmp_path / "server.log")).returncode == 0


def test_retraction_does_not_hide_a_crash(tmp_path: Path) -> None:
    log = write(
        tmp_path,
        "[2024-08-01 10:00:00 TP0] Decode out of memory happened. #retracted_reqs: 3, #new_token_ratio: 0.4000 -> 0.7000\n"
        + SGL_TRACE.format(fn="prepare_for_decode")
        + "KeyError: 'rid'\n",
    )
    assert {"sglang-retraction", "server-crash-unexplained"} <= set(ids(diagnose([log])))


def test_excerpt_note_names_only_what_is_missing(tmp_path: Path) -> None:
    trace = SGL_TRACE.format(fn="prepare_for_extend")
    with_error = diagnose([write(tmp_path, trace + "KeyError: 'rid'\n", "a.log")])
    note = next(n for n in with_error.files[0].notes if "lacks" in n)
    assert "error message after the traceback" not in note and "start-up lines" in note
    without = diagnose([write(tmp_path, trace, "b.log")])
    assert any("error message after the traceback" in n for n in without.files[0].notes)


# --- 10: host RAM ----------------------------------------------------------------------------------


def test_host_ram_oom_while_loading_weights() -> None:
    d = diagnose([CASE_11])
    f = finding(d, "host-oom")
    assert f.severity == "critical"
    assert "while loading weights" in f.title and "1.0 GiB" in f.title and "Ray" not in f.title
    assert "--swap-space" in f.fix and "--mem-fraction-static" not in f.fix
    assert d.events_of("host_oom")[0].phase == "weight_load"
    assert run(str(CASE_11)).returncode == 1


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (  # Linux: posix_memalign's wording
            VLLM_BANNER
            + "RuntimeError: [enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 2147483648 bytes. Error code 12 (Cannot allocate memory)\n",
            "2.0 GiB",
        ),
        (  # Python's own, at the end of a weight-loading traceback
            VLLM_BANNER + "Traceback (most recent call last):\n"
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/model_loader/default_loader.py", line 270, in load_weights\n'
            "    loaded = model.load_weights(self.get_all_weights(model_config, model))\n"
            "MemoryError\n",
            "MemoryError",
        ),
        (  # the kernel's OOM killer, pasted from dmesg
            VLLM_BANNER
            + "[12345.678901] Out of memory: Killed process 4242 (python3) total-vm:123456789kB, "
            "anon-rss:98765432kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:200000kB oom_score_adj:0\n",
            "process 4242 (python3)",
        ),
    ],
)
def test_host_ram_oom_wordings(tmp_path: Path, text: str, words: str) -> None:
    d = diagnose([write(tmp_path, text)])
    f = finding(d, "host-oom")
    assert f.severity == "critical" and words in f.title + f.explanation
    assert "cuda-oom" not in ids(d)


def test_engine_core_killed_by_sigkill_points_at_the_oom_killer(tmp_path: Path) -> None:
    log = write(
        tmp_path,
        VLLM_BANNER
        + "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': -9}\n",
    )
    d = diagnose([log])
    f = finding(d, "host-oom")
    assert f.severity == "warning" and "SIGKILL" in f.title and "dmesg" in f.fix
    assert "server-crash-unexplained" not in ids(d)
    crash = d.events_of("server_crash")[0]
    assert crash.data["failed_procs"] == {"EngineCore_DP0": -9} and "error" not in crash.data
    assert run(str(log)).returncode == 1


@pytest.mark.parametrize(
    "line",
    [
        "vllm-0 exited with code 137",  # docker compose
        "command terminated with exit code 137",  # kubectl exec / logs
        "Nov 30 10:00:05 gpu1 systemd[1]: vllm.service: Main process exited, code=killed, status=9/KILL",
    ],
)
def test_every_supervisors_kill_line_is_a_sigkill(tmp_path: Path, line: str) -> None:
    """The supervisors' own words for a process killed by signal 9 (third review: kubectl's and
    systemd's were not read, so the log was called healthy)."""
    log = write(tmp_path, VLLM_BANNER + line + "\n")
    d = diagnose([log])
    assert d.events_of("sigkill") and finding(d, "host-oom").severity == "warning"


def test_sglang_self_kill_after_a_crash_is_not_an_oom_kill() -> None:
    # Real excerpts: the launcher SIGKILLs its own tree after "Received sigquit from a child process",
    # and the shell prints "Killed"; another cause (Triton shared memory, a flashinfer check) is shown.
    for name in ("07_", "08_"):
        d = diagnose([next(FIX.glob(name + "*.log"))])
        assert d.events_of("sigkill"), name
        assert "host-oom" not in ids(d), name
        assert not d.events_of("host_oom"), name  # the corpus labels: no other memory error


# --- 10 (16): vLLM's death lines are crash lines ---------------------------------------------------


def test_engine_core_failed_to_start_is_a_crash_line() -> None:
    d = diagnose([CASE_16])
    crashes = d.events_of("server_crash")
    assert [e.data["process"] for e in crashes] == ["EngineCore", "EngineCore"]
    f = finding(d, "server-crash-unexplained")
    assert f.severity == "info" and "KeyError" in f.explanation
    assert f.evidence[0].text == "EngineCore failed to start."
    assert run(str(CASE_16)).returncode == 0  # an info finding: not a memory problem


def test_worker_failed_to_start_quotes_its_exception(tmp_path: Path) -> None:
    log = write(
        tmp_path,
        VLLM_BANNER
        + "(VllmWorker rank=1 pid=2978) ERROR 03-19 07:27:53 [multiproc_executor.py:375] WorkerProc failed to start.\n"
        "(VllmWorker rank=1 pid=2978) ERROR 03-19 07:27:53 [multiproc_executor.py:375] Traceback (most recent call last):\n"
        '(VllmWorker rank=1 pid=2978) ERROR 03-19 07:27:53 [multiproc_executor.py:375]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 349, in worker_main\n'
        "(VllmWorker rank=1 pid=2978) ERROR 03-19 07:27:53 [multiproc_executor.py:375]     worker = WorkerProc(*args, **kwargs)\n"
        "(VllmWorker rank=1 pid=2978) ERROR 03-19 07:27:53 [multiproc_executor.py:375] ValueError: Unsupported quantization\n",
    )
    d = diagnose([log])
    assert d.server == "vllm"
    crash = d.events_of("server_crash")[0]
    assert crash.data == {"process": "WorkerProc", "error": "ValueError: Unsupported quantization"}


def test_source_line_quoting_the_message_is_not_a_crash(tmp_path: Path) -> None:
    log = write(
        tmp_path, VLLM_BANNER + '            logger.exception("EngineCore failed to start.")\n'
    )
    assert not diagnose([log]).events_of("server_crash")


# --- 13: several inputs ----------------------------------------------------------------------------


def test_an_empty_rank_log_next_to_a_good_one_is_noted_not_fatal() -> None:
    d = diagnose([CASE_14_GOOD, CASE_14_EMPTY])
    assert "cuda-oom" in ids(d)
    empty = next(fs for fs in d.files if fs.file.endswith("14-empty-rank.log"))
    assert not empty.recognised and empty.notes == [
        "not read: the file is empty, there is no log to read"
    ]
    r = run(str(CASE_14_GOOD), str(CASE_14_EMPTY), "--json")
    assert r.returncode == 1, r.stderr
    files = json.loads(r.stdout)["files"]
    assert [f["recognised"] for f in files] == [True, False]
    text = run(str(CASE_14_GOOD), str(CASE_14_EMPTY))
    assert "14-empty-rank.log: not read: the file is empty" in text.stdout
    assert "not a server log" not in text.stdout


def test_no_readable_input_is_still_exit_2(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="empty"):
        diagnose([CASE_14_EMPTY, tmp_path / "missing.log"])
    r = run(str(CASE_14_EMPTY), str(tmp_path / "missing.log"))
    assert r.returncode == 2 and "empty" in r.stderr and "Traceback" not in r.stderr


def test_the_same_file_twice_counts_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    once = diagnose([CASE_01])
    monkeypatch.chdir(CASE_01.parent)
    twice = diagnose([CASE_01, Path(".") / CASE_01.name])
    assert twice.event_counts == once.event_counts and len(twice.events) == len(once.events)
    assert len(twice.files) == 1
    assert any("given more than once" in n for n in twice.files[0].notes)


# --- 13 (15): wrapped message lines ----------------------------------------------------------------


def test_message_continued_on_a_short_line_gets_a_space() -> None:
    e = diagnose([CASE_15]).events_of("cuda_oom")[0]
    assert "out of memory CUDA kernel errors" in e.text


def test_terminal_wrap_mid_word_is_joined_without_a_space(tmp_path: Path) -> None:
    msg = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 232.00 MiB. GPU 0 has a total capacity "
        "of 23.57 GiB of which 154.25 MiB is free. Including non-PyTorch memory, this process has 23.40 GiB "
        "memory in use"
    )
    wrapped = "\n".join(msg[i : i + 100] for i in range(0, len(msg), 100))  # a 100-column terminal
    e = diagnose([write(tmp_path, wrapped + "\n")]).events_of("cuda_oom")[0]
    assert msg in e.text


def test_phase_less_wording_takes_the_phase_from_the_frames(tmp_path: Path) -> None:
    # mem_cache/common.py `alloc_token_slots` has no phase in its message; `alloc_for_extend` called it
    log = write(
        tmp_path,
        "[2026-02-11 06:44:50 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/schedule_batch.py", line 1849, in prepare_for_extend\n'
        "    out_cache_loc, req_pool_indices_tensor, _ = alloc_for_extend(self)\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/mem_cache/common.py", line 486, in alloc_for_extend\n'
        "    out_cache_loc = alloc_token_slots(batch.tree_cache, batch.extend_num_tokens)\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/mem_cache/common.py", line 380, in alloc_token_slots\n'
        "    raise RuntimeError(error_msg)\n"
        "RuntimeError: Out of memory. Try to lower your batch size.\n"
        "Try to allocate 2318 tokens.\n"
        "Available full tokens: 7949 (full_available_size=4137 + full_evictable_size_=3812)\n"
        "Available swa tokens: 2270 (swa_available_size=2270 + swa_evictable_size=0)\n",
    )
    d = diagnose([log])
    e = d.events_of("kv_pool_exhausted")[0]
    assert e.phase == "prefill" and e.data["short_pool"] == "swa"
    assert e.data["pools"]["full"] == {
        "available_tokens": 7949,
        "free_tokens": 4137,
        "evictable_tokens": 3812,
    }
    assert (
        "the swa pool is the one that ran short"
        in finding(d, "sglang-kv-pool-exhausted").explanation
    )


def test_every_rank_logging_then_raising_counts_once_per_rank(tmp_path: Path) -> None:
    msg = "Prefill out of memory. Try to lower your batch size.\nTry to allocate 8192 tokens.\nAvailable tokens: 100 (available_size=100 + evictable_size=0)\n"
    ranks = "".join(f"[2025-10-14 08:00:01 TP{r}] " + msg for r in range(4))
    raised = "".join(  # rank 3 raises a fork's own exception class: still the same failure
        SGL_TRACE.format(fn="alloc_paged_token_slots_extend").replace("TP0", f"TP{r}")
        + ("sglang.srt.mem_cache.common.PrefillOutOfMemory: " if r == 3 else "RuntimeError: ")
        + msg
        for r in range(4)
    )
    d = diagnose([write(tmp_path, ranks + raised)])
    assert d.event_counts["kv_pool_exhausted"] == 4
    assert all(e.data["raised"] for e in d.events_of("kv_pool_exhausted"))


@pytest.mark.parametrize(
    "line",
    [
        "(EngineCore_DP0 pid=2311) ERROR 09-14 03:22:10 [core.py:711] EngineCore encountered a fatal error.",
        "(APIServer pid=1) ERROR 09-14 03:22:10 [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
        "(EngineCore_DP0 pid=2311) ERROR 09-14 03:22:10 [multiproc_executor.py:149] Worker proc VllmWorker-1 died unexpectedly, shutting down executor.",
    ],
)
def test_vllm_runtime_death_lines(tmp_path: Path, line: str) -> None:
    d = diagnose([write(tmp_path, VLLM_BANNER + line + "\n")])
    assert d.server == "vllm" and d.events_of("server_crash")
    f = finding(d, "server-crash-unexplained")
    assert "does not show why" in f.title
    # with the CUDA OOM that killed it in the log, the OOM is the finding, not the crash
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.00 GiB is free.\n"
    d = diagnose([write(tmp_path, VLLM_BANNER + oom + line + "\n", "b.log")])
    assert "cuda-oom" in ids(d) and "server-crash-unexplained" not in ids(d)


def test_see_root_cause_above_takes_the_exception_above(tmp_path: Path) -> None:
    # vLLM 0.6-0.8 (V0, api_server.py): the engine process's traceback, then the API server's line
    log = write(
        tmp_path,
        "INFO 01-10 10:00:00 api_server.py:712] vLLM API server version 0.6.6\n"
        "Process SpawnProcess-1:\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/engine/multiprocessing/engine.py", line 366, in run_mp_engine\n'
        "    engine = MQLLMEngine.from_engine_args(engine_args=engine_args,\n"
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", line 288, in build_async_engine_client_from_engine_args\n'
        "    raise RuntimeError(\n"
        "RuntimeError: Engine process failed to start. See stack trace for the root cause.\n",
    )
    d = diagnose([log])
    crash = d.events_of("server_crash")[0]
    assert crash.data["process"] == "Engine process" and crash.data["error_above"] is True
    assert crash.data["error"].startswith("ValueError: The model's max seq len (32768)")


def test_killed_after_a_crash_line_is_the_servers_cleanup(tmp_path: Path) -> None:
    # SGLang's scheduler died of an exception (its last line cut off), then the launcher SIGKILLed its
    # own tree and the shell printed "Killed": the crash is the finding, not the OOM killer
    log = write(tmp_path, SGL_TRACE.format(fn="prepare_for_extend") + "\nKilled\n")
    d = diagnose([log])
    assert d.events_of("sigkill") and "host-oom" not in ids(d)
    assert "does not show why" in finding(d, "server-crash-unexplained").title
    # a bare "Killed" with nothing before it: most often the OOM killer (a warning)
    d = diagnose([write(tmp_path, VLLM_BANNER + "Killed\n", "b.log")])
    f = finding(d, "host-oom")
    assert f.severity == "warning" and "SIGKILL" in f.title


def test_sglang_scheduler_dead_with_exit_code_minus_9(tmp_path: Path) -> None:
    # SGLang's launcher (engine.py `_launch_subprocesses`): the scheduler vanished while loading
    # weights, killed by SIGKILL (the OOM killer's mark); no exception anywhere
    log = write(
        tmp_path,
        "[2026-01-28 04:17:40 TP0] Load weight begin. avail mem=78.50 GB\n"
        "[2026-01-28 04:18:10] Rank 0 scheduler is dead. Please check if there are relevant logs.\n"
        "[2026-01-28 04:18:11] Exit code: -9\n",
    )
    d = diagnose([log])
    assert d.server == "sglang"
    crash = d.events_of("server_crash")[0]
    assert crash.data["process"] == "Scheduler" and crash.data["failed_procs"] == {
        "Scheduler rank 0": -9
    }
    f = finding(d, "host-oom")
    assert f.severity == "warning" and "SIGKILL" in f.title
    # exit code 1: it died of an exception printed elsewhere, not of a signal
    log2 = write(tmp_path, log.read_text().replace("Exit code: -9", "Exit code: 1"), "b.log")
    d = diagnose([log2])
    assert not d.events_of("sigkill") and "host-oom" not in ids(d)
    assert "does not show why" in finding(d, "server-crash-unexplained").title


@pytest.mark.parametrize(
    ("line", "process"),
    [
        (
            "(VllmWorkerProcess pid=2212) ERROR 01-10 10:00:05 multiproc_worker_utils.py:233] Exception in worker "
            "VllmWorkerProcess while processing method determine_num_available_blocks.",
            "VllmWorkerProcess",
        ),
        (
            "(RayWorkerWrapper pid=2212) ERROR 01-10 10:00:05 worker_base.py:467] Error executing method "
            "'determine_num_available_blocks'. This might cause deadlock in distributed execution.",
            "worker",
        ),
    ],
)
def test_vllm_v0_worker_exception_lines(tmp_path: Path, line: str, process: str) -> None:
    prefix = line.split("ERROR")[0]
    log = write(
        tmp_path,
        "INFO 01-10 10:00:00 api_server.py:712] vLLM API server version 0.6.6\n"
        + line
        + "\n"
        + prefix
        + "ERROR 01-10 10:00:05 worker_base.py:467] Traceback (most recent call last):\n"
        + prefix
        + 'ERROR 01-10 10:00:05 worker_base.py:467]   File "/usr/local/lib/python3.12/dist-packages/vllm/worker/worker_base.py", line 459, in execute_method\n'
        + prefix
        + "ERROR 01-10 10:00:05 worker_base.py:467] AssertionError: expected a sharded weight\n",
    )
    crash = diagnose([log]).events_of("server_crash")[0]
    assert crash.data == {"process": process, "error": "AssertionError: expected a sharded weight"}
