"""The sampler survives anything: real loopback servers, real files.

A bad value is skipped and said once; a slow /metrics delays nobody but itself; a huge page is
refused, not stored; a full disk keeps the data in memory; a sampler that dies fails the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vramdoctor.errors import SourceUnavailable
from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.samples import (
    COLLECTOR_FAILED,
    SOURCE_ERROR,
    SOURCE_ERROR_COUNT,
    Event,
    HostSample,
    MetricsSample,
)
from vramdoctor.sources.collector import Collector
from vramdoctor.sources.host import HostSource
from vramdoctor.sources.http import Scraper
from vramdoctor.sources.server_metrics import ServerMetricsSource

VLLM_PAGE = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n'
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
)


Handler = Callable[[BaseHTTPRequestHandler], None]


@contextlib.contextmanager
def http_server(handle: Handler) -> Iterator[str]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            with contextlib.suppress(OSError):  # the client gave up (deadline, size cap): expected
                handle(self)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def send(
    req: BaseHTTPRequestHandler, body: bytes, *, length: bool = True, trickle_s: float = 0.0
) -> None:
    req.send_response(200)
    req.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
    if length:
        req.send_header("Content-Length", str(len(body)))
    else:
        req.send_header("Connection", "close")
        req.close_connection = True
    req.end_headers()
    if trickle_s:
        for i in range(len(body)):
            req.wfile.write(body[i : i + 1])
            req.wfile.flush()
            time.sleep(trickle_s)
    else:
        req.wfile.write(body)


def own_host_source() -> HostSource:
    return HostSource({os.getpid(): "watched"}, maps_every=1000)


def run_collector(
    tmp_path: Path, sources: dict, seconds: float, interval: float = 0.1, **kw: object
) -> tuple[Collector, RunWriter]:
    writer = RunWriter(tmp_path / "run.jsonl", make_header("soak", argv=["vramdoctor", "soak"]))
    collector = Collector(writer, sources, interval=interval, **kw)  # type: ignore[arg-type]
    collector.start()
    time.sleep(seconds)
    collector.stop(timeout=5)
    writer.close("failed" if getattr(collector, "failed", None) else "complete")
    return collector, writer


def events(run_path: Path, name: str) -> list[Event]:
    return [r for r in read_run(run_path).of(Event) if r.name == name]


# --- one bad value must not kill the sampler ------------------------------------------------


@pytest.mark.parametrize("label", ["nan", "1e999"])
def test_a_non_finite_label_is_skipped_once_and_sampling_goes_on(
    tmp_path: Path, label: str
) -> None:
    page = (
        VLLM_PAGE + f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{label}"}} 1.0\n'
    ).encode()
    with http_server(lambda req: send(req, page)) as url:
        src = ServerMetricsSource(url + "/metrics", timeout=2)
        collector, writer = run_collector(tmp_path, {"metrics": src}, 1.2)
        src.close()
    run = read_run(writer.path)
    assert run.status == "complete"
    samples = run.of(MetricsSample)
    assert len(samples) >= 5, "sampling stopped after the bad value"
    assert all(s.values.get("running_requests") == 0.0 for s in samples)
    assert collector.failed is None
    errors = events(writer.path, SOURCE_ERROR)
    assert len(errors) == 1, errors  # once, not once per sample
    assert errors[0].data["source"] == "metrics" and "non-finite" in errors[0].data["error"]
    repeated = events(writer.path, SOURCE_ERROR_COUNT)
    assert repeated and repeated[0].data["count"] == len(samples)
    # The report says what was dropped and why, with the count.
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(writer.path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )
    assert r.returncode in (0, 1), r.stderr
    assert "non-finite value (NaN or overflow) left out of the sample" in r.stdout
    assert f"({len(samples)} times)" in r.stdout


# --- a slow source delays nobody but itself --------------------------------------------------


def test_a_trickling_metrics_page_does_not_starve_the_host_sampler(tmp_path: Path) -> None:
    page = VLLM_PAGE.encode() * 3  # ~1.2 KB at one byte per 20 ms: a minute for the whole page
    with http_server(lambda req: send(req, page, trickle_s=0.02)) as url:
        src = ServerMetricsSource(url + "/metrics", timeout=0.8)
        started = time.monotonic()
        _collector, writer = run_collector(
            tmp_path, {"metrics": src, "host": own_host_source()}, 2.5
        )
        elapsed = time.monotonic() - started
        src.close()
    run = read_run(writer.path)
    host = run.of(HostSample)
    # At 0.1 s intervals for 2.5 s the host sampler gets ~25 samples; with one thread for all
    # sources it got one per (never-ending) scrape.
    assert len(host) >= 12, len(host)
    assert elapsed < 6, "stop() waited for the trickle"
    errors = [e for e in events(writer.path, SOURCE_ERROR) if e.data["source"] == "metrics"]
    assert errors and "did not finish its answer within 0.8 s" in errors[0].data["error"]
    assert not run.of(MetricsSample)


def test_the_deadline_is_total_not_per_read() -> None:
    page = VLLM_PAGE.encode()
    with http_server(lambda req: send(req, page, trickle_s=0.01)) as url:
        scraper = Scraper(url + "/metrics", what="server /metrics", timeout=0.5)
        started = time.monotonic()
        with pytest.raises(SourceUnavailable, match=r"within 0\.5 s"):
            scraper.get_text()
        assert time.monotonic() - started < 1.5
        scraper.close()


@pytest.mark.parametrize("declared", [True, False])
def test_a_50_mb_metrics_page_is_refused_not_stored(tmp_path: Path, declared: bool) -> None:
    line = b'vllm:some_series{engine="0",i="0000000"} 1.0\n'
    page = VLLM_PAGE.encode() + line * (50 * 2**20 // len(line))
    with http_server(lambda req: send(req, page, length=declared)) as url:
        src = ServerMetricsSource(url + "/metrics", timeout=10)
        with pytest.raises(SourceUnavailable, match="more than 16 MiB"):
            src.sample()
        _collector, writer = run_collector(tmp_path, {"metrics": src}, 0.5, interval=0.2)
        src.close()
    assert writer.path.stat().st_size < 50_000
    assert any("more than 16 MiB" in e.data["error"] for e in events(writer.path, SOURCE_ERROR))


def test_raw_series_are_kept_once_and_bounded_not_in_every_sample(tmp_path: Path) -> None:
    lines = "".join(f'vllm:some_series{{engine="0",i="{i}"}} {i}.0\n' for i in range(6000))
    page = (VLLM_PAGE + lines).encode()  # ~240 KB of distinct series
    with http_server(lambda req: send(req, page)) as url:
        src = ServerMetricsSource(url + "/metrics", timeout=10)
        _collector, writer = run_collector(tmp_path, {"metrics": src}, 2.0, interval=0.2)
        src.close()
    run = read_run(writer.path)
    samples = run.of(MetricsSample)
    assert len(samples) >= 3
    assert 0 < len(samples[0].raw) <= 2000 and all(not s.raw for s in samples[1:])
    assert all(s.values.get("running_requests") == 0.0 for s in samples)
    # Was: every sample carried all 6000 series (~1 MB a sample).
    assert writer.path.stat().st_size < 200_000
    assert any("raw series limited" in e.data["error"] for e in events(writer.path, SOURCE_ERROR))


# --- a sampler that dies fails the run --------------------------------------------------------


class _OutOfMemory:
    """A source whose reading runs out of memory (what a huge answer does to a small host)."""

    def sample(self) -> None:
        raise MemoryError("cannot allocate")


def test_a_sampler_that_dies_records_collector_failed_and_stops_the_others(tmp_path: Path) -> None:
    reasons: list[str] = []
    collector, writer = run_collector(
        tmp_path, {"host": own_host_source(), "gpu": _OutOfMemory()}, 1.0, on_failure=reasons.append
    )
    assert collector.failed and "MemoryError" in collector.failed
    assert reasons == [collector.failed]
    assert not collector.running
    run = read_run(writer.path)
    assert run.status == "failed"
    failed = events(writer.path, COLLECTOR_FAILED)
    assert len(failed) == 1 and failed[0].data["source"] == "gpu"
    # The host sampler stopped with it: no sample is taken long after the failure.
    host_t = [s.t for s in run.of(HostSample)]
    assert not host_t or max(host_t) <= failed[0].t + 0.5


# --- a full disk: the data stays in memory, the report says the file is incomplete -----------

DISK_FULL = r"""
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
from vramdoctor.samples import GpuMemory, GpuSample
from vramdoctor.record import RunWriter, make_header
w = RunWriter(sys.argv[1], make_header("soak", argv=["vramdoctor", "soak"]))
for i in range(400):
    w.write(GpuSample(t=float(i), wall=1.7e9 + i, source="nvml",
                      gpus=[GpuMemory(index=0, total_mib=81559.0, used_mib=1000.0 + i, free_mib=80000.0)]))
