"""QA regressions found by using the installed CLI as a demanding user would.

Each test is one bug that was seen: real subprocesses, a real loopback server, real files.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import vd as _vd
from support.procs import RefServer

from vramdoctor.errors import InputError
from vramdoctor.judge import INCONCLUSIVE, STABLE, classify_series
from vramdoctor.record import RunWriter, make_header, read_run

ROOT = Path(__file__).resolve().parents[2]
ABTEST_RUN = ROOT / "tests" / "fixtures" / "abtest" / "h200-qwen2_5_vl.jsonl"
SOAK_RUN = ROOT / "tests" / "fixtures" / "soak" / "h200-plain.jsonl"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "VRAMDOCTOR_API_KEY")}
    env.update(NO_COLOR="1")
    return env


def vd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return _vd(*args, cwd=cwd, env=_env(), clean=True)


def _one_line_usage_error(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("vramdoctor: error:")


@pytest.fixture
def ref_server() -> Iterator[str]:
    server = RefServer("plain")
    yield server.url
    server.stop()


# --- report --report on an ab-test run: was a matplotlib traceback --------------------------


def test_report_of_abtest_run_with_html_report_is_one_line_exit_2(tmp_path) -> None:
    r = vd("report", str(ABTEST_RUN), "--report", str(tmp_path / "ab.html"), cwd=tmp_path)
    _one_line_usage_error(r)
    assert ".png" in r.stderr
    assert not (tmp_path / "ab.html").exists()


def test_report_of_abtest_run_into_a_missing_place_is_one_line_exit_2(tmp_path) -> None:
    (tmp_path / "afile").write_text("x")
    r = vd("report", str(ABTEST_RUN), "--report", str(tmp_path / "afile" / "ab.png"), cwd=tmp_path)
    _one_line_usage_error(r)


def test_report_of_abtest_run_writes_png(tmp_path) -> None:
    png = tmp_path / "ab.png"
    r = vd("report", str(ABTEST_RUN), "--report", str(png), "--json", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    json.loads(r.stdout)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- report --report with an unknown extension on a soak run: was exit 0 --------------------


def test_report_of_soak_run_with_unknown_report_extension_exits_2(tmp_path) -> None:
    r = vd("report", str(SOAK_RUN), "--report", str(tmp_path / "x.pdf"), "--json", cwd=tmp_path)
    _one_line_usage_error(r)
    # With --json, stdout carries only the error object (scripts always get JSON).
    err = json.loads(r.stdout)
    assert (
        err["schema"] == "vramdoctor.error/1" and err["exit_code"] == 2 and ".pdf" in err["error"]
    )


# --- run file under a path whose directory part is a file: said "already exists" -----------


def test_run_file_under_a_regular_file_names_the_directory_problem(tmp_path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError) as exc:
        RunWriter(tmp_path / "afile" / "run.jsonl", make_header("soak"))
    assert "already exists" not in str(exc.value)
    assert "directory" in str(exc.value)


def test_soak_negative_min_growth_is_a_usage_error(tmp_path) -> None:
    r = vd("soak", "--url", "http://127.0.0.1:1", "--min-growth-mib", "-1", cwd=tmp_path)
    _one_line_usage_error(r)
    assert "--min-growth-mib" in r.stderr


# --- one settled level and no baseline was called STABLE (exit 0) ---------------------------


def test_a_single_settled_level_without_baseline_is_not_stable() -> None:
    # --idle shorter than --interval: only round 1's idle window caught a sample.
    alone = classify_series(None, [45.7, None, None], [2.0, 4.0, 6.0], [[45.7], [], []], floor=2.0)
    assert alone.verdict == INCONCLUSIVE
    # Even with a baseline, one flat round is too little to call it stable; two are enough.
    with_base = classify_series(
        45.6, [45.7, None, None], [2.0, 4.0, 6.0], [[45.7], [], []], floor=2.0
    )
    assert with_base.verdict == INCONCLUSIVE
    two = classify_series(
        45.6, [45.7, 45.7, None], [2.0, 4.0, 6.0], [[45.7], [45.7], []], floor=2.0
    )
    assert two.verdict == STABLE


# --- Ctrl-C in the second after the run file is created (scipy import): no report, no end ----


def test_ctrl_c_right_after_the_run_file_appears_still_reports(ref_server, tmp_path) -> None:
    run = tmp_path / "run.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "soak",
            "--url",
            ref_server,
            "--out",
            str(run),
            "--rounds",
            "3",
            "--requests",
            "2",
            "--idle",
            "5",
            "--interval",
            "0.1",
            "--image-size",
            "64x64",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not run.exists() and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    d = json.loads(out)
    assert d["status"] == "interrupted"
    r = read_run(run)
    assert r.status == "interrupted"
    assert r.end is not None


# --- a URL that answers /v1/models but serves an HTML page on POST: was STABLE, exit 0 -------


class _NotACompletionServer(http.server.BaseHTTPRequestHandler):
    """Lists a model, then answers every POST with 200 and an HTML page (a proxy's login page)."""

    def _send(self, code: int, body: str, ctype: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            self._send(
                200, json.dumps({"object": "list", "data": [{"id": "m"}]}), "application/json"
            )
        else:
            self._send(404, "not found", "text/plain")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._send(200, "<html><body>please log in</body></html>", "text/html")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def loopback() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotACompletionServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_html_answers_to_completions_are_errors_not_a_stable_verdict(loopback, tmp_path) -> None:
    r = vd(
        "soak",
        "--url",
        loopback,
        "--out",
        str(tmp_path / "run.jsonl"),
        "--rounds",
        "2",
        "--requests",
        "2",
        "--idle",
        "0.5",
        "--interval",
        "0.1",
        "--text-only",
        "--json",
        cwd=tmp_path,
    )
    assert r.returncode == 1, r.stderr  # no request succeeded: the server is failing, not healthy
    d = json.loads(r.stdout)
    assert d["verdict"] == INCONCLUSIVE and d["healthy"] is False
    assert all(rd["ok"] == 0 and rd["errors"] == 2 for rd in d["rounds"])
    assert "choices" in d["headline"]


def test_https_to_a_plain_http_port_says_so(loopback, tmp_path) -> None:
    r = vd("soak", "--url", loopback.replace("http://", "https://"), cwd=tmp_path)
    _one_line_usage_error(r)
    assert "TLS" in r.stderr and "http://" in r.stderr


def test_url_with_a_query_string_is_refused_without_showing_the_token(loopback, tmp_path) -> None:
    r = vd("soak", "--url", loopback + "/v1?token=TOKSECRET789", cwd=tmp_path)
    _one_line_usage_error(r)
    assert "query" in r.stderr
    assert "TOKSECRET789" not in r.stderr + r.stdout


# --- stdout on a full disk: was an OSError traceback --------------------------------------


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_to_a_full_disk_is_one_line_not_a_traceback(tmp_path) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "vramdoctor", "report", str(SOAK_RUN)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=_env(),
            cwd=tmp_path,
        )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "vramdoctor: error: cannot write the output: No space left on device"
    ]


