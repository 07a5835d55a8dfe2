"""watch on real processes: a loopback server that leaks host memory per request, one whose
memory plateaus (glibc keeps what it freed), the exporter over HTTP, the CLI, rotation.

The servers are real processes with real memory behaviour and an SGLang-shaped /metrics
(request counter, running and queued gauges, used tokens); the test sends their traffic in
bursts with idle moments, as production does, while watch samples them without sending any.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from support.agent import agent_env

from vramdoctor.record import read_run
from vramdoctor.sources.nvml import nvml_status
from vramdoctor.watch import EXPORTED_METRICS, WatchConfig, Watcher, WatchOptions

SECRET = "sk-live-DO-NOT-EXPORT-4f2a"

SERVER = r"""
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
mode = sys.argv[1]
kept, lock = [], threading.Lock()
state = {"served": 0, "running": 0}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def _send(self, body):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/metrics":
            s = state
            self._send(
                "# TYPE sglang:num_requests_total counter\n"
                f'sglang:num_requests_total{{model_name="m"}} {s["served"]}\n'
                "# TYPE sglang:num_running_reqs gauge\n"
                f'sglang:num_running_reqs{{model_name="m",tp_rank="0"}} {s["running"]}\n'
                "# TYPE sglang:num_queue_reqs gauge\n"
                'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 0\n'
                "# TYPE sglang:num_used_tokens gauge\n"
                f'sglang:num_used_tokens{{model_name="m",tp_rank="0"}} {64 * s["running"]}\n')
            return
        with lock:
            state["running"] += 1
        blob = bytearray(b"x" * (256 * 1024))  # pages touched: resident
        with lock:
            if mode == "leak":
                kept.append(blob)  # never released: grows per request
            else:
                kept.append(blob)
                del kept[:-20]  # a bounded cache: fills, then reuses
            state["running"] -= 1
            state["served"] += 1
        self._send("ok")
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""


