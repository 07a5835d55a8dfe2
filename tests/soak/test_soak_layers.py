"""Soak per memory layer, end to end against real servers on loopback (no GPU).

Each test is one kind of fault: the reference server is a real
subprocess whose memory does what its mode says (real threads and malloc arenas, real KV
token accounting under SGLang's metric names, a real helper process that comes and goes, a
real kill), soak is a real subprocess, traffic is real HTTP. Short idle windows, few requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.procs import RefServer, run_soak
from support.procs import cli_env as _env

from vramdoctor.record import read_run
from vramdoctor.samples import PROCESS_APPEARED, PROCESS_EXITED, SERVER_DIED, Event

soak = run_soak

FAST = [
    "--requests",
    "20",
    "--concurrency",
    "4",
    "--idle",
    "1",
    "--interval",
    "0.1",
    "--image-size",
    "128x128",
    "--image-size",
    "256x192",
]


def test_one_kv_page_per_request_in_a_million_token_pool_is_a_kv_leak_at_its_rate(
    server_factory, tmp_path
) -> None:
    """SGLang 0.5.12+ gauges, 64-token pages, one page kept per request in a
    1,000,000-token pool (0.0064 % of the pool a request): LEAK in 4 rounds of 30, rate within 10 %."""
    srv = server_factory(
        "kv-leaking",
        "--metrics-flavour",
        "sglang",
        "--kv-pool-tokens",
        "1000000",
        "--kv-page-size",
        "64",
        "--kv-leak-tokens",
        "64",
    )
    r = soak(
        srv.url,
        tmp_path,
        "--rounds",
        "4",
        "--requests",
        "30",
        "--idle",
        "1",
        "--interval",
        "0.1",
        "--text-only",
        "--no-adapt",
        "--json",
    )
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    kv = d["layers"]["kv"]
    assert kv["verdict"] == "LEAK", kv
    pool = kv["pools"][0]
    assert pool["pool"] == "full"
    assert pool["tokens_per_request"] == pytest.approx(64, rel=0.10)
    assert pool["page_size_tokens"] == 64 and not pool["page_size_assumed"]  # from /get_server_info
    assert d["layers"]["host"]["verdict"] != "LEAK"
    run = read_run(tmp_path / "run.jsonl")
    kvs = [s.kv for s in run.records if getattr(s, "kind", "") == "metrics" and s.kv]
    assert (
        kvs
        and kvs[-1][0].source == "sglang:kv_used_tokens"
        and kvs[-1][0].total_tokens == 1_000_000
    )


def test_a_kv_leak_only_aborted_streams_cause_is_found(server_factory, tmp_path) -> None:
    """Pages leaked only when the client closes the stream; --abort-fraction
    finds it, the rounds record how many were streamed and aborted."""
    srv = server_factory(
        "kv-leaking",
        "--metrics-flavour",
        "sglang",
        "--kv-pool-tokens",
        "200000",
        "--kv-page-size",
        "64",
        "--kv-leak-tokens",
        "64",
        "--kv-leak-on",
        "abort",
    )
    r = soak(
        srv.url,
        tmp_path,
        "--rounds",
        "4",
        "--requests",
        "20",
        "--idle",
        "1",
        "--interval",
        "0.1",
        "--text-only",
        "--no-adapt",
        "--stream",
        "--abort-fraction",
        "0.25",
        "--max-tokens",
        "12",
        "--json",
    )
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    assert d["layers"]["kv"]["verdict"] == "LEAK"
    info = srv.info()
    assert info["aborted"] == 4 * 5  # a quarter of every round, the same requests each time
    # per request that reached the server: 5 of 20 requests leak a 64-token page
    assert d["layers"]["kv"]["pools"][0]["tokens_per_request"] == pytest.approx(
        64 * 5 / 20, rel=0.15
    )
    ends = [
        e
        for e in read_run(tmp_path / "run.jsonl").records
        if isinstance(e, Event) and e.name == "round_end"
    ]
    assert [(e.data["streamed"], e.data["aborted"]) for e in ends] == [(20, 5)] * 4


def test_threads_growing_malloc_arenas_are_host_caching_not_a_leak(
    server_factory, tmp_path
) -> None:
    """A thread per request decoding PNGs grows RSS through new glibc arenas
    (bounded by MALLOC_ARENA_MAX): never LEAK; the arenas are measured; with MALLOC_ARENA_MAX=2
    the server has at most two arenas."""
    srv = server_factory("arena")
    r = soak(srv.url, tmp_path, "--rounds", "4", "--max-rounds", "8", *FAST, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    host = d["layers"]["host"]
    assert host["verdict"] in ("CACHING", "STABLE"), host["summary"]
    proc = next(p for p in host["processes"] if p["pid"] == srv.pid)
    assert (
        proc["arenas_last"] > proc["arenas_first"] >= 0
    )  # new arenas appeared: the physics is live
    capped = server_factory("arena", env={"MALLOC_ARENA_MAX": "2"})
    r2 = soak(
        capped.url, tmp_path, "--rounds", "3", "--no-adapt", *FAST, "--json", name="run2.jsonl"
    )
    assert r2.returncode == 0, r2.stderr
    d2 = json.loads(r2.stdout)
    proc2 = next(p for p in d2["layers"]["host"]["processes"] if p["pid"] == capped.pid)
    # the main arena plus one more; the count is of 64 MiB arena heaps, and one arena whose heap
    # filled chains a second heap, so two heaps can belong to that one arena
    assert proc2["arenas_last"] <= 2
    assert d2["layers"]["host"]["verdict"] != "LEAK"


def test_a_helper_process_that_comes_and_goes_does_not_decide_the_verdict(
    server_factory, tmp_path
) -> None:
    """A worker appears in round 1, fails to bind the port and exits; it is
    recorded (appeared, exited) and the caching server stays CACHING/STABLE."""
    srv = server_factory("worker-churn", "--churn-after", "3", "--churn-lifetime", "1.5")
    r = soak(srv.url, tmp_path, "--rounds", "4", "--max-rounds", "6", *FAST, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert srv.info()["churned"]
    assert d["verdict"] != "LEAK", d["headline"]
    events = [e for e in read_run(tmp_path / "run.jsonl").records if isinstance(e, Event)]
    appeared = {e.data["pid"] for e in events if e.name == PROCESS_APPEARED}
    exited = {e.data["pid"] for e in events if e.name == PROCESS_EXITED}
    helpers = appeared & exited
    assert helpers and srv.pid not in helpers
    assert not any(e.name == SERVER_DIED for e in events)
    # Its series are reported, and none decides a layer or keeps one undecided.
    theirs = [s for s in d["series"] if s["pid"] in helpers]
    assert theirs and not any(s["decides"] for s in theirs)
    assert not any(str(pid) in str(u.get("series")) for u in d["undecided"] for pid in helpers)
    server_host = next(s for s in d["series"] if s["id"] == f"rss/pid{srv.pid}")
    assert server_host["decides"]


def test_a_server_killed_mid_round_is_never_a_pass(server_factory, tmp_path) -> None:
    """The server dies during round 2: SERVER_DIED recorded, sending stops,
    exit 1 and the output says so."""
    srv = server_factory("plain")
    run = tmp_path / "run.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "soak",
            "--url",
            srv.url,
            "--out",
            str(run),
            "--rounds",
            "4",
            "--requests",
            "40",
            "--concurrency",
            "2",
            "--idle",
            "1",
            "--interval",
            "0.1",
            "--image-size",
            "128x128",
            "--timeout",
            "5",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if run.exists() and '"round_start","data":{"round":2' in run.read_text().replace(" ", ""):
            break
        time.sleep(0.05)
    time.sleep(0.3)
    srv.proc.kill()
    srv.proc.wait()
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    assert "server died" in err
    d = json.loads(out)
    assert d["verdict"] != "STABLE" and d.get("server_died")
    recs = read_run(run).records
    died = [e for e in recs if isinstance(e, Event) and e.name == SERVER_DIED]
    # killed once round 2 had started; a fast machine may have reached round 3 by then: the death
    # belongs to the round in progress, and no round starts after it
    starts = [e for e in recs if isinstance(e, Event) and e.name == "round_start"]
    in_progress = max(e.data["round"] for e in starts)
    assert len(died) == 1 and died[0].data["round"] == in_progress >= 2
    assert all(e.t <= died[0].t for e in starts)  # nothing sent after the death


def test_undecided_layers_get_more_rounds_and_no_adapt_keeps_the_count(
    server_factory, tmp_path
) -> None:
    """Two rounds cannot decide a layer that rose; soak adds rounds (an
    extra_round event says which layer and why) up to --max-rounds; --no-adapt runs exactly 2."""
    srv = server_factory("plain")
    r = soak(srv.url, tmp_path, "--rounds", "2", "--max-rounds", "5", *FAST, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert 3 <= len(d["rounds"]) <= 5
    extra = [
        e
        for e in read_run(tmp_path / "run.jsonl").records
        if isinstance(e, Event) and e.name == "extra_round"
    ]
    assert extra and extra[0].data["round"] == 3 and extra[0].data["undecided"][0]["layer"]
    assert "extra round: undecided" in r.stderr
    r2 = soak(srv.url, tmp_path, "--rounds", "2", "--no-adapt", *FAST, "--json", name="run2.jsonl")
    assert len(json.loads(r2.stdout)["rounds"]) == 2


def test_with_model_a_failing_model_list_is_a_note_without_it_the_error_names_model(
    server_factory, tmp_path
) -> None:
    """/v1/models answers 500 (transformers serve without an HF cache)."""
    srv = server_factory("stable", "--models-status", "500")
    r = soak(
        srv.url,
        tmp_path,
        "--rounds",
        "1",
        "--no-adapt",
        "--requests",
        "3",
        "--idle",
        "0.3",
        "--text-only",
        "--json",
    )
    assert r.returncode == 2
    assert "--model" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = soak(
        srv.url,
        tmp_path,
        "--model",
        "vramdoctor-reference",
        "--rounds",
        "1",
        "--no-adapt",
        "--requests",
        "3",
        "--idle",
        "0.3",
        "--text-only",
        "--json",
        name="run2.jsonl",
    )
    assert r.returncode == 0, r.stderr
    assert "HTTP 500" in r.stderr
    assert srv.info()["requests"] == 3


def test_two_soaks_started_together_never_collide(server_factory, tmp_path) -> None:
    """Default run-file names are unique per run (and created exclusively)."""
    srv = server_factory("stable")
    cmd = [
        sys.executable,
        "-m",
        "vramdoctor",
        "soak",
        "--url",
        srv.url,
        "--rounds",
        "1",
        "--no-adapt",
        "--requests",
        "2",
        "--idle",
        "0.3",
        "--text-only",
        "--json",
    ]
    procs = [
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path
        )
        for _ in range(3)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in results]
    files = sorted((tmp_path / "runs").glob("soak-*.jsonl"))
    assert len(files) == 3
    assert len({json.loads(o)["run_file"] for o, _ in results}) == 3


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--duration", "inf"], "--duration"),
        (["--timeout", "inf"], "--timeout"),
        (["--idle", "nan"], "--idle"),
        (["--requests", "-5"], "--requests"),
        (["--abort-fraction", "1.5"], "--abort-fraction"),
        (["--production-rate", "0"], "--production-rate"),
        (["--rounds", "6", "--max-rounds", "3"], "--max-rounds"),
    ],
)
def test_values_that_cannot_run_are_one_line_and_exit_2(tmp_path, args, needle) -> None:
    """Rejected before anything is sent or recorded."""
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "soak", "--url", "http://127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_huge_request_count_is_planned_lazily(server_factory, tmp_path) -> None:
    """--requests 100000000 sends its first request at once (the plan is
    built request by request, not in memory first)."""
    srv = server_factory("stable")
    start = time.monotonic()
    r = soak(
        srv.url,
        tmp_path,
        "--rounds",
        "1",
        "--no-adapt",
        "--requests",
        "100000000",
        "--max-requests",
        "3",
        "--idle",
        "0.3",
        "--baseline",
        "0.2",
        "--text-only",
        "--json",
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - start < 30
    assert srv.info()["requests"] == 3


def test_library_run_soak_calls_round_hooks_at_the_end_of_each_idle_window(
    server_factory, tmp_path
) -> None:
    """`vramdoctor.soak` as a library: SoakConfig -> run_soak, hooks see rounds 0..N and the run
    directory after each idle window ended."""
    from vramdoctor.soak import SoakConfig, run_soak

    srv = server_factory("stable")
    seen: list[tuple[int, Path, int]] = []
    run = tmp_path / "lib" / "run.jsonl"

    def hook(round_index: int, run_dir: Path) -> None:
        text = run.read_text()
        seen.append((round_index, run_dir, text.count('"idle_end"') + text.count('"baseline_end"')))

    def broken(_round_index: int, _run_dir: Path) -> None:
        raise RuntimeError("a hook that fails must not end the soak")

    outcome = run_soak(
        SoakConfig(
            url=srv.url,
            rounds=2,
            adapt=False,
            requests=3,
            idle_s=0.3,
            interval_s=0.1,
            text_only=True,
            out=run,
        ),
        hooks=[hook, broken],
    )
    assert [(r, d) for r, d, _ in seen] == [(0, run.parent), (1, run.parent), (2, run.parent)]
    assert [n for _, _, n in seen] == [1, 2, 3]  # called after the window's end mark
    assert outcome.exit_code == 0 and outcome.status == "complete" and outcome.rounds == 2
    assert outcome.analysis.verdict == "STABLE"
    errors = [e for e in read_run(run).records if isinstance(e, Event) and e.name == "source_error"]
    assert any("a hook that fails" in e.data["error"] for e in errors)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_new_process_owning_the_port_is_a_replaced_server(server_factory, tmp_path) -> None:
    """The server restarts between rounds (a new pid on the same port): the
    run records SERVER_REPLACED with both pids, keeps measuring the new one, and never calls
    the death of the first life a pass."""
    port = str(_free_port())
    first = server_factory("stable", "--port", port)
    run = tmp_path / "run.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "soak",
            "--url",
            first.url,
            "--out",
            str(run),
            "--rounds",
            "3",
            "--no-adapt",
            "--requests",
            "6",
            "--idle",
            "2",
            "--interval",
            "0.1",
            "--text-only",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (run.exists() and '"round_end"' in run.read_text()):
        time.sleep(0.05)
    first.stop()
    second = server_factory("stable", "--port", port)
    _out, err = proc.communicate(timeout=90)
    assert "Traceback" not in err
    events = [e for e in read_run(run).records if isinstance(e, Event)]
    replaced = [e for e in events if e.name == "server_replaced"]
    assert replaced and replaced[0].data == {"old_pid": first.pid, "new_pid": second.pid}
    assert second.info()["requests"] > 0  # the soak went on against the new life
    assert proc.returncode in (0, 1)


def test_the_servers_own_request_counter_in_the_baseline_is_the_production_rate(
    server_factory, tmp_path
) -> None:
    """Traffic the server already has (here 10 requests/s from another client)
    is read from its request counter during the baseline, before soak sends anything, and
    becomes the rate hours to OOM are projected at."""
    import threading

    import requests

    srv = server_factory("stable", "--metrics-flavour", "sglang")
    stop = threading.Event()

    def production() -> None:
        body = {"model": "vramdoctor-reference", "prompt": "hi", "max_tokens": 1}
        while not stop.wait(0.1):
            requests.post(srv.url + "/v1/completions", json=body, timeout=5)

    t = threading.Thread(target=production, daemon=True)
    t.start()
    run = tmp_path / "run.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "soak",
            "--url",
            srv.url,
            "--out",
            str(run),
            "--rounds",
            "1",
            "--no-adapt",
            "--requests",
            "4",
            "--baseline",
            "3",
            "--idle",
            "0.5",
            "--interval",
            "0.2",
            "--text-only",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
        run.exists() and '"baseline_end"' in run.read_text()
    ):
        time.sleep(0.05)
    stop.set()
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert "production rate from the server's own counters" in err
    ev = next(
        e for e in read_run(run).records if isinstance(e, Event) and e.name == "baseline_traffic"
    )
    assert ev.data["rate_rps"] == pytest.approx(10, rel=0.35)
    d = json.loads(out)
    assert d["production_rate_rps"] == pytest.approx(ev.data["rate_rps"])


def test_pinned_host_memory_is_caching_in_rss_shmem_or_the_mode_refuses_in_one_line(
    tmp_path,
) -> None:
    """Pinned host memory cached by PyTorch shows in RssShmem and levels off (CACHING, not LEAK).
    Without torch or a CUDA GPU the mode cannot exist: the server says so in one line."""
    from support.procs import SERVER

    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.stdout.strip() != "True":
        r = subprocess.run(
            [sys.executable, str(SERVER), "--port", "0", "--mode", "pinned", "--device", "cpu"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode != 0
        assert "--mode pinned needs" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        return
    srv = RefServer("pinned")
    try:
        r = soak(srv.url, tmp_path, "--rounds", "4", "--max-rounds", "6", *FAST, "--json")
        assert r.returncode == 0, r.stderr
        host = json.loads(r.stdout)["layers"]["host"]
        assert host["verdict"] == "CACHING", host["summary"]
        proc = next(p for p in host["processes"] if p["pid"] == srv.pid)
        assert proc["shmem_growth_mib"] > 0
    finally:
        srv.stop()
