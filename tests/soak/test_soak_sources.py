"""Soak's sources and load pieces against real loopback servers and real processes.

server_info: HTTP servers answering the way SGLang (`/get_server_info`: server args, scheduler
info, `internal_states` with `memory_usage`, `version`) and vLLM (`/version`) answer, as read
from their http_server/api_server source. discover/host: this very process listening on a port.
collector: a real RunWriter file. client: a server that errors, stalls, or is not there.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.samples import Event, HostSample
from vramdoctor.soak.traffic.client import LoadClient
from vramdoctor.soak.traffic.driver import Budget, run_round
from vramdoctor.soak.traffic.images import generate_images, load_image_dir, parse_image_size
from vramdoctor.soak.traffic.workload import build_requests
from vramdoctor.sources.collector import Collector
from vramdoctor.sources.discover import discover_server, is_local, listening_pids, process_tree
from vramdoctor.sources.host import HostSource, host_memory
from vramdoctor.sources.server_info import base_url, identify

SGLANG_INFO = {
    # dataclasses.asdict(server_args) (a few of the many fields) + scheduler_info + internal states
    "model_path": "Qwen/Qwen2.5-VL-7B-Instruct",
    "served_model_name": "Qwen/Qwen2.5-VL-7B-Instruct",
    "tp_size": 1,
    "mem_fraction_static": 0.7835956249999999,
    "enable_metrics": False,
    "max_total_num_tokens": 412345,
    "max_req_input_len": 128000,
    "internal_states": [
        {
            "last_gen_throughput": 0.0,
            "memory_usage": {
                "weight": 15.6,
                "kvcache": 22.09,
                "token_capacity": 412345,
                "graph": 1.2,
            },
        }
    ],
    "version": "0.5.9",
}


def _serve(
    routes: dict[str, tuple[int, object]], delay: float = 0.0
) -> tuple[ThreadingHTTPServer, str]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _answer(self) -> None:
            path = self.path.split("?")[0]
            if self.command == "POST":
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if delay:
                time.sleep(delay)
            code, body = routes.get(path, (404, {"detail": "Not Found"}))
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _answer
        do_POST = _answer

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture
def serve() -> Iterator:
    servers: list[ThreadingHTTPServer] = []

    def make(routes: dict[str, tuple[int, object]], delay: float = 0.0) -> str:
        srv, url = _serve(routes, delay)
        servers.append(srv)
        return url

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()


MODELS = {
    "/v1/models": (
        200,
        {
            "object": "list",
            "data": [
                {"id": "Qwen/Qwen2.5-VL-7B-Instruct", "object": "model", "owned_by": "sglang"}
            ],
        },
    )
}


def test_identify_sglang_gives_version_and_startup_memory(serve) -> None:
    url = serve({**MODELS, "/get_server_info": (200, SGLANG_INFO)})
    info = identify(url + "/v1")
    assert info.kind == "sglang"
    assert info.version == "0.5.9"
    assert info.memory_usage == {
        "weight": 15.6,
        "kvcache": 22.09,
        "token_capacity": 412345,
        "graph": 1.2,
    }
    assert info.model == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert "SGLang 0.5.9" in info.describe() and "kvcache=22.09" in info.describe()


def test_identify_sglang_0523_server_info(serve) -> None:
    url = serve({**MODELS, "/server_info": (200, {**SGLANG_INFO, "version": "0.5.23"})})
    info = identify(url)
    assert (info.kind, info.version) == ("sglang", "0.5.23")


def test_identify_vllm(serve) -> None:
    url = serve(
        {
            "/version": (200, {"version": "0.11.0"}),
            "/v1/models": (200, {"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]}),
        }
    )
    info = identify(url)
    assert (info.kind, info.version, info.model) == ("vllm", "0.11.0", "m")


def test_identify_refuses_what_is_not_an_openai_server(serve) -> None:
    url = serve({"/": (200, {"hello": "world"})})
    with pytest.raises(SourceUnavailable, match="not as an OpenAI-compatible server"):
        identify(url)
    with pytest.raises(SourceUnavailable, match="no server answers"):
        identify("http://127.0.0.1:1")


def test_identify_asks_for_the_key_on_401(serve) -> None:
    url = serve({"/v1/models": (401, {"error": "unauthorized"})})
    with pytest.raises(SourceUnavailable, match="--api-key"):
        identify(url)


def test_base_url_normalises() -> None:
    assert base_url("localhost:30000") == "http://localhost:30000"
    assert base_url("http://h:8000/v1/") == "http://h:8000"
    with pytest.raises(InputError):
        base_url("ftp://h:1")


def test_discover_finds_this_process_listening_and_samples_its_rss() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    try:
        pids, reason = listening_pids(port)
        assert pids == [os.getpid()], reason
        found = discover_server(f"http://127.0.0.1:{port}")
        assert found.root_pids == [os.getpid()]
        assert os.getpid() in found.tree
        assert os.getpid() in process_tree([os.getpid()])
        s = HostSource({os.getpid(): "server"}).sample()
        assert isinstance(s, HostSample)
        row = s.processes[0]
        assert row.pid == os.getpid() and row.role == "server" and row.rss_mib > 10
    finally:
        sock.close()
    pids, reason = listening_pids(port)
    assert pids == [] and "no process" in (reason or "")
    assert host_memory()["available_mib"] > 0


def test_is_local() -> None:
    assert is_local("http://127.0.0.1:1") and is_local("http://localhost:8000")
    assert not is_local("http://192.0.2.1:8000")  # TEST-NET-1, never this host


def test_host_source_drops_processes_that_exit() -> None:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        src = HostSource([p.pid])
        assert [r.pid for r in src.sample().processes] == [p.pid]
    finally:
        p.kill()
        p.wait()
    assert src.sample().processes == []


class _Flaky:
    def __init__(self) -> None:
        self.calls = 0

    def sample(self) -> object:
        self.calls += 1
        if self.calls in (2, 3):
            raise SourceUnavailable("exporter at http://x/metrics did not answer")
        return Event(t=time.monotonic(), wall=time.time(), name="probe", data={"n": self.calls})


def test_collector_life_cycle_writes_every_sample_and_records_failures_once(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    writer = RunWriter(path, make_header("soak", argv=["x"]))
    flaky = _Flaky()
    seen: list[str] = []
    col = Collector(writer, {"flaky": flaky}, interval=0.05)
    col.add_listener(lambda name, rec: seen.append(name))
    col.start()
    assert col.running
    deadline = time.monotonic() + 10
    while flaky.calls < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    # Flushed as it comes: readable while the collector still runs.
    assert len(read_run(path).records) >= 2
    col.stop()
    assert not col.running
    calls = flaky.calls
    time.sleep(0.15)
    assert flaky.calls == calls  # stopped means stopped
    writer.close()
    run = read_run(path)
    errors = [r for r in run.records if isinstance(r, Event) and r.name == "source_error"]
    probes = [r for r in run.records if isinstance(r, Event) and r.name == "probe"]
    assert len(errors) == 1 and "did not answer" in errors[0].data["error"]
    assert len(probes) == calls - 2 == col.samples == len(seen)


def test_images_are_deterministic_and_sized() -> None:
    sizes = [parse_image_size("64x48"), parse_image_size(" 32 X 32 ")]
    a, b = generate_images(sizes, seed=7), generate_images(sizes, seed=7)
    assert [i.data for i in a] == [i.data for i in b]
    assert generate_images(sizes, seed=8)[0].data != a[0].data
    from io import BytesIO

    from PIL import Image

    assert Image.open(BytesIO(a[0].data)).size == (64, 48)
    for bad in ("64", "0x10", "10x99999", "axb"):
        with pytest.raises(InputError, match="--image-size"):
            parse_image_size(bad)


def test_image_dir(tmp_path: Path) -> None:
    for i, img in enumerate(generate_images([parse_image_size("16x16")] * 2, seed=1)):
        (tmp_path / f"{i}.png").write_bytes(img.data)
    (tmp_path / "notes.txt").write_text("x")
    got = load_image_dir(tmp_path)
    assert [g.label for g in got] == ["0.png", "1.png"]
    (tmp_path / "2.png").write_bytes(b"not a png")
    with pytest.raises(InputError, match="not a readable image"):
        load_image_dir(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no images"):
        load_image_dir(empty)


def test_request_set_is_identical_every_round() -> None:
    imgs = generate_images([parse_image_size("16x16")], seed=0)
    a = build_requests(8, model="m", images=imgs, max_tokens=4)
    b = build_requests(8, model="m", images=imgs, max_tokens=4)
    assert [json.dumps(r.body) for r in a] == [json.dumps(r.body) for r in b]
    assert sum(r.images for r in a) == 6  # every fourth request is text only
    assert (
        a[0]
        .body["messages"][0]["content"][0]["image_url"]["url"]
        .startswith("data:image/png;base64,")
    )
    c = build_requests(3, model="m", images=imgs, api="completions")
    assert all(r.path == "/v1/completions" and "prompt" in r.body for r in c)


def test_client_classifies_errors_timeouts_and_a_missing_server(serve) -> None:
    url = serve({"/v1/chat/completions": (500, {"error": {"message": "boom sk-abcdefghijklmnop"}})})
    reqs = build_requests(6, model="m", images=[], text_only=True)
    res = run_round(
        LoadClient(url, "sk-abcdefghijklmnop"),
        reqs,
        concurrency=3,
        budget=Budget(),
        stop=threading.Event(),
    )
    assert res.outcomes["http_error"] == 6 and res.ok == 0
    assert all("sk-abcdefghijklmnop" not in e for e in res.errors)
    slow = serve({"/v1/chat/completions": (200, {})}, delay=1.0)
    res = run_round(
        LoadClient(slow, timeout=0.2),
        reqs[:2],
        concurrency=2,
        budget=Budget(),
        stop=threading.Event(),
    )
    assert res.outcomes["timeout"] == 2
    res = run_round(
        LoadClient("http://127.0.0.1:1"),
        reqs[:2],
        concurrency=1,
        budget=Budget(),
        stop=threading.Event(),
    )
    assert res.outcomes["connection"] == 2 and res.reached == 0


def test_budget_holds_across_rounds_and_threads(serve) -> None:
    url = serve({"/v1/chat/completions": (200, {"ok": True})})
    reqs = build_requests(10, model="m", images=[], text_only=True)
    budget = Budget(max_requests=13)
    sent = [
        run_round(LoadClient(url), reqs, concurrency=4, budget=budget, stop=threading.Event()).sent
        for _ in range(3)
    ]
    assert sent == [10, 3, 0]
    stop = threading.Event()
    stop.set()
    assert run_round(LoadClient(url), reqs, concurrency=4, budget=Budget(), stop=stop).sent == 0


def test_gpu_peers_are_the_other_visible_processes_on_the_servers_gpus() -> None:
    from vramdoctor.samples import GpuMemory, GpuSample, ProcessGpuMemory
    from vramdoctor.sources.discover import ServerProcesses, gpu_peers, roles

    sample = GpuSample(
        t=0.0,
        wall=0.0,
        source="nvml",
        gpus=[GpuMemory(0, 81559, 1000, 80559), GpuMemory(1, 81559, 1000, 80559)],
        processes=[
            ProcessGpuMemory(100, 0, 20000.0, name="sglang::scheduler"),
            ProcessGpuMemory(101, 0, 700.0, name="python3"),  # tokenizer on GPU 0
            ProcessGpuMemory(102, 1, 5000.0, name="other-job"),
            ProcessGpuMemory(999999, 0, 500.0, visible=False),
        ],
    )
    assert gpu_peers(sample, [100]) == {101: "python3"}
    found = ServerProcesses(root_pids=[50], tree={50: "python3", 100: "sglang::scheduler"})
    assert roles(found, gpu_peers(sample, found.tree)) == {
        50: "server",
        100: "child",
        101: "gpu-peer",
    }
    # Server processes invisible to NVML (a container): every visible process on every GPU.
    assert gpu_peers(sample, [7]) == {100: "sglang::scheduler", 101: "python3", 102: "other-job"}


def test_a_port_forwarder_is_not_taken_for_the_server(tmp_path: Path) -> None:
    """A published container port is owned by docker-proxy on the host: its RSS says nothing
    about the server, so discovery says so instead of watching the proxy."""
    import subprocess
    import sys

    proxy = tmp_path / "docker-proxy"
    proxy.symlink_to(sys.executable)  # the kernel names the process after the path exec'd
    code = (
        "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); time.sleep(30)"
    )
    p = subprocess.Popen([str(proxy), "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        found = discover_server(f"http://127.0.0.1:{port}")
        assert not found.found
        assert "forwarded by docker-proxy" in (found.reason or "")
    finally:
        p.kill()
        p.wait()


def test_the_load_client_follows_no_redirect_and_reads_no_huge_answer() -> None:
    """A server that redirects (the API key would go along to wherever it points) or answers
    with something far bigger than a completion: each request is an http_error saying so; the
    redirect's target is never asked and the huge body never held whole."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/redirect/v1/chat/completions":
                self.send_response(307)
                self.send_header("Location", "http://127.0.0.1:9/steal?key=sk-abcdefghijklmnop")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()  # no length: the body runs until the connection closes
            chunk = b" " * (1 << 20)
            try:
                for _ in range(64):  # 64 MiB of whitespace before any JSON
                    self.wfile.write(chunk)
            except OSError:
                pass  # the client stopped reading: as it should
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        reqs = build_requests(1, model="m", images=[], text_only=True)
        out = LoadClient(base + "/redirect", "sk-abcdefghijklmnop").send(reqs[0])
        assert out.kind == "http_error" and out.status == 307, out
        assert "redirect" in (out.detail or "") and "sk-abcdefghijklmnop" not in (out.detail or "")
        assert hits == ["/redirect/v1/chat/completions"]  # the target was never asked
        out = LoadClient(base).send(reqs[0])
        assert out.kind == "http_error" and "over 16 MiB" in (out.detail or ""), out
    finally:
        srv.shutdown()
        srv.server_close()
