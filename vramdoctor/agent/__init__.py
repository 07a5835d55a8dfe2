"""vramdoctor's opt-in in-process agent: allocator snapshots from every server process.

Enable it without touching the server's code, either per launch

    PYTHONPATH=$(vramdoctor agent-path) VRAMDOCTOR_AGENT_DIR=/tmp/vd-agent python -m sglang.launch_server ...

(a `sitecustomize.py` that chains to any existing one), or for every process of an interpreter
with a `.pth` line (`vramdoctor agent-path --pth`, see docs/attribute.md); the `.pth` form also
does nothing until VRAMDOCTOR_AGENT_DIR is set. What runs inside the server is the standard-
library-only `pythonpath/vramdoctor_agent.py`; this package is the side that lives in
vramdoctor's own process: where the agent is (`agent_path`, `pth_line`) and how soak talks to it
(`vramdoctor.agent.control`).
"""

from __future__ import annotations

from pathlib import Path

from .control import AgentInfo, Controller, SnapshotFile, list_agents
from .pythonpath import vramdoctor_agent as runtime

__all__ = [
    "AgentInfo",
    "Controller",
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
