"""`vramdoctor soak` when it cannot or must not go on: every request failing, a key the server
refuses, credentials in the URL next to --api-key, Ctrl-C at any moment; and the help pages
and error lines it prints (nothing cut off at 80 columns, prose about flags not redacted).

Real loopback servers (an HTTP server in this process that records what it receives, and the
reference server), soak as a real subprocess.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.procs import RefServer, cli_env, run_soak

from vramdoctor.record import read_run
from vramdoctor.redact import REDACTED, forget_secrets, redact_argv, redact_text

ROOT = Path(__file__).resolve().parents[2]

FAST = [
    "--rounds",
    "4",
    "--no-adapt",
    "--requests",
    "8",
    "--concurrency",
    "4",
    "--idle",
    "0.5",
    "--interval",
    "0.1",
    "--text-only",
    "--timeout",
    "10",
]


class Recorder:
    """An OpenAI-shaped server on loopback answering every completion with `status` (200: a
    real completion), /v1/models after `models_delay_s`; it records each request's method,
    path and Authorization header."""

    def __init__(self, status: int, *, models_delay_s: float = 0.0) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_a: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                outer.seen.append(("GET", self.path, self.headers.get("Authorization")))
                if self.path == "/v1/models":
                    time.sleep(models_delay_s)
                    return self._send(200, {"object": "list", "data": [{"id": "m"}]})
                self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append(("POST", self.path, self.headers.get("Authorization")))
                if status == 200:
                    return self._send(
                        200,
                        {
                            "id": "x",
                            "object": "chat.completion",
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": "ok"},
                                    "finish_reason": "stop",
                                }
                            ],
                        },
                    )
                self._send(status, {"error": {"message": f"refused with {status}"}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def posts(self) -> list[tuple[str, str, str | None]]:
        return [s for s in self.seen if s[0] == "POST"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder() -> Iterator[Any]:
    made: list[Recorder] = []

    def make(status: int, **kw: Any) -> Recorder:
        made.append(Recorder(status, **kw))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _env(**extra: str) -> dict[str, str]:
    return cli_env(COLUMNS="80", **extra)


def soak(
    url: str, tmp: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_soak(url, tmp, *args, env=env or _env(), timeout=120)


# --- 1. every request failing: stop after round 1, say why, never healthy ----------------------


def test_a_server_failing_every_request_stops_after_round_one_exit_1(recorder, tmp_path) -> None:
    srv = recorder(500)
    r = soak(srv.url, tmp_path, *FAST, "--json")
    assert r.returncode == 1, r.stderr
    assert len(srv.posts()) == 8  # round 1 only, not 4 rounds of a server that cannot answer
    assert "the server is failing" in r.stderr and "8 x HTTP 500" in r.stderr
    assert "Traceback" not in r.stderr
    d = json.loads(r.stdout)
    assert d["healthy"] is False and d["exit_code"] == 1 and d["stopped_by"] == "requests-failed"
    assert len(d["rounds"]) == 1
    # Offline the run file says the same.
    rep = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(tmp_path / "run.jsonl"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert rep.returncode == 1 and json.loads(rep.stdout)["healthy"] is False


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_stops_after_round_one_names_api_key_exit_2(
    recorder, tmp_path, status
) -> None:
    srv = recorder(status)
    r = soak(srv.url, tmp_path, *FAST, "--json", "--api-key", "wrong-key-123")
    assert r.returncode == 2, r.stderr
    assert len(srv.posts()) == 8
    line = next(ln for ln in r.stderr.splitlines() if "unauthorized" in ln)
    assert "--api-key" in line and f"8 x HTTP {status}" in line
    assert "wrong-key-123" not in r.stderr + r.stdout
    d = json.loads(r.stdout)
    assert d["healthy"] is False and d["exit_code"] == 2 and d["stopped_by"] == "auth-failed"


def test_no_key_and_a_server_that_wants_one_says_pass_it(recorder, tmp_path) -> None:
    srv = recorder(401)
    r = soak(srv.url, tmp_path, *FAST)
    assert r.returncode == 2, r.stderr
    assert "the server wants an API key; pass it with --api-key" in r.stderr


def test_a_working_server_is_not_stopped(recorder, tmp_path) -> None:
    srv = recorder(200)
    r = soak(srv.url, tmp_path, *FAST, "--rounds", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert len(srv.posts()) == 16
    d = json.loads(r.stdout)
    assert d["stopped_by"] is None and d["interrupted"] is False


# --- 2. a password in the URL never replaces --api-key --------------------------------------


@pytest.mark.parametrize("how", ["flag", "env"])
def test_url_credentials_and_an_api_key_are_refused_before_anything_is_sent(
    recorder, tmp_path, how
) -> None:
    srv = recorder(200)
    url = srv.url.replace("http://", "http://admin:pw-secret-77@")
    if how == "flag":
        r = soak(url, tmp_path, *FAST, "--api-key", "bearer-key-42")
        where = "--api-key"
    else:
        r = soak(url, tmp_path, *FAST, env=_env(OPENAI_API_KEY="bearer-key-42"))
        where = "$OPENAI_API_KEY"
    assert r.returncode == 2, r.stderr
    assert (
        len(r.stderr.strip().splitlines()) == 1
        and where in r.stderr
        and "Authorization" in r.stderr
    )
    assert "pw-secret-77" not in r.stderr and "bearer-key-42" not in r.stderr
    assert srv.seen == []  # nothing was sent, with either credential
    assert not (tmp_path / "run.jsonl").exists()


def test_the_key_is_sent_as_a_bearer_token_and_url_credentials_alone_as_basic(
    recorder, tmp_path
) -> None:
    srv = recorder(200)
    r = soak(srv.url, tmp_path, *FAST, "--rounds", "1", "--api-key", "bearer-key-42")
    assert r.returncode == 0, r.stderr
    assert srv.posts() and all(auth == "Bearer bearer-key-42" for _m, _p, auth in srv.seen)
    srv.seen.clear()
    (tmp_path / "run.jsonl").unlink()
    r = soak(srv.url.replace("http://", "http://admin:pw@"), tmp_path, *FAST, "--rounds", "1")
    assert r.returncode == 0, r.stderr
    assert srv.posts() and all(str(auth).startswith("Basic ") for _m, _p, auth in srv.seen)


# --- 3. Ctrl-C: interrupted is said, never healthy, exit 130 (1 when a LEAK was found) --------


def _popen(url: str, tmp: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "soak",
            "--url",
            url,
            "--out",
            str(tmp / "run.jsonl"),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_ctrl_c_before_measuring_says_so_in_one_line_exit_130(recorder, tmp_path) -> None:
    srv = recorder(200, models_delay_s=8.0)  # soak waits on /v1/models: nothing recorded yet
    proc = _popen(srv.url, tmp_path, *FAST)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not srv.seen:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted before measuring" in err and "Traceback" not in err
    assert not (tmp_path / "run.jsonl").exists()


def test_ctrl_c_mid_run_json_says_interrupted_not_healthy_exit_130(recorder, tmp_path) -> None:
    srv = recorder(200)
    run = tmp_path / "run.jsonl"
    proc = _popen(srv.url, tmp_path, *FAST, "--rounds", "40", "--json")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (run.exists() and '"idle_end"' in run.read_text()):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    d = json.loads(out)
    assert d["interrupted"] is True and d["healthy"] is False and d["exit_code"] == 130
    assert "interrupted" in err
    assert read_run(run).status == "interrupted"


def _as_interrupted(src: Path, dst: Path) -> None:
    """The same run file, ended by Ctrl-C instead of completing (its end mark rewritten)."""
    lines = src.read_text().splitlines()
    end = json.loads(lines[-1])
    assert end.get("kind") == "end", end
    end["status"] = "interrupted"
    dst.write_text("\n".join([*lines[:-1], json.dumps(end)]) + "\n")


def test_an_interrupted_run_exits_1_when_a_leak_was_found_else_130(tmp_path) -> None:
    # A recorded leaking run (a VRAM leak on an H200): the verdict of a complete run is LEAK.
    leak_run = ROOT / "tests" / "fixtures" / "soak" / "h200-leaking.jsonl"
    _as_interrupted(leak_run, tmp_path / "leak-interrupted.jsonl")
    rep = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "report",
            str(tmp_path / "leak-interrupted.jsonl"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    d = json.loads(rep.stdout)
    assert (
        rep.returncode == 1
        and d["exit_code"] == 1
        and d["interrupted"] is True
        and d["healthy"] is False
    )

    stable = RefServer("stable")
    try:
        r = soak(
            stable.url,
            tmp_path,
            "--rounds",
            "3",
            "--no-adapt",
            "--requests",
            "10",
            "--idle",
            "0.5",
            "--interval",
            "0.1",
            "--image-size",
            "64x64",
        )
    finally:
        stable.stop()
    assert r.returncode == 0, r.stderr
    _as_interrupted(tmp_path / "run.jsonl", tmp_path / "stable-interrupted.jsonl")
    rep = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "report",
            str(tmp_path / "stable-interrupted.jsonl"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    d = json.loads(rep.stdout)
    assert (
        rep.returncode == 130
        and d["exit_code"] == 130
        and d["interrupted"] is True
        and d["healthy"] is False
    )


# --- 4. redaction masks values, not the prose around a flag ----------------------------------


@pytest.fixture
def fresh_secrets() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


@pytest.mark.parametrize(
    "text",
    [
        "(pass a key with --api-key or OPENAI_API_KEY)",
        "the key given with --api-key (or $OPENAI_API_KEY / ${VRAMDOCTOR_API_KEY}) is not accepted",
        "set --hf-token HF_TOKEN, or --api-key is missing",
        "usage: --api-key KEY, --api-key <key>",
        "the server wants a key: pass it with --api-key",
    ],
)
def test_prose_about_a_secret_flag_is_kept(fresh_secrets, text) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(
    "text, secret",
    [
        ("server --api-key hunter2 --port 1", "hunter2"),
        ("server --api-key swordfish", "swordfish"),
        ("server --admin-api-key ABCDEFGHIJKLMNOP", "ABCDEFGHIJKLMNOP"),
        ("server --api-key=or", "=or"),
        ("server --api-key 'or'", "'or'"),
        ("password: swordfish", "swordfish"),
        ("api_key:or", ":or"),
    ],
)
def test_values_after_a_secret_flag_are_still_masked(fresh_secrets, text, secret) -> None:
    out = redact_text(text)
    assert secret not in out and REDACTED in out


def test_argv_stays_strict(fresh_secrets) -> None:
    assert redact_argv(["srv", "--api-key", "or"]) == ["srv", "--api-key", REDACTED]


def test_a_secret_in_the_url_does_not_rewrite_the_error_line(tmp_path) -> None:
    r = soak("http://127.0.0.1:9/?token=TOPSECRET99", tmp_path, "--text-only")
    assert r.returncode == 2
    assert "TOPSECRET99" not in r.stderr
    assert "(pass a key with --api-key or OPENAI_API_KEY)" in r.stderr
    assert f"?token={REDACTED}: give" in r.stderr  # the sentence's colon is not part of the value


# --- 5. no help page is cut off at 80 columns -------------------------------------------------


def _commands() -> list[list[str]]:
    """Every command path of the CLI ([] is the root), from its explicit command list."""
    import click
    import typer

    from vramdoctor.cli import COMMANDS, app

    root = typer.main.get_command(app)
    ctx = click.Context(root)
    out: list[list[str]] = [[]]

    def walk(group: Any, path: list[str]) -> None:
        names = group.list_commands(ctx) if hasattr(group, "list_commands") else []
        for name in names:
            cmd = group.get_command(ctx, name)
            if cmd is None or getattr(cmd, "hidden", False):
                continue
            out.append([*path, name])
            walk(cmd, [*path, name])

    walk(root, [])
    assert {p[0] for p in out if p} == set(COMMANDS)
    return out


def _is_example(line: str) -> bool:
    words = line.split()
    return bool(words) and (words[0] == "vramdoctor" or words[0].startswith("PYTHONPATH="))


def test_every_help_page_fits_80_columns_without_cutting(tmp_path) -> None:
    commands = _commands()
    assert ["soak"] in commands and len(commands) > 5
    for cmd in commands:
        r = subprocess.run(
            [sys.executable, "-m", "vramdoctor", *cmd, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
            cwd=tmp_path,
        )
        assert r.returncode == 0, (cmd, r.stderr)
        text = r.stdout + r.stderr
        assert "…" not in text, (cmd, [ln for ln in text.splitlines() if "…" in ln])
        # An example command line is printed whole on its own line (cli._help: never broken,
        # so it can be copied); everything else fits 80 columns.
        prose = [ln for ln in text.splitlines() if not _is_example(ln)]
        assert max(len(ln) for ln in prose) <= 80, (cmd, [ln for ln in prose if len(ln) > 80])
    soak_help = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "soak", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        cwd=tmp_path,
    ).stdout
    flat = re.sub(r"[\s│]+", "", soak_help)
    assert "runs/soak-UTCTIME-PID-RANDOM.jsonl" in flat  # folded onto two lines, not cut
