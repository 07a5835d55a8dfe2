"""A launched server in the report: how it was started and stopped, and its start-up facts.

Read from the run file's `server_launch` and `server_log` events (`vramdoctor.soak.session`),
so `vramdoctor report RUN.jsonl` shows the same block offline. Runs without `--launch` have
neither event: `launch_json` is then None and `render_launch` prints nothing (their JSON and
terminal report are unchanged).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console

from vramdoctor.samples import Event
from vramdoctor.soak.startup import startup_lines

if TYPE_CHECKING:
    from vramdoctor.record import Run

__all__ = ["launch_json", "render_launch"]

LAUNCH_EVENT = "server_launch"  # vramdoctor.soak.session.LAUNCH_EVENT
SERVER_LOG_EVENT = "server_log"  # vramdoctor.soak.session.SERVER_LOG_EVENT


def _event(run: Run, name: str) -> dict[str, Any] | None:
    for r in run.records:
        if isinstance(r, Event) and r.name == name:
            return dict(r.data)
    return None


def launch_json(run: Run) -> dict[str, Any] | None:
    """The `--json` object's "launch" (docs/soak.md): the launch record (argv redacted, pid,
    log, agent_dir, ready_s, stopped: how/returncode/seconds/signalled/leftovers), the URL, and
    "startup" (the server log's facts, each with its line, and findings); None without a launch."""
    launch = _event(run, LAUNCH_EVENT)
    if launch is None:
        return None
    return {
        **launch,
        "url": run.header.get("target"),
        "startup": _event(run, SERVER_LOG_EVENT),
    }


def _stop_text(stopped: dict[str, Any] | None) -> str:
    if not stopped:
        return "not stopped by vramdoctor (unknown)"
    how = stopped.get("how")
    rc = stopped.get("returncode")
    status = "" if rc is None else (f", exit code {rc}" if rc >= 0 else f", signal {-rc}")
    text = {
        "sigterm": f"stopped with SIGTERM in {stopped.get('seconds', 0):.1f} s",
        "sigkill": "SIGKILLed after the grace period (it did not stop on SIGTERM)",
        "exited": "it had exited by itself before the end",
        "keeper-lost": "its keeper did not answer: its process group was killed",
    }.get(str(how), str(how))
    left = stopped.get("leftovers") or []
    return text + status + (f"; STILL RUNNING: pids {left}" if left else "")


def render_launch(run: Run, console: Console) -> None:
    """The launch block of the terminal report (nothing for a run without `--launch`)."""
    data = launch_json(run)
    if data is None:
        return
    argv = " ".join(str(a) for a in data.get("argv") or [])
    console.print(
        "launched by vramdoctor: " + argv,
        style="bold",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    ready = data.get("ready_s")
    pid = data.get("pid")
    ready_text = (
        f"answered after {ready:.1f} s" if isinstance(ready, (int, float)) else "never answered"
    )
    console.print(
        f"  pid {pid}, {ready_text}; {_stop_text(data.get('stopped'))}",
        markup=False,
        highlight=False,
    )
    env = data.get("env") or {}
    if env or data.get("unset_env"):
        changes = [f"{k}={v}" for k, v in env.items()] + [
            f"-{k}" for k in data.get("unset_env") or []
        ]
        console.print("  environment: " + " ".join(changes), markup=False, highlight=False)
    startup = data.get("startup")
    if startup:
        console.print(
            "server start-up, from its own log:", style="bold", markup=False, highlight=False
        )
        for line in startup_lines(startup):
            console.print("  " + line, markup=False, highlight=False)
