"""Secrets never reach a run file, a process row, or an error message."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from vramdoctor.errors import SourceUnavailable
from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.redact import REDACTED, redact_argv, redact_text, redact_url
from vramdoctor.sources.procinfo import ProcInfoCache, lookup, server_groups
from vramdoctor.sources.server_metrics import ServerMetricsSource

SECRETS = (
    "hunter2-pass",
    "sk-live-4f9a8b7c6d5e",
    "tok_a1b2c3d4e5f6",
    "eyJhbGciOiJIUzI1NiJ9.payload.sig",
    "my-literal-secret",
    "hf_abcdefghijklmnopqrstuvwxyz",
)


def test_header_keeps_no_secret(tmp_path: Path) -> None:
    argv = [
        "vramdoctor",
        "soak",
        "http://admin:hunter2-pass@10.0.0.5:30000/v1?api_key=sk-live-4f9a8b7c6d5e&model=m",
        "--api-key",
        "sk-live-4f9a8b7c6d5e",
        "--token=tok_a1b2c3d4e5f6",
        "--header",
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig",
        "--note",
        "my-literal-secret",
        "--hf",
        "hf_abcdefghijklmnopqrstuvwxyz",
    ]
    header = make_header(
        "soak",
        argv=argv,
        target="http://admin:hunter2-pass@10.0.0.5:30000/v1?api_key=sk-live-4f9a8b7c6d5e&model=m",
        secrets=["my-literal-secret"],
    )
    path = tmp_path / "run.jsonl"
    RunWriter(path, header).close()
    text = path.read_text()
    for secret in SECRETS:
        assert secret not in text, secret
    run = read_run(path)
    # What is not secret survives: host, port, path, ordinary parameters, flags.
    assert run.header["target"] == f"http://10.0.0.5:30000/v1?api_key={REDACTED}&model=m"
    assert "--api-key" in run.header["argv"] and "soak" in run.header["argv"]
    assert run.header["argv"][run.header["argv"].index("--api-key") + 1] == REDACTED


@pytest.mark.parametrize(
    "url, kept, gone",
    [
        (
            "https://user:pw-secret-1@host.example:8443/metrics",
            "https://host.example:8443/metrics",
            "pw-secret-1",
        ),
        ("http://h:9400/metrics?token=abcdef123&x=1", "x=1", "abcdef123"),
        ("http://h:30000", "http://h:30000", "@"),
    ],
)
def test_redact_url(url: str, kept: str, gone: str) -> None:
    out = redact_url(url)
    assert kept in out and gone not in out


def test_redact_text_and_argv_shapes() -> None:
    assert "abc.def-ghi" not in redact_text("Authorization: Bearer abc.def-ghi")
    assert "sk-proj-ABCDEFGH12345678" not in redact_text("key sk-proj-ABCDEFGH12345678 here")
    assert redact_argv(["--password", "p4ss-word!", "--port", "30000"]) == [
        "--password",
        REDACTED,
        "--port",
        "30000",
    ]


def test_process_command_lines_are_redacted_when_read() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(30)",
            "--api-key",
            "sk-live-4f9a8b7c6d5e",
            "http://u:hunter2-pass@h/x",
        ]
    )
    try:
        deadline = time.monotonic() + 10
        info = lookup(proc.pid)
        while (info.cmdline is None or len(info.cmdline) < 3) and time.monotonic() < deadline:
            time.sleep(0.05)
            info = lookup(proc.pid)
        assert info.visible and info.name
        joined = " ".join(info.cmdline or [])
        assert "--api-key" in joined and "time.sleep(30)" in joined
        assert "sk-live-4f9a8b7c6d5e" not in joined and "hunter2-pass" not in joined
    finally:
        proc.kill()
        proc.wait()
    # Gone now: the PID is kept but marked as not visible here.
    gone = lookup(proc.pid)
    assert not gone.visible and gone.name is None
    cache = ProcInfoCache(ttl_s=0.0)
    assert not cache.get(proc.pid).visible


TREE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def test_server_groups_follow_the_process_tree_up_to_the_shell() -> None:
    trees = []
    for _ in range(2):  # two independent "servers", each started from its own shell
        shell = subprocess.Popen(
            ["bash", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(TREE)}; true"],
            stdout=subprocess.PIPE,
            text=True,
        )
        child = int(shell.stdout.readline())  # type: ignore[union-attr]
        parent = psutil.Process(child).ppid()
        trees.append((shell, parent, child))
    try:
        pids = [pid for _, parent, child in trees for pid in (parent, child)]
        groups = server_groups(pids)
        (_, p1, c1), (_, p2, c2) = trees
        assert groups[p1] == groups[c1] == p1  # the shell is a boundary: the server's root is p1
        assert groups[p2] == groups[c2] == p2
        assert server_groups([2**22 + 12345]) == {2**22 + 12345: 2**22 + 12345}  # unseen PID: alone
    finally:
        for shell, parent, child in trees:
            for pid in (child, parent):
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).kill()
            shell.wait(timeout=10)


def test_scrape_errors_never_show_credentials() -> None:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here now
    with (
        ServerMetricsSource(
            f"http://admin:hunter2-pass@127.0.0.1:{port}/metrics?token=tok_a1b2c3d4e5f6", timeout=2
        ) as src,
        pytest.raises(SourceUnavailable) as err,
    ):
        src.sample()
    assert "hunter2-pass" not in str(err.value) and "tok_a1b2c3d4e5f6" not in str(err.value)
    assert f"127.0.0.1:{port}" in str(err.value)
