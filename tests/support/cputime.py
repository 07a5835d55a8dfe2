"""CPU seconds per test, for finding the expensive tests on a shared (loaded) machine.

`--durations` gives wall time, which on a machine other runs share says more about them than
about the test. This plugin counts, for each test (setup, call and teardown), the CPU its
worker process used plus what its reaped child processes used (`resource.getrusage`: servers
and CLI runs a test starts and waits for), and prints the most expensive ones and the total at
the end of the run, each worker's separately under pytest-xdist:

    PYTHONPATH=tests python -m pytest -n 0 -p support.cputime    # top 30, printed at the end
    PYTHONPATH=tests VRAMDOCTOR_CPUTIME_FILE=/tmp/cpu.txt VRAMDOCTOR_CPUTIME_TOP=60 \
        python -m pytest -p support.cputime

A child still running when its test ends (a session fixture's server) is counted when it is
reaped, in the test that reaps it. Numbers are seconds of CPU (user + system).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import pytest

_spent: dict[str, float] = {}


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    start = _cpu()
    yield
    _spent[item.nodeid] = _spent.get(item.nodeid, 0.0) + _cpu() - start


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _spent:
        return
    top = int(os.environ.get("VRAMDOCTOR_CPUTIME_TOP", "30"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    lines = [f"\nCPU seconds per test ({worker}): {sum(_spent.values()):.1f} s in all"]
    for nodeid, cpu in sorted(_spent.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{cpu:8.1f} s  {nodeid}")
    path = os.environ.get("VRAMDOCTOR_CPUTIME_FILE")
    text = "\n".join(lines) + "\n"
    if path:  # xdist workers' output is not shown: each appends to this file
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