w.close("complete")
run = w.read_back()
print(json.dumps({"records": len(run.records), "status": run.status, "problems": run.problems,
                  "error": w.write_error, "last": run.records[-1].gpus[0].used_mib}))
"""


def test_a_full_disk_keeps_every_sample_in_memory_and_says_the_file_is_incomplete(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    r = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert path.stat().st_size <= 20000
    assert out["records"] == 400 and out["last"] == 1399.0 and out["status"] == "complete"
    assert out["error"] and "too large" in out["error"].lower()
    assert any("incomplete" in p for p in out["problems"])
    on_disk = read_run(path)
    assert len(on_disk.records) < 400 and on_disk.status == "truncated"


# --- end to end: a soak whose run file hits a full disk still gives its verdict -------------


def _file_limit(limit_bytes: int) -> Callable[[], None]:
    def apply() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG on write, as ENOSPC on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def test_soak_on_a_full_disk_analyses_what_is_in_memory_and_says_the_file_is_incomplete(
    tmp_path: Path,
) -> None:
    from support.agent import agent_env
    from support.procs import RefServer

    # the agent inside decides the host leak (from outside alone: retention_or_leak)
    srv = RefServer(
        "leaking", "--leak-kib", "1024", env=agent_env(tmp_path / "agent", fake_torch=False)
    )
    try:
        out = tmp_path / "run.jsonl"
        env = {
            k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "VRAMDOCTOR_API_KEY")
        }
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "vramdoctor",
                "soak",
                "--url",
                srv.url,
                "--out",
                str(out),
                "--rounds",
                "5",
                "--no-adapt",
                "--requests",
                "20",
                "--concurrency",
                "4",
                "--idle",
                "1",
                "--interval",
                "0.1",
                "--image-size",
                "64x64",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            env={**env, "NO_COLOR": "1"},
            cwd=tmp_path,
            preexec_fn=_file_limit(24_000),
        )
    finally:
        srv.stop()
    assert r.returncode == 1, r.stderr  # LEAK, from memory: was a traceback or a verdict on a stub
    d = json.loads(r.stdout)
    assert d["verdict"] == "LEAK"
    assert any("incomplete" in n for n in d["notes"]), d["notes"]
    assert out.stat().st_size <= 24_000
    assert read_run(out).status == "truncated"


def test_exporters_of_several_hosts_are_scraped_at_once(tmp_path: Path) -> None:
    from support.sources import nvitop_text

    from vramdoctor.sources.exporter import ExporterSource

    def slow_page(host: str) -> Handler:
        body = nvitop_text(
            host,
            [
                {
                    "index": 0,
                    "name": "H100",
                    "uuid": f"GPU-{host}",
                    "total": 81559.0,
                    "used": 1000.0,
                    "free": 80559.0,
                }
            ],
            [],
        ).encode()

        def handle(req: BaseHTTPRequestHandler) -> None:
            time.sleep(1.0)  # a slow host, inside the deadline
            send(req, body)

        return handle

    with (
        http_server(slow_page("a")) as a,
        http_server(slow_page("b")) as b,
        ExporterSource([a + "/metrics", b + "/metrics"], timeout=5) as src,
    ):
        started = time.monotonic()
        sample = src.sample()
        elapsed = time.monotonic() - started
    assert sorted(g.host for g in sample.gpus) == ["a", "b"]
    assert elapsed < 1.9, elapsed  # one after the other took 2 s: one slow host delayed the next
