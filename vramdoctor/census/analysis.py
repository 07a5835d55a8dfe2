"""Census: who holds GPU memory, grouped by process, with the shapes that point at a cause.

Pure: takes one `GpuSample` (and, where the PIDs are visible, which processes belong to one
server) and returns rows and flags. The flags:

- multi_gpu: one process holds memory on more than one GPU.
- stray_context: a context-sized footprint (default 300-700 MiB) on a GPU other than the
  process's main one: what a tensor-parallel rank leaves on the producer's GPU when it opens
  a CUDA IPC handle there (~500 MiB a rank), or any code that touched bare "cuda" (GPU 0).
- off_main_gpu: a small process (a context up to `helper_max_mib`) of a server on a GPU where
  none of that server's big processes live: SGLang's tokenizer running the fast image
  processor on bare "cuda" (GPU 0) while the model runs elsewhere.
- helper_context (a note, not a problem): such a small process on a GPU the server already
  uses, e.g. the tokenizer's image-processor context next to scheduler TP0. Watch it with
  `soak`: in public reports it grows until OOM.
- api_server_context (a note): a frontend whose title says it may hold its own CUDA context
  on the engine's GPUs (vLLM 0.33's API server: multimodal IPC on the GPU, video decode) does
  so on GPUs its server's model processes use: named as such, never a stray context.
- orphaned_shm / orphaned_gpu_process (problems, with `leftovers`): what crashed servers left
  behind on this host (see `vramdoctor.sources.leftovers`): shared-memory files of the servers'
  and runtimes' families whose creator is gone and nobody holds, and GPU memory held by a
  server's engine or worker whose server is gone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from vramdoctor import servers
from vramdoctor.samples import CONTEXT_MIB, MIB, GpuSample
from vramdoctor.units import format_mib

if TYPE_CHECKING:
    from vramdoctor.sources.leftovers import Leftovers

# The JSON of a census (`vramdoctor census --json`, the run file's result record).
SCHEMA = "vramdoctor.census/1"

HELPER_MAX_MIB = 2048.0

PROBLEM_FLAGS = frozenset(
    {"multi_gpu", "stray_context", "off_main_gpu", "orphaned_shm", "orphaned_gpu_process"}
)


@dataclass
class Flag:
    code: str
    pid: int
    message: str
    gpu: int | None = None
    mib: float | None = None
    host: str | None = None

    @property
    def problem(self) -> bool:
        return self.code in PROBLEM_FLAGS


@dataclass
class ProcessRow:
    pid: int
    host: str | None
    name: str | None
    cmdline: list[str] | None
    visible: bool
    role: str | None
    per_gpu: dict[int, float | None]
    group: int
    flags: list[str] = field(default_factory=list)

    @property
    def total_mib(self) -> float | None:
        known = [v for v in self.per_gpu.values() if v is not None]
        return sum(known) if known else None

    @property
    def main_gpu(self) -> int | None:
        known = [(v, -g) for g, v in self.per_gpu.items() if v is not None]
        if not known:
            return None
        return -max(known)[1]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_gpu"] = {str(g): v for g, v in self.per_gpu.items()}
        d["total_mib"] = self.total_mib
        d["main_gpu"] = self.main_gpu
        return d


@dataclass
class GpuRow:
    index: int
    host: str | None
    name: str | None
    uuid: str | None
    total_mib: float
    used_mib: float
    free_mib: float
    # NVML's driver-reserved memory (not usable by processes); None where the source lacks it.
    driver_reserved_mib: float | None
    processes: int
    processes_mib: float | None
    # used minus what the listed processes hold: other containers, MIG, the driver.
    unattributed_mib: float | None


@dataclass
class Census:
    source: str
    t: float
    wall: float
    gpus: list[GpuRow]
    processes: list[ProcessRow]
    flags: list[Flag]
    notes: list[str] = field(default_factory=list)
    # What crashes left on this host; None when not looked at (a remote exporter's GPUs).
    leftovers: Leftovers | None = None

    @property
    def problem(self) -> bool:
        return any(f.problem for f in self.flags)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "schema": SCHEMA,
            "source": self.source,
            "t": self.t,
            "wall": self.wall,
            "problem": self.problem,
            "gpus": [asdict(g) for g in self.gpus],
            "processes": [p.to_dict() for p in self.processes],
            "flags": [{**asdict(f), "problem": f.problem} for f in self.flags],
            "notes": self.notes,
        }
        if self.leftovers is not None:
            out["leftovers"] = self.leftovers.to_dict()
        return out


def role_of(name: str | None, cmdline: list[str] | None) -> str | None:
    """What the process is for its server, from the process titles and command lines the
    server kinds of `vramdoctor.servers` know (e.g. "vllm worker TP0"); None when none does."""
    found = servers.title_of(name, cmdline)
    return found.role if found is not None else None


ServerKey = tuple[str | None, int]


def census(
    sample: GpuSample,
    *,
    groups: dict[int, int] | None = None,
    context_mib: tuple[float, float] = CONTEXT_MIB,
    helper_max_mib: float = HELPER_MAX_MIB,
    leftovers: Leftovers | None = None,
) -> Census:
    """Group a sample's process rows by process and flag the shapes above. Pure: the
    leftovers are scanned by the caller (`vramdoctor.sources.leftovers.scan`)."""
    lo, hi = context_mib
    rows = _process_rows(sample, groups or {})

    flags: list[Flag] = []
    members = _servers(rows)
    model_gpus = _model_gpus(members, helper_max_mib)
    api_rows = _api_server_contexts(members, model_gpus, helper_max_mib, flags)
    _stray_contexts(rows, api_rows, (lo, hi), flags)
    _helper_contexts(members, model_gpus, api_rows, (lo, helper_max_mib), flags)

    notes = _process_notes(rows)
    gpus = _gpu_rows(sample, rows)
    if sample.source == "dcgm":
        notes.append(
            "dcgm-exporter reports device memory only: no process rows. For processes, run "
            "census on the GPU host or point --gpu-metrics at nvitop-exporter."
        )

    if leftovers is not None:
        _leftover_flags(leftovers, flags)

    ordered = sorted(
        rows.values(),
        key=lambda r: (r.host or "", r.main_gpu if r.main_gpu is not None else 1 << 30, r.pid),
    )
    return Census(
        source=sample.source,
        t=sample.t,
        wall=sample.wall,
        gpus=gpus,
        processes=ordered,
        flags=flags,
        notes=notes,
        leftovers=leftovers,
    )


def _process_rows(sample: GpuSample, groups: dict[int, int]) -> dict[ServerKey, ProcessRow]:
    """One row per (host, PID), with what it holds on each GPU; a PID's server (process tree)
    from `groups`, else the PID itself."""
    rows: dict[ServerKey, ProcessRow] = {}
    for p in sample.processes:
        key = (p.host, p.pid)
        row = rows.get(key)
        if row is None:
            row = rows[key] = ProcessRow(
                pid=p.pid,
                host=p.host,
                name=p.name,
                cmdline=p.cmdline,
                visible=p.visible,
                role=role_of(p.name, p.cmdline),
                per_gpu={},
                group=groups.get(p.pid, p.pid),
            )
        if p.gpu not in row.per_gpu:
            row.per_gpu[p.gpu] = p.used_mib
        elif p.used_mib is not None:  # two rows for one GPU (e.g. MIG instances): add up
            row.per_gpu[p.gpu] = (row.per_gpu[p.gpu] or 0.0) + p.used_mib
    return rows


def _flag(
    flags: list[Flag],
    row: ProcessRow,
    code: str,
    message: str,
    gpu: int | None = None,
    mib: float | None = None,
) -> None:
    """Mark the row with `code` and add the flag to the census's list."""
    row.flags.append(code)
    flags.append(Flag(code=code, pid=row.pid, message=message, gpu=gpu, mib=mib, host=row.host))


