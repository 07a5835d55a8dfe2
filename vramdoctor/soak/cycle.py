"""`soak --cycle sleep[:LEVEL]|release|lora[:NAME[=PATH]]`: what one lifecycle operation leaves.

Between rounds, in the idle window, the server's own lifecycle operation runs through its real
endpoints (the server kind's `lifecycle` section, `vramdoctor.servers.lifecycle_sections`):
vLLM: sleep at LEVEL (default 1) and wake up, or load and unload a LoRA adapter; SGLang:
release and resume memory occupation, or load and unload a LoRA adapter. The operation's `do`
call, a short hold (samples in it show what the operation freed), then its `undo` call, each
marked by a `cycle_do` / `cycle_undo` event with its HTTP status and time.

Rounds are identical traffic; only their idle windows differ: after one warm-up round, blocks
of two rounds, one with the cycle in its idle window and one without, in an order drawn from
the seed (`random.Random(f"{seed}:cycle:{block}")`). What a round left behind (the change of
each layer's settled level, `vramdoctor.soak.contrast`) then contrasts a cycled round with a
plain one: the residue PER CYCLE, with its 90 % interval, apart from whatever the requests
themselves leave. A residue that exceeds the floor, whose interval excludes zero and that does
not fade, is a LEAK of that operation; three blocks are planned, more while undecided.

A call that fails (404: the route is not there, e.g. vLLM without VLLM_SERVER_DEV_MODE=1; an
error answer) stops the soak with one line naming what the server needs; the run's exit code
is then 2. JSON (`soak --json` key `cycle`): {"operation", "display", "blocks", "layers":
{layer: {"unit", "per": "cycle", "residue": Estimate, "plain": Estimate, "held_change": float|null
(the level while the operation held minus before it),
"after_each_cycle": [...], "verdict", "headline"}}, "verdict", "headline", "failed"}.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from vramdoctor.errors import InputError
from vramdoctor.soak.contrast import (
    Estimate,
    LayerRounds,
    Observation,
    decide,
    fit_blocks,
    growth_estimate,
    layer_rounds,
)
from vramdoctor.soak.session import SoakHook
from vramdoctor.soak.vary import LAYER_NAMES, _fmt, _interval

if TYPE_CHECKING:
    from vramdoctor.record import Run
    from vramdoctor.servers.lifecycle_sections import CycleOperation, Endpoint
    from vramdoctor.soak.config import SoakConfig
    from vramdoctor.soak.session import SoakSession

CYCLE_ROUND = "cycle_round"
CYCLE_DO = "cycle_do"
CYCLE_UNDO = "cycle_undo"
CYCLE_FAILED = "cycle_failed"
MIN_BLOCKS = 3
DEFAULT_MAX_BLOCKS = 6
KV_FLOOR_TOKENS = 1.0
OPERATIONS = ("sleep", "release", "lora")


@dataclass(frozen=True)
class CycleSpec:
    """What --cycle asked: the operation, the sleep level, the adapter's name and path."""

    operation: str
    level: int = 1
    lora_name: str | None = None
    lora_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "level": self.level,
            "lora_name": self.lora_name,
            "lora_path": self.lora_path,
        }


def parse_cycle(text: str) -> CycleSpec:
    """`sleep`, `sleep:2`, `release`, `lora`, `lora:NAME`, `lora:NAME=PATH` -> CycleSpec;
    InputError (one line) for anything else."""
    op, _, arg = text.strip().partition(":")
    op = op.strip().lower()
    if op not in OPERATIONS:
        raise InputError(f"--cycle {text!r}: one of sleep[:LEVEL], release, lora[:NAME[=PATH]]")
    if op == "sleep":
        if not arg:
            return CycleSpec("sleep")
        if arg.strip() not in ("0", "1", "2"):
            raise InputError(f"--cycle {text!r}: a sleep level is 0, 1 or 2")
        return CycleSpec("sleep", level=int(arg))
    if op == "release":
        if arg:
            raise InputError(f"--cycle {text!r}: release takes no value")
        return CycleSpec("release")
    name, _, path = arg.partition("=")
    return CycleSpec("lora", lora_name=name.strip() or None, lora_path=path.strip() or None)


