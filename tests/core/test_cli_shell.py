"""The CLI shell as users meet it: entry points, --version, --help, exit codes, NO_COLOR."""

from __future__ import annotations

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
