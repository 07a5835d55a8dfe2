"""The one way tests run vramdoctor as a user does, and the one soak command-line builder.

    from support.cli import vd, soak_args
    r = vd("report", "run.jsonl", "--json")                      # CompletedProcess[str]
    r = vd("diagnose", "-", stdin=b"...", text=False)            # bytes in and out
    r = vd(*soak_args(url, rounds=3, out=tmp / "run.jsonl"), cwd=tmp, timeout=180)

`vd` runs `python -m vramdoctor ARGS` in a subprocess (the real entry point: argument parsing,
exit codes, one-line errors, the Ctrl-C handler), with output captured, in the environment of
`cli_env` (this one's, minus API keys, plus NO_COLOR=1 and CI=1) and the `env` given on top.
`clean=True` starts from an empty environment instead (PATH only), for tests that must not
inherit anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["cli_env", "soak_args", "vd"]

_SECRET_VARS = ("OPENAI_API_KEY", "VRAMDOCTOR_API_KEY")


def cli_env(**extra: str) -> dict[str, str]:
    """This environment without API keys, with NO_COLOR=1 and CI=1 (no live views), + extra."""
    env = {k: v for k, v in os.environ.items() if k not in _SECRET_VARS}
    env.update(NO_COLOR="1", CI="1", **extra)
    return env


def vd(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    clean: bool = False,
    timeout: float = 120,
    stdin: str | bytes | None = None,
    text: bool = True,
) -> subprocess.CompletedProcess[Any]:
    """`python -m vramdoctor ARGS`, output captured. `env` is added on top of `cli_env()`
    (or of PATH alone with `clean`); `stdin` is sent as input; `text=False` for bytes."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")} if clean else cli_env()
    return subprocess.run(
        [sys.executable, "-m", "vramdoctor", *args],
        capture_output=True,
        text=text,
        input=stdin,
        timeout=timeout,
        env={**base, **(env or {})},
        cwd=cwd,
        check=False,
    )


def soak_args(
    url: str,
    *,
    rounds: int = 4,
    requests: int = 20,
    idle: float = 2.0,
    adapt: bool = False,
    text_only: bool = True,
    interval: float | None = None,
    out: Path | str | None = None,
    json: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """`soak --url URL ...` with the settings tests use most: a fixed number of rounds
    (`adapt` off), text-only requests, short idle windows. `extra` is appended verbatim."""
    args = ["soak", "--url", url, "--rounds", str(rounds), "--requests", str(requests)]
    args += ["--idle", f"{idle:g}"]
    if not adapt:
        args.append("--no-adapt")
    if text_only:
        args.append("--text-only")
    if interval is not None:
        args += ["--interval", f"{interval:g}"]
    if out is not None:
        args += ["--out", str(out)]
    if json:
        args.append("--json")
    return [*args, *extra]