@dataclass(frozen=True)
class CyclePlan:
    spec: CycleSpec
    seed: int

    def order(self, block: int) -> list[str]:
        names = ["cycle", "none"]
        random.Random(f"{self.seed}:cycle:{block}").shuffle(names)
        return names

    def shape_of(self, rnd: int) -> tuple[str, int]:
        if rnd <= 1:
            return "none", 0
        k = rnd - 2
        block = k // 2 + 1
        return self.order(block)[k % 2], block

    def rounds_for(self, blocks: int) -> int:
        return 1 + 2 * blocks

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.spec.to_dict(),
            "seed": self.seed,
            "warmup_rounds": 1,
            "block_orders": {str(b): self.order(b) for b in range(1, DEFAULT_MAX_BLOCKS + 1)},
        }


def adjust_config(cfg: SoakConfig) -> SoakConfig:
    """`cfg` with the rounds --cycle needs: a warm-up round and three blocks of two (exactly
    that with --no-adapt), more blocks while undecided up to --max-rounds (default six)."""
    if not cfg.cycle:
        return cfg
    plan = CyclePlan(parse_cycle(cfg.cycle), cfg.seed)
    rounds = plan.rounds_for(MIN_BLOCKS)
    blocks = (
        max(MIN_BLOCKS, (cfg.max_rounds - 1) // 2)
        if cfg.max_rounds is not None
        else DEFAULT_MAX_BLOCKS
    )
    cap = plan.rounds_for(blocks)
    if cfg.rounds == rounds and cfg.max_rounds == (cap if cfg.adapt else None):
        return cfg
    return replace(cfg, rounds=rounds, max_rounds=cap if cfg.adapt else None)


class CycleFailed(Exception):
    """A lifecycle call did not do what it should: the message says what the server needs."""


def _call(
    session: SoakSession, endpoint: Endpoint, params: Mapping[str, str], timeout: float
) -> tuple[int, Any, float]:
    """(status, answer (JSON or text), seconds) of one lifecycle call."""
    import requests

    path, query, body = endpoint.render(**params)
    t0 = time.monotonic()
    r = requests.request(
        endpoint.method,
        session.base + path,
        params=query or None,
        json=body if endpoint.body is not None else None,
        headers=session.headers,
        timeout=timeout,
    )
    took = time.monotonic() - t0
    try:
        answer: Any = r.json()
    except ValueError:
        answer = r.text[:200]
    return r.status_code, answer, took


class CycleHook(SoakHook):
    """Runs the operation in the idle windows of the plan's cycle rounds (see the module doc)."""

    name = "cycle"

    def __init__(self, plan: CyclePlan) -> None:
        self.plan = plan
        self.swapped = False  # an adapter loaded at start: the cycle unloads, then loads
        self.op: CycleOperation | None = None
        self.params: dict[str, str] = {}
        self.display = ""
        self.failed: str | None = None

    def header(self, session: SoakSession) -> Mapping[str, Any]:
        from vramdoctor import servers

        assert session.info is not None
        kind = servers.get(session.info.kind)
        spec = self.plan.spec
        op = kind.lifecycle.get(spec.operation)
        if op is None:
            has = kind.lifecycle.names()
            raise InputError(
                f"--cycle {spec.operation}: {kind.display_name} has no such operation"
                + (
                    f" (it has: {', '.join(has)})"
                    if has
                    else " (it has no lifecycle endpoints vramdoctor knows)"
                )
            )
        params = {"level": str(spec.level)}
        self.swapped = False
        if spec.operation == "lora":
            name, path = spec.lora_name, spec.lora_path
            found_name, found_path = find_lora(session, name)
            if found_path is not None and (name is None or found_name == name):
                # loaded already (vLLM --lora-modules, SGLang --lora-paths): unload, then load
                self.swapped = True
            if not name or not path:
                name, path = name or found_name, path or found_path
            if not name or not path:
                raise InputError(
                    "--cycle lora: name the adapter and its path on the server: "
                    "--cycle lora:NAME=PATH (none found in the server's model list)"
                )
            params.update(name=name, path=path)
            self.plan = CyclePlan(replace(spec, lora_name=name, lora_path=path), self.plan.seed)
        if op.check is not None:
            status, _answer, _ = _call(session, op.check, params, session.config.timeout_s)
            if status == 404:
                raise InputError(
                    f"--cycle {spec.operation}: {session.base}{op.check.path} answers 404: "
                    f"the server needs {op.gate or 'its lifecycle routes'}"
                )
        self.op, self.params = op, params
        self.display = op.display.format(**params)
        if self.swapped:
            self.display = f"unload and load again the LoRA adapter {params['name']}"
        session.say(
            f"--cycle: {self.display} in the idle window of every other round (seeded order), "
            f"through {op.do.describe(**params)} then {op.undo.describe(**params)}"
        )
        return {
            "cycle_plan": {
                **self.plan.to_dict(),
                "display": self.display,
                "source": op.source,
                "undo_first": self.swapped,
            }
        }

    def before_round(self, session: SoakSession, round_index: int) -> None:
        shape, block = self.plan.shape_of(round_index)
        session.event(CYCLE_ROUND, {"round": round_index, "shape": shape, "block": block})

    def on_idle_start(self, session: SoakSession, round_index: int) -> None:
        if self.failed or self.op is None:
            return
        shape, _block = self.plan.shape_of(round_index)
        if shape != "cycle":
            return
        op, params = self.op, self.params
        timeout = max(30.0, session.config.timeout_s)
        # Held long enough for at least 4 samples to see it (at 0.15 x idle alone, a 0.25 s
        # sampler missed a 0.4 s hold on the GPU, and a loaded CI machine a 0.22 s one), at most
        # half the idle window (the undo and the settled level after it need the rest).
        cfg = session.config
        hold = min(max(0.15 * cfg.idle_s, 4.0 * cfg.interval_s, 0.4), 0.5 * cfg.idle_s, 5.0)
        try:
            first, second = (op.undo, op.do) if self.swapped else (op.do, op.undo)
            for step, endpoint, event in (("do", first, CYCLE_DO), ("undo", second, CYCLE_UNDO)):
                status, answer, took = _call(session, endpoint, params, timeout)
                ok = status in endpoint.ok and (
                    endpoint.success_key is None
                    or (isinstance(answer, dict) and answer.get(endpoint.success_key) is True)
                )
                session.event(
                    event,
                    {
                        "round": round_index,
                        "call": endpoint.describe(**params),
                        "status": status,
                        "seconds": round(took, 3),
                        "ok": ok,
                        "answer": answer if isinstance(answer, (dict, list)) else str(answer)[:200],
                    },
                )
                if not ok:
                    need = (
                        f"; the server needs {op.gate}" if status == 404 and op.gate else ""
                    ) or (f"; check {op.needs}" if op.needs else "")
                    raise CycleFailed(
                        f"--cycle {op.operation}: {endpoint.describe(**params)} answered HTTP "
                        f"{status} ({str(answer)[:120]}){need}"
                    )
                if step == "do":
                    time.sleep(hold)  # samples while the operation holds show what it freed
        except (CycleFailed, OSError, Exception) as exc:
            self.failed = (
                str(exc)
                if isinstance(exc, CycleFailed)
                else f"--cycle {op.operation}: {type(exc).__name__}: {exc}"
            )
            session.event(CYCLE_FAILED, {"round": round_index, "error": self.failed[:300]})
            session.say(self.failed + "; the soak stops")
            if session.protocol is not None:
                session.protocol.state.stopped_by = "cycle-failed"
                session.protocol.stop.set()

    def more_rounds(
        self, session: SoakSession, undecided: list[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        assert session.protocol is not None and session.writer is not None
        if self.failed:
            return []
        done = session.protocol.state.round
        if done >= 1 and (done - 1) % 2 != 0:
            return [("cycle", "the block is one round short")]
        result = analyse_cycle(session.writer.read_back())
        if result is None:
            return []
        return [(k, v.headline) for k, v in result.layers.items() if v.verdict == "INCONCLUSIVE"]


def find_lora(session: SoakSession, name: str | None) -> tuple[str | None, str | None]:
    """An adapter (name, path) the server lists: vLLM's /v1/models cards carry `root` = path;
    SGLang's /server_info carries `lora_paths` {name: path}."""
    import requests

    for path, pick in (
        ("/v1/models", "models"),
        ("/server_info", "info"),
        ("/get_server_info", "info"),
    ):
        try:
            data = requests.get(session.base + path, headers=session.headers, timeout=10).json()
        except (requests.RequestException, ValueError):
            continue
        if pick == "models" and isinstance(data, dict):
            for card in data.get("data") or []:
                ok = isinstance(card, dict) and card.get("parent") and card.get("root")
                if ok and (name is None or card.get("id") == name):
                    return str(card["id"]), str(card["root"])
        paths = data.get("lora_paths") if pick == "info" and isinstance(data, dict) else None
        if isinstance(paths, dict):
            for n, p in paths.items():
                if name is None or n == name:
                    return str(n), str(p)
    return name, None


# --- the analysis -------------------------------------------------------------------------


@dataclass
class CycleLayer:
    layer: str
    unit: str
    residue: Estimate
    plain: Estimate
    after_each_cycle: list[float]
    freed: float | None
    verdict: str
    headline: str
    floor: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "per": "cycle",
            "floor": self.floor,
            "held_change": self.freed,
            "residue": self.residue.to_dict(),
            "plain": self.plain.to_dict(),
            "after_each_cycle": self.after_each_cycle,
            "verdict": self.verdict,
            "headline": self.headline,
        }


@dataclass
class CycleResult:
    spec: CycleSpec
    display: str
    blocks: int
    cycles: int
    layers: dict[str, CycleLayer] = field(default_factory=dict)
    failed: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.failed:
            return "FAILED"
        vs = [v.verdict for v in self.layers.values()]
        if "LEAK" in vs:
            return "LEAK"
        if "INCONCLUSIVE" in vs or not vs:
            return "INCONCLUSIVE"
        return "STABLE"

    @property
    def headline(self) -> str:
        if self.failed:
            return self.failed
        leaks = [
            f"{LAYER_NAMES[k]}: {v.headline}" for k, v in self.layers.items() if v.verdict == "LEAK"
        ]
        if leaks:
            return f"each cycle of '{self.display}' leaves memory behind: " + "; ".join(leaks)
        if self.verdict == "INCONCLUSIVE":
            return "undecided: " + "; ".join(
                f"{LAYER_NAMES[k]}: {v.headline}"
                for k, v in self.layers.items()
                if v.verdict == "INCONCLUSIVE"
            )
        return f"'{self.display}' leaves nothing behind per cycle on any layer"

    @property
    def exit_code(self) -> int:
        return 2 if self.failed else (1 if self.verdict == "LEAK" else 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            **self.spec.to_dict(),
            "display": self.display,
            "blocks": self.blocks,
            "cycles": self.cycles,
            "layers": {k: v.to_dict() for k, v in self.layers.items()},
            "verdict": self.verdict,
            "headline": self.headline,
            "failed": self.failed,
            "notes": self.notes,
        }


def _plan_from_header(header: Mapping[str, Any]) -> tuple[CyclePlan, str] | None:
    data = (header.get("config") or {}).get("cycle_plan")
    if not isinstance(data, dict) or data.get("operation") not in OPERATIONS:
        return None
    spec = CycleSpec(
        str(data["operation"]),
        int(data.get("level") or 1),
        data.get("lora_name"),
        data.get("lora_path"),
    )
    return CyclePlan(spec, int(data.get("seed", 0))), str(data.get("display") or spec.operation)


def analyse_cycle(run: Run, *, min_growth_mib: float | None = None) -> CycleResult | None:
    """The --cycle analysis of a run (None when the run did not cycle)."""
    from vramdoctor.judge.series import extract_series

    got = _plan_from_header(run.header)
    if got is None:
        return None
    plan, display = got
    cfg = run.header.get("config") or {}
    floor_mib = float(
        min_growth_mib if min_growth_mib is not None else cfg.get("min_growth_mib", 2.0)
    )
    marks, done, began, failed = _cycle_events(run.records)
    levels, rounds = layer_rounds(run.records)
    complete = {ri.round: ri.complete and ri.reached > 0 for ri in rounds}
    judged = [r for r in sorted(complete) if r >= 2 and complete[r]]

    def shape(r: int) -> tuple[str, int]:
        s, b = marks.get(r, plan.shape_of(r))
        if s == "cycle" and r not in done:
            return "failed", b
        return s, b

    full = _full_blocks(judged, shape)
    use = full[1:] if len(full) >= 3 else full
    result = CycleResult(plan.spec, display, len(full), len(done), failed=failed)
    if len(full) >= 3:
        result.notes.append(f"{len(full)} blocks: the first is left out as the operation's warm-up")
    series = extract_series(list(run.records)) if done else {}
    for layer, lr in levels.items():
        judged_layer = _cycle_layer(layer, lr, judged, shape, use, floor_mib, series, done, began)
        if judged_layer is not None:
            result.layers[layer] = judged_layer
    return result


def _cycle_events(
    records: Sequence[Any],
) -> tuple[
    dict[int, tuple[str, int]], dict[int, tuple[float, float]], dict[int, float], str | None
]:
    """What the run's cycle events say: each round's mark (round -> (shape, block)), each
    completed cycle (round -> (do end, undo start)), when each do began (round -> time), and
    the failed call's error (None when no call failed)."""
    from vramdoctor.samples import Event

    marks: dict[int, tuple[str, int]] = {}
    done: dict[int, tuple[float, float]] = {}  # round -> (do end, undo start)
    began: dict[int, float] = {}  # round -> do start
    failed: str | None = None
    do_t: dict[int, float] = {}
    for r in records:
        if not isinstance(r, Event):
            continue
        d = r.data
        try:
            if r.name == CYCLE_ROUND:
                marks[int(d["round"])] = (str(d["shape"]), int(d["block"]))
            elif r.name == CYCLE_DO and d.get("ok"):
                do_t[int(d["round"])] = r.t
                # when the call began: a sample taken while it ran (or between its answer and
                # this event) already holds what it moved, and "before" must not (seen under
                # load: +21.9 of a sleep's +32 MiB offload)
                began[int(d["round"])] = r.t - float(d.get("seconds") or 0)
            elif r.name == CYCLE_UNDO and d.get("ok") and int(d["round"]) in do_t:
                done[int(d["round"])] = (do_t[int(d["round"])], r.t - float(d.get("seconds") or 0))
            elif r.name == CYCLE_FAILED:
                failed = str(d.get("error"))
        except (KeyError, TypeError, ValueError):
            continue
    return marks, done, began, failed


def _full_blocks(judged: list[int], shape: Callable[[int], tuple[str, int]]) -> list[int]:
    """The blocks whose judged rounds are exactly one cycled round and one plain round."""
    blocks = sorted({shape(r)[1] for r in judged})
    return [
        b
        for b in blocks
        if sorted(shape(r)[0] for r in judged if shape(r)[1] == b) == ["cycle", "none"]
    ]


def _cycle_layer(
    layer: str,
    lr: LayerRounds,
    judged: list[int],
    shape: Callable[[int], tuple[str, int]],
    use: list[int],
    floor_mib: float,
    series: Mapping[str, Any],
    done: Mapping[int, tuple[float, float]],
    began: Mapping[int, float],
) -> CycleLayer | None:
    """One layer's residue per cycle (cycled rounds against plain ones, blocks in `use`), its
    level after each cycle, what the operation held, and its verdict; None when the layer's
    rounds do not give both shapes."""
    obs = []
    for r in judged:
        s, b = shape(r)
        if b not in use or s == "failed":
            continue
        dlt = lr.delta(r)
        if dlt is not None:
            obs.append(Observation(r, b, s, dlt))
    fit = fit_blocks(obs)
    if fit is None or set(fit.shapes) != {"cycle", "none"}:
        return None
    floor = KV_FLOOR_TOKENS if lr.unit == "tokens" else floor_mib
    est = fit.contrast({"cycle": 1.0, "none": -1.0})
    block_sd = math.sqrt(2.0) * fit.sigma if fit.sigma is not None else None
    trend = _residue_trend(est, floor, block_sd)
    residue = decide(est, floor, sigma=block_sd, trend=trend)
    plain = fit.contrast({"none": 1.0}, absolute=True)
    base = lr.baseline
    after = [
        round(lr.levels[r] - base, 3)  # type: ignore[operator]
        for r in sorted(done)
        if lr.levels.get(r) is not None and base is not None
    ]
    freed = _freed(series, lr.series, done, layer, began)
    verdict, head = _cycle_verdict(residue, lr.unit)
    return CycleLayer(layer, lr.unit, residue, plain, after, freed, verdict, head, floor)


def _residue_trend(est: Estimate, floor: float, block_sd: float | None) -> Any:
    """The residue's own trend, cycle after cycle (the growth model's fit over its running
    sum); None with fewer than three blocks."""
    trend = None
    if len(est.per_block) >= 3:  # the residue's own trend, cycle after cycle
        cum = [0.0]
        for dv in est.per_block:
            cum.append(cum[-1] + dv)
        trend = growth_estimate(
            list(range(len(cum))), cum, floor=floor, step=1.0, noise=block_sd or 0.0
        )[1]
    return trend


def _cycle_verdict(residue: Estimate, unit: str) -> tuple[str, str]:
    """A layer's verdict (LEAK, INCONCLUSIVE, STABLE) and its headline, from its residue."""
    if residue.decision == "leak":
        verdict = "LEAK"
        head = (
            f"+{_fmt(residue.value, unit)} per cycle ({_interval(residue, unit)}), "
            "beyond what the same rounds leave without it"
        )
    elif residue.decision == "undecided":
        verdict, head = "INCONCLUSIVE", residue.why
    else:
        verdict = "STABLE"
        head = f"{_fmt(residue.value, unit)} per cycle ({_interval(residue, unit)}): nothing left behind"
    return verdict, head


def _freed(
    series: Mapping[str, Any],
    keys: list[str],
    done: Mapping[int, tuple[float, float]],
    layer: str,
    began: Mapping[int, float] | None = None,
) -> float | None:
    """How the layer changed while the first completed cycle held: the median of the samples
    between its do's answer and its undo minus the last sample before its do began (`began`;
    negative: the operation freed memory; positive: it moved some here, e.g. a sleep's weights
    offloaded to the host); None without samples."""
    if not done or not keys:
        return None
    first = min(done)
    t_do, t_undo = done[first]
    t_began = (began or {}).get(first, t_do)
    total_before = 0.0
    total_during = 0.0
    seen = False
    for key in keys:
        s = series.get(key)
        if s is None:
            continue
        before = [v for t, v in s.points if t <= t_began]
        during = sorted(v for t, v in s.points if t_do < t < t_undo)
        if not before or not during:
            continue
        seen = True
        total_before += before[-1]
        total_during += during[len(during) // 2]
    if not seen:
        return None
    return round(total_during - total_before, 3)


def _silent(after: list[float], residue: Estimate, held: float | None) -> bool:
    """A layer that never moved (e.g. no pinned memory at all): left out of the text."""
    return (
        all(abs(x) < 1e-9 for x in after)
        and abs(residue.value) < 1e-9
        and (held is None or abs(held) < 1e-9)
    )


def render(result: CycleResult, out: Any) -> None:
    """The --cycle block of the text report (`out`: a rich Console)."""
    out.print()
    out.print(f"[bold]--cycle[/bold] {result.spec.operation} ({result.display}): {result.verdict}")
    out.print(f"  {result.headline}")
    out.print(
        f"  {result.cycles} cycle(s) in {result.blocks} block(s) of a cycled and a plain round "
        f"after a warm-up round; residue = what a cycled round left beyond a plain one"
    )
    for layer, v in result.layers.items():
        if _silent(v.after_each_cycle, v.residue, v.freed):
            continue
        freed = (
            f"; while the operation held: {'+' if v.freed > 0 else ''}{_fmt(v.freed, v.unit)}"
            if v.freed is not None
            else ""
        )
        after = ", ".join(_fmt(x, v.unit) for x in v.after_each_cycle[:8])
        out.print(
            f"  {LAYER_NAMES[layer]} ({v.verdict}): {_fmt(v.residue.value, v.unit)}/cycle "
            f"({_interval(v.residue, v.unit)}){freed}; level after each cycle vs baseline: {after}"
        )
    for note in result.notes:
        out.print(f"  note: {note}")
    out.print(
        "  (this block decides what the operation leaves; the verdicts below are the rounds')"
    )


__all__ = [
    "CYCLE_DO",
    "CYCLE_FAILED",
    "CYCLE_ROUND",
    "CYCLE_UNDO",
    "CycleHook",
    "CyclePlan",
    "CycleResult",
    "CycleSpec",
    "adjust_config",
    "analyse_cycle",
    "parse_cycle",
    "render",
]
