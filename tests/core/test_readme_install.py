"""The README's install lines work on a fresh machine (the first-hour walk, docs/first-hour.md).

vramdoctor is not on the package index: `pip install vramdoctor` in a fresh venv fails ("No
matching distribution"). Every install line of the README must install from the clone (`.`,
`'.[extra]'`, `-e .`), every extra it names must be one the package declares (pyproject's, as installed), and the README must
say where to run them (a clone).
"""

from __future__ import annotations

import re
import shlex
from importlib.metadata import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
EXTRAS = set(metadata("vramdoctor").get_all("Provides-Extra") or [])  # pyproject's


def _pip_installs() -> list[list[str]]:
    """The arguments of every `pip install` in the README's shell blocks."""
    out = []
    for block in BLOCKS:
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("#")[0].split("&&"):
                argv = shlex.split(part)
                if "pip" in argv and "install" in argv:
                    out.append(argv[argv.index("install") + 1 :])
    return out


def test_every_readme_install_line_installs_from_the_clone() -> None:
    installs = _pip_installs()
    assert len(installs) >= 4  # quick start, tests, and the Install section
    for args in installs:
        targets = [a for a in args if not a.startswith("-")]
        assert targets, args
        for target in targets:
            m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
            assert m, f"pip install {target}: not on the package index; install from the clone (.)"
            for extra in (m.group(1) or "").split(","):
                assert not extra or extra in EXTRAS, f"pip install {target}: no extra {extra!r}"


def test_readme_says_where_the_install_runs_and_that_the_index_has_no_vramdoctor() -> None:
    install = README.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "clone" in install and "not on the package index" in install
    quick = README.split("## Quick start", 1)[1].split("```", 1)[0]
    assert "git clone " in quick  # the quick start's `pip install .` needs a clone to stand in
