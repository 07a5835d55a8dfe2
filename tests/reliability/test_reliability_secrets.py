"""A known secret written through every path never comes out.

Real subprocesses against a real hostile loopback server (tests/support/hostile_server.py) and a
loopback nvitop-exporter: soak (terminal, --json, run file, HTML and PNG reports), report
of that run (terminal, --json, HTML), census (terminal, --json, its text report), diagnose
(terminal, --json) of a log with a pasted launch command. Every output is grepped for every
secret.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import vd as _vd
from support.sources import metrics_only, nvitop_text, serve

from vramdoctor.redact import REDACTED, forget_secrets, redact_argv, redact_obj, redact_text

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "support" / "hostile_server.py"

API_KEY = "Zq9"  # a 3-character key: was never masked
PASSWORD = "pw-Secret-77"  # --url=http://:PASSWORD@host
URL_TOKEN = "tok-Secret-88"  # --url=http://TOKEN@host form, in the exporter URL
QUERY_KEY = "qs-Secret-99"  # ?key=
JWT = "jwt-Secret-66"  # second URL of a comma-separated list, ?jwt=
FRAGMENT = "frag-Secret-11"  # #access_token=
HF = "hf-Secret-55"  # HF_TOKEN=... in a pasted launch command
FLAG = "flag-Secret-44"  # --admin-api-key V, --auth-token V, --hf-token=V in process command lines
ENV_KEY = "env-Secret-33"  # SOME_KEY=V
SECRETS = (API_KEY, PASSWORD, URL_TOKEN, QUERY_KEY, JWT, FRAGMENT, HF, FLAG, ENV_KEY)


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "VRAMDOCTOR_API_KEY")}
    e.update(NO_COLOR="1", COLUMNS="120")
    return e


def vd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return _vd(*args, cwd=cwd, env=env(), clean=True, timeout=180)


@pytest.fixture
def hostile() -> Iterator[str]:
    # The server echoes the key back in its model id (as some proxies do with a bad request).
    proc = subprocess.Popen(
        [sys.executable, str(HOSTILE), f"m-{API_KEY}", f"lbl {QUERY_KEY}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def exporter_page() -> str:
    return nvitop_text(
        "gpu-host",
        [
            {
                "index": 0,
                "name": "NVIDIA H100",
                "uuid": "GPU-1",
                "total": 81559.0,
                "used": 20000.0,
                "free": 61559.0,
            }
        ],
        [
            {
                "index": 0,
                "pid": 4242,
                "mib": 19000.0,
                "command": f"python -m sglang.launch_server --admin-api-key {FLAG} "
                f"--auth-token {FLAG} --hf-token={FLAG} SOME_KEY={ENV_KEY}",
            }
        ],
    )


def _searchable(blob: bytes) -> bytes:
    """What text a reader can see: a PNG's text chunks, not its compressed pixels; an HTML page
    without its embedded images' base64 (a 3-character key turns up there by chance)."""
    if blob.startswith(b"\x89PNG\r\n\x1a\n"):
        chunks, at = [], 8
        while at + 8 <= len(blob):
            size, kind = int.from_bytes(blob[at : at + 4], "big"), blob[at + 4 : at + 8]
            if kind in (b"tEXt", b"iTXt", b"zTXt"):
                chunks.append(blob[at + 8 : at + 8 + size])
            at += 12 + size
        return b"\n".join(chunks)
    return re.sub(rb"data:image/[a-z+]+;base64,[A-Za-z0-9+/=]+", b"data:image", blob)


def check(outputs: dict[str, bytes | str]) -> None:
    assert outputs
    for where, data in outputs.items():
        blob = _searchable(data if isinstance(data, bytes) else data.encode())
        for secret in SECRETS:
            assert secret.encode() not in blob, f"{secret!r} leaked into {where}"


