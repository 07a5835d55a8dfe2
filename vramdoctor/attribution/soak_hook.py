"""The agent and attribution inside a soak: `soak_hooks(session)` for `SoakSession`.

Whenever the agent is in the server, soak collects its inside evidence at the end of the
baseline and of every idle window (`InsideSample` records in the run file): the directory is
`--attribute DIR` when given, else the `VRAMDOCTOR_AGENT_DIR` of the server's own processes
(`/proc/PID/environ`; `--launch` puts it there). With `--attribute DIR` the same hook also takes a
snapshot of every armed process; `--attribute sglang[:DIR]` is SGLang's own profiler
(`vramdoctor.attribution.hooks.SglangHook`). `--trace-python` adds tracemalloc's lines.

Called by `SoakSession.open_sources()` (the server's processes are known then); raises
InputError for an unusable `--attribute` value before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramdoctor.attribution.hooks import (
    AgentHook,
    SglangHook,
    build_hook,
    inside_hook,
    parse_attribute_option,
)
from vramdoctor.attribution.snapshots import attribution_dir
from vramdoctor.soak.session import SoakHook

if TYPE_CHECKING:
    from vramdoctor.soak.session import SoakSession

__all__ = ["AgentEvidenceHook", "SglangProfileHook", "soak_hooks"]


class AgentEvidenceHook(SoakHook):
    """`AgentHook` as a soak hook: the run file's writer attached at the start, asked at each
    idle-window end, closed (trigger, session and answers removed) at the end."""

    name = "agent"

    def __init__(self, hook: AgentHook, *, found_in: str) -> None:
        self.hook = hook
        self.found_in = found_in

    def header(self, session: SoakSession) -> Mapping[str, Any]:
        return {
            "agent": {
                "dir": str(self.hook.ctl.dir),
                "found_in": self.found_in,
                "snapshots": self.hook.snapshots,
                "trace_python": self.hook.trace_python,
            }
        }

    def on_start(self, session: SoakSession) -> None:
        assert session.writer is not None
        self.hook.attach(session.writer.write, session.server_pids())
        session.say(self.hook.start_note())

    def on_idle_end(self, session: SoakSession, round_index: int) -> None:
        self.hook.server_pids = session.server_pids()  # a restarted server has new pids
        self.hook(round_index, session.run_dir)

    def close(self, session: SoakSession) -> None:
        self.hook.close()


class SglangProfileHook(SoakHook):
    """`SglangHook` (SGLang's /start_profile, /stop_profile) as a soak hook."""

    name = "sglang-profile"

    def __init__(self, hook: SglangHook) -> None:
        self.hook = hook

    def on_idle_end(self, session: SoakSession, round_index: int) -> None:
        self.hook(round_index, session.run_dir)

    def close(self, session: SoakSession) -> None:
        self.hook.close()


def soak_hooks(session: SoakSession) -> list[SoakHook]:
    """The hooks a soak gets from its settings and its server (see the module docstring).

    Raises InputError for an unusable `--attribute` value (an agent directory that cannot be
    used, `sglang` for a server on another host without a shared directory)."""
    cfg = session.config
    trace_python = cfg.trace_python
    found = session.found
    remote = bool(found is not None and found.remote)
    out: list[SoakHook] = []
    agent_dir: Path | None = None
    if cfg.attribute is not None:
        kind, directory = parse_attribute_option(cfg.attribute)
        if kind == "sglang":
            sglang = build_hook(
                cfg.attribute,
                url=cfg.url,
                run_path=session.run_path,
                headers=session.headers,
                remote=remote,
            )
            assert isinstance(sglang, SglangHook)
            out.append(SglangProfileHook(sglang))
        else:
            agent_dir = directory
    if agent_dir is not None:
        hook = AgentHook(
            agent_dir,
            attribution_dir(session.run_path),
            server_pids=session.server_pids(),
            trace_python=trace_python,
        )
        out.append(AgentEvidenceHook(hook, found_in="--attribute"))
        return out
    found_hook = inside_hook(session.server_pids(), trace_python=trace_python, notify=session.say)
    if found_hook is not None:
        out.append(AgentEvidenceHook(found_hook, found_in="the server's environment"))
    return out
