"""The PromQL fleet sends, in one place: selectors, floors, the screen, KV at idle, the rules.

Every expression is plain PromQL that Prometheus, VictoriaMetrics (MetricsQL is a superset),
Thanos and Mimir evaluate the same way. Durations are written in whole seconds (`3600s`).

- floor of a block: `(min_over_time(SEL[B]) >= 0)`: the least memory of each block (its
  quietest moment); the comparison drops NaN blocks and impossible negative readings.
- the screen, per series, computed by the server at the range end (one pass over the raw
  samples at most, the rest over the last day or hours):
  `stddev_over_time(FLOOR3[W:3B])` how much the 3-block floor moved over the window (for GPU
  devices, floors of an empty GPU between two lives left out: `> EMPTY`),
  `deriv(FLOOR[L:B])` the slope of the floor over the late window (per second),
  `last_over_time(SEL[R])` the level now (absent: the series stopped reporting),
  `last_over_time(SEL[3B])` at the range start (absent: it started inside the range).
- KV at idle (per server kind and pool, names from the server registry), `kv_floor`: the least
  used tokens of each block that had an idle moment (the least running and the least waiting
  requests both 0), `sum by (job, instance) (max by (job, instance, dp_rank, engine)
  (min_over_time(USED[B])))`: the TP copies of one replica are one (max), data-parallel
  replicas add up (sum). Held tokens are there at every moment, so this is what was held at
  idle, with no subquery.
- recording rules (`rules()`): the hourly floor of every family, and of KV at idle, named
  `level:metric:operation`; fleet reads them instead of the raw samples when they cover the
  range (docs/fleet.md, examples/monitoring/vramdoctor-fleet.rules.yml).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from vramdoctor.errors import InputError
from vramdoctor.fleet.families import FAMILIES, Family, KvSource

__all__ = [
    "RULES_HEADER",
    "RULE_BLOCK_S",
    "RULE_GROUP",
    "check_matchers",
    "dur",
    "floor",
    "kv_floor",
    "kv_rule_name",
    "resets_rule_name",
    "rule_name",
    "rules",
    "select_exact",
    "selector",
]

RULE_BLOCK_S = 3600
"""The block the shipped recording rules record floors for (their group interval too)."""

RULE_GROUP = "vramdoctor-fleet-floors"

_MATCH = re.compile(r'^\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\\n]|\\.)*"\s*$')


def check_matchers(matchers: Sequence[str]) -> list[str]:
    """Validate `--match 'label="value"'` items (PromQL label matchers): InputError otherwise."""
    out = []
    for m in matchers:
        if not _MATCH.match(m):
            raise InputError(
                f'--match wants a PromQL label matcher like cluster="a" or node=~"gpu-.*", not {m!r}'
            )
        out.append(m.strip())
    return out


def dur(seconds: float) -> str:
    """A PromQL duration in whole seconds (at least 1 s)."""
    if not math.isfinite(seconds):
        raise InputError("durations must be finite")
    return f"{max(1, round(seconds))}s"


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(name: str, matchers: Sequence[str] = (), extra: Sequence[str] = ()) -> str:
    """`{__name__="name", matcher, ...}` (the name as a matcher: names with ':' need no care)."""
    inner = ",".join([f"__name__={quote(name)}", *matchers, *extra])
    return "{" + inner + "}"


# Bare in a selector: classic names, and dotted ones (VictoriaMetrics stores `k8s.pod` and
# parses it bare, but refuses a quoted label name: measured with the VictoriaMetrics here).
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def label_name(name: str) -> str:
    """A label name as a selector writes it: bare when it is made of letters, digits, `_` and
    `.`, quoted otherwise.

    Prometheus 3.x stores UTF-8 label names, so the database can hand back a name a hostile
    exporter chose (`a="b"} or vector(1) or {c`); put into a selector bare, it would be PromQL
    of the exporter's choosing. Quoted (Prometheus 3.0+ syntax) it is one name; a server that
    cannot parse a quoted name refuses that one query (one line), never runs the exporter's
    PromQL."""
    return name if _LABEL_NAME.fullmatch(name) else quote(name)


def select_exact(name: str, labels: Mapping[str, str]) -> str:
    """A selector for exactly one series (all its labels; names quoted when not classic)."""
    items = [f"{label_name(k)}={quote(v)}" for k, v in sorted(labels.items()) if k != "__name__"]
    return selector(name, items)


def floor(
    sel: str,
    block_s: float,
    *,
    recorded: bool = False,
    ratio: bool = False,
    above: float | None = None,
) -> str:
    """The floor of each block ending at the evaluation time; NaN and impossible values out.
    `recorded`: `sel` holds floors already (a recording rule): the latest in the block.
    `above`: keep only floors above this (an empty GPU's floors left out of a screen)."""
    fn = "last_over_time" if recorded else "min_over_time"
    keep = f" > {above:g}" if above is not None else " >= 0"
    expr = f"({fn}({sel}[{dur(block_s)}]){keep})"
    return f"({expr} <= 1)" if ratio else expr


def screen(
    sel: str,
    *,
    window_s: float,
    late_s: float,
    block_s: float,
    recorded: bool = False,
    empty: float | None = None,
) -> dict[str, str]:
    """The per-series screen (see the module doc): name -> expression at the range end.
    `empty`: floors at or below it (an empty GPU between two lives) are left out."""
    b3 = 3 * block_s
    floor3 = floor(sel, b3, above=empty)  # over recorded floors too: the least of them
    late = floor(sel, block_s, recorded=recorded, above=empty)
    return {
        "sd": f"stddev_over_time({floor3}[{dur(window_s)}:{dur(b3)}])",
        "late": f"deriv({late}[{dur(late_s)}:{dur(block_s)}])",
    }


def _by(labels: Sequence[str]) -> str:
    return ", ".join(labels)


KV_GROUP = ("job", "instance")
_REPLICA = ("job", "instance", "dp_rank", "engine")


def kv_used(src: KvSource, matchers: Sequence[str]) -> str:
    """Used tokens (or the usage ratio) per server: TP copies folded by max, replicas summed
    (a ratio: the fullest replica)."""
    sel = selector(src.used, matchers)
    if src.unit == "ratio":
        return f"max by ({_by(KV_GROUP)}) ({sel})"
    return f"sum by ({_by(KV_GROUP)}) (max by ({_by(_REPLICA)}) ({sel}))"


def kv_floor(src: KvSource, matchers: Sequence[str], block_s: float) -> str | None:
    """Tokens (or the usage ratio) each server held at the quietest moment of every block that
    had an idle moment (0 running and 0 waiting requests), at the block's end; None when idle
    moments cannot be told (no running/queued gauges).

    No subquery: held tokens are there at every moment and a request's tokens only add to
    them, so the least used tokens of a block with an idle moment IS what was held at idle
    (per replica, then TP copies folded by max and replicas summed). A block with no idle
    moment has no floor: a server never idle has none at all."""
    if not src.running or not src.queued:
        return None
    b = dur(block_s)
    used = selector(src.used, matchers)
    if src.unit == "ratio":
        floor_ = f"max by ({_by(KV_GROUP)}) (min_over_time({used}[{b}]))"
        bound = " <= 1"
    else:
        floor_ = f"sum by ({_by(KV_GROUP)}) (max by ({_by(_REPLICA)}) (min_over_time({used}[{b}])))"
        bound = ""
    running = f"sum by ({_by(KV_GROUP)}) (min_over_time({selector(src.running[0], matchers)}[{b}]))"
    queued = f"sum by ({_by(KV_GROUP)}) (min_over_time({selector(src.queued[0], matchers)}[{b}]))"
    return f"((({floor_}) >= 0{bound}) and on ({_by(KV_GROUP)}) (({running} + {queued}) == 0))"


def kv_capacity(src: KvSource, matchers: Sequence[str]) -> str | None:
    if src.capacity is None:
        return None
    sel = selector(src.capacity, matchers)
    return f"sum by ({_by(KV_GROUP)}) (max by ({_by(_REPLICA)}) (last_over_time({sel}[1h])))"


def kv_resets(
    src: KvSource, matchers: Sequence[str], window_s: float, *, recorded: str | None = None
) -> str | None:
    """Resets of the server's request counter over the window (restarts), per server; from the
    hourly recording rule `recorded` when given (no raw pass over the window)."""
    if recorded is not None:
        return f"sum by ({_by(KV_GROUP)}) (sum_over_time({selector(recorded, matchers)}[{dur(window_s)}]))"
    if src.counter is None:
        return None
    sel = selector(src.counter, matchers)
    return f"sum by ({_by(KV_GROUP)}) (resets({sel}[{dur(window_s)}]))"


def resets_rule_name(counter: str) -> str:
    """e.g. `instance:sglang_num_requests_total:resets1h`: a request counter's resets an hour."""
    return f"instance:{_safe(counter)}:resets1h"


# --- recording rules ------------------------------------------------------------------------


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def rule_name(fam: Family) -> str:
    """`level:metric:operation` for a family's hourly floor, e.g.
    `gpu:DCGM_FI_DEV_FB_USED:min_over_time1h`."""
    level = "process" if fam.per_process else "gpu"
    return f"{level}:{_safe(fam.name)}:min_over_time1h"


def kv_rule_name(src: KvSource) -> str:
    """e.g. `instance:sglang_kv_used_tokens_idle:min_over_time1h`."""
    return f"instance:{_safe(src.used)}_idle:min_over_time1h"


def rules(kv: Sequence[KvSource] = ()) -> dict[str, Any]:
    """The recording rules fleet can use, as the YAML document's structure: one group,
    evaluated every hour, the hourly floor of every memory family and of each KV pool at idle.
    `kv` defaults to every pool of every registered server kind."""
    if not kv:  # every spelling of every pool of every registered kind (versions differ)
        from vramdoctor import servers
        from vramdoctor.fleet.families import kv_sources

        found: list[KvSource] = []
        for kind in servers.kinds():
            m = kind.metrics
            for pool in m.kv_pools:
                for name in (*pool.used, *pool.usage_ratio):
                    present = {name, *m.running_requests, *m.queued_requests, *m.request_counters}
                    found += [
                        k for k in kv_sources(present) if k.kind == kind.name and k.used == name
                    ]
        kv = list({(k.kind, k.used): k for k in found}.values())
    entries: list[dict[str, str]] = []
    for fam in FAMILIES:
        if fam.kind != "memory" or fam.alias_of or fam.inferred:
            continue
        entries.append(
            {
                "record": rule_name(fam),
                "expr": f"min_over_time({fam.name}[1h])",
            }
        )
    counters: list[str] = []
    for src in kv:
        expr = kv_floor(src, (), RULE_BLOCK_S)
        if expr is None:
            continue
        entries.append({"record": kv_rule_name(src), "expr": expr})
        if src.counter and src.counter not in counters:
            counters.append(src.counter)
    for counter in counters:  # restarts, so a 30-day range never reads raw counters
        entries.append(
            {
                "record": resets_rule_name(counter),
                "expr": f"sum by ({_by(KV_GROUP)}) (resets({counter}[1h]))",
            }
        )
    return {"groups": [{"name": RULE_GROUP, "interval": "1h", "rules": entries}]}


RULES_HEADER = """\
# Recording rules for `vramdoctor fleet` (generated by vramdoctor.fleet.promql.rules_yaml from
# the exporter families and the server registry: do not edit; regenerate with
# `python tests/fleet/test_fleet_rules.py --write`).
#
# One group evaluated every hour records each memory series' floor (its least value in the
# hour: what a process keeps at its quietest moment) and each server's KV tokens held at idle
# moments. fleet reads these instead of the raw samples when they reach back to the start of
# the range it is asked for: 24 points a day per series instead of 5,760 at a 15-s scrape.
# Labels are kept (only the metric name changes), so --match works the same.
#
# Prometheus: add this file to rule_files. Backfill the past with
#   promtool tsdb create-blocks-from rules --start 2026-11-01T00:00:00Z --end 2026-12-01T00:00:00Z \\
#     --url http://prometheus:9090 vramdoctor-fleet.rules.yml
# (--start on an even UTC hour: promtool writes nothing when its first 2-hour block holds no
# evaluation, prometheus/prometheus#19714) and move the blocks it writes (./data) into
# Prometheus's data directory.
# VictoriaMetrics: run vmalert with -rule=vramdoctor-fleet.rules.yml (-replay.timeFrom/-timeTo
# to backfill). Thanos and Mimir: their rulers read the same file.
"""


def _yaml_str(text: str) -> str:
    """A YAML scalar that is always read back as this exact string (double-quoted)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rules_yaml() -> str:
    """`rules()` as the YAML file examples/monitoring/vramdoctor-fleet.rules.yml holds."""
    doc = rules()
    lines = [RULES_HEADER.rstrip("\n"), "groups:"]
    for group in doc["groups"]:
        lines.append(f"  - name: {group['name']}")
        lines.append(f"    interval: {group['interval']}")
        lines.append("    rules:")
        for rule in group["rules"]:
            lines.append(f"      - record: {rule['record']}")
            lines.append(f"        expr: {_yaml_str(rule['expr'])}")
    return "\n".join(lines) + "\n"
