"""`vramdoctor soak` end to end, as a user runs it: the reference server is a real subprocess on
loopback, soak is a real subprocess, traffic is real HTTP. No GPU: host RSS carries the verdict.

Kept small for CI (2 cores): short idle windows, 20 requests a round, small images.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.agent import agent_env
from support.procs import cli_env as _env
from support.procs import run_soak

from vramdoctor.record import read_run

soak = run_soak
ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "--rounds",
    "4",
    "--max-rounds",
    "6",
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


def test_leaking_server_is_leak_with_the_true_rate_and_report_reproduces_it(
    server_factory, tmp_path
) -> None:
    # With the agent in the server: from outside alone a steady heap is retention_or_leak;
    # glibc's bytes in use, read inside, decide.
    srv = server_factory(
        "leaking", "--leak-kib", "1024", env=agent_env(tmp_path / "agent", fake_torch=False)
    )
    html = tmp_path / "leak.html"
    r = soak(srv.url, tmp_path, *FAST, "--json", "--report", str(html), "--production-rate", "2")
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    truth = srv.info()["leak_bytes_per_request"] / 2**20
    assert d["verdict"] == "LEAK"
    assert d["leak_mib_per_request"] == pytest.approx(truth, rel=0.25)
    assert d["culprit"]["pid"] == srv.pid
    assert d["culprit"]["layer"] == "host" and d["culprit"]["cause"] == "host_ram"
    assert d["layers"]["host"]["decided_by"] in ("inside_glibc", "inside_python"), d["layers"][
        "host"
    ]
    # Projection at the stated production rate (2 requests/s), never at the soak's burst load.
    proj = d["layers"]["host"]["projection"]
    assert proj["requests"] > 0 and proj["production_rate_rps"] == 2
    assert proj["hours"] == pytest.approx(proj["requests"] / (2 * 3600), rel=1e-6)
    # Four rounds, then one more: live bytes need five rounds to rule out a cache still filling
    # (vramdoctor.judge.inside.INSIDE_MIN_STEADY_STEPS), so the adaptive rounds go on once.
    assert [x["requests"] for x in d["rounds"]] == [20, 20, 20, 20, 20]
    assert all(x["errors"] == 0 for x in d["rounds"])
    assert f"rss/pid{srv.pid}" in d["rounds"][-1]["settled"]
    page = html.read_text()
    assert "LEAK" in page and "data:image/png;base64," in page
    # Offline: the run file alone gives the same verdict and rate.
    run = tmp_path / "run.jsonl"
    assert read_run(run).status == "complete"
    rep = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(run), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert rep.returncode == 1
    d2 = json.loads(rep.stdout)
    assert d2["verdict"] == "LEAK"
    assert d2["leak_mib_per_request"] == pytest.approx(d["leak_mib_per_request"], rel=1e-9)
    png = tmp_path / "chart.png"
    rep = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(run), "--report", str(png)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert rep.returncode == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "LEAK" in rep.stdout


def test_caching_server_is_caching_never_leak(server_factory, tmp_path) -> None:
    srv = server_factory("plain")
    r = soak(srv.url, tmp_path, *FAST, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "CACHING", d["sentence"]
    assert d["leak_mib_per_request"] is None
    assert srv.info()["cache_bytes"] > 0


def test_stable_server_is_stable_and_the_api_key_stays_secret(server_factory, tmp_path) -> None:
    key = "sk-vramdoctor-test-9f8e7d6c5b4a"
    srv = server_factory("stable", env={"REFERENCE_API_KEY": key})
    html = tmp_path / "r.html"
    r = soak(
        srv.url, tmp_path, *FAST, "--json", "--report", str(html), env=_env(OPENAI_API_KEY=key)
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "STABLE", d["sentence"]
    assert sum(x["errors"] for x in d["rounds"]) == 0  # the key was sent: no 401s
    assert srv.info()["requests"] == 80
    # And passed on the command line: redacted in the run file's argv.
    r2 = soak(
        srv.url,
        tmp_path,
        "--rounds",
        "1",
        "--requests",
        "2",
        "--idle",
        "0.3",
        "--text-only",
        "--api-key",
        key,
        name="run2.jsonl",
    )
    assert r2.returncode == 0, r2.stderr
    for text in (
        r.stdout,
        r.stderr,
        r2.stdout,
        r2.stderr,
        html.read_text(),
        (tmp_path / "run.jsonl").read_text(),
        (tmp_path / "run2.jsonl").read_text(),
    ):
        assert key not in text
    assert "--api-key" in (tmp_path / "run2.jsonl").read_text()


def test_wrong_key_is_counted_as_errors_not_a_crash(server_factory, tmp_path) -> None:
    srv = server_factory("stable", env={"REFERENCE_API_KEY": "right-key-123456"})
    r = soak(
        srv.url,
        tmp_path,
        "--rounds",
        "1",
        "--requests",
        "3",
        "--idle",
        "0.3",
        "--text-only",
        "--json",
    )
    # /v1/models refuses without the key: one line naming the fix, exit 2, before any traffic.
    assert r.returncode == 2
    assert "api-key" in r.stderr.lower() and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_gives_a_partial_report_and_keeps_the_run_file(
    server_factory, tmp_path, sig
) -> None:
    srv = server_factory("leaking", "--leak-kib", "512")
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
            "50",
            "--requests",
            "10",
            "--idle",
            "0.8",
            "--interval",
            "0.1",
            "--image-size",
            "128x128",
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
        if run.exists() and run.read_text().count('"idle_end"') >= 2:
            break
        time.sleep(0.1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    d = json.loads(out)
    assert d["status"] == "interrupted"
    assert len(d["rounds"]) >= 2
    assert d["rounds"][0]["settled"]
    r = read_run(run)
    assert r.status == "interrupted"
    assert any(getattr(e, "name", None) == "interrupted" for e in r.records)
    assert srv.info()["requests"] < 500  # it stopped sending


def test_server_that_disappears_mid_run_is_counted_not_a_crash(server_factory, tmp_path) -> None:
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
            "10",
            "--idle",
            "1",
            "--interval",
            "0.15",
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
        if run.exists() and '"idle_start"' in run.read_text():
            break
        time.sleep(0.05)
    srv.proc.kill()
    srv.proc.wait()
    out, err = proc.communicate(timeout=90)
    # A dead server is never a pass: exit 1, and said so.
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    d = json.loads(out)
    assert d["rounds"][0]["errors"] == 0
    assert d["server_died"]
    assert read_run(run).status == "complete"
    assert "server died" in err


def test_bounds_hold_max_requests_and_duration(server_factory, tmp_path) -> None:
    srv = server_factory("stable")
    r = soak(
        srv.url,
        tmp_path,
        "--rounds",
        "4",
        "--requests",
        "5",
        "--concurrency",
        "3",
        "--idle",
        "0.2",
        "--max-requests",
        "7",
        "--text-only",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert srv.info()["requests"] == 7
    assert sum(x["requests"] for x in json.loads(r.stdout)["rounds"]) == 7
    r = soak(
        srv.url,
        tmp_path,
        "--rounds",
        "100",
        "--requests",
        "5",
        "--idle",
        "0.5",
        "--duration",
        "3",
        "--text-only",
        "--json",
        name="run2.jsonl",
    )
    assert r.returncode in (0, 1), r.stderr
    run = read_run(tmp_path / "run2.jsonl")
    assert run.status == "complete"
    # The protocol ended within the bound (the end mark follows the last in-flight answer).
    assert run.end["t"] - run.header["t"] < 3 + 1.5
    assert len(json.loads(r.stdout)["rounds"]) < 100


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--url", "http://127.0.0.1:1"], "no server answers"),
        (["--url", "http://127.0.0.1:1", "--image-size", "big"], "--image-size"),
        (["--url", "http://127.0.0.1:1", "--rounds", "0"], "--rounds"),
        (["--url", "http://127.0.0.1:1", "--report", "x.pdf"], "--report"),
        (["--url", "http://127.0.0.1:1", "--image-dir", "/nonexistent-dir"], "--image-dir"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "soak", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        cwd=tmp_path,
    )
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing recorded for a run that never started


def test_gpu_metrics_from_an_nvitop_exporter_name_the_leaking_gpu_process(
    server_factory, tmp_path
) -> None:
    """--gpu-metrics: an nvitop-exporter (loopback) whose per-process memory is the reference
    server's real kept bytes. The GPU process series carries the verdict and names the pid."""
    from support.sources import nvitop_text, serve

    srv = server_factory("leaking", "--leak-kib", "2048")

    def respond(path: str) -> tuple[int, str, str]:
        info = srv.info()
        mib = 612.0 + (info["kept_bytes"] + info["cache_bytes"]) / 2**20
        text = nvitop_text(
            "gpu-host",
            [
                {
                    "index": 0,
                    "name": "NVIDIA H100 80GB HBM3",
                    "uuid": "GPU-0",
                    "total": 81559.0,
                    "used": mib + 500,
                    "free": 81559.0 - mib - 500,
                }
            ],
            [{"index": 0, "pid": srv.pid, "mib": mib, "command": "python server.py"}],
        )
        return 200, "text/plain; version=0.0.4; charset=utf-8", text

    with serve(respond) as exporter:
        r = soak(srv.url, tmp_path, *FAST, "--gpu-metrics", exporter + "/metrics", "--json")
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    truth = srv.info()["leak_bytes_per_request"] / 2**20
    assert d["verdict"] == "LEAK"
    assert d["culprit"]["pid"] == srv.pid and d["culprit"]["gpu"] == 0
    assert d["culprit"]["layer"] == "vram" and d["culprit"]["cause"] == "allocator"
    assert d["leak_mib_per_request"] == pytest.approx(truth, rel=0.25)
    gpu = next(s for s in d["series"] if s["id"] == "gpu0")
    assert gpu["verdict"] == "LEAK"
    # Time to OOM in requests, from the exporter's free memory at the end.
    proj = d["layers"]["vram"]["projection"]
    assert proj["requests"] == pytest.approx(
        proj["capacity_left"] / d["leak_mib_per_request"], rel=1e-6
    )
    assert proj["capacity_left"] < 81559.0


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_kv_pages_that_never_come_back_are_a_kv_page_leak(
    server_factory, tmp_path, flavour
) -> None:
    """KV usage published under SGLang's / vLLM's real metric names, scraped and mapped by the
    server-metrics source: usage that creeps up at idle is a KV page leak while RSS is flat."""
    srv = server_factory("kv-leaking", "--metrics-flavour", flavour, "--kv-leak-tokens", "200")
    r = soak(srv.url, tmp_path, *FAST, "--text-only", "--json")
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "LEAK"
    assert d["culprit"]["layer"] == "kv" and d["culprit"]["cause"] == "kv_pages"
    # In tokens, at the pool's real resolution: vLLM's ratio x num_gpu_blocks x block_size.
    kv = next(s for s in d["series"] if s["layer"] == "kv")
    assert kv["verdict"] == "LEAK"
    assert kv["slope_per_request"] == pytest.approx(200, rel=0.10)
    assert kv["baseline"] == 0.0
    rss = next(s for s in d["series"] if s["id"] == f"rss/pid{srv.pid}")
    assert rss["verdict"] != "LEAK"
    assert (
        d["layers"]["kv"]["projection"]["requests"] > 0
        and "KV pool is full" in d["layers"]["kv"]["summary"]
    )


def test_traffic_the_server_refuses_is_inconclusive_not_stable(tmp_path) -> None:
    """A server that lists a model but refuses every request (here: it answers GET only, so
    each POST gets HTTP 501): memory never moved under load, and that proves nothing."""
    from support.sources import serve

    def respond(path: str) -> tuple[int, str, str]:
        if path.startswith("/v1/models"):
            return 200, "application/json", json.dumps({"object": "list", "data": [{"id": "m"}]})
        return 404, "application/json", json.dumps({"detail": "Not Found"})

    with serve(respond) as url:
        r = soak(
            url,
            tmp_path,
            "--rounds",
            "3",
            "--requests",
            "4",
            "--idle",
            "0.3",
            "--text-only",
            "--json",
        )
    assert r.returncode == 1, r.stderr  # the server is failing: a problem, never healthy
    d = json.loads(r.stdout)
    assert d["verdict"] == "INCONCLUSIVE" and d["healthy"] is False
    assert len(d["rounds"]) == 1 and d["stopped_by"] == "requests-failed"  # no more rounds sent
    assert "no request succeeded" in d["headline"]
    assert "--model" in d["suggestion"]
    assert all(x["error_kinds"].get("http_error") == 4 for x in d["rounds"])