@pytest.fixture
def server(tmp_path: Path):
    started = []

    def start(mode: str, agent: bool = False) -> tuple[subprocess.Popen, str]:
        script = tmp_path / "server.py"
        script.write_text(SERVER)
        base = agent_env(tmp_path / f"agent-{mode}", fake_torch=False) if agent else os.environ
        env = {**base, "HF_TOKEN": SECRET}
        proc = subprocess.Popen(
            [sys.executable, str(script), mode, "--api-key", SECRET],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        started.append(proc)
        port = int(proc.stdout.readline())
        return proc, f"http://127.0.0.1:{port}"

    yield start
    for p in started:
        p.kill()
        p.wait(5)


def _traffic(urls: list[str], seconds: float, idle_s: float = 0.3) -> int:
    """Bursts of 5 requests, then an idle moment; returns requests sent per server."""
    sessions = [requests.Session() for _ in urls]
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(5):
            for s, u in zip(sessions, urls, strict=True):
                s.get(u + "/generate", timeout=5)
            sent += 1
        time.sleep(idle_s)
    return sent


def _config() -> WatchConfig:
    return WatchConfig(
        bucket_s=0.1, max_buckets=400, warmup_s=0.0, min_idle_s=0.06, inside_every_s=0.0
    )


def test_watch_calls_a_per_request_host_leak_and_not_a_plateau_and_exports_it_without_secrets(
    server, tmp_path
) -> None:
    # the leak with the agent inside (from outside alone a steady heap is retention_or_leak);
    # the plateau without it (a plateau needs no inside evidence)
    leak_proc, leak_url = server("leak", agent=True)
    cache_proc, cache_url = server("cache")
    watchers = [
        Watcher(
            WatchOptions(
                interval_s=0.04,
                analyse_every_s=3600,
                server_url=url,
                pids=[p.pid],
                use_nvml=False,
                config=_config(),
                listen="127.0.0.1:0",
                out_dir=tmp_path / name,
                rotate_bytes=16 * 1024,
                keep_files=3,
            )
        )
        for name, url, p in (("leak", leak_url, leak_proc), ("cache", cache_url, cache_proc))
    ]
    stop = threading.Event()
    threads = []
    for w in watchers:
        w.open()
        threads.append(threading.Thread(target=w.run, args=(stop,), daemon=True))
        threads[-1].start()
    time.sleep(0.5)
    sent = _traffic([leak_url, cache_url], 5.0)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(10)
    try:
        leak_res, cache_res = (w.analyse() for w in watchers)
        host = leak_res.layers["host"]
        assert sent > 30 and leak_res.mode == "rounds" and leak_res.idle_windows >= 5
        assert host.verdict == "LEAK", (host, leak_res.notes)
        assert host.main_series == f"rss/pid{leak_proc.pid}"
        assert host.rate_per_request == pytest.approx(0.25, rel=0.35)  # 256 KiB a request
        assert cache_res.verdict != "LEAK", cache_res.layers
        assert leak_res.requests_per_hour and leak_res.requests_per_hour > 1000

        text = requests.get(watchers[0].exporter.url, timeout=5).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for name in (
            "vramdoctor_process_memory_bytes",
            "vramdoctor_process_memory_growth_bytes_per_request",
            "vramdoctor_process_memory_verdict",
            "vramdoctor_sampler_up",
            "vramdoctor_sampler_samples",
        ):
            assert name in families, name
        exported = {s.name for f in families.values() for s in f.samples}
        assert exported <= set(EXPORTED_METRICS) | {
            "vramdoctor_sampler_samples_total",
            "vramdoctor_sampler_errors_total",
            "vramdoctor_events_total",
            "vramdoctor_watch_records_dropped_total",
        }
        verdicts = [
            s
            for s in families["vramdoctor_process_memory_verdict"].samples
            if s.labels["layer"] == "rss"
            and s.labels["pid"] == str(leak_proc.pid)
            and s.value == 1.0
        ]
        assert [s.labels["verdict"] for s in verdicts] == ["LEAK"]
        assert verdicts[0].labels["process"].startswith("python")
        assert verdicts[0].labels["scope"] == "server"
        growth = [
            s
            for s in families["vramdoctor_process_memory_growth_bytes_per_request"].samples
            if s.labels["layer"] == "rss" and s.labels["pid"] == str(leak_proc.pid)
        ]
        assert growth[0].value == pytest.approx(host.rate_per_request * 2**20, rel=1e-9)
        layer = {
            s.labels["layer"]: s.labels["verdict"]
            for s in families["vramdoctor_layer_verdict"].samples
            if s.value == 1.0
        }
        assert layer["host"] == "LEAK"
        recording = families["vramdoctor_watch_recording_up"].samples[0].value
        assert recording == 1.0
        up = {s.labels["source"]: s.value for s in families["vramdoctor_sampler_up"].samples}
        assert up == {"server_metrics": 1.0, "host": 1.0}
        assert SECRET not in text and "--api-key" not in text
        # run files rotated, bounded, readable, and free of the secret too
        for name in ("leak", "cache"):
            parts = sorted((tmp_path / name).glob("watch-*.jsonl"))
            assert 1 <= len(parts) <= 3
            for part in parts:
                assert SECRET not in part.read_text()
                assert read_run(part).command == "watch"
        assert len(list((tmp_path / "leak").glob("*.jsonl"))) == 3  # it rotated past --keep
    finally:
        for w in watchers:
            w.close()


def test_watch_cli_runs_without_nvml_rotates_and_prints_json(server, tmp_path) -> None:
    proc, url = server("cache")
    out = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "vramdoctor",
        "watch",
        "--server",
        url,
        "--pid",
        str(proc.pid),
        "--duration",
        "2s",
        "--interval",
        "0.1s",
        "--bucket",
        "0.2s",
        "--window",
        "20s",
        "--warmup",
        "0s",
        "--listen",
        "127.0.0.1:0",
        "--out",
        str(out),
        "--rotate-mib",
        "0.01",
        "--keep",
        "2",
        "--json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "vramdoctor.watch/2"
    assert any(s["pid"] == proc.pid and s["layer"] == "rss" for s in doc["series"])
    assert doc["exit_code"] == done.returncode and doc["interrupted"] is False
    assert "serving /metrics on http://127.0.0.1:" in done.stderr
    if not nvml_status()[0]:
        assert "GPU memory is not watched: NVML is not available here" in done.stderr
    parts = sorted(out.glob("watch-*.jsonl"))
    assert len(parts) == 2
    assert max(read_run(p).header["config"]["part"] for p in parts) > 2
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--listen", "nonsense"], "--listen wants HOST:PORT"),
        (["--pid", "999999999"], "--pid 999999999: no such process"),
        (
            ["--window", "1s", "--bucket", "1m", "--pid", "1"],
            "--window must hold at least two buckets",
        ),
        (["--interval", "soon", "--pid", "1"], "--interval wants a duration"),
        # every number bounded: not finite, absurdly large or small, a memory that cannot fit
        (["--rotate-mib", "nan", "--pid", "1"], "--rotate-mib 'nan': give a finite size"),
        (["--rotate-mib", "-3", "--pid", "1"], "--rotate-mib '-3': give a finite size"),
        (["--window", "1e300", "--pid", "1"], "--window"),
        (["--bucket", "1e-300", "--pid", "1"], "--bucket"),
        (["--interval", "inf", "--pid", "1"], "--interval 'inf': give a finite duration"),
        (["--duration", "nan", "--pid", "1"], "--duration 'nan': give a finite duration"),
        (["--duration", "0", "--pid", "1"], "--duration 0 s: must be between"),
        (["--warmup", "999d", "--pid", "1"], "--warmup"),
        (["--min-idle", "-1", "--pid", "1"], "--min-idle"),
        (["--keep", "0", "--pid", "1"], "--keep 0: keep between 1"),
        (["--window", "90d", "--bucket", "1s", "--pid", "1"], "buckets per series: at most 20,000"),
        (
            ["--interval", "1m", "--bucket", "10s", "--pid", "1"],
            "--bucket 10 s is shorter than --interval",
        ),
        (["--analyse-every", "0", "--pid", "1"], "--analyse-every"),
    ],
)
def test_watch_bad_input_is_one_line_and_exit_2(args, message) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "watch", "--no-exporter", "--duration", "1s", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_ctrl_c_gives_the_report_and_keeps_the_data(server, tmp_path) -> None:
    import signal

    proc, url = server("leak")
    out = tmp_path / "runs"
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "watch",
            "--server",
            url,
            "--pid",
            str(proc.pid),
            "--interval",
            "0.1s",
            "--bucket",
            "0.2s",
            "--window",
            "20s",
            "--warmup",
            "0s",
            "--no-exporter",
            "--out",
            str(out),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not list(out.glob("watch-*.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    # samples are flushed as they come: interrupt once the part holds some (a loaded machine
    # samples slowly)
    while time.monotonic() < deadline + 30:
        parts = list(out.glob("watch-*.jsonl"))
        if parts and len(parts[0].read_text().splitlines()) > 15:
            break
        time.sleep(0.2)
    cli.send_signal(signal.SIGINT)
    stdout, stderr = cli.communicate(timeout=30)
    # 130: interrupted before a leak was found (1 had one been found), as the README says
    doc = json.loads(stdout)
    assert cli.returncode == doc["exit_code"] and cli.returncode in (1, 130), stderr
    assert doc["interrupted"] is True and (cli.returncode == 1) == (doc["verdict"] == "LEAK")
    assert "Traceback" not in stderr
    assert [ln for ln in stderr.splitlines() if ln.startswith("vramdoctor: ")] == [
        "vramdoctor: interrupted; the report below covers what was sampled"
    ]
    assert doc["schema"] == "vramdoctor.watch/2"
    (part,) = out.glob("watch-*.jsonl")
    run = read_run(part)
    assert run.status == "interrupted" and len(run.records) > 10


def test_report_re_analyses_a_recorded_watch_part(tmp_path) -> None:
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).parents[1]))
    from fixtures.fleet.histories import History, Proc, records

    from vramdoctor.record import RunWriter, make_header

    h = History(
        hours=8,
        step_s=30,
        procs=[Proc(pid=100, name="p", leak_mib_per_request=0.03, leak_from_h=2.0)],
    )
    path = tmp_path / "watch-part.jsonl"
    with RunWriter(
        path,
        make_header(
            "watch",
            argv=["vramdoctor", "watch"],
            config={"bucket_s": 60.0, "max_buckets": 360, "warmup_s": 1800.0},
        ),
    ) as w:
        for r in records(h):
            w.write(r)
    done = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "vramdoctor.watch/2" and doc["culprit"]["pid"] == 100
    assert doc["layers"]["vram"]["verdict"] == "LEAK"


