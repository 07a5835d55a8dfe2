"""Real time-series databases on loopback for fleet's tests: Prometheus and VictoriaMetrics.

- Prometheus (Debian `prometheus`): history is backfilled with `promtool tsdb
  create-blocks-from openmetrics` into a fresh data directory, then Prometheus serves it;
  optional rule files and scrape targets.
- VictoriaMetrics (Debian `victoria-metrics`): history is imported through its
  `/api/v1/import/prometheus` endpoint (millisecond timestamps), then flushed.

Each is a context manager yielding an `Engine` (name, base URL, process) and stops the process
on exit. Nothing here is fleet's code: tests talk to the engines as an operator's fleet would.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests
from fixtures.fleet.backfill import Series
from fixtures.fleet.scenario import openmetrics, prometheus_text

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
VICTORIA = shutil.which("victoria-metrics") or (
    "/usr/bin/victoria-metrics" if Path("/usr/bin/victoria-metrics").exists() else None
)
VMALERT = shutil.which("vmalert")

APT = "apt-get install prometheus victoria-metrics; .ci/run installs them"


@dataclass
class Engine:
    name: str  # "prometheus" | "victoriametrics"
    url: str
    proc: subprocess.Popen[bytes]
    data: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, what: str, path: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url + path, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not become ready: {log.read_text()[-2000:]}")


def backfill_prometheus(tmp: Path, series: Sequence[Series], data: Path) -> None:
    """promtool's backfill of `series` into `data` (TSDB blocks)."""
    assert PROMTOOL is not None
    om = tmp / "history.om"
    with om.open("w") as fh:
        fh.writelines(openmetrics(list(series)))
    subprocess.run(
        [
            PROMTOOL,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=240h",
            "-q",
            str(om),
            str(data),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    om.unlink()


@contextlib.contextmanager
def prometheus(
    tmp: Path,
    series: Sequence[Series] = (),
    *,
    rules: Sequence[Path] = (),
    scrape: Sequence[tuple[str, str]] = (),
    data: Path | None = None,
    interval: str = "1s",
) -> Iterator[Engine]:
    """A Prometheus on loopback serving `series` (backfilled), with `rules` files and `scrape`
    targets (job, host:port)."""
    assert PROMETHEUS is not None
    tmp.mkdir(parents=True, exist_ok=True)
    data = data or tmp / "data"
    if series:
        backfill_prometheus(tmp, series, data)
    conf = [f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"]
    if rules:
        conf.append("rule_files:\n" + "".join(f"  - {r}\n" for r in rules))
    conf.append("scrape_configs:\n" if scrape else "scrape_configs: []\n")
    for job, target in scrape:
        conf.append(f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n")
    (tmp / "prometheus.yml").write_text("".join(conf))
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=3650d",
                "--web.enable-lifecycle",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log, "Prometheus", "/-/ready")
        yield Engine("prometheus", url, proc, data)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def import_vm(url: str, series: Sequence[Series]) -> None:
    """Import `series` into a VictoriaMetrics at `url` and make them searchable."""
    batch: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal size
        if batch:
            r = requests.post(
                url + "/api/v1/import/prometheus", data="".join(batch).encode(), timeout=120
            )
            r.raise_for_status()
            batch.clear()
            size = 0

    for chunk in prometheus_text(list(series)):
        batch.append(chunk)
        size += len(chunk)
        if size > 8_000_000:
            flush()
    flush()
    requests.get(url + "/internal/force_flush", timeout=60).raise_for_status()


@contextlib.contextmanager
def victoriametrics(tmp: Path, series: Sequence[Series] = ()) -> Iterator[Engine]:
    """A VictoriaMetrics single-node on loopback holding `series`."""
    assert VICTORIA is not None
    tmp.mkdir(parents=True, exist_ok=True)
    data = tmp / "vmdata"
    port = free_port()
    log = tmp / "victoria-metrics.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                VICTORIA,
                f"-storageDataPath={data}",
                f"-httpListenAddr=127.0.0.1:{port}",
                "-retentionPeriod=100y",
                "-search.disableCache",
                "-search.latencyOffset=0s",
                "-loggerLevel=ERROR",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log, "VictoriaMetrics", "/health")
        if series:
            import_vm(url, series)
        yield Engine("victoriametrics", url, proc, data)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
