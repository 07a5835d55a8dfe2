"""Shared test plumbing: `gpu`-marked tests skip cleanly where there is no NVIDIA GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def _nvidia_gpu_present() -> bool:
    """A driver that NVML can open and at least one GPU: what every gpu test needs first.

    Tests that also need torch or two GPUs skip themselves for that.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _nvidia_gpu_present():
        skip = pytest.mark.skip(
            reason="needs an NVIDIA GPU (run on the GPU machine: pytest -m gpu)"
        )
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def server_factory() -> Iterator[Any]:
    """Start reference servers (tests/support/procs.RefServer); all are stopped at the end."""
    from support.procs import RefServer

    started: list[RefServer] = []

    def make(mode: str, *extra: str, env: dict[str, str] | None = None) -> RefServer:
        s = RefServer(mode, *extra, env=env)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()
