"""The HTTP clients against hostile servers, each kind in every client it applies to.

Against real loopback servers that send raw bytes (tests/reliability/r3_servers.py):

1. a total deadline (connect + status line + headers + body): fleet's Prometheus client and
   the /metrics and exporter scraper, with the body or the headers trickling a byte at a time;
2. redirects are never followed: a redirect with an endless body is refused at once (its body
   never read), and a `--header` credential never reaches the host a redirect names;
3. a server that connected and stalled is never "cannot connect ... is it running";
4. a deeply nested JSON answer is a malformed answer, never "internal error: RecursionError";
5. watch stops promptly on SIGTERM while a /metrics stalls in its headers.

Each call that could hang on the old code runs on a daemon thread with a bound, so a
regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from r3_servers import RawServer, answer, redirect, trickle_body, trickle_headers
from support.cli import cli_env, vd

from vramdoctor.errors import SourceUnavailable
from vramdoctor.sources.http import Scraper
from vramdoctor.sources.prometheus import MalformedAnswer, PrometheusClient

SECRET = "HDR-SECRET-777"


def bounded(fn: Callable[[], Any], limit_s: float) -> tuple[BaseException | None, float]:
    """fn() on a daemon thread; (what it raised, seconds taken). Fails when it outlives limit_s."""
    got: list[BaseException | None] = [None]

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the test
            got[0] = exc

    t0 = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    took = time.monotonic() - t0
    assert not thread.is_alive(), f"still waiting after {limit_s} s: the deadline is not total"
    return got[0], took


def prometheus_call(url: str, deadline_s: float = 1.5, **kw: Any) -> Callable[[], Any]:
    def call() -> Any:
        with PrometheusClient(url, deadline_s=deadline_s, **kw) as client:
            return client.label_values("__name__")

    return call


def scrape(url: str, timeout: float = 1.5, **kw: Any) -> Callable[[], Any]:
    def call() -> Any:
        with Scraper(url, what="server /metrics", timeout=timeout, **kw) as s:
            return s.get_text()

    return call


# --- 1. the deadline is total -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["body", "headers"])
def test_fleets_deadline_is_total_when_the_answer_trickles(kind: str) -> None:
    handler = trickle_body(0.2) if kind == "body" else trickle_headers(0.2)
    with RawServer(handler) as srv:
        exc, took = bounded(prometheus_call(srv.url, 1.5), 15)
    assert isinstance(exc, SourceUnavailable), exc
    assert "1.5 s deadline" in str(exc) and "--query-timeout" in str(exc), exc
    assert "cannot connect" not in str(exc)
    assert took < 8, took


@pytest.mark.parametrize("kind", ["body", "headers"])
def test_the_scrapers_deadline_covers_headers_and_body(kind: str) -> None:
    handler = trickle_body(0.2) if kind == "body" else trickle_headers(0.2)
    with RawServer(handler) as srv:
        exc, took = bounded(scrape(srv.url, 1.5), 15)
    assert isinstance(exc, SourceUnavailable), exc
    assert "did not finish its answer within 1.5 s" in str(exc), exc
    assert "cannot connect" not in str(exc) and "is it running" not in str(exc), exc
    assert took < 8, took


def test_fleet_cli_with_a_trickling_prometheus_exits_2_at_its_query_timeout() -> None:
    with RawServer(trickle_body(0.5)) as srv:
        t0 = time.monotonic()
        r = vd(
            "fleet", "--prometheus", srv.url, "--since", "1d", "--query-timeout", "2s", timeout=60
        )
        took = time.monotonic() - t0
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "deadline" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert took < 30, took


def test_a_server_that_closes_after_connecting_is_not_called_unreachable() -> None:
    def hang_up(conn: Any, head: bytes, server: RawServer) -> None:
        return  # the request was read; close without a word

    with RawServer(hang_up) as srv:
        exc, _ = bounded(scrape(srv.url, 3), 15)
        exc2, _ = bounded(prometheus_call(srv.url, 3), 15)
    for e in (exc, exc2):
        assert isinstance(e, SourceUnavailable), e
        assert "connected but closed the connection" in str(e), e
        assert "is it running" not in str(e), e


# --- 2. redirects are never followed ------------------------------------------------------


@pytest.mark.parametrize("client", ["prometheus", "scraper"])
def test_a_redirect_with_an_endless_body_is_refused_not_read(client: str) -> None:
    target = "http://127.0.0.1:9/elsewhere?access_token=TOKEN-IN-LOCATION"
    with RawServer(redirect(target, 302, endless_body=True)) as srv:
        call = prometheus_call(srv.url, 10) if client == "prometheus" else scrape(srv.url, 10)
        exc, took = bounded(call, 20)
    assert isinstance(exc, SourceUnavailable), exc
    text = str(exc)
    assert "HTTP 302, a redirect to http://127.0.0.1:9/elsewhere" in text, text
    assert "not followed" in text and "TOKEN-IN-LOCATION" not in text, text
    assert took < 5, f"{took:.1f} s: the redirect's body was read"


@pytest.mark.parametrize("client", ["prometheus", "scraper"])
def test_a_header_credential_never_reaches_the_host_a_redirect_names(client: str) -> None:
    body = json.dumps({"status": "success", "data": ["up"]}).encode()
    with RawServer(answer(200, body), host="127.0.0.2") as other:
        with RawServer(redirect(other.url + "/api/v1/label/__name__/values", 307)) as srv:
            headers = {"X-Api-Key": SECRET, "X-Scope-OrgID": "tenant-1"}
            if client == "prometheus":
                call = prometheus_call(srv.url, 5, headers=headers)
            else:
                call = scrape(srv.url, 5, headers=headers)
            exc, _ = bounded(call, 20)
        assert srv.heads and SECRET.encode() in srv.heads[0]  # sent where the user said
        assert other.heads == [], "a redirect was followed to another host"
    assert isinstance(exc, SourceUnavailable), exc
    assert f"a redirect to {other.url}/api/v1/label" in str(exc), exc
    assert SECRET not in str(exc)


def test_fleet_cli_says_the_redirect_and_sends_nothing_to_its_target() -> None:
    body = json.dumps({"status": "success", "data": ["up"]}).encode()
    with RawServer(answer(200, body), host="127.0.0.2") as other:
        with RawServer(redirect(other.url + "/api/v1/query", 307)) as srv:
            r = vd(
                "fleet",
                "--prometheus",
                srv.url,
                "--header",
                f"X-Api-Key: {SECRET}",
                "--since",
                "1d",
                timeout=60,
            )
        assert other.heads == []
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "redirect to http://127.0.0.2:" in r.stderr and "not followed" in r.stderr, r.stderr
    assert SECRET not in r.stdout + r.stderr


# --- 4. deeply nested JSON ----------------------------------------------------------------


def test_a_deeply_nested_json_answer_is_a_malformed_answer() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    with RawServer(answer(200, deep)) as srv:
        exc, _ = bounded(prometheus_call(srv.url, 10), 20)
        r = vd("fleet", "--prometheus", srv.url, "--since", "1d", timeout=60)
    assert isinstance(exc, MalformedAnswer), exc
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "did not answer as a Prometheus server" in r.stderr, r.stderr
    assert "internal error" not in r.stderr and "RecursionError" not in r.stderr, r.stderr


# --- 3 and 5: watch against a /metrics that stalls in its headers -------------------------


def _watch(url: str, *args: str, tmp: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "watch",
            "--server",
            url,
            "--interval",
            "1s",
            "--no-exporter",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=tmp,
        start_new_session=True,
    )


def test_watch_ends_on_time_when_metrics_headers_trickle(tmp_path: Path) -> None:
    with RawServer(trickle_headers(0.3)) as srv:
        t0 = time.monotonic()
        p = _watch(srv.url, "--duration", "4s", tmp=tmp_path)
        try:
            _out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        took = time.monotonic() - t0
    assert p.returncode in (0, 1), (p.returncode, err)
    assert "did not finish its answer within 5 s" in err, err
    assert "is it running" not in err, err
    # 4 s of watching, a 5 s deadline for the last scrape, start-up on a loaded machine
    assert took < 40, took


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_stops_watch_promptly_while_metrics_headers_trickle(
    tmp_path: Path, sig: signal.Signals
) -> None:
    with RawServer(trickle_headers(0.3)) as srv:
        p = _watch(srv.url, "--duration", "10m", tmp=tmp_path)
        try:
            time.sleep(6)  # past start-up, sampling, a scrape stalled in its headers
            assert p.poll() is None, p.communicate()
            t0 = time.monotonic()
            p.send_signal(sig)
            try:
                _out, err = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"watch did not stop within 20 s of {sig.name}")
            took = time.monotonic() - t0
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert took < 12, took
    assert "Traceback" not in err, err
