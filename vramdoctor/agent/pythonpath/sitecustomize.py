"""vramdoctor agent loader: `PYTHONPATH=$(vramdoctor agent-path) VRAMDOCTOR_AGENT_DIR=/dir python ...`.

Starts `vramdoctor_agent` (does nothing without VRAMDOCTOR_AGENT_DIR), then runs the
sitecustomize this one shadows, if any, so an existing site customisation keeps working.
"""

import os as _os
import sys as _sys

_HERE = _os.path.dirname(_os.path.abspath(__file__))


def _boot() -> None:
    try:
        import vramdoctor_agent

        vramdoctor_agent.boot()
    except Exception as exc:  # never stop the interpreter from starting
        _sys.stderr.write(
            f"vramdoctor-agent[{_os.getpid()}]: not started: {type(exc).__name__}: {exc}\n"
        )


def _chain() -> None:
    """Execute the next `sitecustomize` on sys.path (the one ours shadows)."""
    import importlib.machinery
    import importlib.util

    def other(entry: str) -> bool:
        try:
            return _os.path.abspath(entry or _os.getcwd()) != _HERE
        except OSError:
            return True

    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in _sys.path if other(p)]
    )
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    module = importlib.util.module_from_spec(spec)
    _sys.modules["_vramdoctor_chained_sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors surface as they would have without us


_boot()
_chain()