def _servers(rows: dict[ServerKey, ProcessRow]) -> dict[ServerKey, list[ProcessRow]]:
    """The process rows of each server (process tree), by (host, group)."""
    members: dict[ServerKey, list[ProcessRow]] = {}
    for row in rows.values():
        members.setdefault((row.host, row.group), []).append(row)
    return members


def _model_gpus(
    members: dict[ServerKey, list[ProcessRow]], helper_max_mib: float
) -> dict[ServerKey, set[int]]:
    """Per server: the GPUs its model processes hold (a main GPU with more than a helper)."""
    model_gpus: dict[ServerKey, set[int]] = {}
    for key, group_rows in members.items():
        model_gpus[key] = {
            r.main_gpu
            for r in group_rows
            if r.main_gpu is not None and (r.per_gpu.get(r.main_gpu) or 0) > helper_max_mib
        }
    return model_gpus


def _api_server_contexts(
    members: dict[ServerKey, list[ProcessRow]],
    model_gpus: dict[ServerKey, set[int]],
    helper_max_mib: float,
    flags: list[Flag],
) -> set[int]:
    """Flag a frontend that may hold its own context on the engine's GPUs (vLLM's API server),
    with context-sized footprints only on GPUs its server's model processes use; the ids of
    those rows, which the other shapes leave alone."""
    api_rows: set[int] = set()
    for key, group_rows in members.items():
        engine = model_gpus[key]
        for row in group_rows:
            title = servers.title_of(row.name, row.cmdline)
            if title is None or title.title.gpu_context != "possible" or not engine:
                continue
            sizes = [(gi, mib) for gi, mib in row.per_gpu.items() if mib is not None]
            if sizes and all(gi in engine and mib <= helper_max_mib for gi, mib in sizes):
                api_rows.add(id(row))
                for gi, mib in sorted(sizes):
                    _flag(
                        flags,
                        row,
                        "api_server_context",
                        f"PID {row.pid} ({row.role}) holds {format_mib(mib, 0)} on GPU {gi}, one "
                        "of its engine's GPUs: the API server's own CUDA context (multimodal "
                        "inputs over GPU IPC, video decoding), not a stray context",
                        gpu=gi,
                        mib=mib,
                    )
    return api_rows


