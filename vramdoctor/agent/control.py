"""The soak side of the agent protocol: which processes are armed, trigger, collect.

Files in the agent directory (written by `pythonpath/vramdoctor_agent.py`):
`agents/<host>-<pid>.json` (state "armed" / "stood-down"), `trigger.json` (ours: token, seq,
expiry), `snapshots/<token>/<seq>-<host>-<pid>.pickle` and its `.json` (written last: the pair is
complete once the `.json` exists).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from vramdoctor.agent.pythonpath import vramdoctor_agent as runtime
from vramdoctor.errors import InputError

__all__ = ["AgentInfo", "Controller", "SnapshotFile", "list_agents"]


@dataclass(frozen=True)
class AgentInfo:
    """One process's agent as its status file says (times are wall-clock seconds)."""

    pid: int
    host: str
    program: str
    state: str
    reason: str | None
    torch: str | None
    updated_wall: float

    @property
    def local(self) -> bool:
        return self.host == runtime.safe_host()

    def alive(self) -> bool | None:
        """True/False for a process on this host; None (unknown) for another host's."""
        if not self.local:
            return None
        try:
            return (
                psutil.pid_exists(self.pid)
                and psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False

    def label(self) -> str:
        where = "" if self.local else f"@{self.host}"
        return f"pid {self.pid}{where} ({self.program})"


def list_agents(agent_dir: Path) -> list[AgentInfo]:
    """Every status file in the agent directory (unreadable ones skipped), by pid."""
    out: list[AgentInfo] = []
    for path in sorted((agent_dir / runtime.AGENTS_DIR).glob("*.json")):
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            out.append(
                AgentInfo(
                    int(d["pid"]),
                    str(d["host"]),
                    str(d.get("program", "?")),
                    str(d.get("state", "?")),
                    d.get("reason"),
                    d.get("torch"),
                    float(d.get("updated_wall", 0.0)),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda a: (a.host, a.pid))


@dataclass(frozen=True)
class SnapshotFile:
    """One collected snapshot: its pickle and the agent's metadata."""

    pickle_path: Path
    seq: int
    pid: int
    host: str
    program: str
    wall: float
    snapshot_s: float | None

    @classmethod
    def from_meta(cls, meta_path: Path) -> SnapshotFile:
        d = json.loads(meta_path.read_text(encoding="utf-8"))
        return cls(
            meta_path.with_suffix(".pickle"),
            int(d["seq"]),
            int(d["pid"]),
            str(d["host"]),
            str(d.get("program", "?")),
            float(d["wall"]),
            float(d["snapshot_s"]) if d.get("snapshot_s") is not None else None,
        )


class Controller:
    """Trigger snapshots in every armed process of an agent directory and collect them.

    token: this run's own (random by default); a trigger expires after `expires_s`, so one left
    behind by a killed soak does nothing to a later server.
    """

    def __init__(
        self,
        agent_dir: Path,
        *,
        token: str | None = None,
        expires_s: float = 120.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.dir = Path(agent_dir)
        self.token = token or secrets.token_hex(8)
        if not runtime.TOKEN_RE.fullmatch(self.token):
            raise InputError(f"agent token {self.token!r}: use 1-64 letters, digits, '-' or '_'")
        self.expires_s = expires_s
        self.clock = clock

    def check(self) -> None:
        """The directory must exist (or be creatable) and be writable: a usage error otherwise."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--attribute {self.dir}: cannot create it ({exc.strerror})") from None
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise InputError(f"--attribute {self.dir}: not writable")

    def armed(self) -> list[AgentInfo]:
        """Armed agents that are alive (or on another host, where we cannot tell)."""
        return [a for a in list_agents(self.dir) if a.state == "armed" and a.alive() is not False]

    def trigger(self, seq: int) -> None:
        """Write trigger.json atomically (agents pick it up at their next poll)."""
        now = self.clock()
        data = {
            "protocol": runtime.PROTOCOL,
            "token": self.token,
            "seq": int(seq),
            "created_wall": now,
            "expires_wall": now + self.expires_s,
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=self.dir, prefix=".vd-", suffix=".tmp"
        )  # never through a planted link
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data))
        os.replace(tmp, self.dir / runtime.TRIGGER_FILE)

    def _meta_paths(self, seq: int) -> dict[tuple[str, int], Path]:
        found: dict[tuple[str, int], Path] = {}
        for meta in (self.dir / runtime.SNAPSHOTS_DIR / self.token).glob(f"{seq:04d}-*.json"):
            try:
                host, pid = meta.stem.split("-", 1)[1].rsplit("-", 1)
                found[(host, int(pid))] = meta
            except ValueError:
                continue
        return found

    def snapshot(
        self, seq: int, *, timeout_s: float = 10.0, sleep: Callable[[float], None] = time.sleep
    ) -> tuple[list[SnapshotFile], list[AgentInfo]]:
        """Trigger `seq` and wait until every armed agent answered or `timeout_s` passed.

        Returns (snapshots written for this token and seq, armed agents that did not answer).
        """
        self.trigger(seq)
        deadline = time.monotonic() + timeout_s
        while True:
            agents = self.armed()
            found = self._meta_paths(seq)
            missing = [a for a in agents if (a.host, a.pid) not in found]
            if not missing or time.monotonic() >= deadline:
                break
            sleep(0.1)
        files: list[SnapshotFile] = []
        for meta in found.values():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                files.append(SnapshotFile.from_meta(meta))
        return sorted(files, key=lambda f: (f.host, f.pid)), missing

    def move(self, files: list[SnapshotFile], dest: Path) -> list[SnapshotFile]:
        """Move collected snapshots (pickle + json) into `dest` (the run's attribution folder)."""
        dest.mkdir(parents=True, exist_ok=True)
        out: list[SnapshotFile] = []
        for f in files:
            meta = f.pickle_path.with_suffix(".json")
            try:
                shutil.move(str(f.pickle_path), dest / f.pickle_path.name)
                shutil.move(str(meta), dest / meta.name)
            except OSError:
                continue
            out.append(SnapshotFile.from_meta(dest / meta.name))
        return out

    def clear(self) -> None:
        """Remove our trigger (if it is still ours) and our empty snapshot folder."""
        path = self.dir / runtime.TRIGGER_FILE
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text(encoding="utf-8")).get("token") == self.token:
                path.unlink()
        with contextlib.suppress(OSError):
            (self.dir / runtime.SNAPSHOTS_DIR / self.token).rmdir()
