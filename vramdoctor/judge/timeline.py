"""The run's protocol from its events: windows, rounds, server lives, processes that came and went.

Soak writes every phase boundary as an event (baseline_start/end, round_start/end,
idle_start/end), and the sampler writes what it saw happen to the server
(`model.SERVER_DIED`, `SERVER_REPLACED`, `PROCESS_APPEARED`, `PROCESS_EXITED`). A death
splits the run: rounds whose idle window had not ended when the server died, and every round
after it, carry no verdict. A replacement (a new pid owns the port) starts a new life, judged
on its own rounds.
"""

from __future__ import annotations

import math
from typing import Any

from vramdoctor.judge.results import Life, ProcessChange, RoundInfo, Window
from vramdoctor.samples import (
    PROCESS_APPEARED,
    PROCESS_EXITED,
    REACHED_SERVER,
    SERVER_DIED,
    SERVER_REPLACED,
    Event,
)

_STARTS = {"baseline_start": "baseline", "round_start": "load", "idle_start": "idle"}
_ENDS = {"baseline_end": "baseline", "round_end": "load", "idle_end": "idle"}
# Older run files (before model.SERVER_DIED) marked a server that stopped answering so.
_LEGACY_GONE = "server_gone"


def _int(value: Any, default: int = 0) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return default
    return int(f) if math.isfinite(f) else default


def windows_from_events(events: list[Event]) -> list[Window]:
    """Baseline, load and idle windows from the protocol events (open ones have end=None)."""
    out: list[Window] = []
    open_: dict[tuple[str, int], Window] = {}
    for ev in events:
        rnd = _int(ev.data.get("round", 0))
        if ev.name in _STARTS:
            w = Window(_STARTS[ev.name], rnd, ev.t, None)
            open_[(w.kind, rnd)] = w
            out.append(w)
        elif ev.name in _ENDS:
            closed = open_.pop((_ENDS[ev.name], rnd), None)
            if closed is not None:
                closed.end = ev.t
    return out


def rounds_from_events(events: list[Event]) -> list[RoundInfo]:
    """One RoundInfo per started round, with the outcome counts of its round_end event."""
    rounds: dict[int, RoundInfo] = {}
    starts: dict[int, float] = {}
    for ev in events:
        if ev.name == "round_start":
            rnd = _int(ev.data.get("round", 0))
            starts[rnd] = ev.t
            rounds[rnd] = RoundInfo(rnd, 0, 0, 0, 0, {}, None, False)
        elif ev.name == "round_end":
            rnd = _int(ev.data.get("round", 0))
            outcomes = ev.data.get("outcomes") or {}
            kinds = (
                {str(k): _int(v) for k, v in outcomes.items()} if isinstance(outcomes, dict) else {}
            )
            sent = _int(ev.data.get("sent", sum(kinds.values())))
            # A planned abort (the client closes the stream after the first tokens) is traffic
            # the server served, not an error: it counts with the successes.
            n_aborted = kinds.get("aborted", 0)
            ok = kinds.get("ok", 0) + n_aborted
            reached = sum(kinds.get(k, 0) for k in REACHED_SERVER)
            streamed = ev.data.get("streamed")
            aborted = ev.data.get("aborted", kinds.get("aborted"))
            rounds[rnd] = RoundInfo(
                rnd,
                sent,
                ok,
                max(0, sent - ok),
                reached,
                {k: v for k, v in kinds.items() if k not in ("ok", "aborted") and v},
                ev.t - starts[rnd] if rnd in starts else None,
                bool(ev.data.get("complete", True)),
                [str(m) for m in ev.data.get("errors") or []],
                streamed=None if streamed is None else _int(streamed),
                aborted=None if aborted is None else _int(aborted),
            )
    return [rounds[k] for k in sorted(rounds)]


def lives_from_events(
    events: list[Event],
    windows: list[Window],
    rounds: list[RoundInfo],
    start_t: float,
    pid: int | None = None,
) -> list[Life]:
    """Split the run at server deaths and replacements; assign each round to a life.

    A round belongs to the life in which both its load started and its idle window ended. A
    round that a death or a replacement cuts (or that comes after a death with no new server)
    gets life -1: it carries no verdict.
    """
    lives = [Life(0, start_t, None, pid, None)]
    dead = False
    for ev in events:
        if ev.name in (SERVER_DIED, _LEGACY_GONE) and not dead:
            cur = lives[-1]
            cur.end_t, cur.ended_by = ev.t, SERVER_DIED
            reason = ev.data.get("reason")
            cur.reason = str(reason) if reason is not None else None
            if cur.pid is None and ev.data.get("pid") is not None:
                cur.pid = _int(ev.data.get("pid"))
            dead = True
        elif ev.name == SERVER_REPLACED:
            cur = lives[-1]
            if cur.end_t is None:
                cur.end_t, cur.ended_by = ev.t, SERVER_REPLACED
            if cur.pid is None and ev.data.get("old_pid") is not None:
                cur.pid = _int(ev.data.get("old_pid"))
            new_pid = ev.data.get("new_pid")
            lives.append(
                Life(len(lives), ev.t, None, None if new_pid is None else _int(new_pid), None)
            )
            dead = False
    load = {w.round: w for w in windows if w.kind == "load"}
    idle = {w.round: w for w in windows if w.kind == "idle"}
    for r in rounds:
        w_load, w_idle = load.get(r.round), idle.get(r.round)
        r.life = -1
        if w_load is None:
            continue
        end = w_idle.end if w_idle is not None and w_idle.end is not None else None
        home = [life for life in lives if life.start_t <= w_load.start]
        if not home:
            continue
        life = home[-1]
        if life.end_t is not None and (
            end is None or end > life.end_t or w_load.start >= life.end_t
        ):
            continue  # cut by the death or replacement, or after a death
        r.life = life.index
        life.rounds.append(r.round)
    return lives


def process_changes_from_events(events: list[Event], windows: list[Window]) -> list[ProcessChange]:
    """PROCESS_APPEARED / PROCESS_EXITED events as changes, each placed in its round."""
    out: list[ProcessChange] = []
    for ev in events:
        if ev.name not in (PROCESS_APPEARED, PROCESS_EXITED) or ev.data.get("pid") is None:
            continue
        gpu = ev.data.get("gpu")
        out.append(
            ProcessChange(
                pid=_int(ev.data.get("pid")),
                change="appeared" if ev.name == PROCESS_APPEARED else "exited",
                t=ev.t,
                round=round_at(windows, ev.t),
                name=None if ev.data.get("name") is None else str(ev.data.get("name")),
                gpu=None if gpu is None else _int(gpu),
            )
        )
    return out


def round_at(windows: list[Window], t: float) -> int | None:
    """The round whose load or idle window contains `t` (0 in the baseline), else None; at a
    boundary (one window's end is the next one's start) the later window."""
    found = None
    for w in windows:
        if w.start <= t and (w.end is None or t <= w.end):
            found = w.round
    return found
