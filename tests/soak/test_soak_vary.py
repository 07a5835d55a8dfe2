"""soak --vary: the feature that leaks is named, with its rate, on real servers.

Every test runs the real CLI against a real reference-server process whose leak depends on ONE
request feature (examples/reference_server/refserver/modes/feature_leaks.py); the truth is the
server's own count of what it kept (GET /reference/info), never a number written here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.cli import vd
from support.refserver import RefProc, Traffic
from support.vgpu import VirtualGpu

from vramdoctor.record import read_run
from vramdoctor.samples import Event
from vramdoctor.soak.contrast import Observation, decide, fit_blocks
from vramdoctor.soak.vary import VARY_ROUND, VaryPlan

FAST = ["--requests", "5", "--concurrency", "3", "--idle", "0.6", "--interval", "0.1"]
KIB = 1024


def vary(url: str, tmp: Path, features: str, *extra: str, name: str = "run.jsonl") -> dict:
    r = vd(
        "soak",
        "--url",
        url,
        "--vary",
        features,
        *FAST,
        *extra,
        "--out",
        str(tmp / name),
        "--json",
        cwd=tmp,
        timeout=300,
    )
    assert r.returncode in (0, 1), r.stderr[-2000:]
    d = json.loads(r.stdout)
    d["_exit"] = r.returncode
    return d


# Each run varies four or five features against a server where three of them leak, each on
# its own layer (--mode leak-on-features, whose predicates are the single-feature modes'), and
# one does not leak at all: every layer must name its own culprit and only it. Four runs cover
# every feature; sizes: host 1024 KiB, VRAM 2048 KiB, KV 64 tokens per request with the feature.
MATRIX = [
    (
        "image-size:host,abort:kv,n:vram:2048",
        "image-size,abort,n,multi-image",
        {"host": ["image-size"], "kv": ["abort"], "vram": ["n"]},
        (),
    ),
    (
        "images:host,stream:kv,max-tokens:vram:2048",
        "images,stream,max-tokens,prefix",
        {"host": ["images"], "kv": ["stream"], "vram": ["max-tokens"]},
        (),
    ),
    (
        "prefix:host,structured:kv,multi-image:vram:2048",
        "prefix,structured,regex,multi-image,n",
        {"host": ["prefix"], "kv": ["regex", "structured"], "vram": ["multi-image"]},
        (),
    ),
    (
        "lora:host",
        "lora,images",
        {"host": ["lora"]},
        ("--enable-lora", "--lora-paths", "tiny=ADAPTER"),
    ),
]
RATES = {"host": 1.0, "vram": 2.0, "kv": 64.0}  # MiB, MiB, tokens per request with the feature


@pytest.mark.parametrize(
    ("leak_on", "features", "culprits", "args"), MATRIX, ids=["A", "B", "C", "lora"]
)
def test_vary_names_each_layers_culprit_and_its_rate(
    tmp_path, leak_on, features, culprits, args
) -> None:
    from support.refserver import ROOT

    adapter = str(ROOT / "examples" / "reference_server" / "adapters" / "tiny-lora")
    args = tuple(a.replace("ADAPTER", adapter) for a in args)
    with (
        VirtualGpu(tmp_path / "vgpu") as gpu,
        RefProc(
            "leak-on-features",
            "--leak-on",
            leak_on,
            "--leak-kib",
            "1024",
            "--kv-leak-tokens",
            "64",
            "--metrics-flavour",
            "sglang",
            "--vgpu-dir",
            str(gpu.dir),
            *args,
        ) as srv,
    ):
        d = vary(srv.url, tmp_path, features, "--gpu-metrics", gpu.metrics_url)
        info = srv.info()
    v = d["vary"]
    assert d["_exit"] == 1 and v["verdict"] == "LEAK", v["headline"]
    for layer in ("host", "kv", "vram"):
        got = sorted(v["layers"][layer]["culprits"]) if layer in v["layers"] else []
        assert got == sorted(culprits.get(layer, [])), (layer, v["layers"].get(layer))
    for layer, names in culprits.items():
        for name in names:
            e = v["layers"][layer]["features"][name]
            want = RATES[layer]
            assert e["value"] == pytest.approx(want, rel=0.15), (layer, name, e)
            assert e["lo"] <= want * 1.05 and e["hi"] >= want * 0.95
    # the truth: the server counted every request with each feature
    assert all(n > 0 for n in info["feature_requests_by"].values())
    assert v["rounds_judged"] <= 1 + 4 * len(v["shapes"])


def test_vary_with_launch_on_a_single_feature_server_without_an_exporter(tmp_path) -> None:
    """--launch starts leak-on-large-images (the agent in its environment), --vary names
    image-size on host RAM at the server's own rate, and nothing of the launch outlives it."""
    from support.procs import free_port, pid_alive, ref_cmd, wait_gone

    port = free_port()
    cmd = ref_cmd("leak-on-large-images", port, "--leak-kib", "1024")
    r = vd(
        "soak",
        "--vary",
        "image-size,stream",
        *FAST,
        "--out",
        str(tmp_path / "run.jsonl"),
        "--json",
        "--",
        *cmd,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    d = json.loads(r.stdout)
    host = d["vary"]["layers"]["host"]
    assert host["culprits"] == ["image-size"]
    assert host["features"]["image-size"]["value"] == pytest.approx(1.0, rel=0.1)
    assert host["features"]["stream"]["decision"] != "leak"
    pid = d["launch"]["pid"]
    assert wait_gone([pid]) == [] and not pid_alive(pid)


def test_a_leak_of_every_request_names_no_feature(tmp_path) -> None:
    with RefProc("leak-on-every", "--leak-kib", "1024") as srv:
        d = vary(srv.url, tmp_path, "images,stream")
    host = d["vary"]["layers"]["host"]
    assert host["verdict"] == "LEAK" and host["culprits"] == []
    assert "every request leaks alike" in host["headline"]
    assert host["control"]["value"] == pytest.approx(1.0, rel=0.1)
    for f in ("images", "stream"):
        assert host["features"][f]["decision"] != "leak"


def test_a_healthy_server_leaks_on_no_feature_and_exits_0(tmp_path) -> None:
    with RefProc("stable") as srv:
        d = vary(srv.url, tmp_path, "image-size,stream")
    assert d["_exit"] == 0, d["vary"]["headline"]
    assert d["vary"]["verdict"] in ("STABLE", "CACHING", "INCONCLUSIVE")
    assert all(not layer["culprits"] for layer in d["vary"]["layers"].values())


def test_a_cache_that_only_large_images_fill_is_not_a_leak_of_image_size(tmp_path) -> None:
    """The converging tile cache: the large-image shape brings new tiles, cached the first
    times it is seen (each block adds less): that is caching, never named a leak."""
    with RefProc("converging", "--admit-probability", "0.35", "--converge-entry-kib", "256") as srv:
        d = vary(srv.url, tmp_path, "image-size,stream", "--max-rounds", "30")
    host = d["vary"]["layers"]["host"]
    assert host["features"]["image-size"]["decision"] != "leak", host["features"]["image-size"]
    assert d["vary"]["verdict"] != "LEAK"


def test_the_plan_is_seeded_recorded_and_report_re_analyses_it(tmp_path) -> None:
    with RefProc("leak-on-stream", "--leak-kib", "512") as srv:
        d = vary(srv.url, tmp_path, "stream,n", "--seed", "7")
    run = read_run(tmp_path / "run.jsonl")
    plan = run.header["config"]["vary_plan"]
    assert plan["seed"] == 7 and plan["features"] == ["stream", "n"]
    expected = VaryPlan.create("stream,n", 7)
    marks = [e.data for e in run.records if isinstance(e, Event) and e.name == VARY_ROUND]
    assert marks[0] == {"round": 1, "shape": "warm-up", "block": 0}  # every shape once
    for m in marks[1:]:
        assert (m["shape"], m["block"]) == expected.shape_of(m["round"])
    assert plan["block_orders"]["1"] == expected.order(1)
    assert expected.order(1) != VaryPlan.create("stream,n", 8).order(1) or expected.order(
        2
    ) != VaryPlan.create("stream,n", 8).order(2)
    r = vd("report", str(tmp_path / "run.jsonl"), "--json", cwd=tmp_path)
    again = json.loads(r.stdout)["vary"]
    assert r.returncode == 1
    assert again["layers"]["host"]["features"] == d["vary"]["layers"]["host"]["features"]
    text = vd("report", str(tmp_path / "run.jsonl"), cwd=tmp_path).stdout
    assert "--vary stream, n: LEAK" in text and "streamed requests leak" in text


@pytest.mark.parametrize(
    ("args", "server", "says"),
    [
        (("--vary", "colour"), (), "--vary 'colour': unknown feature"),
        (("--vary", "stream,stream"), (), "stream is given twice"),
        (("--vary", "images", "--cycle", "sleep"), (), "--vary and --cycle: one at a time"),
        (("--vary", "images", "--text-only"), (), "drop --text-only"),
        (("--vary", "lora"), (), "has no way to name a LoRA adapter"),
        (("--vary", "lora"), ("--metrics-flavour", "vllm"), "no LoRA adapter is loaded"),
        (("--vary", "regex"), (), "has no regex request field"),
    ],
)
def test_bad_vary_values_are_one_line_and_exit_2(tmp_path, args, server, says) -> None:
    with RefProc("stable", *server) as srv:
        r = vd(
            "soak",
            "--url",
            srv.url,
            *args,
            *FAST,
            "--out",
            str(tmp_path / "r.jsonl"),
            cwd=tmp_path,
            timeout=120,
        )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert says in r.stderr
    assert "Traceback" not in r.stderr


# --- the estimator itself (synthetic rounds whose truth is known by construction) ----------


def _obs(
    effects: dict[str, float], blocks: int, drift: float = 0.0, noise=None
) -> list[Observation]:
    import random

    rng = random.Random(1)
    out = []
    rnd = 2
    for b in range(1, blocks + 1):
        for s, e in effects.items():
            out.append(
                Observation(
                    rnd, b, s, e + drift * b + (noise or (lambda: 0.0))() + rng.gauss(0, 0.01)
                )
            )
            rnd += 1
    return out


def test_block_fit_recovers_an_effect_under_drift_and_says_when_it_cannot() -> None:
    fit = fit_blocks(_obs({"control": 0.1, "x": 1.1, "y": 0.1}, blocks=2, drift=0.5))
    assert fit is not None
    e = decide(fit.contrast({"x": 1.0, "control": -1.0}), floor=0.05)
    assert e.value == pytest.approx(1.0, abs=0.05) and e.decision == "leak"
    none = decide(fit.contrast({"y": 1.0, "control": -1.0}), floor=0.05)
    assert none.decision == "none"
    one = fit_blocks(_obs({"control": 0.0, "x": 1.0}, blocks=1))
    assert (
        one is not None
        and decide(one.contrast({"x": 1.0, "control": -1.0}), 0.05).decision == "undecided"
    )


def test_an_effect_that_fades_block_after_block_is_not_a_leak_yet() -> None:
    obs = [
        Observation(2, 1, "control", 0.0),
        Observation(3, 1, "x", 2.0),
        Observation(4, 1, "y", 0.0),
        Observation(5, 2, "control", 0.0),
        Observation(6, 2, "x", 0.2),
        Observation(7, 2, "y", 0.01),
    ]
    fit = fit_blocks(obs)
    assert fit is not None
    e = decide(fit.contrast({"x": 1.0, "control": -1.0}), floor=0.05)
    assert e.decision != "leak"


def test_traffic_helper_sends_what_vary_sends_without_error(tmp_path) -> None:
    """Smoke of the shapes against the server: every shape's requests are answered 200."""
    from vramdoctor import servers
    from vramdoctor.soak.traffic.features import FEATURES, ShapePlan

    with RefProc("stable", "--metrics-flavour", "vllm") as srv:
        t = Traffic(srv.url)
        for name, feat in FEATURES.items():
            if name == "lora":
                continue
            plan = ShapePlan(
                feat.shape,
                2,
                model="vramdoctor-reference",
                max_tokens=8,
                request_features=servers.get("vllm").request_features,
            )
            for req in plan:
                assert t.send(req.body, req.path) == 200, name
        time.sleep(0.1)
