"""The figures docs/watch.md records: watch against each reference-server mode.

    python tests/watch/modes_figures.py            # all runs, 4 at a time (~90 s on 2 cores)
    python tests/watch/modes_figures.py mig plain  # some of them

The runs are test_watch_modes.py's own (the same servers, traffic and watch settings); this
prints, per run, what the server says is true and what watch said: the layer that decides, its
verdict and reason, the evidence that decided, the rate, the culprit and the exit code.
"""

from __future__ import annotations

import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from test_watch_modes import _RUNS, MIB, PARALLEL  # noqa: E402

from vramdoctor.watch import WatchResult  # noqa: E402

# run -> (the result(s) to show, the layer that decides, where the truth is)
SHOW: dict[str, tuple[tuple[str, ...], str]] = {
    "retention": (("outside", "inside"), "host"),
    "host_leak": (("res",), "host"),
    "converging": (("res",), "host"),
    "background": (("res",), "host"),
    "leaking": (("res",), "host"),
    "plain": (("res",), "host"),
    "vram_leaking": (("res",), "vram"),
    "tenant": (("res",), "vram"),
    "two_servers": (("leaky", "other"), "vram"),
    "mig": (("res",), "vram"),
    "restart": (("res",), "host"),
}


def _rate(res: WatchResult, layer: str) -> str:
    v = res.layers.get(layer)
    if v is None:
        return "-"
    if v.rate_per_request is not None:
        return f"{v.rate_per_request:.3f} MiB/request"
    if v.rate_per_hour is not None:
        return f"{v.rate_per_hour:,.0f} MiB/hour"
    return "-"


def _truth(facts: dict[str, Any], layer: str) -> str:
    seen = facts.get("seen")
    if not seen:
        return "-"
    t = seen[-1]["truth"]["layers"].get(layer, {})
    if not isinstance(t, dict):
        return "-"
    out = str(t.get("verdict", "-"))
    if t.get("bytes_per_request"):
        out += f" {t['bytes_per_request'] / MIB:.3f} MiB/request"
    if t.get("bytes_per_hour"):
        out += f" {t['bytes_per_hour'] / MIB:,.0f} MiB/hour"
    return out


def main(names: list[str]) -> int:
    names = names or list(SHOW)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(PARALLEL) as pool:
        for n in names:
            (Path(tmp) / n).mkdir()
        futures = {n: pool.submit(_RUNS[n], Path(tmp) / n) for n in names}
        facts = {n: f.result(timeout=900) for n, f in futures.items()}
    print("| run | truth | watch | layer verdict (reason) | decided by | rate | culprit | exit |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        keys, layer = SHOW[n]
        for key in keys:
            res: WatchResult = facts[n][key]
            v = res.layers.get(layer)
            culprit = res.culprit.key if res.culprit is not None else "-"
            tenants = ", ".join(v.tenants) if v is not None and v.tenants else ""
            replaced = [e for e in res.events if e.get("event") == "server_replaced"]
            if tenants:
                culprit += f"; tenants {tenants}"
            if replaced:
                culprit += f"; server_replaced {replaced[0].get('old_pid')} -> {replaced[0].get('new_pid')}"
            print(
                f"| {n}" + (f" ({key})" if len(keys) > 1 else "") + f" | {_truth(facts[n], layer)}"
                f" | {res.verdict} ({res.mode}, {res.rounds} rounds)"
                f" | {layer}: {v.verdict if v else '-'} ({v.reason if v else '-'})"
                f" | {v.decided_by if v and v.decided_by else '-'} | {_rate(res, layer)}"
                f" | {culprit} | {res.exit_code} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
