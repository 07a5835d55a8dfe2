"""Kinds that have no verified excerpt: lines built from the servers' format strings.

These kinds were seen on logs that could not be found verbatim in a public thread, so they are
not shipped as fixtures; each test below builds the lines from the format strings in the servers'
released source (named at each), with figures of those logs. The kinds with verified excerpts
are checked in tests/fixtures/logs/wild/claims.json (files 62-76).
"""

from __future__ import annotations

from pathlib import Path

from support.procs import cli_env, run_cli

from vramdoctor.diagnose import diagnose

# llama.cpp (src/llama-context.cpp, ggml-cuda.cu, ggml-alloc.c; PR #16748 added the retry):
#   "%s: allocating %.2f MiB on device %d: cudaMalloc failed: %s"
#   "%s: failed to allocate %s buffer of size %zu"
#   "%s: failed to allocate compute buffers"
#   "%s: compute buffer allocation failed, retrying without pipeline parallelism"
#   "%s: %10s compute buffer size = %8.2f MiB"
LCPP_HEAD = [
    "llama_context: pipeline parallelism enabled (n_copies=4)",
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 51748.72 MiB on device 1: "
    "cudaMalloc failed: out of memory",
    "ggml_gallocr_reserve_n: failed to allocate CUDA1 buffer of size 54262464512",
    "graph_reserve: failed to allocate compute buffers",
    "llama_context: compute buffer allocation failed, retrying without pipeline parallelism",
]


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_llamacpp_retry_without_pipeline_parallelism_that_worked_is_a_warning(
    tmp_path: Path,
) -> None:
    log = _write(
        tmp_path,
        "llama.log",
        [*LCPP_HEAD, "llama_context:      CUDA1 compute buffer size =  6468.59 MiB"],
    )
    d = diagnose([log])
    oom = [f for f in d.findings if f.id == "cuda-oom"]
    assert len(oom) == 1 and oom[0].severity == "warning", [(f.id, f.severity) for f in oom]
    assert "retried without pipeline parallelism and went on" in oom[0].title
    assert [e.line for e in oom[0].evidence] == [2, 5, 6]  # the OOM, the retry, the context
    r = run_cli("diagnose", str(log), env=cli_env())
    assert r.returncode == 1 and "CRITICAL" not in r.stdout, r.stdout


def test_llamacpp_retry_that_failed_again_stays_critical(tmp_path: Path) -> None:
    log = _write(
        tmp_path,
        "llama.log",
        [
            *LCPP_HEAD,
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 12936.00 MiB on device 1: "
            "cudaMalloc failed: out of memory",
            "llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers",
        ],
    )
    d = diagnose([log])
    assert [f.severity for f in d.findings if f.id == "cuda-oom"] == ["critical"]
    # the evidence is each line on its own, never run into the next (never "of size
    # 54262464512" + the next line's timestamp read as one number)
    assert all("\n" not in e.text and "buffersggml" not in e.text for e in d.events)


# torch (c10/cuda/CUDACachingAllocator.cpp, 2.1+): "CUDA out of memory. Tried to allocate %s. GPU %d
# has a total capacity of %s of which %s is free. " + per NVML process: "Process %d has %s memory in
# use. " or "Including non-PyTorch memory, this process has %s memory in use. " + "Of the allocated
# memory %s is allocated by PyTorch, and %s is reserved by PyTorch but unallocated. ..."
OTHER_PROCESS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
    "capacity of 23.53 GiB of which 20.38 MiB is free. Process 5403 has 21.69 GiB memory in use. "
    "Including non-PyTorch memory, this process has 1.81 GiB memory in use. Of the allocated memory "
    "1.50 GiB is allocated by PyTorch, and 94.59 MiB is reserved by PyTorch but unallocated. If "
    "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "to avoid fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


def test_another_process_holding_the_gpu_is_the_cause(tmp_path: Path) -> None:
    d = diagnose([_write(tmp_path, "app.log", [OTHER_PROCESS])])
    (f,) = [f for f in d.findings if f.id == "cuda-oom"]
    assert "another process holds the GPU" in f.title, f.title
    assert "process 5403" in f.fix and "21.69 GiB" in f.explanation
    # 20.00 MiB asked with 20.38 MiB free is a full device, not fragmentation
    assert "smaller than the free memory" not in f.title + f.explanation
    assert "expandable_segments" not in f.fix and "Lower --" not in f.fix, f.fix
    assert f.basis == "derived" and f.derived


