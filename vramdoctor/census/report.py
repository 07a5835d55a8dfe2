"""Census on the terminal: a GPU table, a process table, the flags, one verdict line."""

from __future__ import annotations

import datetime as _dt
import os

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from vramdoctor.census.analysis import Census


def _mib(value: float | None) -> str:
    return "?" if value is None else f"{value:,.0f}"


def _when(wall: float) -> str:
    return _dt.datetime.fromtimestamp(wall).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def gpu_table(c: Census) -> Table:
    multi_host = len({g.host for g in c.gpus}) > 1
    show_reserved = any(g.driver_reserved_mib is not None for g in c.gpus)
    per_proc = c.source != "dcgm"
    t = Table(title="GPUs (MiB)", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    if multi_host:
        t.add_column("host", no_wrap=True)
    t.add_column("GPU", justify="right", no_wrap=True, min_width=3)
    t.add_column("name", no_wrap=True, overflow="ellipsis", max_width=26, min_width=8)
    for name in (
        "used",
        "total",
        "free",
        *(("driver reserved",) if show_reserved else ()),
        *(("procs", "in procs", "other") if per_proc else ()),
    ):
        t.add_column(name, justify="right", no_wrap=True)
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
    t = Table(title="Processes (MiB)", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    if multi_host:
        t.add_column("host", no_wrap=True)
    t.add_column("PID", justify="right", no_wrap=True)
    t.add_column("per GPU", no_wrap=True)
    t.add_column("total", justify="right", no_wrap=True)
    t.add_column("role", overflow="fold", max_width=26)
    t.add_column("command", overflow="fold", max_width=80)
    t.add_column("flags", style="bold yellow", overflow="fold")
    for p in c.processes:
        per_gpu = ", ".join(f"{g}: {_mib(v)}" for g, v in sorted(p.per_gpu.items()))
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


def render(c: Census, console: Console) -> None:
    """The human report. Plain when piped or NO_COLOR (the console decides)."""
    if not console.is_terminal and "COLUMNS" not in os.environ and console.width < 160:
        console.width = 160  # piped to a file or pager: do not wrap at rich's default 80
    width = console.width
    console.print(
        f"GPU memory census: source {c.source}, {_when(c.wall)}", markup=False, style="bold"
    )
    console.print(gpu_table(c), width=width)
    if c.processes:
        console.print(process_table(c), width=width)
    elif c.source != "dcgm":
        console.print("No process holds GPU memory.", markup=False)
    for f in c.flags:
        mark = "!" if f.problem else "-"
        style = "yellow" if f.problem else "dim"
        console.print(Text(f"{mark} [{f.code}] {f.message}", style=style), width=width)
    for note in c.notes:
        console.print(Text(f"- note: {note}", style="dim"), width=width)
    problems = [f for f in c.flags if f.problem]
    if problems:
        pids = sorted({f.pid for f in problems})
        console.print(
            Text(
                f"PROBLEM: {len(problems)} finding(s) on PID {', '.join(map(str, pids))}",
                style="bold yellow",
            )
        )
    else:
        console.print(
            Text("OK: no process shows a stray-context or multi-GPU pattern", style="bold green")
        )
