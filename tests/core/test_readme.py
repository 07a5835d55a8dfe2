"""The README's commands are what users run first: they must keep working."""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import run_cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
LINES = [
    line.split("#")[0].strip()
    for block in BLOCKS
    for line in block.replace("\\\n", " ").splitlines()
    if line.strip()
]


def vramdoctor(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=ROOT, env={"COLUMNS": "200", "NO_COLOR": "1"})


@functools.cache
def help_of(command: str) -> subprocess.CompletedProcess[str]:
    """`vramdoctor COMMAND --help`, once per command (the README names each many times)."""
    return vramdoctor(command, "--help")


def test_quick_start_diagnoses_the_shipped_real_log() -> None:
    first = BLOCKS[0].strip()
    assert first.startswith("python3 -m pip install . && vramdoctor diagnose ")
    args = shlex.split(first.split("&&", 1)[1])[1:]
    assert (ROOT / args[1]).is_file()
    proc = vramdoctor(*args)
    assert proc.returncode == 1, proc.stderr  # it finds a critical CUDA OOM
    assert "CUDA out of memory" in proc.stdout
    assert "prefill" in proc.stdout


def test_ci_runs_the_readme_test_command() -> None:
    test_command = BLOCKS[1].strip()
    assert "pytest" in test_command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command.replace("python3 ", "python ") in ci or test_command in ci


def test_every_vramdoctor_command_in_the_readme_parses() -> None:
    commands = [line for line in LINES if line.startswith("vramdoctor ")]
    assert len(commands) >= 10
    for line in commands:
        argv = shlex.split(line.split("&&")[0].split("|")[0])[1:]
        # Local files the README names must ship with the project.
        for arg in argv:
            if arg.startswith(("examples/", "tests/fixtures/")):
                assert (ROOT / arg).exists(), f"README names {arg}, which does not exist"
        # Every option must be one the command documents.
        proc = help_of(argv[0])
        assert proc.returncode == 0, f"{line}: {proc.stderr or proc.stdout}"
        own = argv[1 : argv.index("--")] if "--" in argv else argv[1:]  # after --: the server's
        for option in (a for a in own if a.startswith("--")):
            assert option.split("=")[0] in proc.stdout, (
                f"{line}: {option} is not an option of {argv[0]}"
            )


def test_readme_report_example_reanalyses_a_recorded_gpu_run() -> None:
    proc = vramdoctor("report", "tests/fixtures/soak/h200-leaking.jsonl")
    assert proc.returncode == 1
    assert "LEAK" in proc.stdout


def _commands() -> list[str]:
    import typer.main

    from vramdoctor.cli import app

    return sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_help_pages_name_values_not_python_types() -> None:
    raw = re.compile(r"<(?:list\[|bool>|str>|int>|float>|path>|Path>)")
    for name in ["", *_commands()]:
        proc = help_of(name) if name else vramdoctor("--help")
        assert proc.returncode == 0, f"{name} --help: {proc.stderr}"
        assert not raw.search(proc.stdout), (
            f"vramdoctor {name} --help shows a Python type: {raw.search(proc.stdout)}"
        )
        assert not re.search(r"-\.jsonl|--\.jsonl", proc.stdout), (
            f"vramdoctor {name} --help lost a file-name pattern"
        )


def test_no_color_is_one_switch_for_every_command() -> None:
    run_file = "tests/fixtures/soak/h200-leaking.jsonl"
    forced = run_cli("report", run_file, cwd=ROOT, env={"COLUMNS": "200", "FORCE_COLOR": "1"})
    assert "\x1b[" in forced.stdout  # coloured when forced
    plain = run_cli(
        "--no-color", "report", run_file, cwd=ROOT, env={"COLUMNS": "200", "FORCE_COLOR": "1"}
    )
    assert plain.returncode == forced.returncode and "\x1b[" not in plain.stdout


NO_MATPLOTLIB = (
    "import sys, importlib.abc\n"
    "class _No(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'matplotlib':\n"
    "            raise ImportError('No module named matplotlib (blocked by the test)')\n"
    "sys.meta_path.insert(0, _No())\n"
    "from vramdoctor.cli import main\n"
)


@pytest.mark.parametrize(
    "run_file",
    ["tests/fixtures/soak/h200-leaking.jsonl", "tests/fixtures/abtest/h200-qwen2_5_vl.jsonl"],
)
def test_base_install_reports_and_a_chart_names_the_extra(run_file: str, tmp_path: Path) -> None:
    def report(*extra: str) -> subprocess.CompletedProcess[str]:
        code = NO_MATPLOTLIB + f"sys.exit(main(['report', {run_file!r}, *{list(extra)!r}]))\n"
        return subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "COLUMNS": "200"},
        )

    assert report().returncode in (0, 1)  # the report itself needs no matplotlib
    chart = report("--report", str(tmp_path / "chart.png"))
    assert chart.returncode == 2
    assert "Traceback" not in chart.stderr
    assert "pip install 'vramdoctor[charts]'" in chart.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "chart.png").exists()


def test_report_json_is_versioned_and_names_its_run_file() -> None:
    for run_file, schema in (
        ("tests/fixtures/soak/h200-leaking.jsonl", "vramdoctor.soak/"),
        ("tests/fixtures/abtest/h200-qwen2_5_vl.jsonl", "vramdoctor.abtest/"),
    ):
        doc = json.loads(vramdoctor("report", run_file, "--json").stdout)
        assert str(doc["schema"]).startswith(schema)
        named = doc.get("run_file") or (doc.get("run") or {}).get("path")
        assert named == run_file