def test_watch_reads_gpu_processes_from_an_exporter_and_flags_a_stray_context() -> None:
    """No NVML here: --gpu-metrics from a loopback nvitop-exporter. PID 4242 grows 3 MiB a scrape on
    GPU 0 and holds a 520 MiB CUDA context on GPU 1 (a TP rank's IPC context on the producer's GPU)."""
    from support.sources import nvitop_text, serve

    scrapes = [0]

    def respond(path: str) -> tuple[int, str, str]:
        scrapes[0] += 1
        n = scrapes[0]
        gpus = [
            {
                "index": i,
                "name": "NVIDIA H200",
                "uuid": f"GPU-{i}",
                "total": 143771,
                "used": 60000 + 3 * n,
                "free": 83771 - 3 * n,
            }
            for i in (0, 1)
        ]
        procs = [
            {
                "index": 0,
                "pid": 4242,
                "username": "svc",
                "mib": 40000 + 3 * n,
                "command": f"python3 -m sglang.launch_server --api-key {SECRET}",
            },
            {"index": 1, "pid": 4242, "username": "svc", "mib": 520, "command": "python3"},
            {"index": 1, "pid": 5151, "username": "svc", "mib": 50000, "command": "python3"},
        ]
        return 200, "text/plain; version=0.0.4", nvitop_text("gpu-host", gpus, procs)

    with serve(respond) as url:
        w = Watcher(
            WatchOptions(
                interval_s=0.03,
                analyse_every_s=3600,
                gpu_metrics=[url + "/metrics"],
                config=_config(),
                listen="127.0.0.1:0",
            )
        ).open()
        try:
            for _ in range(60):
                w.tick()
                time.sleep(0.02)
            res = w.analyse()
            text = requests.get(w.exporter.url, timeout=5).text
        finally:
            w.close()
    vram = next(s for s in res.series if s.layer == "vram" and s.pid == 4242 and s.gpu == 0)
    assert vram.verdict == "LEAK" and vram.mode == "time" and res.layers["vram"].verdict == "LEAK"
    assert vram.growth_per_hour and vram.growth_per_hour > 0
    assert vram.hours_to_oom is not None
    assert [(f["code"], f["pid"], f["gpu"]) for f in res.strays] == [("stray_context", 4242, 1)]
    strays = [
        s
        for f in text_string_to_metric_families(text)
        if f.name == "vramdoctor_stray_context_bytes"
        for s in f.samples
    ]
    assert [(s.labels["gpu"], s.labels["pid"], s.labels["flag"], s.value) for s in strays] == [
        ("1", "4242", "stray_context", 520 * 2**20)
    ]
    assert SECRET not in text and "sglang.launch_server" not in text
    assert "no server /metrics was read" in " ".join(res.notes)