def test_a_memory_failure_line_is_never_refused_as_not_a_server_log(tmp_path: Path) -> None:
    # Python's own errno text (OSError: [Errno 12] Cannot allocate memory) in a log no reader
    # knows: never exit 2 "not a server log"
    log = _write(
        tmp_path,
        "worker.log",
        [
            "Traceback (most recent call last):",
            '  File "/app/serve.py", line 88, in <module>',
            "OSError: [Errno 12] Cannot allocate memory",
        ],
    )
    d = diagnose([log])
    assert [f.id for f in d.findings] == ["memory-error-unread"]
    assert d.findings[0].evidence[0].line == 3
    r = run_cli("diagnose", str(log), env=cli_env())
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "not a server log" not in r.stdout + r.stderr


def test_a_log_without_a_memory_line_is_still_refused(tmp_path: Path) -> None:
    log = _write(tmp_path, "notes.txt", ["shopping list", "milk", "eggs"])
    r = run_cli("diagnose", str(log), env=cli_env())
    assert r.returncode == 2 and "not a server log" in r.stdout + r.stderr


# vLLM (v1/worker/gpu_model_runner.py _dummy_sampler_run): raise RuntimeError("CUDA out of memory
# occurred when warming up sampler with {num_reqs} dummy requests. Please try lowering `max_num_seqs`
# or `gpu_memory_utilization` when initializing the engine.") from the torch error, printed below it
def test_vllm_sampler_warmup_takes_the_figures_of_the_torch_message_it_wraps(
    tmp_path: Path,
) -> None:
    log = _write(
        tmp_path,
        "vllm.log",
        [
            "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests. "
            "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.",
            "",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 252.00 MiB. GPU 0 has a total "
            "capacity of 10.57 GiB of which 163.12 MiB is free. Including non-PyTorch memory, this process "
            "has 10.41 GiB memory in use. Of the allocated memory 9.67 GiB is allocated by PyTorch, and "
            "26.44 MiB is reserved by PyTorch but unallocated.",
        ],
    )
    d = diagnose([log])
    (f,) = [f for f in d.findings if f.id == "cuda-oom"]
    assert d.server == "vllm"
    assert "sampler warm-up" in f.title and "163.12 MiB free of 10.57 GiB" in f.explanation
    assert "no figures" not in f.explanation and "--max-num-seqs" in f.fix


def test_prose_about_running_out_of_memory_is_not_a_server_log(tmp_path: Path) -> None:
    # A README or a postmortem says "out of memory" in sentences: no exception name, level,
    # time or errno on the line, so the safety net does not take it for a log's failure line.
    doc = _write(
        tmp_path,
        "notes.md",
        [
            "# Why our server restarts",
            'A server that dies during the soak turns "out of memory after N requests" into hours.',
            "We saw it run out of memory twice last week; the cause is below.",
        ],
    )
    assert [f.id for f in diagnose([doc]).findings] == []
    r = run_cli("diagnose", str(doc), env=cli_env())
    assert r.returncode == 2 and "not a server log" in r.stdout + r.stderr, (r.stdout, r.stderr)
    # the same words on a logged line are read
    log = _write(tmp_path, "w.log", ["2026-11-02 10:00:01 ERROR worker ran out of memory"])
    assert [f.id for f in diagnose([log]).findings] == ["memory-error-unread"]


def test_a_long_command_is_not_joined_with_the_next_command(tmp_path: Path) -> None:
    # Two commands one after the other in a pasted shell session: the first is wider than 80
    # columns, but the second row starts a command of its own, not a terminal-wrapped tail.
    first = (
        "PYTHONPATH=/opt/agent VRAMDOCTOR_AGENT_DIR=/tmp/vd-agent python -m sglang.launch_server "
        "--model-path Qwen/Qwen2.5-VL-7B-Instruct"
    )
    log = _write(tmp_path, "cmds.txt", [first, "vramdoctor soak --url http://127.0.0.1:30000"])
    facts = diagnose([log]).facts
    assert facts.model == "Qwen/Qwen2.5-VL-7B-Instruct", facts.model
