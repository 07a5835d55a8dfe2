"""Shared test plumbing: `gpu`-marked tests skip cleanly where there is no NVIDIA GPU."""

from __future__ import annotations

from pathlib import Path

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
