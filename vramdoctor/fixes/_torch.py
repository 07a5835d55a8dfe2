"""The one place `vramdoctor.fixes` and `vramdoctor.abtest` import torch.

torch is an optional extra: `import vramdoctor.fixes` must work without it, and using a fix
without it must say what to install in one line rather than fail with an ImportError deep in
a call stack.
"""

from __future__ import annotations

from types import ModuleType

from vramdoctor.errors import MissingExtra


def load_torch(what: str = "vramdoctor.fixes") -> ModuleType:
    """Import torch on first use; raise MissingExtra naming the fix when it is absent."""
    try:
        import torch
    except ImportError:
        raise MissingExtra(what, "torch") from None
    module: ModuleType = torch
    return module


def torch_available() -> bool:
    """True when torch can be imported (does not import it)."""
    import importlib.util
    import sys

    if "torch" in sys.modules:
        return sys.modules["torch"] is not None
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def cuda_usable(torch: ModuleType) -> bool:
    """True when torch was built with CUDA and sees at least one GPU."""
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver install reports itself as an exception here
        return False


def has_mem_pool(torch: ModuleType) -> bool:
    """MemPool/use_mem_pool to scope, and the allocator's live-block check to guard the scope."""
    return (
        hasattr(torch.cuda, "MemPool")
        and hasattr(torch.cuda, "use_mem_pool")
        and hasattr(torch._C, "_cuda_checkPoolLiveAllocations")
        and hasattr(torch._C, "_cuda_memoryStats")
    )