def test_a_secret_never_leaves_through_any_path(hostile: str, tmp_path: Path) -> None:
    outputs: dict[str, bytes | str] = {}
    with serve(metrics_only(exporter_page())) as exp:
        exp_host = exp.removeprefix("http://")
        # A password in --url next to --api-key is refused (one Authorization header): its
        # one line is an output too; the password rides in an exporter URL for the soaks.
        r = vd("soak", "--url", f"http://:{PASSWORD}@{hostile}", "--api-key", API_KEY, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        outputs["soak url+key stderr"] = r.stderr
        exporters = (
            f"http://{URL_TOKEN}@{exp_host}/metrics?key={QUERY_KEY}#access_token={FRAGMENT},"
            f"http://:{PASSWORD}@{exp_host}/metrics?jwt={JWT}"
        )
        common = [
            "--url",
            f"http://{hostile}",
            "--api-key",
            API_KEY,
            "--rounds",
            "2",
            "--no-adapt",
            "--requests",
            "2",
            "--concurrency",
            "1",
            "--idle",
            "0.3",
            "--baseline",
            "0.3",
            "--interval",
            "0.1",
            "--text-only",
            "--max-tokens",
            "1",
            "--timeout",
            "5",
        ]
        for n, extra in enumerate((["--json", "--report", "soak.html"], ["--report", "soak.png"])):
            out = tmp_path / f"run{n}.jsonl"
            r = vd(
                "soak", *common, "--gpu-metrics", exporters, "--out", str(out), *extra, cwd=tmp_path
            )
            assert r.returncode in (0, 1), r.stderr
            outputs[f"soak{n} stdout"], outputs[f"soak{n} stderr"] = r.stdout, r.stderr
            outputs[f"run file {n}"] = out.read_bytes()
        outputs["soak html"] = (tmp_path / "soak.html").read_bytes()
        outputs["soak png"] = (tmp_path / "soak.png").read_bytes()
        assert outputs["soak png"][:4] == b"\x89PNG"
        for args in (["--json"], ["--report", "again.html"], []):
            r = vd("report", str(tmp_path / "run0.jsonl"), *args, cwd=tmp_path)
            assert r.returncode in (0, 1), r.stderr
            outputs[f"report {args} stdout"], outputs[f"report {args} stderr"] = r.stdout, r.stderr
        outputs["report html"] = (tmp_path / "again.html").read_bytes()
        for args in (["--json"], ["--report", "census.txt"], []):
            r = vd(
                "census",
                "--gpu-metrics",
                exporters.split(",")[0],
                "--gpu-metrics",
                exporters.split(",")[1],
                *args,
                cwd=tmp_path,
            )
            assert r.returncode in (0, 1), r.stderr
            assert "4242" in r.stdout or args == ["--report", "census.txt"]
            outputs[f"census {args} stdout"], outputs[f"census {args} stderr"] = r.stdout, r.stderr
        outputs["census txt"] = (tmp_path / "census.txt").read_bytes()
    log = tmp_path / "server.log"
    log.write_text(
        f"$ HF_TOKEN={HF} SOME_KEY={ENV_KEY} python -m sglang.launch_server --model-path Qwen/Qwen2-VL-2B "
        f"--api-key {API_KEY} --hf-token={FLAG} --port 30000\n"
        "[2026-11-30 10:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2-VL-2B', "
        f"api_key='{API_KEY}', mem_fraction_static=0.88)\n"
        "[2026-11-30 10:00:05 TP0] Load weight end. type=Qwen2VLForConditionalGeneration, "
        "avail mem=60.10 GB, mem usage=4.42 GB.\n"
        "[2026-11-30 10:05:00 TP0] Decode batch. #running-req: 1, #token: 1234, token usage: 0.01, "
        f"gen throughput (token/s): 40.00, #queue-req: 0, error: invalid key {API_KEY}\n"
    )
    for args in (["--json"], []):
        r = vd("diagnose", str(log), *args, cwd=tmp_path)
        assert r.returncode in (0, 1), r.stderr
        outputs[f"diagnose {args} stdout"], outputs[f"diagnose {args} stderr"] = r.stdout, r.stderr
    check(outputs)
    # What is not secret is still there: the host and port, the flags, the model path.
    assert hostile in outputs["run file 0"].decode()  # type: ignore[union-attr]
    assert "--admin-api-key" in str(outputs["census ['--json'] stdout"])
    assert "Qwen/Qwen2-VL-2B" in str(outputs["diagnose ['--json'] stdout"])


# --- the rules, one by one ----------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


@pytest.mark.parametrize(
    "text, secret",
    [
        ("--url=http://:PASSWORD1@host:8000", "PASSWORD1"),
        ("--url=http://TOKEN1234@host", "TOKEN1234"),
        ("http://user:pw1234@host/x", "pw1234"),
        ("http://h/metrics?key=K1234", "K1234"),
        ("http://h/metrics?code=C1234&x=1", "C1234"),
        ("http://h/metrics?jwt=J1234", "J1234"),
        ("http://h/metrics#access_token=A1234", "A1234"),
        ("http://h/metrics?X-Amz-Signature=S1234", "S1234"),
        ("http://a/metrics,http://b/metrics?token=T1234", "T1234"),
        ("HF_TOKEN=hf1234 python -m sglang", "hf1234"),
        ("SOME_KEY=V1234 cmd", "V1234"),
        ("cmd --hf-token=V5678", "V5678"),
        ("cmd --admin-api-key V9999 --port 1", "V9999"),
        ("cmd --auth-token V8888", "V8888"),
        ("Authorization: Bearer abc.def-ghi", "abc.def-ghi"),
        ('{"api_key": "J5555"}', "J5555"),
        ("api_key='P4444', other=1", "P4444"),
    ],
)
def test_each_rule_masks(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out
    assert REDACTED in out or ("@" in text and "@" not in out)  # userinfo is dropped whole
    if "@" in text:
        assert out.endswith(text.rsplit("@", 1)[1])  # host, port and path kept
    else:
        assert len(out) >= len(text) - len(secret)  # only the secret went, not its surroundings


@pytest.mark.parametrize(
    "text",
    [
        "#token: 1234, token usage: 0.01, gen throughput (token/s): 40.00",
        "--max-tokens 16 --tokenizer-path /m",
        "http://127.0.0.1:30000/metrics?engine=0",
        'sglang:token_usage{tp_rank="0"}',
    ],
)
def test_what_is_not_secret_is_kept(text: str) -> None:
    assert redact_text(text) == text


def test_known_secrets_are_masked_wherever_they_come_back() -> None:
    redact_argv(["vramdoctor", "soak", "--api-key", "k3y"])  # learned from the command line
    assert redact_text("model id m-k3y echoed") == f"model id m-{REDACTED} echoed"
    assert redact_text("monk3yish") == "monk3yish"  # a 3-character key only where it stands alone
    redact_text("http://:longer-secret-1@h")
    assert redact_text("error: bad key xxlonger-secret-1yy") == f"error: bad key xx{REDACTED}yy"


def test_argv_lists_inside_records_are_masked_by_position() -> None:
    rec = {
        "cmdline": ["python", "-m", "x", "--auth-token", "T-7777", "--port", "1"],
        "api_key": "Q-1",
    }
    out = redact_obj(rec)
    assert out["cmdline"] == ["python", "-m", "x", "--auth-token", REDACTED, "--port", "1"]
    assert out["api_key"] == REDACTED
