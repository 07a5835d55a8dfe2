"""The reference server launched by vramdoctor in each of its modes.

Every mode the reference server registers (its own registry: a new mode joins this test by
itself) is started by `SoakSession` with `launch`, soaked briefly, stopped. A hook reads the
mode's own truth (GET /reference/info, "truth" per layer) while it runs. Each run must end with
the server stopped and its whole tree gone, and no layer may be confused the expensive way: a
layer whose truth is LEAK must not be called CACHING or STABLE, one whose truth is CACHING or
STABLE must not be called LEAK (a short soak may say INCONCLUSIVE; the truth-run tests of the
analysis check the full verdicts on longer soaks). A layer whose leak needs a request feature
(the truth names it: images, streams, ...) is left to the --vary tests: text traffic does not
exercise it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import requests
from support.procs import ROOT, free_port, pid_alive, ref_cmd

from vramdoctor.soak import LaunchFailed, SoakConfig, SoakHook, SoakSession

sys.path.insert(0, str(ROOT / "examples" / "reference_server"))
from refserver.modes import modes

MODES = sorted(modes())


class _Truth(SoakHook):
    name = "truth"

    def __init__(self) -> None:
        self.truth: dict[str, Any] = {}
        self.tree: list[int] = []

    def on_start(self, session: SoakSession) -> None:
        info = requests.get(session.base + "/reference/info", timeout=10).json()
        self.truth = info.get("truth") or {}
        assert session.launched is not None
        self.tree = session.launched.tree()

    def on_idle_end(self, session: SoakSession, round_index: int) -> None:
        if session.launched is not None:  # children the mode starts later (helpers, restarts)
            self.tree = sorted(set(self.tree) | set(session.launched.tree()))


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_launched_soaked_and_stopped(mode: str, tmp_path: Path) -> None:
    port = free_port()
    hook = _Truth()
    cfg = SoakConfig(
        launch=tuple(ref_cmd(mode, port)),
        rounds=3,
        adapt=False,
        requests=6,
        idle_s=1.0,
        interval_s=0.1,
        text_only=True,
        stop_grace_s=5,
        startup_timeout_s=60,
        out=tmp_path / "run.jsonl",
    )
    try:
        outcome = SoakSession(cfg, hooks=[hook]).run()
    except LaunchFailed as exc:
        if any("needs" in line for line in exc.log_tail):  # e.g. pinned: torch and a CUDA GPU
            pytest.skip(f"{mode}: {exc.log_tail[-1]}")
        raise
    launched = outcome.launched
    assert launched is not None and launched["stopped"]["leftovers"] == []
    assert hook.tree and not [p for p in hook.tree if pid_alive(p)], hook.tree
    # A leak that needs a request feature (images, streams, n > 1, ...) is --vary's to exercise
    # (its own tests); plain text traffic does not touch it, so its layer is not judged here.
    truth = {
        k: v.get("verdict")
        for k, v in (hook.truth.get("layers") or {}).items()
        if not v.get("feature")
    }
    assert truth, f"{mode} states no truth"
    a = outcome.analysis
    for layer, expected in truth.items():
        got = a.layers[layer].verdict if layer in a.layers else "NOT_MEASURED"
        if got in ("NOT_MEASURED", "INCONCLUSIVE") or expected is None:
            continue
        if expected == "LEAK":
            assert got == "LEAK", (mode, layer, got, a.layers[layer].reason, hook.truth["summary"])
        else:
            assert got != "LEAK", (mode, layer, got, a.layers[layer].reason, hook.truth["summary"])
