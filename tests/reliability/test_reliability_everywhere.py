"""Every command, every outside input: each kind, for every command it applies to, with real
processes, real files and real servers on loopback.

Newlines in one-line fields from outside never start a line; a report is written through a
temporary file and a rename, never through a planted symlink; a Latin-1 (or ASCII) terminal gets
ASCII stand-ins, never a UnicodeEncodeError; damaged run files are one skipped line, never an
internal error or an invented server death; a proxy that carries a loopback URL is named;
Ctrl-C is one line and exit 130 in every command at any moment after start-up, and a library's
warning is one note line.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.text import Text
from support.cli import vd
from support.procs import RefServer
from support.sources import metrics_only, nvitop_text, serve

from vramdoctor.errors import InputError
from vramdoctor.redact import one_line
from vramdoctor.render import console
from vramdoctor.render.files import ReportMeta, write_report
from vramdoctor.render.table import Table

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
LEAKING = FIX / "soak" / "h200-leaking.jsonl"
HOSTILE = ROOT / "tests" / "support" / "hostile_server.py"
FORGED = "STABLE: no leak in 18 series over 7 days."


# --- newlines in one-line fields ----------------------------------------------------------


def test_one_line_shows_every_line_break() -> None:
    assert one_line("a\nb\r\nc\u2028d\x85e") == "a\\nb\\r\\nc\\u2028d\\x85e"
    assert one_line("plain") == "plain"


def test_a_table_cell_never_starts_a_row() -> None:
    t = Table()
    t.add_column("where")
    t.add_column("verdict")
    t.add_row(f"gpu-a\n{FORGED}", Text("LEAK\nSTABLE", style="red"))
    for width in (None, 80, 40):
        lines = t.plain(width).splitlines()
        assert not any(line.lstrip().startswith(("STABLE", FORGED)) for line in lines), lines
        assert "\\n" in t.plain(width)


def test_messages_never_start_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    console._reset()
    console.error(f"bad model id qwen\n{FORGED}")
    console.note(f"server: qwen\n{FORGED}")
    console.interrupted(f"interrupted\n{FORGED}")
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 3, err
    assert all(line.startswith(("vramdoctor: ", "server: ")) for line in err.splitlines())
    console._reset()


@pytest.fixture
def hostile() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(HOSTILE), f"qwen\n{FORGED}", f"lbl\n{FORGED}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def test_a_model_id_with_a_newline_starts_no_line_in_soak(hostile: str, tmp_path: Path) -> None:
    page = nvitop_text(
        "gpu-host",
        [{"index": 0, "name": "H100", "uuid": "GPU-1", "total": 81559.0, "used": 2e4,
          "free": 61559.0}],
        [{"index": 0, "pid": 4242, "mib": 19000.0, "command": "python -m server"}],
    )  # fmt: skip
    with serve(metrics_only(page)) as exporter:
        r = vd(
            "soak", "--url", hostile, "--gpu-metrics", exporter, "--rounds", "2", "--no-adapt",
            "--requests", "2", "--concurrency", "1", "--idle", "0.3", "--baseline", "0.3",
            "--interval", "0.1", "--text-only", "--max-tokens", "1", "--timeout", "5",
            "--out", str(tmp_path / "run.jsonl"), cwd=tmp_path, timeout=180,
        )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr
    for stream in (r.stdout, r.stderr):
        assert not any(line.lstrip("│ ").startswith(FORGED) for line in stream.splitlines()), stream
    assert "qwen\\nSTABLE" in r.stderr  # shown, escaped: the operator sees something odd
    # the run file keeps it exact (JSON escapes it the JSON way)
    assert json.dumps(f"qwen\n{FORGED}")[1:-1] in (tmp_path / "run.jsonl").read_text()


# --- reports never follow a planted symlink ----------------------------------------------


def test_write_report_replaces_a_planted_link_and_leaves_its_target(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me")
    link = tmp_path / "report.html"
    link.symlink_to(target)
    write_report(link, "<html>report</html>")
    assert target.read_text() == "keep me"
    assert not link.is_symlink() and link.read_text() == "<html>report</html>"


def test_write_report_failing_leaves_the_old_file_and_says_so(tmp_path: Path) -> None:
    old = tmp_path / "r.txt"
    old.write_text("old")
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):
            pytest.skip("running as root: a read-only folder is still writable")
        with pytest.raises(InputError, match=r"cannot write report .*r\.txt"):
            write_report(old, "new")
        assert old.read_text() == "old"
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    finally:
        os.chmod(tmp_path, 0o700)
    with pytest.raises(InputError, match="is a directory"):
        write_report(tmp_path, "x")


def test_write_report_leaves_no_temporary_file_when_the_disk_is_full(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    # a folder whose writes fail: RLIMIT_FSIZE makes the kernel refuse the bytes (a real EFBIG)
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))\n"
        "from vramdoctor.render.files import write_report\n"
        "from vramdoctor.errors import InputError\n"
        f"p = {str(tmp_path / 'r.html')!r}\n"
        "open(p, 'w').write('old')\n"
        "try:\n    write_report(p, 'x' * 100000)\nexcept InputError as e:\n    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "cannot write report" in r.stdout, (r.stdout, r.stderr)
    assert (tmp_path / "r.html").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_census_report_replaces_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "census.html").symlink_to(target)
    page = nvitop_text(
        "h", [{"index": 0, "name": "H100", "uuid": "G", "total": 81559.0, "used": 1e3,
               "free": 80559.0}], [],
    )  # fmt: skip
    with serve(metrics_only(page)) as url:
        r = vd("census", "--gpu-metrics", url, "--report", "census.html", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    assert target.read_text() == "keep me"
    html = (tmp_path / "census.html").read_text()
    assert "<html" in html and "vramdoctor " in html and "census report" in html


def test_soak_report_replaces_a_planted_link_and_says_what_made_it(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "soak.html").symlink_to(target)
    r = vd("report", str(LEAKING), "--report", "soak.html", cwd=tmp_path, timeout=180)
    assert r.returncode == 1, r.stderr
    assert target.read_text() == "keep me"
    page = (tmp_path / "soak.html").read_text()
    assert f"run file: <code>{LEAKING}</code>" in page and "vramdoctor " in page
    assert " UTC" in page and ">NOT_MEASURED<" not in page and ">NOT MEASURED<" in page


def test_the_html_report_of_an_attribute_run_carries_the_attribution(tmp_path: Path) -> None:
    run = FIX / "attribute" / "soak_run" / "run.jsonl"
    r = vd("report", str(run), "--report", "a.html", cwd=tmp_path, timeout=180)
    assert r.returncode in (0, 1), r.stderr
    page = (tmp_path / "a.html").read_text()
    assert "Which code holds it (attribution)" in page and "covers: pid" in page
    plain = vd("report", str(LEAKING), "--report", "l.html", cwd=tmp_path, timeout=180)
    assert plain.returncode == 1
    assert "attribution" not in (tmp_path / "l.html").read_text().lower()


def test_report_meta_names_tool_version_command_run_file_and_time() -> None:
    meta = ReportMeta("soak", run_file="runs/x.jsonl")
    line = meta.line()
    assert line.startswith("vramdoctor ") and "soak report" in line and "runs/x.jsonl" in line
    assert line.endswith("UTC")
    assert "runs/x.jsonl" in meta.html() and "<script" not in ReportMeta("<script>").html()


# --- a terminal that is not UTF-8 --------------------------------------------------------


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_a_report_on_a_latin1_or_ascii_terminal_gives_the_verdict(
    encoding: str, tmp_path: Path
) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "vramdoctor", "report", str(LEAKING)],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": encoding, "NO_COLOR": "1"},
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 1, r.stderr.decode(encoding, "replace")
    out = r.stdout.decode(encoding)  # encodable: no UnicodeEncodeError, no mojibake bytes
    assert "LEAK" in out and "13.7 MiB" in out
    assert b"Traceback" not in r.stderr
    assert "\\u" not in out  # stand-ins, not escapes, for the glyphs we print


def test_ascii_fallback_has_a_stand_in_for_every_glyph_we_print() -> None:
    text = "▁▂▃▄▅▆▇█ … → ≈ ≤ ≥ × ± – — ─ │ ━"
    shown = console.ascii_fallback(text, "ascii")
    assert shown.isascii() and "?" not in shown
    assert console.ascii_fallback("héllo 12.5 %", "latin-1") == "héllo 12.5 %"


# --- damaged run files --------------------------------------------------------------------


def _damaged(tmp_path: Path, name: str, change: object) -> Path:
    lines = LEAKING.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        out.append(change(i, line))  # type: ignore[operator]
    path = tmp_path / name
    path.write_text("\n".join(out) + "\n")
    return path


def test_a_401_digit_time_is_one_skipped_line_not_an_internal_error(tmp_path: Path) -> None:
    path = _damaged(
        tmp_path, "digits.jsonl",
        lambda i, line: line.replace('"t":', '"t":' + "9" * 401 + ',"x":', 1) if i == 5 else line,
    )  # fmt: skip
    r = vd("report", str(path), cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # the leak is still found from the other lines
    assert "internal error" not in r.stderr
    assert "a number of 401 digits, beyond any measurement; skipped" in r.stdout + r.stderr


def test_nan_times_do_not_invent_a_server_death(tmp_path: Path) -> None:
    path = _damaged(
        tmp_path, "nan.jsonl",
        lambda i, line: line.replace('"t":', '"t":NaN,"x":', 1) if i and i % 3 == 0 else line,
    )  # fmt: skip
    r = vd("report", str(path), cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    text = r.stdout + r.stderr
    assert "death" not in text and "died" not in text, text
    assert "damaged" in text


def test_a_watch_header_with_bucket_s_0_is_damaged_settings(tmp_path: Path) -> None:
    header = {
        "kind": "header", "schema": "vramdoctor.run/1", "tool": "vramdoctor",
        "tool_version": "0.1.0", "command": "watch", "t": 1.0, "wall": 1.79e9,
        "config": {"bucket_s": 0, "max_buckets": 360, "warmup_s": 0},
    }  # fmt: skip
    sample = {"kind": "host", "t": 2.0, "wall": 1.79e9 + 1, "processes": []}
    path = tmp_path / "watch.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps(sample) + "\n")
    r = vd("report", str(path), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"vramdoctor: error: {path}: damaged watch settings in the header"
    ]


# --- a proxy that carries a loopback URL is named ---------------------------------------


def test_a_loopback_server_behind_http_proxy_names_the_proxy(tmp_path: Path) -> None:
    server = RefServer("plain")
    try:
        env = {"http_proxy": "http://user:pw-secret-9@127.0.0.1:9", "no_proxy": ""}
        r = vd(
            "soak", "--url", server.url, "--rounds", "1", "--requests", "2", "--idle", "0.5",
            "--text-only", "--no-adapt", "--out", str(tmp_path / "r.jsonl"),
            env=env, cwd=tmp_path, timeout=120,
        )  # fmt: skip
        assert r.returncode == 2, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("vramdoctor: error: ") and "through the proxy" in last, r.stderr
        assert "http://127.0.0.1:9 (http_proxy)" in last and "no_proxy=127.0.0.1" in last
        assert "pw-secret-9" not in r.stderr
        direct = vd(
            "soak", "--url", server.url, "--rounds", "1", "--requests", "2", "--idle", "0.5",
            "--text-only", "--no-adapt", "--out", str(tmp_path / "d.jsonl"),
            env={**env, "no_proxy": "127.0.0.1"}, cwd=tmp_path, timeout=120,
        )  # fmt: skip
        assert direct.returncode in (0, 1), direct.stderr
        assert "through the proxy" not in direct.stderr
    finally:
        server.stop()


# --- Ctrl-C is one line everywhere; warnings are one note ----------------------------------


@pytest.fixture(scope="module")
def slow_url() -> Iterator[str]:
    """A loopback server that never answers in time (a stuck Prometheus, exporter or server)."""

    def respond(path: str) -> tuple[int, str, str]:
        time.sleep(30)
        return 200, "text/plain", ""

    with serve(respond) as url:
        yield url


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = (ROOT / "examples" / "logs").glob("*.log")
    lines = "".join(p.read_text() for p in sorted(src))
    path = tmp_path_factory.mktemp("log") / "big.log"
    with path.open("w") as f:
        for _ in range(max(1, 30_000_000 // max(1, len(lines)))):
            f.write(lines)
    return path


@pytest.fixture(scope="module")
def big_snapshots(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The recorded escape pair, the second repeated 30,000 times at new addresses: a few seconds
    of attribution (the recorded files take 0.3 s, so a Ctrl-C at 0.5 s could land after the
    end; seen in CI: exit 1 and nothing said, the command had finished)."""
    first, second = sorted((FIX / "attribute" / "gpu").glob("escape-*.pickle"))[:2]
    snap = pickle.loads(second.read_bytes())
    snap["segments"] = [
        {**seg, "address": seg["address"] + (k << 36),
         "blocks": [{**b, "address": b["address"] + (k << 36)} for b in seg["blocks"]]}
        for k in range(1, 30_001)
        for seg in snap["segments"]
    ]  # fmt: skip
    path = tmp_path_factory.mktemp("snap") / "big-escape-1.pickle"
    path.write_bytes(pickle.dumps(snap))
    return [str(first), str(path)]


