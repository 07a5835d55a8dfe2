"""watch for weeks, against careless operators and hostile inputs: real processes, real files.

Each test is a kind of failure watch had: a /metrics refused on every scrape was never said
(and the notes told the user to pass --server, which they had); a full disk grew its memory
without bound and was never said; newlines in fields from outside started lines of the
sender's choosing; a Latin-1 terminal; --launch leaving nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from support.cli import cli_env, vd
from support.disks import on_small_disk
from support.procs import free_port, pid_alive, ref_cmd
from support.sources import nvitop_text, serve

# A process that holds a port and answers /metrics with a page over the 16 MiB cap (declared
# in Content-Length): every scrape is refused. It is a real local server process, so its
# host memory is still watched.
BIG_METRICS = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(17 * 1024 * 1024))
        self.end_headers()
        try:
            self.wfile.write(b"# " + b"x" * (17 * 1024 * 1024 - 2))
        except OSError:
            pass
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""

FAST = ["--interval", "0.2s", "--bucket", "1s", "--window", "5m", "--warmup", "0s"]


@pytest.fixture
def big_metrics_server(tmp_path: Path):
    script = tmp_path / "big.py"
    script.write_text(BIG_METRICS)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    yield proc, f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait(5)


def test_a_metrics_page_refused_on_every_scrape_is_said_once_and_in_the_result(
    big_metrics_server,
) -> None:
    proc, url = big_metrics_server
    r = vd("watch", "--server", url, *FAST, "--duration", "3s", "--no-exporter", "--json")
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "sent more than 16 MiB" in ln]
    assert len(said) == 1, r.stderr  # once, though every scrape failed the same way
    doc = json.loads(r.stdout)
    notes = " ".join(doc["notes"])
    assert "server_metrics never answered" in notes and "sent more than 16 MiB" in notes
    assert "pass --server" not in r.stderr + notes  # they did pass it
    assert doc["sources"]["server_metrics"]["errors"] >= 3
    assert doc["sources"]["server_metrics"]["samples"] == 0
    # its processes are still watched (found by the port it holds)
    assert any(s["pid"] == proc.pid for s in doc["series"])


def test_a_watch_whose_source_never_answers_says_why_in_its_change_line() -> None:
    # A wrong port repeated "INCONCLUSIVE: no comparable moment yet"; the line
    # now names the source that never answered and its error, said once (it does not change)
    r = vd(
        "watch", "--server", f"http://127.0.0.1:{free_port()}", "--interval", "0.3s",
        "--analyse-every", "1s", "--duration", "4s", "--no-exporter",
    )  # fmt: skip
    lines = [ln for ln in r.stderr.splitlines() if "nothing measured yet" in ln]
    assert lines and "server_metrics never answered (cannot connect" in lines[0], r.stderr
    assert len(lines) == 1 and "no comparable moment yet" not in r.stderr, r.stderr


def test_newlines_in_outside_fields_never_start_a_line(tmp_path: Path) -> None:
    # An exporter whose process command and user carry newlines and a forged verdict line.
    forged = "python3\nSTABLE: no leak in any process\nx"

    def respond(path: str) -> tuple[int, str, str]:
        gpus = [
            {
                "index": 0,
                "name": "H200\nLEAK",
                "uuid": "GPU-0",
                "total": 143771,
                "used": 1000,
                "free": 142771,
            }
        ]
        procs = [
            {"index": 0, "pid": 4242, "username": "evil\nSTABLE", "mib": 900, "command": forged}
        ]
        return 200, "text/plain; version=0.0.4", nvitop_text("gpu\nhost", gpus, procs)

    with serve(respond) as url:
        r = vd(
            "watch", "--gpu-metrics", url + "/metrics", *FAST, "--duration", "2s", "--no-exporter"
        )
    assert r.returncode == 0, r.stderr
    for line in (r.stdout + r.stderr).splitlines():
        assert not line.startswith(("STABLE", "LEAK", "x")), line


def test_a_latin_1_terminal_gets_the_report_not_an_encoding_error(big_metrics_server) -> None:
    _proc, url = big_metrics_server
    r = vd(
        "watch", "--server", url, *FAST, "--duration", "2s", "--no-exporter",
        env={"PYTHONIOENCODING": "latin-1", "LANG": "C", "LC_ALL": "C"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "UnicodeEncodeError" not in r.stderr
    assert "watch:" in r.stdout


def test_a_full_disk_under_watch_is_said_once_and_the_watch_goes_on(tmp_path: Path) -> None:
    # watch --out on a 192 KiB filesystem (a real tmpfs, else a file-size limit): the parts fill
    # it; watch keeps sampling, says it once, exports recording_up 0 and the records dropped.
    disk = tmp_path / "disk"
    port = free_port()
    argv = [
        sys.executable, "-m", "vramdoctor", "watch", "--pid", str(os.getpid()), *FAST,
        "--interval", "0.02s", "--bucket", "0.1s", "--out", str(disk), "--rotate-mib", "0.05",
        "--keep", "100", "--listen", f"127.0.0.1:{port}", "--duration", "8s", "--json",
    ]  # fmt: skip
    scraped: list[str] = []
    done_event = threading.Event()

    def scrape() -> None:  # the exporter's pages while the watch runs (the last one kept)
        while not done_event.wait(0.5):
            try:
                scraped.append(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
            except requests.RequestException:
                continue

    t = threading.Thread(target=scrape, daemon=True)
    t.start()
    r = on_small_disk(argv, disk, size_kib=192, env=cli_env())
    done_event.set()
    t.join(10)
    done = r.done
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "vramdoctor.watch/2" and "Traceback" not in done.stderr
    stuck = [ln for ln in done.stderr.splitlines() if "later records are dropped" in ln]
    assert len(stuck) == 1, done.stderr
    if r.kind != "rlimit":  # inside its own mount namespace the exporter is still ours to scrape
        assert scraped, "the exporter never answered"
        # a page scraped while the disk refused (on a loaded machine the disk fills late in
        # the run: not necessarily on the last page)
        stuck_pages = [p for p in scraped if "vramdoctor_watch_recording_up 0.0" in p]
        assert stuck_pages, scraped[-1][:400]
        text = stuck_pages[-1]
        dropped = [
            ln
            for ln in text.splitlines()
            if ln.startswith("vramdoctor_watch_records_dropped_total")
        ]
        assert dropped and float(dropped[0].split()[-1]) > 0


def test_watch_launch_starts_watches_and_stops_the_server_leaving_nothing(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "runs"
    r = vd(
        "watch", *FAST, "--duration", "4s", "--no-exporter", "--out", str(out), "--json",
        "--launch", " ".join(ref_cmd("plain", port)), timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "launched the server (pid " in r.stderr
    pid = int(r.stderr.split("launched the server (pid ", 1)[1].split(")", 1)[0])
    assert any(s["pid"] == pid for s in doc["series"])  # its tree was the server
    assert not pid_alive(pid)
    logs = list(out.glob("*.server.log"))
    assert logs and logs[0].stat().st_size > 0
    part = sorted(out.glob("watch-*.jsonl"))[-1]
    names = [json.loads(ln).get("name") for ln in part.read_text().splitlines()[1:]]
    assert "launched" in names and "launch_stopped" in names


def test_ctrl_c_in_watch_launch_stops_the_server_too(tmp_path: Path) -> None:
    port = free_port()
    cli = subprocess.Popen(
        [sys.executable, "-m", "vramdoctor", "watch", *FAST, "--no-exporter",
         "--launch", " ".join(ref_cmd("plain", port))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    pid = None
    deadline = time.monotonic() + 60
    seen = ""
    while time.monotonic() < deadline and pid is None:
        line = cli.stderr.readline()
        seen += line
        if "launched the server (pid " in line:
            pid = int(line.split("launched the server (pid ", 1)[1].split(")", 1)[0])
    assert pid is not None, seen
    time.sleep(1.5)
    cli.send_signal(signal.SIGINT)
    _out, err = cli.communicate(timeout=60)
    assert cli.returncode == 130, seen + err
    time.sleep(0.5)
    assert not pid_alive(pid)
    assert "vramdoctor: interrupted" in err


def test_sigterm_with_nothing_watched_is_one_line_and_exit_130() -> None:
    # A watch of a port where nothing listens, stopped by SIGTERM: nothing was watched, so no
    # report follows: one line that says so, exit 130 (interrupted), never "the report below".
    port = free_port()
    cli = subprocess.Popen(
        [sys.executable, "-m", "vramdoctor", "watch", *FAST, "--no-exporter",
         "--server", f"http://127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    seen = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "watch:" not in seen:
        seen += cli.stderr.readline()  # the source's failure, said once
    assert "watch:" in seen, seen
    time.sleep(1.0)
    cli.send_signal(signal.SIGTERM)
    out, err = cli.communicate(timeout=60)
    err = seen + err
    assert cli.returncode == 130, err
    assert "vramdoctor: interrupted; nothing was watched" in err, err
    assert "report below" not in err and not out.strip(), err


def test_watch_launch_follows_a_server_that_hands_its_socket_to_a_successor(
    tmp_path: Path,
) -> None:
    # The reference server's handover restart (at its first idle moment): the launched process
    # starts its successor on the socket it holds and exits 0. That is no death: watch says the
    # successor took over, records it, and stops the successor at the end with the launch.
    port = free_port()
    out = tmp_path / "runs"
    cmd = [*ref_cmd("restart", port), "--restart-after", "0"]
    r = vd(
        "watch", *FAST, "--duration", "6s", "--no-exporter", "--out", str(out), "--json",
        "--launch", " ".join(cmd), timeout=120,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr
    assert "took over its port: watching the successor" in r.stderr, r.stderr
    assert "the launched server exited" not in r.stderr
    part = sorted(out.glob("watch-*.jsonl"))[-1]
    recs = [json.loads(ln) for ln in part.read_text().splitlines()[1:]]
    (handover,) = [x for x in recs if x.get("name") == "launched_handover"]
    assert handover["data"]["status"] == 0
    assert not [x for x in recs if x.get("name") == "server_died"]
    assert not pid_alive(handover["data"]["successor"])
    assert not pid_alive(handover["data"]["pid"])
