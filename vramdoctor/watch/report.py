"""The terminal face of `watch`: one sentence, one table of series, the events and notes.

Never measures. One rate and one time to out of memory per result: the sentence and the
culprit's row both come from the leaking layer (`WatchResult.layers`), so stderr's lines
(`sentence`) and the final table agree. The table is `vramdoctor.render.table.Table`: nothing
is cut at any width or in a pipe, and every INCONCLUSIVE row says why in the table.
"""

from __future__ import annotations

import math
import time

from rich.console import Console
from rich.text import Text

from vramdoctor.render.table import Table
from vramdoctor.units import format_count, format_duration, format_mib
from vramdoctor.watch.result import LayerView, SeriesVerdict, WatchResult

__all__ = ["DECIDE_HOST", "change_line", "reason_words", "render", "sentence", "size"]

_STYLE = {"LEAK": "bold red", "CACHING": "yellow", "STABLE": "green", "INCONCLUSIVE": "dim"}

# Evidence codes in words (the JSON keeps the code)
_BASIS = {
    "inside_cuda": "the CUDA allocator's own counters, read inside the process",
    "inside_glibc": "glibc's bytes in use, read inside the process",
    "inside_python": "Python's own allocations, read inside the process",
    "rounds": "the levels after each round",
    "time": "growth inside idle windows",
    "kv_count": "the server's used-token count at idle",
}

DECIDE_HOST = (
    "from outside the process allocator retention and a leak look the same: to decide, run the "
    "server with vramdoctor's agent inside (watch --launch, or PYTHONPATH=$(vramdoctor "
    "agent-path) VRAMDOCTOR_AGENT_DIR=DIR), or restart it with MALLOC_ARENA_MAX=2 (retention "
    "goes away, a leak stays)"
)

_REASONS = {
    "flat": "flat",
    "rose_then_flat": "rose, then flat",
    "converging": "converging towards a bound",
    "fell_back": "rose, then fell back",
    "bounded": "moves within a band",
    "live_flat": "live bytes flat: kept, not held",
    "grew_every_round": "grows with the requests",
    "grew_with_time": "grows with time, idle too",
    "live_grew": "live bytes grow with the requests",
    "no_settled_level": "no idle window yet",
    "no_reference": "one idle window so far",
    "one_round_only": "one round so far",
    "too_few_rounds": "too few idle windows yet",
    "too_few_points": "too few points yet",
    "still_changing": "still changing",
    "steady_or_converging": "steady or converging: more idle windows decide",
    "retention_or_leak": "allocator retention or a leak (same from outside)",
    "outside_malloc": "grows outside malloc's counters",
    "transient": "came and went",
    "never_idle": "the server is never idle",
    "no_request_succeeded": "no request served",
    "server_died": "the server died",
    "noisy": "noise as large as any trend",
    "warming_up": "warming up",
}
_EXPLAIN = {
    "malloc_arenas": "new malloc arenas",
    "arena_retention": "glibc keeps freed bytes",
    "pinned_host_memory": "pinned host cache",
    "file_backed": "mapped files",
    "allocator_cache": "allocator cache",
    "fragmentation": "fragmentation",
    "converging_cache": "a cache filling",
    "live_cache": "a bounded cache of live objects",
    "stray_context": "a stray CUDA context",
}
_LAYER_NAME = {"vram": "VRAM", "kv": "the KV pool", "host": "host RAM"}


def size(value: float | None, unit: str, *, signed: bool = False) -> str:
    """A number with its unit: MiB (KiB under 1 MiB), or tokens; '-' for none."""
    if value is None or not math.isfinite(value):
        return "-"
    if unit == "tokens":
        sign = "+" if signed and value > 0 else ""
        return sign + format_count(round(value, 1), "tokens")
    if unit == "MiB" and abs(value) < 1.0 and value != 0.0:
        sign = "+" if signed and value > 0 else ""
        return f"{sign}{value * 1024:,.1f} KiB"
    return format_mib(value, signed=signed)


def reason_words(reason: str, explanation: str | None = None) -> str:
    words = _REASONS.get(reason, reason.replace("_", " "))
    if explanation:
        words += f" ({_EXPLAIN.get(explanation, explanation.replace('_', ' '))})"
    return words


