"""Census on the terminal: a GPU table, a process table, the flags, the leftovers of crashes on
this host (with the clean-up as text, never run), one verdict line.

Tables are `vramdoctor.render.table.Table`: cells wrap at word boundaries, a number keeps its
unit, columns of lower priority are left out (and named) when the terminal is narrow, and a
pipe gets every column at full width.
"""

from __future__ import annotations

import datetime as _dt

from rich.console import Console
from rich.text import Text

from vramdoctor.census.analysis import Census
from vramdoctor.redact import one_line
from vramdoctor.render.table import Table
from vramdoctor.sources.leftovers import Leftovers, cleanup_commands
from vramdoctor.units import MIB


def _mib(value: float | None) -> str:
    return "?" if value is None else f"{value:,.0f} MiB"


def _bytes(value: int | None) -> str:
    if value is None:
        return "?"
    mib = value / MIB
    if 0 < value < MIB:  # a 4 KiB semaphore is not "0.0 MiB"
        return f"{value / 1024:,.1f} KiB"
    return f"{mib:,.1f} MiB" if mib < 10 else f"{mib:,.0f} MiB"


def _when(wall: float) -> str:
    return _dt.datetime.fromtimestamp(wall).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def gpu_table(c: Census) -> Table:
    multi_host = len({g.host for g in c.gpus}) > 1
    show_reserved = any(g.driver_reserved_mib is not None for g in c.gpus)
    per_proc = c.source != "dcgm"
    t = Table(title="GPUs")
    if multi_host:
        t.add_column("host")
    t.add_column("GPU", justify="right")
    t.add_column("name", priority=3)
    t.add_column("used", justify="right")
    t.add_column("total", justify="right")
    t.add_column("free", justify="right")
    if show_reserved:
        t.add_column("driver reserved", justify="right", priority=2)
    if per_proc:
        t.add_column("procs", justify="right", priority=1)
        t.add_column("in procs", justify="right", priority=1)
        t.add_column("other", justify="right", priority=1)
    for g in c.gpus:
        cells = [str(g.index), g.name or "?", _mib(g.used_mib), _mib(g.total_mib), _mib(g.free_mib)]
        if show_reserved:
            cells.append(_mib(g.driver_reserved_mib))
        if per_proc:
            cells += [str(g.processes), _mib(g.processes_mib), _mib(g.unattributed_mib)]
        t.add_row(*([g.host or "?"] if multi_host else []), *cells)
    return t


def process_table(c: Census) -> Table:
    multi_host = len({p.host for p in c.processes}) > 1
    t = Table(title="Processes")
    if multi_host:
        t.add_column("host")
    t.add_column("PID", justify="right")
    t.add_column("per GPU")
    t.add_column("total", justify="right", priority=2)
    t.add_column("role", priority=1)
    t.add_column("command", priority=3)
    t.add_column("flags", style="bold yellow")
    for p in c.processes:
        per_gpu = ", ".join(f"GPU {g}: {_mib(v)}" for g, v in sorted(p.per_gpu.items()))
        if p.cmdline:
            command = " ".join(p.cmdline)
        elif not p.visible:
            command = "(PID not in this namespace)"
        else:
            command = p.name or "?"
        flags = ", ".join(dict.fromkeys(p.flags))
        t.add_row(
            *([p.host or "?"] if multi_host else []),
            str(p.pid),
            per_gpu,
            _mib(p.total_mib),
            p.role or "",
            command,
            flags,
        )
    return t


def leftovers_table(lo: Leftovers) -> Table:
    t = Table(title=f"Left in {lo.shm_dir} (shared memory and semaphores of known families)")
    t.add_column("state")
    t.add_column("family")
    t.add_column("file", priority=2)
    t.add_column("size", justify="right")
    t.add_column("owner", priority=3)
    t.add_column("why", priority=1)
    for e in lo.entries:
        style = "yellow" if e.orphaned else None
        t.add_row(
            Text(e.state, style=style or ""),
            e.family,
            e.name,
            _bytes(e.size_bytes),
            e.owner or str(e.owner_uid),
            e.why,
            style=style,
        )
    return t