def _commands(slow: str, log: Path, snaps: list[str]) -> dict[str, list[str]]:
    return {
        "diagnose": ["diagnose", str(log)],
        "fleet": ["fleet", "--prometheus", slow],
        "watch": ["watch", "--server", slow, "--duration", "60s", "--no-exporter"],
        "census": ["census", "--gpu-metrics", slow],
        "attribute": ["attribute", *snaps],
        # with a chart: 2.5 s here (the text report alone, 1.6 s, could end before a Ctrl-C at 1.5)
        "report": ["report", str(LEAKING), "--report", "chart.png"],
        "soak": ["soak", "--url", slow, "--rounds", "1", "--requests", "1", "--timeout", "30"],
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (/proc/PID/stat), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _exited(pid: int) -> bool:
    """The child has exited and waits to be reaped (a zombie): a Ctrl-C now finds nobody."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _wait_into_its_run(proc: subprocess.Popen[str], delay: float) -> None:
    """`delay` seconds, and at least until the child has spent 0.15 CPU seconds: Python's own
    start-up (site, before any of vramdoctor runs) costs about 0.03, and on a loaded machine
    it can take longer than `delay` in wall time; a Ctrl-C there is Python's, not ours."""
    start = time.monotonic()
    while proc.poll() is None and time.monotonic() - start < 60:
        if time.monotonic() - start >= delay and _cpu_seconds(proc.pid) >= 0.15:
            return
        time.sleep(0.01)


@pytest.mark.parametrize("command", ["diagnose", "fleet", "watch", "census", "attribute",
                                     "report", "soak"])  # fmt: skip
def test_ctrl_c_is_one_line_and_130_at_any_moment(
    command: str, slow_url: str, big_log: Path, big_snapshots: list[str], tmp_path: Path
) -> None:
    args = _commands(slow_url, big_log, big_snapshots)[command]
    for delay in (0.5, 1.5):
        proc = subprocess.Popen(
            [sys.executable, "-m", "vramdoctor", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "NO_COLOR": "1", "CI": "1"},
            cwd=tmp_path,
        )
        _wait_into_its_run(proc, delay)
        finished = proc.poll() is not None or _exited(proc.pid)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
        if finished:
            continue  # it was done before the Ctrl-C: nothing to say about it
        assert "Traceback" not in err, (delay, err)
        lines = [ln for ln in err.splitlines() if "interrupted" in ln]
        assert len(lines) == 1 and lines[0].startswith("vramdoctor: interrupted"), (delay, err)
        # 130, or killed by the re-raised SIGINT (a shell shows both as 130)
        assert proc.returncode in (130, -signal.SIGINT), (delay, proc.returncode, err)


def test_a_librarys_warning_is_one_note_line(tmp_path: Path) -> None:
    """matplotlib warns (a glyph missing from its font) in several lines with its source line;
    the user sees one note."""
    lines = LEAKING.read_text().splitlines()
    header = json.loads(lines[0])
    header["target"] = "http://gpu-host:30000/\u4e2d\u6587"  # CJK: not in matplotlib's font
    (tmp_path / "run.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    r = vd("report", "run.jsonl", "--report", "chart.png", cwd=tmp_path, timeout=180)
    assert r.returncode == 1, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if "Glyph" in ln or "Warning" in ln]
    assert warned, r.stderr  # the warning is said (the test must see it to mean anything)
    assert all(ln.startswith("note: ") for ln in warned), r.stderr
    assert "UserWarning" not in r.stderr and "savefig" not in r.stderr
