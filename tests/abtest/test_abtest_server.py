"""`ab-test --server CMD --variant ... --preset ...`: the mitigations on a real server, launched.

The reference server (examples/reference_server) is launched by vramdoctor once per variant, as a
real process: its leaking mode, a variant that fixes the leak through its own environment
variable (REFERENCE_FREE_REQUEST_BUFFERS=1), one that makes it worse (--leak-scale 4), one that
fails to start (--fail-start), one that crashes mid-soak (--crash-after N --crash-how segv). What
each variant launched is looked up afterwards by pid, from /proc: nothing may be left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.procs import TARGETS, cli_env, free_port, kill_all, pid_alive, ref_cmd

from vramdoctor.abtest.server.variants import Change, apply_args, build_variants, parse_variant
from vramdoctor.errors import InputError
from vramdoctor.record import read_run
from vramdoctor.samples import Event

TRAFFIC = ["--rounds", "5", "--requests", "8", "--idle", "1.5", "--interval", "0.1"]
TRAFFIC += ["--text-only", "--stop-grace", "3", "--startup-timeout", "30"]


def _abtest(tmp: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vramdoctor", "ab-test", "--out", str(tmp / "ab"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        cwd=tmp,
    )


def _launched_pids(folder: Path) -> list[int]:
    """Every pid the variants' soaks recorded as the server (launch record and process tree)."""
    pids: list[int] = []
    for run in folder.glob("*.jsonl"):
        if run.name == "abtest.jsonl":
            continue
        r = read_run(run)
        pids += [int(p) for p in (r.header.get("config") or {}).get("server_tree", {})]
        pids += [
            int(e.data["pid"])
            for e in r.records
            if isinstance(e, Event) and e.name == "server_launch"
        ]
    return pids


def _processes_with(text: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmd and pid_alive(int(name)):
                out.append(int(name))
    return out


def test_the_variant_matrix_on_the_reference_server(tmp_path: Path) -> None:
    port = free_port()
    r = _abtest(
        tmp_path, *TRAFFIC, "--json",
        "--variant", "fixed=REFERENCE_FREE_REQUEST_BUFFERS=1",
        "--variant", "worse=--leak-scale 4",
        "--variant", "nostart=--fail-start",
        "--variant", "crash=--crash-after 14", "--variant", "crash=--crash-how segv",
        "--", *ref_cmd("leaking", port, "--leak-kib", "1024"),
    )  # fmt: skip
    assert r.returncode == 1, r.stderr  # a variant failed
    doc = json.loads(r.stdout)
    rows = {row["name"]: row for row in doc["rows"]}
    assert list(rows) == ["baseline", "fixed", "worse", "nostart", "crash", "baseline-again"]
    host = {n: (row["layers"] or {}).get("host", {}).get("verdict") for n, row in rows.items()}
    assert host["baseline"] == "LEAK" and host["baseline-again"] == "LEAK", host
    assert host["fixed"] in ("STABLE", "CACHING"), rows["fixed"]["layers"]
    assert rows["fixed"]["stops"] and "host RAM LEAK" in rows["fixed"]["stops"][0]
    assert host["worse"] == "LEAK" and "faster host RAM LEAK" in rows["worse"]["worse"][0]
    base_rate = rows["baseline"]["layers"]["host"]["rate_per_request"]
    assert rows["worse"]["layers"]["host"]["rate_per_request"] > 3 * base_rate
    assert rows["nostart"]["status"] == "failed_to_start"
    assert any("CUDA out of memory" in line for line in rows["nostart"]["log_tail"])
    assert rows["crash"]["status"] == "crashed", rows["crash"]
    assert "the server died" in rows["crash"]["message"]
    assert rows["crash"]["layers"] is not None  # what it measured before the crash is kept
    assert doc["recommendation"]["variant"] == "fixed"
    assert "REFERENCE_FREE_REQUEST_BUFFERS=1" in doc["recommendation"]["text"]
    assert doc["drift"]["checked"] is True
    for name in ("baseline", "fixed", "worse", "crash", "baseline-again"):
        lat = rows[name]["latency"]
        assert lat["p50_s"] and lat["p99_s"] >= lat["p50_s"] > 0
        assert (tmp_path / "ab" / f"{name}.jsonl").exists()
    assert "CUDA out of memory" in (tmp_path / "ab" / "nostart.server.log").read_text()
    # nothing it launched is left, by pid and by the port in a command line
    pids = _launched_pids(tmp_path / "ab")
    assert len(pids) >= 5 and not [p for p in pids if pid_alive(p)]
    assert _processes_with(f"--port {port}") == []
    # the whole table again, offline, from the results folder
    again = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(tmp_path / "ab" / "abtest.jsonl"), "--json"],
        capture_output=True, text=True, env=cli_env(), timeout=120,
    )  # fmt: skip
    assert again.returncode == 1, again.stderr
    assert json.loads(again.stdout) == doc
    text = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(tmp_path / "ab" / "abtest.jsonl")],
        capture_output=True, text=True, env=cli_env(COLUMNS="100"), timeout=120,
    ).stdout  # fmt: skip
    assert "recommended: fixed (REFERENCE_FREE_REQUEST_BUFFERS=1) stops the host RAM LEAK" in text
    assert "FAILED TO START" in text and "CRASHED" in text


