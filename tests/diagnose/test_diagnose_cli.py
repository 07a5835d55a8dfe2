"""`vramdoctor diagnose` end to end in a subprocess: exit codes, --json schema, stdin, plain output."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from support.cli import vd as _vd

ROOT = Path(__file__).parents[2]
FIX = ROOT / "tests" / "fixtures" / "logs"
EXAMPLE = ROOT / "examples" / "logs" / "sglang_qwen2.5-vl-7b-tp2_fast-image-processor_gpu0-oom.log"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return _vd("diagnose", *args, stdin=stdin, text=False, env={"COLUMNS": "120"})


def fix(prefix: str) -> str:
    return str(next(FIX.glob(prefix + "_*.log")))


def test_example_from_readme() -> None:
    r = run(str(EXAMPLE))
    out = r.stdout.decode()
    assert r.returncode == 1
    assert out.splitlines()[0].startswith("SGLang: ")
    assert (
        "WARNING Fast image processor" in out
        and "vramdoctor ab-test --model Qwen/Qwen2.5-VL-7B-Instruct" in out
    )
    assert "\x1b[" not in out  # plain when piped / NO_COLOR
    # most severe first
    assert out.index("CRITICAL") < out.index("WARNING")


def test_healthy_log_exits_0() -> None:
    r = run(fix("22"))
    assert r.returncode == 0, r.stderr
    assert "no known cause" in r.stdout.decode().splitlines()[0]


def test_info_only_exits_0() -> None:
    r = run(fix("06"), "--json")
    d = json.loads(r.stdout)
    assert r.returncode == 0 and [f["severity"] for f in d["findings"]] == ["info"]


def test_json_schema() -> None:
    r = run(fix("16"), "--json")
    assert r.returncode == 1
    d = json.loads(r.stdout)
    assert (
        d["schema"] == "vramdoctor.diagnose/2"
    )  # 2: every evidence and finding says what it rests on
    assert d["server"] == "vllm" and d["version"] == "0.6.1.dev238+ge2c6e0a82"
    for key in (
        "model",
        "architecture",
        "multimodal",
        "tp_size",
        "dp_size",
        "pp_size",
        "mem_fraction_static",
        "gpu_memory_utilization",
        "attention_backend",
        "fast_image_processor",
        "cuda_ipc_transport",
    ):
        assert key in d["facts"]
    assert d["facts"]["tp_size"] == 2 and d["facts"]["mem_fraction_static"] is None
    for ev in d["events"]:  # every event (the V0 worker's crash line comes before the OOM)
        assert {"kind", "phase", "file", "line", "text"} <= set(ev)
    ev = next(e for e in d["events"] if e["kind"] == "cuda_oom")
    assert ev["phase"] == "mm_profiling"
    f = d["findings"][0]
    assert set(f) == {
        "id",
        "severity",
        "title",
        "basis",
        "evidence",
        "derived",
        "explanation",
        "fix",
    }
    assert {"file", "line", "text", "kind"} == set(f["evidence"][0])
    assert f["basis"] in ("read", "derived", "unknown") and f["evidence"][0]["kind"] == "read"
    for name, ev in d["facts"][
        "evidence"
    ].items():  # every fact: a line read, or how it was derived
        assert ev["kind"] == ("read" if ev["line"] else "derived"), name


def test_stdin_and_gz_and_several_files(tmp_path: Path) -> None:
    data = Path(fix("15")).read_bytes()
    r = run("-", "--json", stdin=data)
    d = json.loads(r.stdout)
    assert r.returncode == 1 and d["files"][0]["file"] == "<stdin>"
    assert d["findings"][0]["id"] == "sglang-kv-selfcheck-leak"
    gz = tmp_path / "tp.log.gz"
    gz.write_bytes(gzip.compress(Path(fix("05")).read_bytes()))
    r = run(str(gz), fix("14"), "--json")
    d = json.loads(r.stdout)
    assert {f["id"] for f in d["findings"]} >= {"cuda-oom", "sglang-kv-selfcheck-leak"}
    assert len(d["files"]) == 2


def test_not_a_server_log_and_bad_input(tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    p.write_text("shopping list\neggs\nmilk\n")
    r = run(str(p))
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "not a server log diagnose reads (SGLang, vLLM, TGI" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    for content in (b"", b"\x00\x01\x02" * 100):
        p.write_bytes(content)
        r = run(str(p))
        assert r.returncode == 2 and b"Traceback" not in r.stderr
    r = run(str(tmp_path / "missing.log"))
    assert r.returncode == 2 and b"no such file" in r.stderr


def test_api_key_from_args_never_printed() -> None:
    # File 23 is a real vLLM log whose args: Namespace(...) line carries an api_key value.
    secret = "k7YgF9RwP4qXmTnV2LsJ3HdO5zIc6AeB0Uv"
    assert secret in Path(fix("23")).read_text()
    for extra in ((), ("--json",)):
        r = run(fix("23"), *extra)
        assert r.returncode in (0, 1)
        assert secret[:12] not in r.stdout.decode() and secret[:12] not in r.stderr.decode()
    d = json.loads(run(fix("23"), "--json").stdout)
    assert d["facts"]["server_args"]["api_key"] == "***"


def test_readme_quick_start_example_exits_1() -> None:
    r = run(str(ROOT / "examples" / "logs" / "sglang_llama4-scout-vlm_tp8_prefill-oom.log"))
    assert r.returncode == 1, r.stderr
    assert "CRITICAL" in r.stdout.decode()


def test_vllm_example_has_no_false_other_process_claim() -> None:
    r = run(str(ROOT / "examples" / "logs" / "vllm_llama3.2-11b-vision-tp2_mm-profiling-oom.log"))
    out = " ".join(r.stdout.decode().split())
    assert r.returncode == 1 and "Another process holds" not in out


def test_nothing_is_cut_off_at_80_columns(tmp_path: Path) -> None:
    """At 80 columns a long finding title wraps (nothing is cut with an ellipsis), a reasoning shown as
    a fact's source is whole, and an OOM message's last figures are shown."""
    log = tmp_path / "vlm-tp.log"
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. GPU 0 has a total"
        " capacity of 23.57 GiB of which 605.88 MiB is free. Including non-PyTorch memory, this"
        " process has 22.96 GiB memory in use. Of the allocated memory 20.21 GiB is allocated by"
        " PyTorch, and 210.00 MiB is reserved by PyTorch but unallocated. If reserved but"
        " unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )
    lines = [
        "(VllmWorker rank=0 pid=811) INFO 04-16 11:12:01 [gpu_model_runner.py:1200] Starting to load model",
        "(VllmWorker rank=1 pid=812) INFO 04-16 11:12:01 [gpu_model_runner.py:1200] Starting to load model",
        "(VllmWorker rank=1 pid=812) ERROR 04-16 11:12:31 [multiproc_executor.py:380] Traceback (most recent call last):",
        '(VllmWorker rank=1 pid=812) ERROR 04-16 11:12:31 [multiproc_executor.py:380]   File "/usr/local/lib/python3.12/site-packages/vllm/model_executor/models/qwen2_5_vl.py", line 1020, in get_multimodal_embeddings',
        f"(VllmWorker rank=1 pid=812) ERROR 04-16 11:12:31 [multiproc_executor.py:380] {oom}",
    ]
    log.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "80"}
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "diagnose", str(log)],
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    out = r.stdout.decode()
    assert r.returncode == 1, out + r.stderr.decode()
    assert max(len(x) for x in out.splitlines()) <= 80
    assert "…" not in out, out
    flat = " ".join(x.strip() for x in out.splitlines())
    assert "reserved by PyTorch but unallocated" in flat
    # the facts table's "from" column (vramdoctor.render.table: cells wrap between words, never cut):
    # every word of the reasoning is there, whole
    reasoning = "world size >= 2 (TP x PP; tp >= 2, assuming no pipeline parallelism)"
    words = set(out.split())
    assert all(w in words for w in reasoning.split()), out
