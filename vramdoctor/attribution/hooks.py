"""`soak --attribute`: round hooks that take one allocator snapshot per process at the end of
every idle window (round 0 = the baseline) and collect them into the run's attribution folder.

- `AgentHook` (`--attribute DIR`): vramdoctor's agent (`vramdoctor.agent`) in every server
  process that initialised CUDA, through trigger files in DIR.
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
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import requests

from vramdoctor.agent.control import Controller
from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.redact import redact_url

__all__ = ["SGLANG_NOT_COVERED", "AgentHook", "SglangHook", "build_hook", "parse_attribute_option"]

SGLANG_NOT_COVERED = (
    "the tokenizer/HTTP process (multimodal preprocessing runs there), the "
    "detokenizer and any data-parallel controller: SGLang's profiler runs only in "
    "the schedulers; start the server with the vramdoctor agent to cover them"
)
_SGLANG_FILE = re.compile(r"-TP-(\d+)-memory(?:-[^/]*)?\.pickle$")


def parse_attribute_option(value: str) -> tuple[str, Path | None]:
    """`--attribute DIR` -> ("agent", DIR); `sglang` -> ("sglang", None); `sglang:DIR` -> ("sglang", DIR)."""
    if value == "sglang":
        return "sglang", None
    if value.startswith("sglang:"):
        rest = value.split(":", 1)[1]
        if not rest:
            raise InputError("--attribute sglang:DIR needs a directory after the colon")
        return "sglang", Path(rest).expanduser().resolve()
    if not value.strip():
        raise InputError("--attribute needs the agent directory or 'sglang'")
    return "agent", Path(value).expanduser().resolve()


def _write_collection(dest: Path, data: dict[str, Any]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "collection.json").write_text(json.dumps(data, indent=1), encoding="utf-8")


class AgentHook:
    """Round hook for the agent: trigger, wait for every armed process, move the files to `dest`."""

    def __init__(
        self,
        agent_dir: Path,
        dest: Path,
        *,
        timeout_s: float = 10.0,
        server_pids: dict[int, str] | None = None,
    ) -> None:
        self.ctl = Controller(agent_dir)
        self.ctl.check()
        self.dest = dest
        self.timeout_s = timeout_s
        self.server_pids = dict(server_pids or {})
        self.covered: dict[str, int] = {}
        self.silent: dict[str, int] = {}
        self.notes: list[str] = []

    def start_note(self) -> str:
        """One line for the start of soak: which processes are armed now."""
        armed = self.ctl.armed()
        if not armed:
            return (
                f"attribution: no armed process in {self.ctl.dir} yet (start the server with "
                f"PYTHONPATH=$(vramdoctor agent-path) VRAMDOCTOR_AGENT_DIR={self.ctl.dir}); "
                "processes that initialise CUDA later are picked up"
            )
        return "attribution: armed " + ", ".join(a.label() for a in armed)

    def __call__(self, round_index: int, run_dir: Path | None = None) -> None:
        files, missing = self.ctl.snapshot(round_index, timeout_s=self.timeout_s)
        for f in self.ctl.move(files, self.dest):
            key = f"pid {f.pid} ({f.program})"
            self.covered[key] = self.covered.get(key, 0) + 1
        for a in missing:
            self.silent[a.label()] = self.silent.get(a.label(), 0) + 1
        self._save()

    def _save(self) -> None:
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
        self.ctl.clear()
        with contextlib.suppress(OSError):
            self._save()


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
    return AgentHook(directory, dest, server_pids=server_pids)