def _where(s: SeriesVerdict) -> str:
    if s.layer == "kv":
        return f"KV pool {s.pool}" if s.pool and s.pool != "kv" else "KV pool"
    who = ""
    if s.pid is not None:
        who = f"PID {s.pid}" + (f" ({s.process})" if s.process else "")
    gpu = ""
    if s.gpu is not None:
        gpu = f"GPU {s.gpu}" + (f" MIG GI {s.gpu_instance}" if s.gpu_instance is not None else "")
    if s.layer == "device":
        return gpu or "device"
    if s.layer == "dev_shm":
        return "/dev/shm"
    text = f"{who} on {gpu}" if who and gpu else (who or gpu or s.key)
    if s.scope == "tenant":
        text += " [other tenant" + (f", user {s.username}" if s.username else "") + "]"
    return text


def _oom(hours: float | None, unit: str) -> str:
    if hours is None or not math.isfinite(hours):
        return "-"
    return ("pool full in " if unit == "tokens" else "") + format_duration(hours * 3600.0)


def _culprit_layer(result: WatchResult) -> LayerView | None:
    return result.layers.get(result.culprit_layer) if result.culprit_layer else None


def sentence(result: WatchResult) -> str:
    """One sentence: is anything leaking, how fast, when will it run out; else why not."""
    c, lay = result.culprit, _culprit_layer(result)
    if c is not None and lay is not None:
        rate = size(lay.rate_per_hour, lay.unit, signed=True)
        per_req = ""
        if lay.rate_per_request is not None:
            per_req = f" ({size(lay.rate_per_request, lay.unit, signed=True)} per served request)"
        how = " (it grows with time, idle too)" if lay.reason == "grew_with_time" else ""
        basis = (
            f"; decided by {_BASIS.get(lay.decided_by, lay.decided_by)}" if lay.decided_by else ""
        )
        if lay.hours_to_oom is not None:
            when = (
                f"the pool is full in {format_duration(lay.hours_to_oom * 3600.0)}"
                if lay.unit == "tokens"
                else f"{_LAYER_NAME.get(lay.layer, lay.layer)} runs out in "
                f"{format_duration(lay.hours_to_oom * 3600.0)}"
            )
        else:
            when = "time to out of memory unknown (free memory not read)"
        return (
            f"LEAK in {c.layer} of {_where(c)}: {rate} per hour{per_req}{how}; {when} at the "
            f"traffic it serves{basis}."
        )
    if result.verdict == "INCONCLUSIVE":
        return "INCONCLUSIVE: " + _why_undecided(result)
    caching = [n for n, v in result.layers.items() if v.verdict == "CACHING"]
    if caching:
        parts = [
            f"{_LAYER_NAME.get(n, n)} {reason_words(result.layers[n].reason, result.layers[n].explanation)}"
            for n in caching
        ]
        return f"No leak ({result.verdict}): " + "; ".join(parts) + "."
    return f"No leak ({result.verdict}): every watched layer is stable over the window."


def change_line(result: WatchResult) -> str:
    """The verdict and what it names, without a number: stderr's line when the verdict
    changes (the run's one rate and time to OOM are the final report's, `sentence`)."""
    c = result.culprit
    if c is not None:
        lay = _culprit_layer(result)
        how = " (in time, idle too)" if lay is not None and lay.reason == "grew_with_time" else ""
        return f"LEAK in {c.layer} of {_where(c)}{how}"
    measured = {n: v for n, v in result.layers.items() if v.verdict != "NOT_MEASURED"}
    if not measured:
        silent = next((n for n in result.notes if " never answered (" in n), None)
        if silent is not None:  # say why (its count left out: the line is said on a change)
            source, _, rest = silent.partition(" never answered (")
            why = rest.split("): ", 1)[1] if "): " in rest else ""
            return f"{result.verdict}: nothing measured yet: {source} never answered" + (
                f" ({why})" if why else ""
            )
        return f"{result.verdict}: no comparable moment yet"
    layers = ", ".join(f"{_LAYER_NAME.get(n, n)} {v.verdict}" for n, v in measured.items())
    return f"{result.verdict} ({layers})"


