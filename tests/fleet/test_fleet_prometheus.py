"""fleet against a REAL Prometheus (Debian package `prometheus`; .ci/run installs it).

The test starts Prometheus on loopback with a temporary config (1 s scrapes) and a data
directory holding three days of exporter history backfilled with `promtool tsdb
create-blocks-from openmetrics` (tests/fixtures/fleet/backfill.py: known leaks, plateaus,
restarts, both dcgm-exporter host labels, nvitop-exporter, nvidia_gpu_exporter, SGLang KV).
It also scrapes a live `vramdoctor watch` exporter and a live dcgm-exporter-shaped target,
and loads the shipped rules (examples/monitoring). Skipped only where the binary is absent.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from fixtures.fleet.backfill import TRUTH, fleet_series, openmetrics, pods_series
from support.sources import serve

from vramdoctor.errors import SourceUnavailable
from vramdoctor.fleet import FleetConfig, run_fleet
from vramdoctor.sources.prometheus import PrometheusClient
from vramdoctor.watch import TrendThresholds, WatchConfig, Watcher, WatchOptions

# backfill.TRUTH names rows as fleet did before rows had pools ("srv-a:30000/kv"): the same rows
_KV = {"srv-a:30000/kv": "srv-a/kv/pool=full", "srv-b:30000/kv": "srv-b/kv/pool=full"}

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="needs the prometheus and promtool binaries (apt-get install prometheus; CI installs them)",
)

RULES = Path(__file__).parents[2] / "examples" / "monitoring" / "vramdoctor.rules.yml"
DAYS = 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _live_dcgm(counter: list[int]):
    """A dcgm-exporter (main branch: `hostname`) whose GPU 0 grows 8 MiB a scrape."""

    def respond(path: str) -> tuple[int, str, str]:
        counter[0] += 1
        used = 30_000 + 8 * counter[0]
        lab = 'gpu="0",UUID="GPU-live0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",hostname="live-1"'
        body = (
            f"# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n"
            f"DCGM_FI_DEV_FB_USED{{{lab}}} {used}\n"
            f"# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
            f"DCGM_FI_DEV_FB_FREE{{{lab}}} {81_559 - used}\n"
        )
        return 200, "text/plain; version=0.0.4", body

    return respond


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prom")
    end = (time.time() // 60) * 60 - 600
    (tmp / "history.om").write_text(
        "".join(openmetrics(fleet_series(end, DAYS, 60.0) + pods_series(end, DAYS, 60.0)))
    )
    data = tmp / "data"
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=96h",
            "-q",
            str(tmp / "history.om"),
            str(data),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    with contextlib.ExitStack() as stack:
        counter = [0]
        dcgm_url = stack.enter_context(serve(_live_dcgm(counter)))
        watcher = Watcher(
            WatchOptions(
                interval_s=0.2,
                analyse_every_s=0.5,
                pids=[__import__("os").getpid()],
                use_nvml=False,
                listen="127.0.0.1:0",
                config=WatchConfig(
                    bucket_s=0.5,
                    max_buckets=120,
                    warmup_s=0.0,
                    memory=TrendThresholds(min_growth=1.0),
                ),
            )
        )
        watcher.open()
        stack.callback(watcher.close)
        stop = threading.Event()
        thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
        thread.start()
        stack.callback(thread.join, 5)
        stack.callback(stop.set)
        port = _free_port()
        watch_target = watcher.exporter.url.split("//", 1)[1].split("/", 1)[0]
        (tmp / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {RULES}\n"
            "scrape_configs:\n"
            f"  - job_name: watch\n    static_configs:\n      - targets: ['{watch_target}']\n"
            f"  - job_name: dcgm-live\n    static_configs:\n      - targets: ['{dcgm_url.split('//', 1)[1]}']\n"
        )
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=3650d",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "prometheus.log").open("w"),
        )
        stack.callback(proc.wait, 10)
        stack.callback(proc.terminate)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(
                "Prometheus did not become ready: " + (tmp / "prometheus.log").read_text()[-2000:]
            )
        yield {"url": url, "end": end, "watch_pid": __import__("os").getpid()}


def _rows_by_key(doc: dict) -> dict[str, dict]:
    return {r["id"]: r for r in doc["rows"]}


def test_fleet_finds_every_known_leak_at_its_rate_and_calls_nothing_else_a_leak(
    prom, tmp_path
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "fleet",
            "--prometheus",
            prom["url"],
            "--since",
            "3d",
            "--until",
            str(prom["end"]),
            "--match",
            'job!="watch"',
            "--match",
            'job!="dcgm-live"',
            "--json",
            "--charts",
            str(tmp_path / "charts"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # leaks found
    doc = json.loads(done.stdout)
    assert doc["schema"] == "vramdoctor.fleet/2"
    rows = _rows_by_key(doc)
    truth_rows = {_KV.get(k, k): v for k, v in TRUTH.items()}
    assert set(truth_rows) <= set(rows), sorted(rows)
    for key, (truth, rate) in truth_rows.items():
        row = rows[key]
        if truth == "LEAK":
            assert row["verdict"] == "LEAK", (key, row)
            assert row["growth_per_hour"] == pytest.approx(rate, rel=0.1), key
        else:
            assert row["verdict"] != "LEAK", (key, row)
    # both dcgm-exporter host labels are read: `Hostname` (gpu-a) and `hostname` (gpu-b); each
    # restart empties the GPU for a while (the exporter still reports it): one new life each
    assert rows["gpu-a/device/gpu=1"]["restarts"] == 1
    # gpu-b GPU 0 is stable across its restart: screened by the database, its restarts are not
    # counted (null: "-" in the table), never a wrong number
    b0 = rows["gpu-b/device/gpu=0"]
    assert (b0["screened"] and b0["restarts"] is None) or b0["restarts"] == 1, b0
    assert rows["gpu-a/device/gpu=1"]["lives"][-1]["began"] == "emptied"
    assert rows["gpu-a/device/gpu=1"]["warmup_skipped"] is True
    # ranked: leaks first, the soonest to run out first
    leaks = [r for r in doc["rows"] if r["verdict"] == "LEAK"]
    assert doc["rows"][: len(leaks)] == leaks
    first = doc["rows"][0]
    assert (first["host"], first["pid"]) == ("gpu-c", 4242)
    assert first["hours_to_oom"] == pytest.approx(
        first["free"] / first["growth_per_hour"], rel=1e-6
    )
    assert first["hours_to_oom"] < rows["gpu-a/device/gpu=0"]["hours_to_oom"]
    kv = rows["srv-a/kv/pool=full"]  # free tokens = sglang:max_total_num_tokens - held at idle
    assert kv["runs_out"] == "pool"
    assert kv["hours_to_oom"] == pytest.approx(
        (500_000 - kv["level"]) / kv["growth_per_hour"], rel=1e-6
    )
    # a chart per culprit
    assert len(doc["charts"]) == len(leaks)
    assert all(
        Path(p).stat().st_size > 10_000 and Path(p).read_bytes()[:4] == b"\x89PNG"
        for p in doc["charts"]
    )


def test_long_ranges_are_chunked_under_the_points_limit(prom) -> None:
    end, start = prom["end"], prom["end"] - DAYS * 86400
    one_shot = requests.post(
        prom["url"] + "/api/v1/query_range",
        timeout=30,
        data={"query": "DCGM_FI_DEV_FB_USED", "start": start, "end": end, "step": 15},
    )
    assert one_shot.status_code == 400 and "11,000 points" in one_shot.json()["error"]
    with PrometheusClient(prom["url"]) as client:
        series = client.range('DCGM_FI_DEV_FB_USED{Hostname="gpu-a",gpu="0"}', start, end, 15.0)
        assert client.calls[-1].chunks == 2 and client.calls[-1].kind == "range"
    (s,) = series
    # every step from the first stored sample (start + 60 s) to the end once: none lost or doubled at the seam
    assert s.t[0] == start + 60 and s.t[-1] == end
    assert (s.t[1:] - s.t[:-1] == 15.0).all()
    fine = run_fleet(
        prom["url"],
        days=DAYS,
        end=end,
        step_s=15.0,
        matchers=['Hostname="gpu-a"', 'gpu="0"'],
        strategy="pull",
    )
    (row,) = [r for r in fine.rows if r.layer == "device"]
    assert row.verdict == "LEAK" and row.growth_per_hour == pytest.approx(40.0, rel=0.1)
    assert max(q["chunks"] for q in fine.queries) == 2  # 3 days of 15-s steps: two chunks


def test_kubernetes_virtual_gpus_give_one_series_per_pod(prom) -> None:
    kw = dict(days=DAYS, end=prom["end"], matchers=['Hostname="gpu-k"'])
    per_pod = run_fleet(prom["url"], virtual_gpus=True, **kw)
    by_pod = {r.pod: r for r in per_pod.rows}
    assert set(by_pod) == {"infer/leaky-0", "infer/steady-0"}
    assert {r.layer for r in per_pod.rows} == {"pod"}
    assert by_pod["infer/leaky-0"].verdict == "LEAK"
    assert by_pod["infer/leaky-0"].growth_per_hour == pytest.approx(60.0, rel=0.1)
    assert by_pod["infer/steady-0"].verdict != "LEAK"
    merged = run_fleet(prom["url"], **kw)
    # without the flag, the two pods' rows of one GPU are one GPU's history, not two rows
    assert {r.layer for r in merged.rows} == {"device"} and {r.gpu for r in merged.rows} == {"0"}


def test_prometheus_scrapes_watch_and_fleet_reads_it_with_the_live_dcgm_target(prom) -> None:
    url = prom["url"]
    deadline = time.monotonic() + 30
    with PrometheusClient(url) as client:
        while time.monotonic() < deadline:
            up = client.instant('vramdoctor_sampler_up{job="watch",source="host"}', time.time())
            mem = client.instant(
                f'vramdoctor_process_memory_bytes{{job="watch",pid="{prom["watch_pid"]}",layer="rss"}}',
                time.time(),
            )
            ratio = client.instant(
                'gpu:dcgm_fb_free:ratio{hostname="live-1"}', time.time()
            )  # the shipped recording rule
            if (
                up
                and mem
                and ratio
                and len(
                    client.range(
                        'DCGM_FI_DEV_FB_USED{hostname="live-1"}', time.time() - 60, time.time(), 1.0
                    )[0].t
                )
                >= 12
            ):
                break
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus did not scrape watch and the live exporter in time")
    assert up[0].value == 1.0 and mem[0].value > 0 and 0 < ratio[0].value < 1
    res = run_fleet(
        url,
        days=120 / 86400,
        step_s=1.0,
        matchers=['job=~"watch|dcgm-live"'],
        config=FleetConfig(block_s=1.0, warmup_s=0.0, stale_s=30.0, min_growth_mib=16.0),
    )
    sources = {r.source for r in res.rows}
    assert {"vramdoctor watch", "dcgm-exporter"} <= sources
    live = next(r for r in res.rows if r.host == "live-1")
    assert live.verdict == "LEAK" and live.gpu == "0"  # +8 MiB every 1 s scrape
    assert live.growth_per_hour == pytest.approx(8 * 3600, rel=0.35)
    watched = next(r for r in res.rows if r.source == "vramdoctor watch" and r.layer == "rss")
    assert watched.pid == prom["watch_pid"]


def test_fleet_says_in_one_line_when_the_url_is_not_prometheus(prom) -> None:
    with serve("not prometheus") as other:
        done = subprocess.run(
            [sys.executable, "-m", "vramdoctor", "fleet", "--prometheus", other],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "did not answer as a Prometheus server" in done.stderr
    with (
        pytest.raises(SourceUnavailable, match="refused the query"),
        PrometheusClient(prom["url"]) as client,
    ):
        client.range("sum(", 0, 60, 15)
