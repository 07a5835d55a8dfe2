"""`vramdoctor abtest` (placeholder until its issue lands)."""

from __future__ import annotations

import typer

from . import app


@app.command("ab-test")
def abtest_cmd(json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Not yet available."""
    from ..errors import VramdoctorError

    raise VramdoctorError("'abtest' is not available yet in this version")