def _stray_contexts(
    rows: dict[ServerKey, ProcessRow],
    api_rows: set[int],
    context_mib: tuple[float, float],
    flags: list[Flag],
) -> None:
    """Per process: flag memory on several GPUs, and context-sized footprints off the main one."""
    lo, hi = context_mib
    for row in rows.values():
        if id(row) in api_rows:
            continue
        if len(row.per_gpu) > 1:
            main = row.main_gpu
            held_on = ", ".join(str(g) for g in sorted(row.per_gpu))
            _flag(
                flags,
                row,
                "multi_gpu",
                f"PID {row.pid} holds memory on GPUs {held_on}"
                + (f" (main: GPU {main})" if main is not None else ""),
            )
            for g, v in sorted(row.per_gpu.items()):
                if g != main and v is not None and lo <= v <= hi:
                    _flag(
                        flags,
                        row,
                        "stray_context",
                        f"PID {row.pid} holds {format_mib(v, 0)} on GPU {g} besides its main GPU {main}: "
                        "the size of a CUDA context. A tensor-parallel rank that opens a CUDA IPC "
                        "handle on the producer's GPU creates one there (~500 MiB a rank); so "
                        "does any code that touches bare 'cuda' (GPU 0).",
                        gpu=g,
                        mib=v,
                    )


def _helper_contexts(
    members: dict[ServerKey, list[ProcessRow]],
    model_gpus: dict[ServerKey, set[int]],
    api_rows: set[int],
    helper_mib: tuple[float, float],
    flags: list[Flag],
) -> None:
    """Per server (process tree): flag small processes (a context, up to a helper's size) on a
    GPU none of its model processes use (a problem), or on one they do (a note)."""
    lo, helper_max_mib = helper_mib
    for key, group_rows in members.items():
        if len(group_rows) < 2:
            continue
        big_gpus = model_gpus[key]
        if not big_gpus:
            continue
        for row in group_rows:
            if len(row.per_gpu) != 1 or id(row) in api_rows:
                continue
            ((g, v),) = row.per_gpu.items()
            if v is None or not lo <= v <= helper_max_mib:
                continue
            who = row.role or row.name or "process"
            if g not in big_gpus:
                where = ", ".join(str(x) for x in sorted(big_gpus))
                _flag(
                    flags,
                    row,
                    "off_main_gpu",
                    f"PID {row.pid} ({who}) holds {format_mib(v, 0)} on GPU {g}, where none of its server's "
                    f"model processes run (they are on GPU {where}): a CUDA context on the wrong GPU, "
                    "e.g. SGLang's tokenizer running the fast image processor on bare 'cuda' (GPU 0)",
                    gpu=g,
                    mib=v,
                )
            else:
                _flag(
                    flags,
                    row,
                    "helper_context",
                    f"PID {row.pid} ({who}) holds {format_mib(v, 0)} on GPU {g} beside its server's model "
                    "process: a CUDA context in a helper (e.g. the tokenizer's fast image "
                    "processor). If it grows under load, `vramdoctor soak` will show it.",
                    gpu=g,
                    mib=v,
                )