# --- soak --report into a directory: found only after the whole soak (exit 0, no report) -----


def test_soak_report_path_that_cannot_be_a_file_is_refused_before_measuring(tmp_path) -> None:
    (tmp_path / "d.html").mkdir()
    (tmp_path / "afile").write_text("x")
    for bad in (tmp_path / "d.html", tmp_path / "afile" / "r.html"):
        r = vd(
            "soak",
            "--url",
            "http://127.0.0.1:1",
            "--out",
            str(tmp_path / "run.jsonl"),
            "--report",
            str(bad),
            cwd=tmp_path,
        )
        _one_line_usage_error(r)
        assert "--report" in r.stderr  # not the unreachable server: checked before anything else
        assert not (tmp_path / "run.jsonl").exists()


# --- --duration is a hard bound, also when the server never answers ----------------------


def test_duration_bound_holds_against_a_server_that_never_answers(tmp_path) -> None:
    release = threading.Event()

    class Hanging(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            release.wait(120)  # answers only when the test is over

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        start = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "vramdoctor",
                "soak",
                "--url",
                f"http://127.0.0.1:{server.server_port}",
                "--duration",
                "3",
                "--timeout",
                "120",
                "--rounds",
                "2",
                "--requests",
                "2",
                "--idle",
                "1",
                "--out",
                str(tmp_path / "run.jsonl"),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=_env(),
            cwd=tmp_path,
            timeout=110,
        )
        elapsed = time.monotonic() - start
    finally:
        release.set()
        server.shutdown()
    assert "Traceback" not in proc.stderr
    d = json.loads(proc.stdout)
    assert d["verdict"] != "LEAK"
    # The request timeout is 120 s; the --duration of 3 s must cut the waiting requests short.
    assert elapsed < 60, elapsed