def test_each_variant_is_flushed_as_it_ends_and_ctrl_c_keeps_them(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramdoctor", "ab-test", "--out", str(tmp_path / "ab"), *TRAFFIC,
         "--variant", "arena2=MALLOC_ARENA_MAX=2", "--", *ref_cmd("stable", port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=tmp_path,
    )  # fmt: skip
    results = tmp_path / "ab" / "abtest.jsonl"
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if results.exists() and '"abtest_variant"' in results.read_text():
                break
            time.sleep(0.1)
        assert '"abtest_variant"' in results.read_text(), "the baseline was not flushed"
        while not (tmp_path / "ab" / "arena2.jsonl").exists() and time.monotonic() < end:
            time.sleep(0.1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "finished variants are kept" in err
        run = read_run(results)
        assert run.status == "interrupted"
        names = [
            e.data["name"]
            for e in run.records
            if isinstance(e, Event) and e.name == "abtest_variant"
        ]
        assert names[0] == "baseline" and "arena2" in names
        assert not [p for p in _launched_pids(tmp_path / "ab") if pid_alive(p)]
        assert _processes_with(f"--port {port}") == []
        again = subprocess.run(
            [sys.executable, "-m", "vramdoctor", "report", str(results)],
            capture_output=True, text=True, env=cli_env(COLUMNS="120"), timeout=120,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert "baseline" in again.stdout and "interrupted" in again.stdout
    finally:
        kill_all([proc.pid])


def test_a_server_left_behind_is_named_and_the_run_stops(tmp_path: Path) -> None:
    """The variant's server is started by a daemon outside our tree (as `docker run -d`): it
    still serves the port after the variant ended; the next variants must not run."""
    port = free_port()
    spool = tmp_path / "spool"
    spool.mkdir()
    daemon = subprocess.Popen([sys.executable, str(TARGETS / "spawner.py"), str(spool)])
    base = ref_cmd("stable", port)
    left: list[int] = []
    try:
        # the variant asks the daemon to start the server instead: VIA_SPAWNER=1 in its env
        wrapper = tmp_path / "wrap.sh"
        wrapper.write_text(
            "#!/bin/sh\n"
            f'if [ "$VIA_SPAWNER" = 1 ]; then exec {sys.executable} {TARGETS / "via_spawner.py"} {spool} -- "$@"; fi\n'
            f'exec {sys.executable} "$@"\n'
        )
        wrapper.chmod(0o755)
        # what is judged is the stop after the daemon's variant, not a verdict: 3 short rounds
        quick = [*TRAFFIC, "--rounds", "3", "--idle", "1.0"]  # the last of an option wins
        r = _abtest(
            tmp_path, *quick, "--json", "--variant", "daemon=VIA_SPAWNER=1",
            "--variant", "after=MALLOC_ARENA_MAX=2", "--", str(wrapper), *base[1:],
        )  # fmt: skip
        left = [int(p.read_text()) for p in spool.glob("*.pid")]
        assert r.returncode == 1, r.stderr
        doc = json.loads(r.stdout)
        rows = {row["name"]: row for row in doc["rows"]}
        assert rows["daemon"]["status"] == "leftover", rows["daemon"]
        what = rows["daemon"]["leftovers"][0]
        assert what["pid"] == left[0] and what["where"] == "port"
        assert f"still serving port {port}" in what["what"]
        assert (
            rows["after"]["status"] == "not_run" and rows["baseline-again"]["status"] == "not_run"
        )
        assert "left pid" in rows["after"]["message"]
        assert f"pid {left[0]}" in r.stderr
    finally:
        kill_all([daemon.pid, *left])


def test_variant_changes_apply_to_the_command_line() -> None:
    base = (
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "M",
        "--mem-fraction-static",
        "0.88",
        "--enable-torch-compile",
    )
    name, change = parse_variant("frac=--mem-fraction-static 0.8")
    assert name == "frac" and apply_args(base, change)[-2:] == ("--mem-fraction-static", "0.8")
    assert apply_args(base, change).count("--mem-fraction-static") == 1
    _, drop = parse_variant("nocompile=drop:--enable-torch-compile")
    assert "--enable-torch-compile" not in apply_args(base, drop)
    _, env = parse_variant("arena=MALLOC_ARENA_MAX=2")
    assert dict(env.env) == {"MALLOC_ARENA_MAX": "2"} and not env.add_args
    _, unset = parse_variant("x=unset:SGLANG_USE_CUDA_IPC_TRANSPORT")
    assert unset.unset_env == ("SGLANG_USE_CUDA_IPC_TRANSPORT",)
    _, both = parse_variant("y=env:PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert dict(both.env) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert (change + env).describe() == "--mem-fraction-static 0.8; MALLOC_ARENA_MAX=2"
    for bad in ("noequals", "baseline=--x", "x=", "x=lowercase=1", "x=drop:", "x=--a 'open"):
        with pytest.raises(InputError):
            parse_variant(bad)
    with pytest.raises(InputError, match="has no --disable-radix-cache"):
        apply_args(base, Change(remove_args=("--disable-radix-cache",)))


def test_presets_use_the_servers_real_flags() -> None:
    sglang = ("python", "-m", "sglang.launch_server", "--model-path", "M", "--port", "30000")
    variants, kind = build_variants(sglang, (), ("fast-image-processor-off", "malloc-arena-max-2"))
    assert kind == "sglang"
    assert [v.name for v in variants] == [
        "baseline",
        "fast-image-processor-off",
        "malloc-arena-max-2",
        "baseline-again",
    ]
    assert variants[1].argv(sglang)[-1] == "--disable-fast-image-processor"
    assert dict(variants[2].change.env) == {"MALLOC_ARENA_MAX": "2"} and variants[2].trades
    vllm = ("vllm", "serve", "Qwen/Qwen2.5-VL-3B-Instruct", "--gpu-memory-utilization", "0.92")
    variants, kind = build_variants(
        vllm, (), ("gpu-memory-utilization-0.85", "mm-processor-cache-off")
    )
    assert kind == "vllm"
    argv = variants[1].argv(vllm)
    assert argv.count("--gpu-memory-utilization") == 1 and argv[-1] == "0.85"
    assert variants[2].argv(vllm)[-2:] == ("--mm-processor-cache-gb", "0")
    tserve = ("transformers", "serve", "M", "--port", "8000")
    _, kind = build_variants(tserve, (), ("expandable-segments",))
    assert kind == "openai"
    with pytest.raises(InputError, match="the vllm presets are"):
        build_variants(vllm, (), ("fast-image-processor-of",))
    with pytest.raises(InputError, match="at least one --variant"):
        build_variants(vllm)


def test_bad_ab_test_server_input_is_one_line_exit_2(tmp_path: Path) -> None:
    port = str(free_port())
    for args, needle in (
        (["--variant", "x=--a"], "need the server"),
        (["--variant", "bad", "--server", f"python s.py --port {port}"], "give NAME=CHANGE"),
        (["--preset", "nope", "--", "vllm", "serve", "M", "--port", port], "the vllm presets are"),
        (["--", "vllm", "serve", "M", "--port", port], "at least one --variant"),
        (["--server", "python s.py", "--variant", "a=X=1"], "names no --port"),
        (
            ["--server", "a --port 1", "--variant", "a=X=1", "--", "b"],
            "give the server's command once",
        ),
    ):
        r = _abtest(tmp_path, *args, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, r.stderr)


def test_list_presets_prints_the_kinds_presets() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "ab-test", "--list-presets", "--server", "python -m sglang.launch_server --model-path M"],
        capture_output=True, text=True, env=cli_env(COLUMNS="120"), timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "sglang fast-image-processor-off: --disable-fast-image-processor" in r.stdout
    assert "vllm" not in r.stdout.split("\n")[0]
