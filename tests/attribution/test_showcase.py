"""The showcases of docs/attribute.md show what the page says they show: one server,
one leak, the report agreeing with the truth the server itself reports, and the page's text
being the report's own output."""

from __future__ import annotations

import json
import re
from pathlib import Path

from support.procs import run_cli

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "tests" / "fixtures" / "attribute" / "showcase_cpu"
DOC = ROOT / "docs" / "attribute.md"
MIB = 1024 * 1024


def _attribution_block(text: str) -> str:
    """The report's attribution section: from its title to the end, trailing spaces dropped."""
    start = text.index("Attribution (")
    return "\n".join(line.rstrip() for line in text[start:].strip().splitlines())


def test_the_cpu_showcase_is_one_server_one_leak_and_the_report_says_so() -> None:
    truth = json.loads((CPU / "truth.json").read_text())
    assert truth["leak_bytes_per_request"] == MIB and truth["mode"] == "leaking"
    r = run_cli("report", str(CPU / "run.jsonl"), "--json")
    d = json.loads(r.stdout)
    header = json.loads((CPU / "run.jsonl").read_text().splitlines()[0])
    server = truth["pid"]
    assert header["config"]["server_tree"] == {str(server): "python"}  # one server, one process
    assert header["config"]["agent"]["found_in"] == "the server's environment"
    host = d["layers"]["host"]
    assert host["verdict"] == "LEAK" and d["culprit"]["pid"] == server
    assert abs(host["rate_per_request"] - 1.0) < 0.05  # MiB, the truth's 1 MiB
    (proc,) = d["attribution"]["python"]
    (line,) = proc["growing"]
    assert line["frames"][-1][0].endswith("refserver/modes/leaking.py")
    src = (ROOT / "examples/reference_server/refserver/modes/leaking.py").read_text().splitlines()
    assert "np.ones(nbytes" in src[line["frames"][-1][1] - 1]  # the line that keeps the buffer
    assert abs(line["bytes_per_request"] - MIB) < 0.01 * MIB


def test_the_page_shows_the_showcase_reports_own_words() -> None:
    page = DOC.read_text()
    text = run_cli("report", str(CPU / "run.jsonl"), env={"NO_COLOR": "1", "COLUMNS": "100"}).stdout
    block = _attribution_block(text)
    shown = re.search(r"```\n(Attribution \(Python allocations by line.*?)```", page, re.S)
    assert shown, "docs/attribute.md shows no CPU showcase attribution block"
    assert shown.group(1).strip() == block


GPU_RUN = ROOT / "tests" / "fixtures" / "attribute" / "soak_run" / "run.jsonl"


def test_the_gpu_showcase_is_one_server_alone_on_the_gpu() -> None:
    from vramdoctor.record import read_run
    from vramdoctor.samples import GpuSample

    run = read_run(GPU_RUN)
    tree = {int(p) for p in run.header["config"]["server_tree"]}
    on_gpu = {p.pid for s in run.of(GpuSample) for p in s.processes}
    assert on_gpu <= tree, f"other processes on the GPU: {sorted(on_gpu - tree)}"
    d = json.loads(run_cli("report", str(GPU_RUN), "--json").stdout)
    vram = d["layers"]["vram"]
    assert vram["verdict"] == "LEAK" and abs(vram["rate_per_request"] - 1.0) < 0.05
    assert d["culprit"]["pid"] in tree
    (proc,) = d["attribution"]["processes"]
    (g,) = proc["growing"]
    assert abs(g["bytes_per_request"] - MIB) < 0.01 * MIB
