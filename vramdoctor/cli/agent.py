"""`vramdoctor agent-path`: where the in-process agent is, to put on a server's PYTHONPATH.

PYTHONPATH=$(vramdoctor agent-path) VRAMDOCTOR_AGENT_DIR=/tmp/vd-agent python -m sglang.launch_server ...
vramdoctor agent-path --pth > "$(python -c 'import site; print(site.getsitepackages()[0])')/vramdoctor-agent.pth"
"""

from __future__ import annotations

import typer

from vramdoctor.agent import agent_path, pth_line
from vramdoctor.cli import app


@app.command("agent-path")
def agent_path_cmd(
    pth: bool = typer.Option(
        False, "--pth", help="Print a .pth file's content instead (for site-packages)."
    ),
) -> None:
    """Print the agent's directory (for PYTHONPATH) or a .pth file that loads it.

    The agent does nothing unless VRAMDOCTOR_AGENT_DIR is set in the server's environment.

    Examples:

      PYTHONPATH=$(vramdoctor agent-path) VRAMDOCTOR_AGENT_DIR=/tmp/vd-agent python -m sglang.launch_server --model-path ...

      vramdoctor agent-path --pth > /path/to/site-packages/vramdoctor-agent.pth
    """
    typer.echo(pth_line() if pth else str(agent_path()), nl=not pth)
