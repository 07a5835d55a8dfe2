"""The README's commands are what users run first: they must keep working."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from helpers_procs import run_cli

ROOT = Path(__file__).resolve().parents[1]
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
        proc = vramdoctor(argv[0], "--help")
        assert proc.returncode == 0, f"{line}: {proc.stderr or proc.stdout}"
        for option in (a for a in argv[1:] if a.startswith("--")):
            assert option.split("=")[0] in proc.stdout, f"{line}: {option} is not an option of {argv[0]}"


def test_readme_report_example_reanalyses_a_recorded_gpu_run() -> None:
    proc = vramdoctor("report", "tests/fixtures/soak/h200-leaking.jsonl")
    assert proc.returncode == 1
    assert "LEAK" in proc.stdout
