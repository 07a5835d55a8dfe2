"""The snapshot diff on allocator snapshots recorded on an H200 (tests/fixtures/attribute/gpu/).

Series recorded by scripts/record_attribute_fixtures.py (run from /opt/torch/vd_app/, beside the
device's venv /opt/torch/.venv): `leak` keeps 1 MiB per request (10 requests a round) next to a
bounded cache and weights allocated before history was armed; `caching` the same without the
leak; `escape` lets a 1.5 MiB output escape a request-scoped MemPool; `expandable` is `leak`
with expandable segments. `ref-*` are the reference server and `tserve-leak` is `transformers
serve` with the agent's test-only leak, both taken by the agent during the GPU acceptance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramdoctor.attribution import (
    GROWING,
    NO_GROWING_STACK,
    TOO_FEW_SNAPSHOTS,
    Frame,
    SnapshotError,
    attribute,
    frame_origin,
    load_snapshot,
    stack_of,
    summarise,
)
from vramdoctor.units import MIB

GPU = Path(__file__).parents[1] / "fixtures" / "attribute" / "gpu"


def series(prefix: str) -> list[dict]:
    paths = sorted(GPU.glob(f"{prefix}-*.pickle"))
    assert len(paths) >= 4, prefix
    return [load_snapshot(p) for p in paths]


def truth(kind: str) -> dict:
    return json.loads((GPU / f"{kind}.json").read_text())


@pytest.mark.parametrize(
    ("path", "origin"),
    [
        ("/opt/torch/.venv/lib/python3.12/site-packages/torch/cuda/memory.py", ("torch", "torch")),
        (
            "/opt/torch/.venv/lib/python3.12/site-packages/torchvision/transforms/v2/functional/_geometry.py",
            ("torch", "torchvision"),
        ),
        (
            "/opt/torch/.venv/lib/python3.12/site-packages/transformers/image_processing_utils.py",
            ("package", "transformers"),
        ),
        (
            "/opt/torch/vd_app/record_attribute_fixtures.py",
            ("code", None),
        ),  # under /opt/torch/, not torch
        ("/home/me/torch/server.py", ("code", None)),
        ("/usr/lib/python3.12/threading.py", ("stdlib", None)),
        (
            "/root/.local/share/uv/python/cpython-3.12.3-linux-x86_64-gnu/lib/python3.12/concurrent/futures/thread.py",
            ("stdlib", None),
        ),
        ("/usr/lib/python3/dist-packages/six.py", ("package", "six")),
        (
            "/usr/local/lib/python3.11/dist-packages/sglang/srt/managers/scheduler.py",
            ("package", "sglang"),
        ),
        ("<frozen importlib._bootstrap>", ("stdlib", None)),
        ("/tmp/torchinductor_root/ab/cabxyz.py", ("torch", "torch")),
        ("/x/vramdoctor/agent/pythonpath/vramdoctor_agent.py", ("agent", None)),
    ],
)
def test_frame_origin_matches_package_roots_not_substrings(path: str, origin: tuple) -> None:
    assert frame_origin(path) == origin


def test_stack_goes_out_of_a_package_up_to_the_servers_own_line() -> None:
    frames = [
        Frame("/v/lib/python3.12/site-packages/torch/nn/functional.py", 10, "pad"),
        Frame("/v/lib/python3.12/site-packages/transformers/models/x/proc.py", 20, "inner"),
        Frame("/usr/lib/python3.12/contextlib.py", 30, "__enter__"),
        Frame("/v/lib/python3.12/site-packages/transformers/proc_utils.py", 40, "__call__"),
        Frame("/srv/app/server.py", 50, "handle"),
        Frame("/srv/app/server.py", 60, "do_POST"),
    ]
    st = stack_of(frames)
    assert st.kind == "code"
    assert [f.function for f in st.frames] == ["inner", "__call__", "handle"]
    assert stack_of([]).kind == "no-frames"
    assert stack_of(frames[:1]).kind == "library-only"


def test_leak_series_names_the_line_and_the_rate() -> None:
    t = truth("leak")
    pa = attribute(series("leak"), requests=[t["requests_per_round"]] * t["rounds"])
    assert pa.verdict == GROWING
    (grow,) = pa.growing
    top = grow.stack.frames[0]
    assert top.filename == "/opt/torch/vd_app/record_attribute_fixtures.py"
    assert top.function == "keep_per_request"
    assert grow.bytes_per_request == t["kept_bytes_per_request"]
    # the bounded cache filled in round 1 and stayed: live, but not growing
    cache = [
        s for s in pa.stacks if s.stack.frames and s.stack.frames[0].function == "cache_features"
    ]
    assert cache and not cache[0].growing and cache[0].live_bytes[1] == cache[0].live_bytes[-1] > 0
    # weights allocated before arming: counted, without a stack, never the leak
    frameless = [s for s in pa.stacks if s.stack.kind == "no-frames"]
    assert frameless and frameless[0].live_bytes[-1] == 8 * MIB and not frameless[0].growing
    assert any("before history was armed" in n for n in pa.notes)
    assert pa.split is not None
    assert pa.split.growing_stacks_bytes == pa.split.reserved_growth_bytes == 2 * 10 * MIB


def test_caching_series_has_no_growing_stack() -> None:
    pa = attribute(series("caching"), requests=[10, 10, 10])
    assert pa.verdict == NO_GROWING_STACK
    assert pa.growing == []
    assert pa.split is not None and pa.split.reserved_growth_bytes == 0


def test_escape_series_separates_dead_private_pool_slack() -> None:
    snaps = series("escape")
    pa = attribute(snaps, requests=[10, 10, 10])
    (grow,) = pa.growing
    assert grow.stack.frames[0].function == "escape_request"
    assert grow.bytes_per_request == truth("escape")["kept_bytes_per_request"]
    pools = [summarise(s).private_pools for s in snaps]
    assert pools == [0, 10, 20, 30]  # one orphaned pool per request
    sp = pa.split
    assert sp is not None and sp.slack_private_pool_bytes > 0 and sp.slack_default_bytes == 0
    assert (
        sp.growing_stacks_bytes
        + sp.other_live_bytes
        + sp.slack_default_bytes
        + sp.slack_private_pool_bytes
    ) == sp.reserved_growth_bytes


def test_expandable_segments_series() -> None:
    snaps = series("expandable")
    assert truth("expandable")["alloc_conf"] == "expandable_segments:True"
    assert summarise(snaps[-1]).expandable_segments > 0
    pa = attribute(snaps, requests=[10, 10, 10])
    assert [g.stack.frames[0].function for g in pa.growing] == ["keep_per_request"]
    assert pa.growing[0].bytes_per_request == MIB


def test_reference_server_bytes_leak_is_its_own_line() -> None:
    pa = attribute(series("ref-bytes"), requests=[40, 40, 40, 40])
    (grow,) = pa.growing
    assert grow.stack.frames[0].filename.endswith("examples/reference_server/server.py")
    assert grow.stack.frames[0].function == "after_request"
    assert grow.bytes_per_request == MIB


def test_reference_server_pool_escape_is_the_image_processor_called_from_the_server() -> None:
    pa = attribute(series("ref-escape"), requests=[40, 40, 40, 40])
    (grow,) = pa.growing
    frames = grow.stack.frames
    assert "/site-packages/transformers/" in frames[0].filename  # under /opt/torch/.venv/
    assert frames[0].filename.startswith("/opt/torch/.venv/")
    assert frames[-1].filename.endswith("examples/reference_server/server.py")
    assert all("/site-packages/torch" not in f.filename for f in frames)
    sp = pa.split
    assert sp is not None and sp.slack_private_pool_bytes > 0
    assert summarise(series("ref-escape")[-1]).private_pools > 100
    # the whole per-request cost: live output plus the orphaned pool segment around it
    # (the reference server counted 17,845,331 bytes kept per request)
    assert sp.requests == 120 and sp.growth_per_request_bytes == pytest.approx(17_845_331, rel=0.01)


def test_transformers_serve_injected_leak_is_the_target_function() -> None:
    pa = attribute(series("tserve-leak"), requests=[20, 20, 20, 20])
    (grow,) = pa.growing
    assert grow.stack.frames[0].function == "_build_generation_config"
    assert grow.stack.frames[0].filename.endswith("transformers/cli/serving/chat_completion.py")
    assert grow.bytes_per_request == 512 * 1024


def test_nvml_split_outside_the_allocator() -> None:
    snaps = series("leak")
    reserved = [summarise(s).reserved_bytes for s in snaps]
    extra = [0, 0, 4 * MIB, 8 * MIB]  # e.g. NCCL buffers growing beside the allocator
    nvml = [600 * MIB + r + e for r, e in zip(reserved, extra, strict=True)]
    pa = attribute(snaps, requests=[10, 10, 10], nvml_used_bytes=nvml)
    assert pa.split is not None
    assert pa.split.outside_allocator_bytes == 8 * MIB
    assert pa.split.nvml_growth_bytes == pa.split.reserved_growth_bytes + 8 * MIB
    assert pa.split.explained_fraction == pytest.approx(20 / 28)


def test_few_snapshots_and_bad_input() -> None:
    snaps = series("leak")
    assert attribute(snaps[:1]).verdict == TOO_FEW_SNAPSHOTS
    two = attribute(snaps[1:3], requests=[10])
    assert two.verdict == GROWING and any("two snapshots" in n for n in two.notes)
    with pytest.raises(ValueError):
        attribute(snaps, requests=[10])
    with pytest.raises(SnapshotError):
        summarise({"device_traces": []})
    with pytest.raises(SnapshotError):
        attribute([{"segments": ["x"]}, {"segments": []}])


def test_growth_not_in_proportion_to_requests_is_not_the_leak() -> None:
    """A stack that grows, but not with the traffic (one interval served 10x the requests for the
    same growth), is not reported as growing in proportion to requests."""
    pa = attribute(series("leak"), requests=[10, 100, 10])
    assert pa.growing == []