def _why_undecided(result: WatchResult) -> str:
    undecided = [v for v in result.layers.values() if v.verdict == "INCONCLUSIVE"]
    if not undecided:
        if result.mode == "rounds" and result.idle_windows < 3:
            return (
                f"not enough comparable moments yet ({result.idle_windows} idle window(s) of the "
                "server; about four are needed)."
            )
        return "no layer could be measured yet (see the notes)."
    parts = []
    for v in undecided:
        main = next((s for s in result.series if s.key == v.main_series), None)
        text = f"{_LAYER_NAME.get(v.layer, v.layer)}: {reason_words(v.reason)}"
        if v.reason == "retention_or_leak":
            rate = size(main.growth_per_request if main else None, v.unit, signed=True)
            text += f" ({rate} per served request); {DECIDE_HOST}"
        elif v.reason in ("too_few_rounds", "no_settled_level", "no_reference", "one_round_only"):
            text += f" ({result.idle_windows} idle window(s) so far)"
        elif v.steps_to_decide:
            text += f" (about {v.steps_to_decide} more idle windows)"
        parts.append(text)
    return "; ".join(parts) + "."


def _row_cells(s: SeriesVerdict) -> list[str | Text]:
    verdict = Text(str(s.verdict).replace("_", " "), style=_STYLE.get(str(s.verdict), ""))
    why = reason_words(s.reason, s.explanation)
    if not s.decides:
        why += "; evidence only" if s.scope == "server" and s.alive else ""
    if not s.alive:
        why += "; exited"
    basis = f"{s.mode}, {format_count(s.points, 'points' if s.mode != 'rounds' else 'rounds')}"
    return [
        _where(s),
        s.layer,
        size(s.level, s.unit),
        size(s.growth_per_hour, s.unit, signed=True),
        size(s.growth_per_request, s.unit, signed=True),
        _oom(s.hours_to_oom, s.unit),
        verdict,
        why,
        basis,
    ]


def render(result: WatchResult, console: Console, *, max_rows: int = 40) -> None:
    """The sentence, the table (deciding series first; evidence rows after, at most
    `max_rows` in all: the JSON has every one), stray contexts, the last events, the notes."""
    console.print(Text(sentence(result), style=_STYLE.get(result.verdict, "")))
    # the window is the most watch keeps, not how long it ran (a 45 s run has a 10-minute
    # window); rounds are the steps between idle windows, so 4 idle windows give 3 rounds
    title = f"watch: the last {format_duration(result.window_s)} at most, {result.mode}"
    if result.mode == "rounds":
        title += (
            f" ({format_count(result.rounds, 'round' if result.rounds == 1 else 'rounds')} "
            f"between {format_count(result.idle_windows, 'idle windows')})"
        )
    table = Table(title=title)
    table.add_column("where")
    table.add_column("layer", priority=1)
    table.add_column("level", justify="right", priority=1)
    table.add_column("growth/hour", justify="right")
    table.add_column("growth/request", justify="right", priority=2)
    table.add_column("time to OOM", justify="right")
    table.add_column("verdict")
    table.add_column("why")
    table.add_column("basis", priority=3)
    shown = result.series[:max_rows]
    for s in shown:
        table.add_row(*_row_cells(s), style="dim" if not s.decides else None)
    if shown:
        console.print(table)
    else:
        console.print(Text(f"{title}: no series measured yet", style="dim"))
    if len(result.series) > len(shown):
        console.print(Text(f"{len(result.series) - len(shown)} more series in --json", style="dim"))
    for f in result.strays:
        console.print(Text(f"stray context: {f['message']}", style="yellow"))
    for ev in result.events[-10:]:
        wall = ev.get("wall", 0)
        when = time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(wall if isinstance(wall, (int, float)) else 0)
        )
        rest = ", ".join(f"{k}={v}" for k, v in ev.items() if k not in ("wall", "event", "by"))
        console.print(Text(f"{when} {ev.get('event')}: {rest}", style="dim"))
    for note in result.notes:
        console.print(Text(f"note: {note}", style="dim"))
