"""Census on the terminal: a GPU table, a process table, the flags, one verdict line."""

from __future__ import annotations

import datetime as _dt

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..analysis.census import Census


def _mib(value: float | None) -> str:
    return "?" if value is None else f"{value:,.0f}"


def _when(wall: float) -> str:
    return _dt.datetime.fromtimestamp(wall).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _command(cmdline: list[str] | None, width: int = 70) -> str:
    text = " ".join(cmdline or [])
    return text if len(text) <= width else text[: width - 1] + "…"


def gpu_table(c: Census) -> Table:
    multi_host = len({g.host for g in c.gpus}) > 1
    t = Table(title="GPUs (MiB)", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    if multi_host:
        t.add_column("host")
    for name, justify in (("GPU", "right"), ("name", "left"), ("used", "right"), ("total", "right"),
                          ("free", "right"), ("reserved", "right"), ("procs", "right"),
                          ("by procs", "right"), ("other", "right")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for g in c.gpus:
        cells = [str(g.index), g.name or "?", _mib(g.used_mib), _mib(g.total_mib), _mib(g.free_mib),
                 _mib(g.reserved_mib), str(g.processes) if c.source != "dcgm" else "-",
                 _mib(g.processes_mib) if c.source != "dcgm" else "-", _mib(g.unattributed_mib)]
        t.add_row(*([g.host or "?"] if multi_host else []), *cells)
    return t


def process_table(c: Census) -> Table:
    multi_host = len({p.host for p in c.processes}) > 1
    t = Table(title="Processes (MiB)", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    if multi_host:
        t.add_column("host")
    t.add_column("PID", justify="right")
    t.add_column("per GPU", no_wrap=True)
    t.add_column("total", justify="right")
    t.add_column("what", overflow="fold")
    t.add_column("flags", style="bold yellow")
    for p in c.processes:
        per_gpu = ", ".join(f"{g}: {_mib(v)}" for g, v in sorted(p.per_gpu.items()))
        if p.role:
            what = f"{p.role}  {_command(p.cmdline, 50)}" if p.cmdline else p.role
        elif p.cmdline:
            what = _command(p.cmdline)
        elif not p.visible:
            what = "(PID not in this namespace)"
        else:
            what = p.name or "?"
        flags = ", ".join(dict.fromkeys(p.flags))
        t.add_row(*([p.host or "?"] if multi_host else []), str(p.pid), per_gpu, _mib(p.total_mib),
                  what, flags)
    return t


def render(c: Census, console: Console) -> None:
    """The human report. Plain when piped or NO_COLOR (the console decides)."""
    width = max(console.width, 120) if not console.is_terminal else console.width
    console.print(f"GPU memory census: source {c.source}, {_when(c.wall)}", markup=False, style="bold")
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
        console.print(Text(
            f"PROBLEM: {len(problems)} finding(s) on PID {', '.join(map(str, pids))}", style="bold yellow"
        ))
    else:
        console.print(Text("OK: no process shows a stray-context or multi-GPU pattern", style="bold green"))
