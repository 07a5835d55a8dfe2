"""fleet against any database or proxy.

A misbehaving reverse proxy (fleet_proxy.Proxy) sits in front of a real Prometheus and a real
VictoriaMetrics holding the scenario fleet; each test gives it one fault and runs the real
command line. Each fault ends in one clear line and exit 2 (never a traceback, never a healthy
exit 0), within the deadline; credentials never reach the output.
"""

from __future__ import annotations

import base64
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Loaded
from fleet_proxy import Proxy

from vramdoctor.cli.fleet import _duration
from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.fleet import run_fleet
from vramdoctor.sources.prometheus import chunk_bounds


def _env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("COLUMNS", "VRAMDOCTOR_PROMETHEUS_TOKEN")
    }
    env["NO_COLOR"] = "1"
    return env


def _fleet(
    url: str, engine: Loaded, *extra: str, timeout: float = 120, **kw: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "fleet",
            "--prometheus",
            url,
            "--since",
            "6d",
            "--until",
            f"{engine.end:.0f}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        **kw,  # type: ignore[call-overload]
    )


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_trickling_answer_is_cut_at_the_total_deadline(engine: Loaded) -> None:
    with Proxy(engine.url).running() as proxy:
        proxy.mode, proxy.trickle_bytes, proxy.trickle_s = "trickle", 32, 0.25
        t0 = time.monotonic()
        done = _fleet(proxy.url, engine, "--query-timeout", "3s")
        took = time.monotonic() - t0
    line = _one_line(done)
    assert "did not finish its answer within the 3 s deadline" in line
    assert took < 20  # one deadline per query, not a read timeout per byte


def test_an_answer_over_the_size_cap_is_refused_in_bounded_memory(engine: Loaded) -> None:
    with Proxy(engine.url).running() as proxy:
        proxy.mode, proxy.huge_mib = "huge", 24.0
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vramdoctor",
                "fleet",
                "--prometheus",
                proxy.url,
                "--since",
                "6d",
                "--until",
                f"{engine.end:.0f}",
                "--max-answer-mib",
                "2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        peak_kib = 0
        while proc.poll() is None:  # VmHWM: the new program's own high-water mark (ru_maxrss
            try:  # would carry over the forked test process's)
                status = Path(f"/proc/{proc.pid}/status").read_text()
                peak_kib = max(peak_kib, int(status.split("VmHWM:")[1].split()[0]))
            except (OSError, IndexError, ValueError):
                pass
            time.sleep(0.02)
        out, err = proc.communicate(timeout=60)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    line = _one_line(done)
    assert "over the 2 MiB cap (--max-answer-mib): narrow --match or coarsen --step" in line
    assert 0 < peak_kib < 250 * 1024  # the 24 MiB answer was never held whole


SHAPES = [
    "data_list",
    "result_obj",
    "value_null",
    "value_text",
    "times_backwards",
    "label_number",
    "status_odd",
    "html",
]


def test_every_malformed_answer_is_one_line_and_never_healthy(engine: Loaded) -> None:
    with Proxy(engine.url).running() as proxy:
        for shape in SHAPES:  # the library: an error naming the fault, never a result
            proxy.mode = f"shape:{shape}"
            with pytest.raises(SourceUnavailable) as caught:
                run_fleet(proxy.url, since_s=6 * 86400, end=engine.end)
            message = str(caught.value)
            assert "\n" not in message and len(message) < 400, (shape, message)
            assert (
                "malformed" in message or "not Prometheus JSON" in message or "status" in message
            ), (shape, message)
        proxy.mode = "shape:values_null"  # and the command line: one line, exit 2, never healthy
        done = _fleet(proxy.url, engine)
    line = _one_line(done)
    assert "a value is null, not a number" in line
    assert "No leak" not in done.stdout and "No live leak" not in done.stdout


