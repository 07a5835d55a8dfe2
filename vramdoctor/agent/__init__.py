"""vramdoctor's in-process agent: what the server's allocators count, and allocator snapshots.

Enable it without touching the server's code, either per launch

    PYTHONPATH=$(vramdoctor agent-path) VRAMDOCTOR_AGENT_DIR=/tmp/vd-agent python -m sglang.launch_server ...

(a `sitecustomize.py` that chains to any existing one), or for every process of an interpreter
with a `.pth` line (`vramdoctor agent-path --pth`, see docs/attribute.md); the `.pth` form also
does nothing until VRAMDOCTOR_AGENT_DIR is set. What runs inside the server is the standard-
library-only `pythonpath/vramdoctor_agent.py`; this package is the side that lives in
vramdoctor's own process: where the agent is (`agent_path`, `pth_line`) and how soak talks to it
(`vramdoctor.agent.control`: `Controller.collect` for inside evidence and snapshots). The
directory's rules and who can do what to the agent: docs/threat-model.md ("The agent").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramdoctor import _lazy
from vramdoctor.agent.pythonpath import vramdoctor_agent as runtime

if TYPE_CHECKING:  # the lazy names below, for type checkers
    from vramdoctor.agent.control import AgentInfo, Controller, Reply, SnapshotFile, list_agents

# Public name -> the module that defines it (imported on first access: control brings psutil,
# which `vramdoctor --help` and `vramdoctor agent-path` do not need).
_LAZY = {
    "AgentInfo": ".control",
    "Controller": ".control",
    "Reply": ".control",
    "SnapshotFile": ".control",
    "list_agents": ".control",
}

__all__ = [
    "AgentInfo",
    "Controller",
    "Reply",
    "SnapshotFile",
    "agent_path",
    "list_agents",
    "pth_line",
    "runtime",
]


def agent_path() -> Path:
    """The directory to put first on a server's PYTHONPATH (holds sitecustomize.py)."""
    return Path(runtime.__file__).resolve().parent


def pth_line() -> str:
    """The content of a `vramdoctor-agent.pth` file for a site-packages directory: adds the agent's
    directory to sys.path and boots it (a no-op unless VRAMDOCTOR_AGENT_DIR is set)."""
    return f"{agent_path()}\nimport vramdoctor_agent; vramdoctor_agent.boot()\n"


def __getattr__(name: str) -> Any:
    """PEP 562: the names of the control side imported on first use, so importing the package (or the CLI) stays light."""
    return _lazy.load(__name__, name, _LAZY)


def __dir__() -> list[str]:
    return _lazy.listing(globals(), _LAZY)
