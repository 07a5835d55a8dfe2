"""soak's round hooks into the server's processes, at the end of every idle window (round 0 = the
baseline): inside evidence (what the allocators count) and allocator snapshots.

- `AgentHook`: vramdoctor's agent (`vramdoctor.agent`) in the server's processes, through the
  files of its directory. Always (whenever the agent is in the server, found from the
  processes' own environment or given with `--attribute DIR`): one `InsideSample` record per
  answering process in the run file, the CUDA caching allocator's counters per device and pool,
  glibc's `mallinfo2()`, Python's allocator and, with `--trace-python`, tracemalloc's lines.
  With `--attribute DIR`: also a snapshot from every armed process, moved into the run's
  attribution folder.
- `SglangHook` (`--attribute sglang[:DIR]`): SGLang's own `POST /start_profile
  {"activities": ["MEM"], "output_dir": D}` / `POST /stop_profile`, scheduler processes only;
  stop dumps `D/<time>-TP-<rank>-memory.pickle` and turns history off, so each round is
  stop (collect) + start again, and `close()` always stops (an idle server never reaches
  `num_steps`).

Both write `collection.json` (which processes are covered, which are not) beside the snapshots;
`vramdoctor.attribution.snapshots.attribute_run` reads the folder back.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import requests

from vramdoctor.agent.control import Controller, Reply
from vramdoctor.agent.pythonpath import vramdoctor_agent as runtime
from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.redact import redact_url
from vramdoctor.samples import SOURCE_ERROR, Event, InsideSample, now

__all__ = [
    "SGLANG_NOT_COVERED",
    "AgentHook",
    "SglangHook",
    "agent_dirs_of",
    "build_hook",
    "inside_hook",
    "parse_attribute_option",
    "process_uid",
]

SGLANG_NOT_COVERED = (
    "the tokenizer/HTTP process (multimodal preprocessing runs there), the "
    "detokenizer and any data-parallel controller: SGLang's profiler runs only in "
    "the schedulers; start the server with the vramdoctor agent to cover them"
)
_SGLANG_FILE = re.compile(r"-TP-(\d+)-memory(?:-[^/]*)?\.pickle$")
ENVIRON_MAX_BYTES = 1024 * 1024

Write = Callable[[Any], Any]


def parse_attribute_option(value: str) -> tuple[str, Path | None]:
    """`--attribute DIR` -> ("agent", DIR); `sglang` -> ("sglang", None); `sglang:DIR` -> ("sglang", DIR)."""
    if value == "sglang":
        return "sglang", None
    if value.startswith("sglang:"):
        rest = value.split(":", 1)[1]
        if not rest:
            raise InputError("--attribute sglang:DIR needs a directory after the colon")
        return "sglang", Path(rest).expanduser().absolute()
    if not value.strip():
        raise InputError("--attribute needs the agent directory or 'sglang'")
    return "agent", Path(value).expanduser().absolute()


def _write_collection(dest: Path, data: dict[str, Any]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "collection.json").write_text(json.dumps(data, indent=1), encoding="utf-8")


def process_uid(pid: int) -> int | None:
    """The effective uid of a process (/proc/PID/status), or None when it cannot be read."""
    try:
        with open(f"/proc/{int(pid)}/status", encoding="utf-8", errors="replace") as fh:
            line = next((x for x in fh if x.startswith("Uid:")), None)
    except OSError:
        return None
    parts = line.split() if line else []
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None


def agent_dirs_of(pids: Iterable[int]) -> dict[Path, list[int]]:
    """The agent directories named by VRAMDOCTOR_AGENT_DIR in these processes' environments
    (/proc/PID/environ, readable for our own user's processes or as root), each with the pids
    that name it. A relative directory is taken from the process's working directory."""
    found: dict[Path, list[int]] = {}
    key = runtime.ENV_DIR.encode() + b"="
    for pid in sorted(set(pids)):
        try:
            with open(f"/proc/{int(pid)}/environ", "rb") as fh:
                raw = fh.read(ENVIRON_MAX_BYTES)
        except OSError:
            continue
        for item in raw.split(b"\0"):
            if not item.startswith(key):
                continue
            value = item[len(key) :].decode("utf-8", errors="replace").strip()
            if not value or "\n" in value:
                continue
            path = Path(value)
            if not path.is_absolute():
                try:
                    path = Path(os.readlink(f"/proc/{int(pid)}/cwd")) / path
                except OSError:
                    continue
            found.setdefault(path, []).append(int(pid))
    return found


class AgentHook:
    """Round hook for the agent: at each idle-window end, ask every live agent of the directory
    for its inside evidence (written as `InsideSample` records through `write`, once `attach`ed
    to the run file) and, when `snapshots`, a snapshot from every armed one (moved to `dest`).

    Nothing here may end the soak: an agent that does not answer, stood down, or a directory
    that disappears is said once (a `source_error` event and `notes`)."""

    def __init__(
        self,
        agent_dir: Path,
        dest: Path | None = None,
        *,
        snapshots: bool = True,
        inside: bool = True,
        trace_python: bool = False,
        timeout_s: float = 10.0,
        server_pids: Mapping[int, str] | None = None,
        write: Write | None = None,
        found_in: str = "--attribute",
        create: bool = True,
        owner_uid: int | None = None,
    ) -> None:
        self.ctl = Controller(agent_dir, create=create, owner_uid=owner_uid)
        self.ctl.check()
        self.dest = dest
        self.snapshots = snapshots and dest is not None
        self.inside = inside
        self.trace_python = trace_python
        self.timeout_s = timeout_s
        self.server_pids = dict(server_pids or {})
        self.write = write
        self.found_in = found_in
        self.covered: dict[str, int] = {}
        self.silent: dict[str, int] = {}
        self.notes: list[str] = []
        self.inside_records = 0
        self._said: set[str] = set()

    def attach(self, write: Write, server_pids: Mapping[int, str] | None = None) -> None:
        """Where the records go (the run file's writer) and the server's processes, once known."""
        self.write = write
        if server_pids is not None:
            self.server_pids = dict(server_pids)

    def start_note(self) -> str:
        """One line for the start of soak: which processes have an agent now."""
        ready = self.ctl.ready()
        if not ready:
            return (
                f"agent: no process has an agent in {self.ctl.dir} yet (start the server with "
                f"PYTHONPATH=$(vramdoctor agent-path) VRAMDOCTOR_AGENT_DIR={self.ctl.dir}); "
                "processes that start later are picked up"
            )
        parts = [f"{a.label()}{' [CUDA armed]' if a.state == 'armed' else ''}" for a in ready]
        what = "inside evidence" + (" and snapshots" if self.snapshots else "")
        return f"agent ({self.found_in}): {what} from " + ", ".join(parts)

    def _say(self, kind: str, message: str) -> None:
        if kind in self._said:
            return
        self._said.add(kind)
        self.notes.append(message)
        if self.write is not None:
            self.write(Event(*now(), name=SOURCE_ERROR, data={"source": "agent", "error": message}))

    def __call__(self, round_index: int, run_dir: Path | None = None) -> None:
        want = (["inside"] if self.inside and self.write is not None else []) + (
            ["snapshot"] if self.snapshots else []
        )
        if not want:
            return
        replies, missing = self.ctl.collect(
            round_index,
            round_index=round_index,
            want=want,
            trace_python=self.trace_python,
            timeout_s=self.timeout_s,
        )
        mono, wall = now()
        for reply in replies:
            if reply.inside is not None and self.write is not None:
                self.write(self._record(reply, round_index, mono, wall))
                self.inside_records += 1
        if self.snapshots and self.dest is not None:
            moved = self.ctl.move([r.snapshot for r in replies if r.snapshot], self.dest)
            for f in moved:
                key = f"pid {f.pid} ({f.program})"
                self.covered[key] = self.covered.get(key, 0) + 1
        self.ctl.discard(replies)
        for a in missing:
            self.silent[a.label()] = self.silent.get(a.label(), 0) + 1
            self._say(
                f"silent {a.label()}",
                f"{a.label()} has an agent but did not answer within {self.timeout_s:.0f} s "
                f"(round {round_index})",
            )
        for a in self.ctl.stood_down():
            self._say(f"down {a.label()}", f"the agent in {a.label()} stood down: {a.reason}")
        if self.dest is not None:
            self._save()

    @staticmethod
    def _record(reply: Reply, round_index: int, mono: float, wall: float) -> InsideSample:
        inside = reply.inside or {}
        pid = reply.local_pid if reply.local_pid is not None else reply.pid
        return InsideSample(
            t=mono - max(0.0, wall - reply.wall),
            wall=reply.wall,
            pid=pid,
            round=round_index,
            window=reply.window,
            cuda=inside.get("cuda"),
            glibc=inside.get("glibc"),
            python=inside.get("python"),
            error=inside.get("error"),
            host=reply.host,
            program=reply.program,
            pinned=inside.get("pinned"),
            cuda_ms=inside.get("cuda_ms"),
            agent_pid=reply.pid if pid != reply.pid else None,
        )

    def _save(self) -> None:
        assert self.dest is not None
        covered_pids = {int(k.split()[1]) for k in self.covered}
        unarmed = [
            f"pid {p} ({n})" for p, n in sorted(self.server_pids.items()) if p not in covered_pids
        ]
        not_covered = [
            f"{k}: armed but did not answer {n} trigger(s)" for k, n in self.silent.items()
        ]
        if unarmed:
            not_covered.append(
                "server processes without an armed agent (no CUDA, or started without "
                "the agent): " + ", ".join(unarmed)
            )
        _write_collection(
            self.dest,
            {
                "source": "agent",
                "covered": sorted(self.covered),
                "not_covered": not_covered,
                "notes": self.notes,
            },
        )

    def close(self) -> None:
        self.ctl.close()
        if self.dest is not None:
            with contextlib.suppress(OSError):
                self._save()


def inside_hook(
    server_pids: Mapping[int, str],
    *,
    trace_python: bool = False,
    write: Write | None = None,
    notify: Callable[[str], None] | None = None,
) -> AgentHook | None:
    """The inside-evidence hook for a soak without `--attribute DIR`: the agent directory named in
    the server processes' own environment, or None (no agent in the server; said through
    `notify` when `--trace-python` asked for one). A directory the agents would refuse, or that
    we cannot use, is said and skipped."""
    say = notify or (lambda _m: None)
    dirs = agent_dirs_of(server_pids)
    if not dirs:
        if trace_python:
            say(
                "--trace-python: no server process has the agent (start the server with "
                "PYTHONPATH=$(vramdoctor agent-path) VRAMDOCTOR_AGENT_DIR=DIR); not traced"
            )
        return None
    directory, pids = next(iter(sorted(dirs.items(), key=lambda kv: -len(kv[1]))))
    if len(dirs) > 1:
        say(
            "agent: the server's processes name several agent directories; using "
            f"{directory} ({len(pids)} processes)"
        )
    uids = {process_uid(pid) for pid in pids}
    if len(uids) != 1 or None in uids:
        say(
            f"agent: the processes naming {directory} run as different or unknown users; "
            "not used (no inside evidence)"
        )
        return None
    try:
        # A directory a server process names is used only as that process's user's: existing
        # (never created here), not a link, not writable by others, owned by that uid.
        return AgentHook(
            directory,
            None,
            snapshots=False,
            trace_python=trace_python,
            server_pids=server_pids,
            write=write,
            found_in="in the server's environment",
            create=False,
            owner_uid=uids.pop(),
        )
    except InputError as exc:
        say(f"agent: {exc}; no inside evidence")
        return None


class SglangHook:
    """Round hook for SGLang's own memory profiler (scheduler processes only)."""

    def __init__(
        self,
        base_url: str,
        dest: Path,
        *,
        output_dir: Path | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 60.0,
        file_wait_s: float = 15.0,
    ) -> None:
        self.base = base_url.rstrip("/")
        self.dest = dest
        self.raw = output_dir or (dest / "sglang-output")
        self.headers = headers or {}
        self.timeout_s = timeout_s
        self.file_wait_s = file_wait_s
        self.started = False
        self.given_up = False
        self.seen: set[str] = set()
        self.covered: set[str] = set()
        self.notes: list[str] = []
        self.host = socket.gethostname()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> str:
        url = f"{self.base}{path}"
        try:
            r = requests.post(url, json=body, headers=self.headers, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise SourceUnavailable(f"{redact_url(url)}: {type(exc).__name__}") from None
        if r.status_code != 200:
            raise SourceUnavailable(
                f"{redact_url(url)} answered HTTP {r.status_code}: {r.text.strip()[:200]}"
            )
        return r.text

    def start(self) -> None:
        """Arm SGLang's memory history (`activities: ["MEM"]`, no num_steps: we stop explicitly)."""
        self.raw.mkdir(parents=True, exist_ok=True)
        self._post("/start_profile", {"activities": ["MEM"], "output_dir": str(self.raw)})
        self.started = True

    def _new_files(self) -> list[Path]:
        out = []
        for p in sorted(self.raw.glob("*.pickle")):
            if p.name not in self.seen and _SGLANG_FILE.search(p.name):
                out.append(p)
        return out

    def _stop(self, expect: int) -> list[Path]:
        self._post("/stop_profile")
        self.started = False
        deadline = time.monotonic() + (self.file_wait_s if expect else 2.0)
        files = self._new_files()
        while len(files) < max(1, expect) and time.monotonic() < deadline:
            time.sleep(0.2)  # older SGLang answers before the schedulers have written the file
            files = self._new_files()
        for p in files:
            self.seen.add(p.name)
        return files

    def __call__(self, round_index: int, run_dir: Path | None = None) -> None:
        if self.given_up:
            return
        if not self.started:
            self.start()
            return
        files = self._stop(max(1, len(self.covered)))
        wall = time.time()
        for p in files:
            m = _SGLANG_FILE.search(p.name)
            rank = int(m.group(1)) if m else 0
            name = f"{round_index:04d}-sglang-TP{rank}"
            shutil.move(str(p), self.dest / f"{name}.pickle")
            (self.dest / f"{name}.json").write_text(
                json.dumps(
                    {
                        "seq": round_index,
                        "process": f"sglang-TP{rank}",
                        "label": f"SGLang scheduler TP {rank}",
                        "pid": None,
                        "host": self.host,
                        "wall": wall,
                        "source": "sglang",
                        "original": p.name,
                    }
                ),
                encoding="utf-8",
            )
            self.covered.add(f"SGLang scheduler TP {rank}")
        if not files:
            self.notes.append(
                f"round {round_index}: /stop_profile wrote no memory pickle into {self.raw} "
                f'within {self.file_wait_s:.0f} s (SGLang older than 0.4.3.post3 has no "MEM" '
                "activity; or that directory is not the server's at the same path): gave up"
            )
            self.given_up = True  # no further rounds: each would wait again for nothing
            self._save()
            return
        self._save()
        self.start()

    def _save(self) -> None:
        _write_collection(
            self.dest,
            {
                "source": "sglang",
                "covered": sorted(self.covered),
                "not_covered": [SGLANG_NOT_COVERED],
                "notes": self.notes,
            },
        )

    def close(self) -> None:
        """Always stop an armed profile (its last dump is not part of any round and is dropped)."""
        if self.started:
            with contextlib.suppress(SourceUnavailable):
                for p in self._stop(0):
                    with contextlib.suppress(OSError):
                        p.unlink()
        if self.raw == self.dest / "sglang-output":
            with contextlib.suppress(OSError):
                self.raw.rmdir()  # ours, and empty once every dump was moved or dropped
        with contextlib.suppress(OSError):
            self._save()


def build_hook(
    value: str,
    *,
    url: str,
    run_path: Path,
    headers: dict[str, str] | None = None,
    remote: bool = False,
    server_pids: dict[int, str] | None = None,
    trace_python: bool = False,
) -> AgentHook | SglangHook:
    """The round hook for `soak --attribute VALUE`; snapshots go to `runs/soak-X.attribution/`.

    Raises InputError for an unusable value (an agent directory we cannot write; `sglang` for a
    server on another host without a shared directory)."""
    from vramdoctor.attribution.snapshots import attribution_dir

    kind, directory = parse_attribute_option(value)
    dest = attribution_dir(run_path)
    if kind == "sglang":
        if remote and directory is None:
            raise InputError(
                "--attribute sglang: the server is on another host; give a directory both "
                "see at the same path: --attribute sglang:/shared/dir"
            )
        dest.mkdir(parents=True, exist_ok=True)
        return SglangHook(url, dest, output_dir=directory, headers=headers)
    assert directory is not None
    return AgentHook(directory, dest, server_pids=server_pids, trace_python=trace_python)