def _process_notes(rows: dict[ServerKey, ProcessRow]) -> list[str]:
    """Notes on what the process rows could not tell: PIDs outside this namespace, and rows
    without a per-process size."""
    notes: list[str] = []
    invisible = [r.pid for r in rows.values() if not r.visible]
    if invisible:
        notes.append(
            f"{len(invisible)} PID(s) NVML reports are not in this PID namespace, or belong here to a "
            "process without the GPU open (a container sees host PIDs): rows kept, names unknown; "
            "run census on the host, or the container with --pid=host."
        )
    if any(v is None for r in rows.values() for v in r.per_gpu.values()):
        notes.append("the driver does not report per-process memory for some rows (shown as '?').")
    return notes


def _gpu_rows(sample: GpuSample, rows: dict[ServerKey, ProcessRow]) -> list[GpuRow]:
    """One row per GPU: its memory, what its listed processes hold, and what nobody listed
    does (None where a size is unknown, or the source is dcgm-exporter)."""
    gpus: list[GpuRow] = []
    for mem in sample.gpus:
        procs = [r for r in rows.values() if mem.index in r.per_gpu and r.host == mem.host]
        known = [r.per_gpu[mem.index] for r in procs]
        proc_mib = sum(v for v in known if v is not None) if procs else 0.0
        all_known = all(v is not None for v in known)
        unattributed = mem.used_mib - proc_mib if all_known and sample.source != "dcgm" else None
        gpus.append(
            GpuRow(
                index=mem.index,
                host=mem.host,
                name=mem.name,
                uuid=mem.uuid,
                total_mib=mem.total_mib,
                used_mib=mem.used_mib,
                free_mib=mem.free_mib,
                driver_reserved_mib=mem.driver_reserved_mib,
                processes=len(procs),
                processes_mib=proc_mib if all_known else None,
                unattributed_mib=unattributed,
            )
        )
    return gpus


def _leftover_flags(leftovers: Leftovers, flags: list[Flag]) -> None:
    """One flag per orphaned family (its files, their size, what that rests on) and per
    orphaned GPU process."""
    by_family: dict[str, list[Any]] = {}
    for e in leftovers.orphaned:
        by_family.setdefault(e.family, []).append(e)
    for family, entries in by_family.items():
        size = sum(e.size_bytes for e in entries) / MIB
        pids = sorted({e.creator_pid for e in entries if e.creator_pid is not None})
        first = entries[0]
        more = f" and {len(entries) - 1} more" if len(entries) > 1 else ""
        flags.append(
            Flag(
                code="orphaned_shm",
                pid=pids[0] if pids else 0,
                message=f"{len(entries)} orphaned {family} file(s) in {leftovers.shm_dir} hold "
                f"{format_mib(size, 1)} ({first.name}{more}): {first.why}",
                mib=size,
            )
        )
    for p in leftovers.orphan_processes:
        held = [v for v in p.gpu_mib.values() if v is not None]
        gpus = ", ".join(str(g) for g in sorted(p.gpu_mib))
        flags.append(
            Flag(
                code="orphaned_gpu_process",
                pid=p.pid,
                message=f"PID {p.pid} ({p.role}) holds "
                + (f"{format_mib(sum(held), 0)} " if held else "memory ")
                + f"on GPU {gpus}, but {p.why}",
                gpu=min(p.gpu_mib) if p.gpu_mib else None,
                mib=sum(held) if held else None,
            )
        )
