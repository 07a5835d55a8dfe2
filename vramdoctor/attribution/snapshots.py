"""Snapshot files: reading pickles safely, the run's attribution folder, and the offline diff.

A run `runs/soak-X.jsonl` keeps its snapshots in `runs/soak-X.attribution/`: per snapshot a
`.pickle` (PyTorch's own format, loadable by pytorch.org/memory_viz) and a `.json` with the
process and round (`seq`, the soak round whose idle window it ends; 0 is the baseline).

Pickles are read with an unpickler that refuses every class: an allocator snapshot is plain
dicts, lists, tuples, strings and numbers, and a pickle from elsewhere must not run code.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import pickle
import stat
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramdoctor.attribution.analysis import (
    ProcessAttribution,
    SnapshotError,
    Thresholds,
    attribute,
    has_device,
    has_pinned,
)
from vramdoctor.attribution.python_lines import PythonLines, python_lines_of_run
from vramdoctor.errors import InputError
from vramdoctor.samples import REACHED_SERVER, Event, GpuSample
from vramdoctor.units import MIB

__all__ = [
    "SCHEMA",
    "AttributionReport",
    "SnapshotMeta",
    "attribute_files",
    "attribute_memories",
    "attribute_run",
    "attribution_dir",
    "load_snapshot",
]

SCHEMA = "vramdoctor.attribution/1"


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: an allocator snapshot holds plain data only"
        )


# A snapshot larger than this is refused before it is read (real ones: KiB to tens of MiB).
SNAPSHOT_MAX_BYTES = 1024 * 1024 * 1024
_O_READ = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def load_snapshot(path: Path) -> dict[str, Any]:
    """Read one snapshot pickle. Raises InputError (one line) for anything else.

    The file must be a regular file (a link, a FIFO or a device is refused: the file may come
    from a directory another user controls) of at most SNAPSHOT_MAX_BYTES, unpickled with no
    class allowed, and hold a `segments` list (or `host_segments`: torch 2.14+ with
    `record_cuda=False`)."""
    try:
        fd = os.open(path, _O_READ)
    except FileNotFoundError:
        raise InputError(f"no such snapshot file: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a snapshot pickle") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{path} is a symbolic link: refused (give the file itself)") from None
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{path} is a directory, not a snapshot pickle")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path} is not a regular file: refused")
        if st.st_size > SNAPSHOT_MAX_BYTES:
            raise InputError(
                f"{path} has {st.st_size / 2**20:,.0f} MiB: larger than any allocator snapshot "
                f"vramdoctor reads ({SNAPSHOT_MAX_BYTES // 2**20:,} MiB)"
            )
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = _PlainUnpickler(fh).load()
    except InputError:
        raise
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        MemoryError,
        RecursionError,
        OverflowError,
        UnicodeDecodeError,
    ) as exc:
        raise InputError(f"{path}: not a PyTorch allocator snapshot pickle ({exc})") from None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or not (
        isinstance(data.get("segments"), list) or isinstance(data.get("host_segments"), list)
    ):
        raise InputError(f"{path}: not a PyTorch allocator snapshot (no 'segments' list)")
    return data


def attribution_dir(run_path: Path) -> Path:
    """Where a run file's snapshots live: `runs/soak-X.jsonl` -> `runs/soak-X.attribution/`."""
    return run_path.with_name(run_path.stem + ".attribution")


@dataclass(frozen=True)
class SnapshotMeta:
    """What the `.json` beside a collected pickle says."""

    pickle_path: Path
    seq: int
    process: str  # grouping key: "<host>-<pid>" (agent) or "sglang-TP<rank>"
    label: str
    pid: int | None
    wall: float
    source: str  # "agent" or "sglang"

    @classmethod
    def read(cls, meta_path: Path) -> SnapshotMeta:
        d = json.loads(meta_path.read_text(encoding="utf-8"))
        pid = int(d["pid"]) if d.get("pid") is not None else None
        host = str(d.get("host", "?"))
        process = str(d.get("process") or f"{host}-{pid}")
        label = str(d.get("label") or f"pid {pid} ({d.get('program', '?')})")
        return cls(
            meta_path.with_suffix(".pickle"),
            int(d["seq"]),
            process,
            label,
            pid,
            float(d.get("wall", 0.0)),
            str(d.get("source", "agent")),
        )