def test_basic_auth_and_its_base64_never_reach_the_output(engine: Loaded) -> None:
    user, password = "ops", "correct-horse-battery-9"
    b64 = base64.b64encode(f"{user}:{password}".encode()).decode()
    with Proxy(engine.url).running() as proxy:
        proxy.require_auth = (user, password)
        url = proxy.url.replace("http://", f"http://{user}:{password}@")
        good = _fleet(url, engine, "--json")
        proxy.mode = "echo"  # a proxy that repeats the Authorization header it was sent
        echoed = _fleet(url, engine)
    assert good.returncode == 1, good.stderr  # authenticated: the leaks are found
    for done in (good, echoed):
        for text in (done.stdout, done.stderr):
            assert password not in text and b64 not in text and f"{user}:{password}" not in text
    line = _one_line(echoed)
    assert "refused the query" in line and "***" in line


def test_a_path_prefix_and_a_token_in_the_query_string_are_kept(engine: Loaded) -> None:
    token = "tok-7f3a9c2e1b"
    with Proxy(engine.url, prefix="/prom").running() as proxy:
        proxy.require_query = ("access_token", token)
        done = _fleet(f"{proxy.url}/?access_token={token}", engine, "--json")
        seen = list(proxy.seen)
    assert done.returncode == 1, done.stderr
    assert seen and all(
        p.startswith("/prom/api/v1/") and f"access_token={token}" in p for p in seen
    )
    assert token not in done.stdout and token not in done.stderr


def test_a_tiny_step_or_a_far_until_is_refused_before_any_query(prometheus_fleet: Loaded) -> None:
    engine = prometheus_fleet
    with Proxy(engine.url).running() as proxy:
        for extra, said in (
            (["--step", "0.000001s"], "--step must be between"),
            (["--until", f"{engine.end * 1000:.0f}"], "looks like milliseconds"),
            (["--until", "99999999999"], "is in the future"),
        ):
            t0 = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "vramdoctor", "fleet", "--prometheus", proxy.url, *extra],
                capture_output=True,
                text=True,
                timeout=60,
                env=_env(),
            )
            assert said in _one_line(done) and time.monotonic() - t0 < 20
        assert proxy.seen == []  # refused before any query
    # every numeric option is bounded (the same checks, without a process each)
    for option, text in (
        ("--step", "nan"),
        ("--since", "1e300"),
        ("--query-timeout", "inf"),
        ("--block", "-5"),
    ):
        with pytest.raises(InputError, match=f"{option} must be between"):
            _duration(text, option, 1.0, 86400.0)
    # the library's chunking is bounded too: no step or end makes it loop or eat memory
    with pytest.raises(InputError, match="steps of"):
        chunk_bounds(0.0, 7 * 86400.0, 1e-300, 10_000)
    with pytest.raises(InputError, match="steps of"):
        chunk_bounds(0.0, 1e300, 15.0, 10_000)


def test_charts_that_cannot_be_written_keep_the_verdict_and_the_table(
    prometheus_fleet: Loaded, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    engine = prometheus_fleet

    def small_files() -> None:  # a full disk: any file over 4 KiB fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    done = _fleet(engine.url, engine, "--charts", str(tmp_path / "charts"), preexec_fn=small_files)
    assert done.returncode == 1, done.stderr  # the leak found is kept: an alert on exit 1 fires
    assert "is leaking" in done.stdout.splitlines()[0] and "LEAK" in done.stdout
    assert "cannot write a chart" in done.stderr and "the verdicts stand" in done.stderr
    assert "Traceback" not in done.stderr


def test_ctrl_c_ends_fleet_with_one_line(prometheus_fleet: Loaded) -> None:
    engine = prometheus_fleet
    with Proxy(engine.url).running() as proxy:
        proxy.mode, proxy.trickle_bytes, proxy.trickle_s = "trickle", 16, 0.5
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vramdoctor",
                "fleet",
                "--prometheus",
                proxy.url,
                "--until",
                f"{engine.end:.0f}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        deadline = time.monotonic() + 30
        while not proxy.seen and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    assert proc.returncode == 130, (proc.returncode, err)
    assert [ln for ln in err.splitlines() if ln.strip()] == ["vramdoctor: interrupted"], err
    assert took < 5
