"""The sampler against hostile /metrics pages, side by side in one run (issue 11, kinds 1-2).

    python3 benchmarks/reliability_sampler.py            # this checkout
    PYTHONPATH=/path/to/old/checkout python3 benchmarks/reliability_sampler.py   # an older one

For each case a real loopback server and the real Collector/RunWriter sample for a few
seconds at 0.1 s; it prints the host samples taken beside the page, the /metrics samples
recorded, the run-file size and whether the sampler was still alive at the end:

- trickle: /metrics sends one byte every 20 ms (a whole page would take a minute);
- nan-label: `vllm:cache_config_info{num_gpu_blocks="nan"} 1` on every scrape;
- 6000-series: a 240 KB page of distinct series, scraped every 0.1 s;
- 50MB: a 50 MB page.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.samples import HostSample, MetricsSample
from vramdoctor.sources.collector import Collector
from vramdoctor.sources.host import HostSource
from vramdoctor.sources.server_metrics import ServerMetricsSource

SECONDS = 3.0
PAGE = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
    "# TYPE vllm:cache_config_info gauge\n"
)
CASES: dict[str, tuple[bytes, float]] = {
    "trickle": ((PAGE * 4).encode(), 0.02),
    "nan-label": (
        (PAGE + 'vllm:cache_config_info{block_size="16",num_gpu_blocks="nan"} 1.0\n').encode(),
        0.0,
    ),
    "6000-series": (
        (PAGE + "".join(f'vllm:s{{i="{i}"}} {i}.0\n' for i in range(6000))).encode(),
        0.0,
    ),
    "50MB": ((PAGE + 'vllm:s{i="0000000"} 1.0\n' * (50 * 2**20 // 24)).encode(), 0.0),
}


def serve(body: bytes, trickle_s: float) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if trickle_s:
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(trickle_s)
                else:
                    self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main() -> None:
    print(
        f"{'case':<12} {'host samples':>12} {'metrics samples':>15} {'run file':>12} {'sampler alive':>13}"
    )
    for name, (body, trickle) in CASES.items():
        srv = serve(body, trickle)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "run.jsonl"
            writer = RunWriter(path, make_header("soak", argv=["vramdoctor", "soak"]))
            src = ServerMetricsSource(
                f"http://127.0.0.1:{srv.server_address[1]}/metrics", timeout=1.0
            )
            sources = {
                "metrics": src,
                "host": HostSource({os.getpid(): "watched"}, maps_every=1000),
            }
            collector = Collector(writer, sources, interval=0.1)  # type: ignore[arg-type]
            collector.start()
            time.sleep(SECONDS)
            alive = collector.running
            collector.stop(timeout=3)
            writer.close()
            run = read_run(path)
            size = path.stat().st_size
            print(
                f"{name:<12} {len(run.of(HostSample)):>12} {len(run.of(MetricsSample)):>15} "
                f"{size / 1024:>9.0f} KiB {alive!s:>13}"
            )
            src.close()
        srv.shutdown()
        srv.server_close()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
