"""vramdoctor.fixes without a GPU: import without torch, the install line, the budget split,
the buffer allocator, and the pass-through paths."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import NO_TORCH

from vramdoctor.errors import MissingExtra
from vramdoctor.fixes import per_worker_bytes
from vramdoctor.fixes.feature_pool import _ALIGN, _FreeList

MIB = 1024 * 1024


def _py(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH + code], capture_output=True, text=True, timeout=60
    )


def test_import_without_torch_then_use_raises_missing_extra() -> None:
    proc = _py(
        "import vramdoctor.fixes as f\n"
        "from vramdoctor.errors import MissingExtra\n"
        "assert f.escaped_bytes() == 0\n"
        "for call in (lambda: f.request_scoped_pool().__enter__(), lambda: f.peer_access(0, 1),\n"
        "             lambda: f.FeatureBufferPool(1 << 30, 2)):\n"
        "    try:\n"
        "        call()\n"
        "    except MissingExtra as exc:\n"
        "        print(exc)\n"
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3
    assert all("pip install 'vramdoctor[gpu]'" in line for line in lines)
    assert lines[0].startswith("request_scoped_pool needs torch")


def test_torch_is_imported_in_one_module_only() -> None:
    from pathlib import Path

    import vramdoctor.abtest
    import vramdoctor.fixes

    importers = []
    for pkg in (vramdoctor.fixes, vramdoctor.abtest):
        for path in Path(pkg.__path__[0]).glob("*.py"):
            text = path.read_text()
            if "import torch" in text.replace("import torchvision", ""):
                importers.append(path.name)
    assert importers == ["_torch.py"]


def test_disabled_scope_needs_nothing() -> None:
    from vramdoctor.fixes import request_scoped_pool

    with request_scoped_pool(enabled=False) as scope:
        pass
    assert not scope.pooled and "disabled" in (scope.reason or "")


@pytest.mark.parametrize(
    ("total_mib", "workers", "expected_mib"),
    [(1024, 1, 1024), (1024, 4, 256), (1024, 16, 128), (4096, 8, 512), (100, 1, 128)],
)
def test_budget_split(total_mib: int, workers: int, expected_mib: int) -> None:
    assert per_worker_bytes(total_mib * MIB, workers) == expected_mib * MIB


def test_budget_split_rejects_no_workers() -> None:
    with pytest.raises(ValueError):
        per_worker_bytes(MIB, 0)


def test_free_list_first_fit_coalesces_and_refuses_what_does_not_fit() -> None:
    fl = _FreeList(10 * _ALIGN)
    a = fl.alloc(3 * _ALIGN)
    b = fl.alloc(1)  # rounded up to one alignment unit
    c = fl.alloc(6 * _ALIGN)
    assert (a, b, c) == (0, 3 * _ALIGN, 4 * _ALIGN)
    assert fl.alloc(1) is None  # full
    fl.free(b)
    assert fl.alloc(2 * _ALIGN) is None  # only one unit free between a and c
    fl.free(a)
    assert fl.alloc(4 * _ALIGN) == 0  # a and b coalesced
    fl.free(0)
    fl.free(c)
    assert fl.used_bytes == 0
    assert fl.alloc(10 * _ALIGN) == 0


def test_outputs_to_cpu_keeps_structure_without_tensors() -> None:
    from vramdoctor.fixes import outputs_to_cpu

    data = {"a": [1, 2], "b": (3, {"c": "x"}), "d": None}
    assert outputs_to_cpu(data) == data


def test_outputs_to_cpu_on_a_real_batch_feature() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    feature = transformers.BatchFeature(
        {"pixel_values": torch.ones(2, 3), "grid": [torch.zeros(1)]}
    )
    from vramdoctor.fixes import outputs_to_cpu

    out = outputs_to_cpu(feature)
    assert type(out) is transformers.BatchFeature
    assert out["pixel_values"].device.type == "cpu" and out["grid"][0].device.type == "cpu"


def test_scope_passes_through_without_cuda() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this checks the no-CUDA path")
    from vramdoctor.fixes import request_scoped_pool

    with request_scoped_pool("cuda:0") as scope:
        x = torch.ones(4)
    assert not scope.pooled and scope.reason == "no CUDA GPU usable" and x.sum() == 4


def test_missing_extra_message_is_one_line() -> None:
    assert "\n" not in str(MissingExtra("vramdoctor ab-test", "torch"))


def test_fixes_and_abtest_are_regular_packages() -> None:
    # A directory without __init__.py imports in a checkout but is left out of the wheel.
    import vramdoctor.abtest
    import vramdoctor.fixes

    assert vramdoctor.abtest.__file__ and vramdoctor.fixes.__file__


def test_scoping_needs_the_live_block_check_not_just_mempool() -> None:
    """Without the allocator's live-block check the guard could only snapshot, which crashed
    torch 2.11 (docs/gpu-results.md), so such a torch passes through instead of scoping."""
    from types import SimpleNamespace

    from vramdoctor.fixes._torch import has_mem_pool

    cuda = SimpleNamespace(MemPool=object, use_mem_pool=object)
    full = SimpleNamespace(_cuda_checkPoolLiveAllocations=len, _cuda_memoryStats=len)
    assert has_mem_pool(SimpleNamespace(cuda=cuda, _C=full))
    assert not has_mem_pool(SimpleNamespace(cuda=cuda, _C=SimpleNamespace(_cuda_memoryStats=len)))
    assert not has_mem_pool(SimpleNamespace(cuda=SimpleNamespace(MemPool=object), _C=full))


def test_the_example_without_torch_says_what_to_install_in_one_line() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "fixes" / "scoped_processor.py"
    code = (
        NO_TORCH
        + f"import runpy; sys.argv = [{str(example)!r}]; runpy.run_path({str(example)!r}, run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'vramdoctor[gpu]'" in lines[0], proc.stderr


def test_the_example_imports_public_names_only() -> None:
    import ast

    example = Path(__file__).resolve().parents[2] / "examples" / "fixes" / "scoped_processor.py"
    for node in ast.walk(ast.parse(example.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vramdoctor"):
            module = importlib.import_module(node.module or "")
            assert not any(part.startswith("_") for part in (node.module or "").split("."))
            for alias in node.names:
                assert alias.name in module.__all__, f"{node.module}.{alias.name} is not public"
