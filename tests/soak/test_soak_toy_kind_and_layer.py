"""A server kind and a memory layer added from a test file run through soak and report.

`toy_plugin.py` registers, through the public registries only, a server kind (ToyVLM), a memory
layer (its adapter cache, read off its own /metrics gauge) and that layer's report block. A
process with the plugin runs the real CLI (`vramdoctor soak`) against a real loopback ToyVLM
server whose adapter cache keeps 0.5 MiB per request: the soak must identify the kind by its
own probe, judge the new layer like the built-in ones, find the leak there at that rate, put it
in the headline, the table and the JSON in the block's own words, and exit 1. The recorded run
reports the same again with the plugin loaded, and without it (no KeyError: the new layer is
simply not judged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.cli import cli_env, vd

HERE = Path(__file__).resolve().parent


def _with_plugin(code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    script = "import sys, toy_plugin\ntoy_plugin.register()\n" + textwrap.dedent(code)
    env = cli_env(PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]), COLUMNS="120")
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_a_plugin_kind_and_layer_are_soaked_and_reported(tmp_path: Path) -> None:
    run = tmp_path / "toy.jsonl"
    soak = [
        "soak", "--rounds", "4", "--requests", "10", "--idle", "1", "--interval", "0.1",
        "--no-adapt", "--text-only", "--out", str(run),
    ]  # fmt: skip
    r = _with_plugin(
        f"""
        from vramdoctor.cli import main
        with toy_plugin.ToyServer(leak_mib=0.5) as srv:
            sys.exit(main({soak!r} + ["--url", srv.url, "--json"]))
        """
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert "ToyVLM 0.9 serving toyvlm-2b" in r.stderr  # identified by the kind's own probe
    doc = json.loads(r.stdout)
    toy = doc["layers"]["adapters"]
    assert toy["verdict"] == "LEAK" and toy["unit"] == "MiB"
    assert abs(toy["rate_per_request"] - 0.5) < 0.05
    assert toy["summary"].startswith("adapter cache: LEAK: ")
    assert "of adapter weights per request" in toy["summary"]
    assert list(doc["layers"])[:3] == ["vram", "kv", "host"]  # the built-in ones first
    assert doc["layers"]["kv"]["verdict"] in ("STABLE", "CACHING")  # the toy KV pool is back to 0
    assert "adapter cache leaks 512.0 KiB per request" in doc["headline"]
    assert doc["verdict"] == "LEAK"
    # the same run, reported again in a process with the plugin: the terminal table names it
    text = _with_plugin(
        f"from vramdoctor.cli import main\nsys.exit(main(['report', {str(run)!r}]))"
    )
    assert text.returncode == 1, text.stderr[-2000:]
    assert "adapter cache" in text.stdout and "of adapter weights per request" in text.stdout
    assert "adapter cache leak per request" in text.stdout  # the figures block
    # and without the plugin: the built-in layers only, no error
    bare = vd("report", str(run), "--json")
    assert bare.returncode in (0, 1), bare.stderr
    assert "adapters" not in json.loads(bare.stdout)["layers"]
    assert "Traceback" not in bare.stderr