@dataclass
class AttributionReport:
    """Every process's attribution in one run (or one set of files), with coverage notes."""

    processes: list[ProcessAttribution]
    source: str
    covered: list[str] = field(default_factory=list)
    not_covered: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # `soak --trace-python`: each process's traced Python lines (vramdoctor.attribution.python_lines)
    python: list[PythonLines] = field(default_factory=list)

    @property
    def growing(self) -> bool:
        return any(p.growing for p in self.processes) or any(p.growing for p in self.python)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "source": self.source,
            "growing": self.growing,
            "covered": self.covered,
            "not_covered": self.not_covered,
            "notes": self.notes,
            "processes": [p.to_dict() for p in self.processes],
            "python": [p.to_dict() for p in self.python],
        }


def _requests_between(events: Sequence[Event]) -> dict[int, int]:
    """round number -> requests that reached the server in it (from round_end events)."""
    out: dict[int, int] = {}
    for ev in events:
        if ev.name != "round_end":
            continue
        data = ev.data or {}
        outcomes = data.get("outcomes") or {}
        n = (
            sum(int(v) for k, v in outcomes.items() if k in REACHED_SERVER)
            if outcomes
            else int(data.get("sent") or 0)
        )
        rnd = int(data.get("round", 0) or 0)
        out[rnd] = out.get(rnd, 0) + n
    return out


def _nvml_at(samples: Sequence[GpuSample], pid: int, wall: float) -> float | None:
    """The process's NVML usage (bytes, all GPUs) in the last sample at or before `wall`."""
    best: GpuSample | None = None
    for s in samples:
        if s.wall <= wall and any(p.pid == pid for p in s.processes):
            best = s
    if best is None:
        return None
    used = [p.used_mib for p in best.processes if p.pid == pid and p.used_mib is not None]
    return sum(used) * MIB if used else None


def _group(metas: Iterable[SnapshotMeta]) -> dict[str, list[SnapshotMeta]]:
    groups: dict[str, list[SnapshotMeta]] = defaultdict(list)
    for m in metas:
        groups[m.process].append(m)
    return {k: sorted(v, key=lambda m: m.seq) for k, v in sorted(groups.items())}


def attribute_run(
    records: Sequence[Any], snap_dir: Path, *, th: Thresholds | None = None
) -> AttributionReport | None:
    """The attribution of a soak run from its records and its snapshot folder, with the traced
    Python lines of a `--trace-python` run (None: no folder and no traced line)."""
    traced = python_lines_of_run(
        records, _requests_between([r for r in records if isinstance(r, Event)])
    )
    if not snap_dir.is_dir():
        return AttributionReport([], source="tracemalloc", python=traced) if traced else None
    report = _attribute_folder(records, snap_dir, th)
    report.python = traced
    return report


