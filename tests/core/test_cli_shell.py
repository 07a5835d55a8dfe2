"""The CLI shell as users meet it: entry points, --version, --help, exit codes, NO_COLOR."""

from __future__ import annotations

import re

import pytest
from support.procs import run_cli

from vramdoctor import __version__
from vramdoctor.cli import main

COMMANDS = ["soak", "diagnose", "ab-test", "census", "report"]


def test_version_flag_via_python_m() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"vramdoctor {__version__}"


def test_help_lists_every_command() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    for command in COMMANDS:
        assert command in proc.stdout
    assert "Exit codes" in proc.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_help_with_examples(command: str) -> None:
    proc = run_cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout
    assert "Example" in proc.stdout, f"{command} --help shows no examples"


def test_unknown_command_is_usage_error() -> None:
    assert main(["no-such-command"]) == 2


def test_unknown_option_is_usage_error() -> None:
    assert main(["census", "--no-such-option"]) == 2


def test_plain_output_when_piped_and_no_color() -> None:
    proc = run_cli("--help", env={"NO_COLOR": "1", "TERM": "xterm-256color"})
    assert proc.returncode == 0
    assert "\x1b[" not in proc.stdout


# --- the house: the command list, global options, suggestions, help pages ---------------------


def test_the_command_list_is_what_is_registered_in_that_order() -> None:
    import importlib

    import typer.main

    from vramdoctor.cli import COMMANDS, app

    for module in COMMANDS.values():
        importlib.import_module(f"vramdoctor.cli.{module}")
    registered = list(getattr(typer.main.get_command(app), "commands", {}))
    assert sorted(registered) == sorted(COMMANDS), "a command registered but not listed, or back"
    page = run_cli("--help", env={"NO_COLOR": "1"}).stdout
    listed = page.split("Commands:", 1)[1].split("Options:", 1)[0]
    order = [
        line.split()[0] for line in listed.splitlines() if line.startswith("  ") and line[2] != " "
    ]
    assert order == list(COMMANDS), order


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "import sys\nfrom vramdoctor.cli import main\n"
        "try:\n    main(['census', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('vramdoctor.cli.')))\n"
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    ).stdout.splitlines()[-1]
    assert "vramdoctor.cli.census" in out and "vramdoctor.cli.diagnose" not in out, out


def test_global_options_are_accepted_after_the_command() -> None:
    run_file = "tests/fixtures/soak/h200-plain.jsonl"
    r = run_cli("report", run_file, "--no-color", "--width", "70", env={"FORCE_COLOR": "1"})
    assert r.returncode == 0, r.stderr
    assert "\x1b[" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 72, r.stdout


@pytest.mark.parametrize(
    "args, suggestion",
    [
        (["soak", "--bogus"], None),
        (["soak", "--rpund", "3"], "--rounds"),
        (["census", "--jsn"], "--json"),
        (["sok"], "soak"),
    ],
)
def test_a_wrong_option_suggests_only_a_close_one(args: list[str], suggestion: str | None) -> None:
    r = run_cli(*args)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    if suggestion is None:
        assert "did you mean" not in line, line
    else:
        assert f"did you mean {suggestion}?" in line, line


def test_help_examples_are_whole_lines_even_at_60_columns() -> None:
    import importlib
    import inspect

    import typer.main

    from vramdoctor.cli import COMMANDS, app

    for module in COMMANDS.values():
        importlib.import_module(f"vramdoctor.cli.{module}")
    for name in COMMANDS:
        page = run_cli("--width", "60", name, "--help").stdout
        command = getattr(typer.main.get_command(app), "commands", {})[name]
        doc = inspect.cleandoc(command.help or "")
        examples = [ln.strip() for ln in doc.splitlines() if ln.startswith("  vramdoctor ")]
        assert examples, f"{name} --help has no example"
        shown = [ln.strip() for ln in page.splitlines()]
        for example in examples:
            assert example in shown, f"{name}: {example!r} is not one whole line of --help"
        broken = [ln for ln in page.splitlines() if re.search(r"[A-Za-z]-$", ln.rstrip())]
        assert not broken, f"{name}: a word broken at a hyphen: {broken}"


def test_the_cli_uses_no_private_typer_or_rich_help_api() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "vramdoctor"
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for private in ("typer._click", "from typer import _click", "rich_utils"):
            assert private not in text, f"{path} uses {private}"