def render_leftovers(lo: Leftovers, console: Console) -> None:
    """The leftovers block: nothing at all on a clean host (no known-family file, no orphan)."""
    if lo.entries:
        console.print(leftovers_table(lo))
        orphaned = lo.orphaned
        size = sum(e.size_bytes for e in orphaned)
        used = (
            f"; {lo.shm_dir} holds {_bytes(lo.shm_used_bytes)} of {_bytes(lo.shm_total_bytes)}"
            if lo.shm_used_bytes is not None and lo.shm_total_bytes
            else ""
        )
        console.print(
            f"{len(lo.entries)} file(s) of known families, {len(orphaned)} orphaned "
            f"({_bytes(size)}){used}.",
            markup=False,
        )
    for p in lo.orphan_processes:
        held = ", ".join(f"GPU {g}: {_mib(v)}" for g, v in sorted(p.gpu_mib.items()))
        console.print(
            Text(
                one_line(f"! orphaned GPU process PID {p.pid} ({p.role}) holds {held}: {p.why}"),
                "yellow",
            )
        )
    commands = cleanup_commands(lo)
    if commands:
        console.print(
            "To clean up (vramdoctor never runs this; check that no server of yours still needs "
            "them first):",
            markup=False,
        )
        for line in commands:
            console.print("    " + one_line(line), markup=False, soft_wrap=True)
    for note in lo.notes:
        console.print(Text(one_line(f"- note: {note}"), style="dim"))


def render(c: Census, console: Console) -> None:
    """The human report. Plain when piped or NO_COLOR (the console decides). Without a GPU
    source (`--only-leftovers`) it says what it looked at, and its verdict speaks only of that."""
    gpu_looked = c.source != "none" or bool(c.gpus)
    if gpu_looked:
        head = f"GPU memory census: source {c.source}, {_when(c.wall)}"
    else:
        where = c.leftovers.shm_dir if c.leftovers is not None else "nothing"
        head = f"Census of what crashes left: {where} only, no GPU looked at, {_when(c.wall)}"
    console.print(head, markup=False, style="bold")
    if c.gpus or c.source != "none":
        console.print(gpu_table(c))
    if c.processes:
        console.print(process_table(c))
    elif c.source not in ("dcgm", "none"):
        console.print("No process holds GPU memory.", markup=False)
    for f in c.flags:
        if f.code in ("orphaned_shm", "orphaned_gpu_process"):
            continue  # said in the leftovers block, with its table
        mark = "!" if f.problem else "-"
        style = "yellow" if f.problem else "dim"
        console.print(Text(one_line(f"{mark} [{f.code}] {f.message}"), style=style))
    for note in c.notes:
        console.print(Text(one_line(f"- note: {note}"), style="dim"))
    if c.leftovers is not None:
        render_leftovers(c.leftovers, console)
    problems = [f for f in c.flags if f.problem]
    if problems:
        pids = sorted({f.pid for f in problems if f.pid})
        console.print(
            Text(
                f"PROBLEM: {len(problems)} finding(s)"
                + (f" on PID {', '.join(map(str, pids))}" if pids else ""),
                style="bold yellow",
            )
        )
    elif gpu_looked:
        console.print(
            Text(
                "OK: no process shows a stray-context or multi-GPU pattern"
                + ("; nothing orphaned is left by crashes" if c.leftovers is not None else ""),
                style="bold green",
            )
        )
    elif c.leftovers is not None:
        console.print(
            Text(
                f"OK: nothing orphaned is left by crashes in {c.leftovers.shm_dir} "
                "(no GPU was looked at)",
                style="bold green",
            )
        )
    else:
        console.print(Text("Nothing was looked at.", style="bold"))