def _attribute_folder(
    records: Sequence[Any], snap_dir: Path, th: Thresholds | None
) -> AttributionReport:
    """The snapshot folder's part of `attribute_run`."""
    metas: list[SnapshotMeta] = []
    notes: list[str] = []
    for meta in sorted(snap_dir.glob("*.json")):
        if meta.name == "collection.json":
            continue
        try:
            m = SnapshotMeta.read(meta)
        except (OSError, ValueError, KeyError, TypeError):
            notes.append(f"{meta.name}: unreadable metadata, skipped")
            continue
        if m.pickle_path.exists():
            metas.append(m)
    coverage: dict[str, Any] = {}
    with_cov = snap_dir / "collection.json"
    if with_cov.exists():
        try:
            coverage = json.loads(with_cov.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            coverage = {}
    events = [r for r in records if isinstance(r, Event)]
    gpu = [r for r in records if isinstance(r, GpuSample)]
    per_round = _requests_between(events)
    processes: list[ProcessAttribution] = []
    sources = {m.source for m in metas}
    for _key, group in _group(metas).items():
        try:
            snaps = [load_snapshot(m.pickle_path) for m in group]
        except InputError as exc:
            notes.append(str(exc))
            continue
        reqs: list[int | None] = [
            sum(per_round.get(r, 0) for r in range(a.seq + 1, b.seq + 1)) or None
            for a, b in itertools.pairwise(group)
        ]
        nvml = [(_nvml_at(gpu, m.pid, m.wall) if m.pid is not None else None) for m in group]
        try:
            processes.extend(
                attribute_memories(
                    snaps,
                    requests=reqs,
                    nvml_used_bytes=nvml if all(v is not None for v in nvml) else None,
                    label=group[0].label,
                    pid=group[0].pid,
                    th=th,
                )
            )
        except SnapshotError as exc:
            notes.append(f"{group[0].label}: {exc}")
    not_covered = list(coverage.get("not_covered", []))
    if "sglang" not in sources:  # agent snapshots carry pids: name the GPU processes without any
        seen = {m.pid for m in metas if m.pid is not None}
        on_gpu = {p.pid: p.name for g in gpu for p in g.processes if p.pid not in seen}
        if on_gpu:
            not_covered.append(
                "GPU processes without snapshots (started without the agent, or "
                "another server): "
                + ", ".join(f"pid {pid} ({name or '?'})" for pid, name in sorted(on_gpu.items()))
            )
    return AttributionReport(
        processes,
        source="/".join(sorted(sources)) or str(coverage.get("source", "agent")),
        covered=list(coverage.get("covered", [])),
        not_covered=not_covered,
        notes=list(coverage.get("notes", [])) + notes,
    )


def attribute_files(
    paths: Sequence[Path], *, requests: Sequence[int] | None = None, th: Thresholds | None = None
) -> AttributionReport:
    """`vramdoctor attribute a.pickle b.pickle ...`: the files are one process's snapshots in time
    order. requests: one count for every interval, or a single count used for all of them."""
    snaps = [load_snapshot(p) for p in paths]
    reqs: list[int | None] | None = None
    if requests:
        if len(requests) == 1:
            reqs = [requests[0]] * (len(paths) - 1)
        elif len(requests) == len(paths) - 1:
            reqs = list(requests)
        else:
            raise InputError(
                f"--requests: give one count, or one per interval ({len(paths) - 1}), not {len(requests)}"
            )
    label = f"{paths[0].name} .. {paths[-1].name} ({len(paths)} snapshots)"
    try:
        procs = attribute_memories(snaps, requests=reqs, label=label, th=th)
    except SnapshotError as exc:
        raise InputError(str(exc)) from None
    return AttributionReport(procs, source="files")


def attribute_memories(
    snaps: Sequence[dict[str, Any]],
    *,
    requests: Sequence[int | None] | None = None,
    nvml_used_bytes: Sequence[float | None] | None = None,
    label: str = "process",
    pid: int | None = None,
    th: Thresholds | None = None,
) -> list[ProcessAttribution]:
    """One process's snapshots diffed per kind of memory they hold: GPU memory (unless every
    snapshot was taken with `record_cuda=False`) and, where torch 2.14+ recorded it, pinned host
    memory (`host_segments`/`host_traces`), each attributed to its stacks the same way.
    Raises SnapshotError on bad input."""
    out: list[ProcessAttribution] = []
    device = any(has_device(s) for s in snaps) or not any(has_pinned(s) for s in snaps)
    if device:
        out.append(
            attribute(
                snaps,
                requests=requests,
                nvml_used_bytes=nvml_used_bytes,
                label=label,
                pid=pid,
                th=th,
            )
        )
    if any(has_pinned(s) for s in snaps):
        pinned = attribute(
            snaps,
            requests=requests,
            label=label,
            pid=pid,
            th=th,
            memory="pinned",
        )
        if not device:
            pinned.notes.append(
                "the snapshots hold no GPU memory (taken with record_cuda=False): pinned host "
                "memory only"
            )
        out.append(pinned)
    return out
