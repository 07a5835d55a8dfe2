"""The server registry: built-in kinds, a kind added from outside, names read from the kinds.

A toy kind registered from this file is identified over real HTTP and its /metrics read by the
same source that reads SGLang and vLLM: adding a server is one module, not edits elsewhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace

import pytest
from support.sources import serve, sglang_text, vllm_text

from vramdoctor import servers
from vramdoctor.servers.base import (
    UNITS,
    BoundedCache,
    Identity,
    KvPoolMetrics,
    Metrics,
    MetricSeries,
    Probe,
    ProbeAnswer,
    ProcessTitle,
    ServerKind,
    ShmFamily,
    fold,
)
from vramdoctor.sources.server_info import identify
from vramdoctor.sources.server_metrics import ServerMetricsSource, parse_metrics_text, stable_names


def test_builtin_kinds_in_identification_order_with_the_fallback_last() -> None:
    names = [k.name for k in servers.kinds()]
    assert names[:2] == ["sglang", "vllm"] and names[-1] == "openai"
    assert servers.get("openai").identity.fallback
    assert not any(k.identity.fallback for k in servers.kinds()[:-1])
    assert servers.display_name("sglang") == "SGLang"
    assert servers.display_name(None) == "an OpenAI-compatible server"
    with pytest.raises(KeyError, match="no-such-server"):
        servers.get("no-such-server")  # (tgi is a kind: one of diagnose's kinds)


def test_every_series_has_a_known_unit_and_every_name_its_kinds_prefix() -> None:
    for kind in servers.kinds():
        for series in kind.metrics.series:
            assert series.unit in UNITS
        for name in kind.metrics.names:
            assert name.startswith(kind.identity.metric_prefixes), (kind.name, name)
    with pytest.raises(ValueError, match="unit"):
        MetricSeries("x", ("x",), "max", "furlongs", "not a unit")


def test_metric_names_are_written_once_across_kinds() -> None:
    # The three tables that used to spell these names (server_metrics, watch, fleet) now read
    # them here: every name the old tables held is in a kind.
    names = set(servers.metric_names())
    for name in (
        "sglang:num_requests_total",
        "vllm:request_success_total",
        "sglang:num_used_tokens",
        "sglang:kv_used_tokens",
        "sglang:max_total_num_tokens",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:engine_sleep_state",
        "sglang:hicache_host_used_tokens",
        "sglang:lora_pool_slots_used",
        "sglang:encoder_cache_entries",
    ):
        assert name in names, name


def test_fold_rules() -> None:
    rows = [
        ({"dp_rank": "0", "tp_rank": "0"}, 5.0),
        ({"dp_rank": "0", "tp_rank": "1"}, 5.0),
        ({"dp_rank": "1", "tp_rank": "0"}, 3.0),
    ]
    assert fold(rows, "replicas_sum") == 8.0  # TP copies folded, DP replicas summed
    assert fold(rows, "sum") == 13.0 and fold(rows, "max") == 5.0 and fold(rows, "min") == 3.0
    phases = [({"tp_rank": "0", "phase": "a"}, 1.0), ({"tp_rank": "0", "phase": "b"}, 2.0)]
    phases += [({"tp_rank": "1", "phase": "a"}, 0.5)]
    assert fold(phases, "rank_sum_max") == 3.0
    with pytest.raises(ValueError):
        fold(rows, "median")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "cmdline, role, part",
    [
        (["VLLM::EngineCore"], "vllm engine core", "engine"),
        (["VLLM::EngineCore_DP1"], "vllm engine core DP1", "engine"),
        (["VLLM::Worker"], "vllm worker", "worker"),
        (["VLLM::Worker_TP0"], "vllm worker TP0", "worker"),
        (["VLLM::Worker_PP1_TP3"], "vllm worker PP1 TP3", "worker"),
        (
            ["VLLM::Worker_DP1_PP0_PCP0_TP1_DCP0_EP3"],
            "vllm worker DP1 PP0 PCP0 TP1 DCP0 EP3",
            "worker",
        ),
        (["VLLM::APIServer_0"], "vllm API server 0", "frontend"),
        (["VLLM::APIServer_DP2"], "vllm API server DP2", "frontend"),
        (["VLLM::DPCoordinator"], "vllm DP coordinator", "helper"),
        (
            ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "Qwen/Qwen3-VL"],
            "vllm API server",
            "frontend",
        ),
        (["sglang::scheduler_TP1"], "sglang scheduler TP1", "engine"),
        (
            ["sglang::scheduler_DP0_PP1_ATTN_CP2_MOE_DP0_TP3_EP1"],
            "sglang scheduler DP0 PP1 ATTN_CP2 MOE_DP0 TP3 EP1",
            "engine",
        ),
        (["sglang::detokenizer_router"], "sglang detokenizer router", "helper"),
        (["sglang::data_parallel_controller"], "sglang data-parallel controller", "helper"),
        (["sglang::tokenizer_worker:4242"], "sglang tokenizer worker", "frontend"),
        (
            ["python3", "-m", "sglang.launch_server", "--model", "m"],
            "sglang server (tokenizer)",
            "frontend",
        ),
        (["transformers", "serve", "/models/tiny-vlm"], "transformers serve", "engine"),
    ],
)
def test_process_titles_name_what_the_process_is(cmdline: list[str], role: str, part: str) -> None:
    found = servers.title_of(None, cmdline)
    assert found is not None and found.role == role and found.title.part == part


def test_vllm_api_server_may_hold_a_context_on_an_engine_gpu_workers_hold_the_model() -> None:
    api = servers.title_of(None, ["VLLM::APIServer_0"])
    worker = servers.title_of(None, ["VLLM::Worker_TP0"])
    assert api is not None and api.title.gpu_context == "possible"
    assert worker is not None and worker.title.gpu_context == "model"
    assert servers.title_of("python", ["python", "train.py"]) is None


@pytest.mark.parametrize(
    "filename, family, pid",
    [
        ("sgl_shm_mm_31337_0a1b2c3d", "sglang sgl_shm", "31337"),
        ("sgl_shm_nodecheck_7_deadbeef", "sglang sgl_shm", "7"),
        ("multi_tokenizer_args_4321", "sglang multi-tokenizer args", "4321"),
        ("sglang_loads_router_0a1b2c3d.shm", "sglang load snapshot", None),
        ("vllm_offload_2510ed76-5f3c-4d58-9a1e-3b2f0c9d8e7a.mmap", "vllm offload region", None),
        ("vllm_offload_2510ed76-5f3c-4d58-9a1e-3b2f0c9d8e7a.mmap.2", "vllm offload region", None),
        ("vllm_ec_abc.mmap", "vllm encoder-cache region", None),
        ("vllm_mm_AAAAAAAAAAAAAAAAAAAAAA", "vllm mm processor cache", None),
    ],
)
def test_shm_families_of_the_servers(filename: str, family: str, pid: str | None) -> None:
    found = servers.shm_family(filename)
    assert found is not None
    assert found[1].family == family
    match = found[1].match(filename)
    assert match is not None and match.groupdict().get("pid") == pid
    assert servers.shm_family("sgl_shm_mm_notapid_0a1b2c3d") is None


def test_bounded_cache_sizes_rest_on_flag_env_or_default() -> None:
    vlm = next(
        c
        for c in servers.get("sglang").metrics.bounded_caches
        if c.name == "sglang_vlm_embedding_cache"
    )
    assert vlm.layer == "vram" and vlm.unit == "MiB"
    assert vlm.size_of(None, {}) == (100.0, "the default 100 MiB")
    assert vlm.size_of(None, {"SGLANG_VLM_CACHE_SIZE_MB": "512"}) == (
        512.0,
        "SGLANG_VLM_CACHE_SIZE_MB=512 in the environment",
    )
    size, why = vlm.size_of(None, {"SGLANG_VLM_CACHE_SIZE_MB": "lots"})
    assert size == 100.0 and "'lots' is not a size" in why
    mm = next(c for c in servers.get("vllm").metrics.bounded_caches if c.layer == "host")
    assert mm.size_of(["vllm", "serve", "m", "--mm-processor-cache-gb", "8"])[0] == 8.0
    assert mm.size_of(["vllm", "serve", "m", "--mm-processor-cache-gb=0"])[0] == 0.0
    assert mm.size_of(["vllm", "serve", "m"]) == (4.0, "the default 4 GiB")
    assert mm.holders == ("vllm API server", "vllm engine core")


# --- new gauges read through the registry -----------------------------------------------


def test_sglang_0523_host_kv_cache_lora_pool_and_encoder_cache() -> None:
    text = sglang_text(version="0.5.23", hicache=(91000, 400000), lora=(2, 8), encoder_entries=37)
    s = parse_metrics_text(text)
    assert s.flavour == "sglang"
    assert s.values["hicache_host_used_tokens"] == 91000
    assert s.values["hicache_host_total_tokens"] == 400000
    assert s.values["lora_slots_used"] == 2 and s.values["lora_slots_total"] == 8
    assert s.values["lora_pool_utilization"] == pytest.approx(0.25)
    assert s.values["encoder_cache_entries"] == 37
    # A host KV tier is not a KV pool: it keeps what it holds at idle (caching), so it must not
    # become a pool the KV layer expects to empty.
    assert [p.pool for p in s.kv] == ["full"]
    host_kv = [c for c in servers.get("sglang").metrics.bounded_caches if c.layer == "host_kv"]
    assert [(c.used, c.capacity) for c in host_kv] == [
        ("hicache_host_used_tokens", "hicache_host_total_tokens")
    ]
    # Older pages have none of them and say nothing about them.
    old = parse_metrics_text(sglang_text(version="0.5.9", hicache=(1, 2)))
    assert "hicache_host_used_tokens" not in old.values


@pytest.mark.parametrize(
    "levels, sleeping, level",
    [([None], 0.0, 0.0), ([1], 1.0, 1.0), ([2], 1.0, 2.0), ([0], 1.0, 0.0), ([None, 2], 1.0, 2.0)],
)
def test_vllm_sleep_state(levels: list[int | None], sleeping: float, level: float) -> None:
    s = parse_metrics_text(vllm_text(version="0.33", engines=len(levels), sleep_level=levels))
    assert s.values["sleeping"] == sleeping and s.values["sleep_level"] == level


def test_vllm_033_sleep_operations_and_no_sleep_metric_before() -> None:
    s = parse_metrics_text(
        vllm_text(
            version="0.33", sleep_level=[1], sleep_ops={"sleep": 2, "wake": 1}, sleep_in_flight=1
        )
    )
    assert s.values["sleep_operations_total"] == 3
    assert s.values["sleep_operations_in_flight"] == 1
    before = parse_metrics_text(vllm_text(version="0.12"))
    assert "sleeping" not in before.values and "sleep_operations_total" not in before.values


# --- a kind added from outside ------------------------------------------------------------


def _read_toy(data: object) -> ProbeAnswer | None:
    if isinstance(data, dict) and data.get("server") == "toyserve":
        return ProbeAnswer(version=str(data["release"]), model="toy-1b")
    return None


TOY = ServerKind(
    name="toy",
    display_name="ToyServe",
    identity=Identity(
        probes=(Probe("/toy/about", _read_toy),),
        metric_prefixes=("toy_",),
        titles=(
            ProcessTitle(
                re.compile(r"toyserve::engine(?P<ranks>(?:_TP\d+)?)"),
                "toy engine",
                "engine",
                "model",
            ),
        ),
        shm_families=(
            ShmFamily("toy ring", re.compile(r"toy_ring_(?P<pid>\d+)"), "toy", "this test"),
        ),
    ),
    metrics=Metrics(
        series=(
            MetricSeries("running_requests", ("toy_running",), "sum", "requests", "running"),
            MetricSeries("toy_cache_entries", ("toy_cache_entries",), "max", "entries", "cache"),
        ),
        kv_pools=(
            KvPoolMetrics(
                "kv", used=("toy_kv_used_tokens",), capacity="toy_kv_capacity_tokens", primary=True
            ),
        ),
        running_requests=("toy_running",),
        queued_requests=("toy_waiting",),
        request_counters=("toy_requests_total",),
        bounded_caches=(BoundedCache("toy_cache", "host", "toy", "this test", default_size=1.0),),
    ),
)

TOY_METRICS = """# TYPE toy_running gauge
toy_running{replica="a"} 0
toy_running{replica="b"} 0
# TYPE toy_waiting gauge
toy_waiting 0
# TYPE toy_kv_used_tokens gauge
toy_kv_used_tokens 0
# TYPE toy_kv_capacity_tokens gauge
toy_kv_capacity_tokens 4096
# TYPE toy_cache_entries gauge
toy_cache_entries 12
# TYPE toy_requests counter
toy_requests_total 130
"""


@pytest.fixture
def toy() -> Iterator[ServerKind]:
    servers.register(TOY)
    try:
        yield TOY
    finally:
        servers.unregister("toy")


def test_a_kind_registered_from_outside_is_identified_and_its_metrics_read(toy: ServerKind) -> None:
    names = [k.name for k in servers.kinds()]
    assert names.index("toy") < names.index("openai")  # before the fallback
    with pytest.raises(ValueError, match="already"):
        servers.register(TOY)
    servers.register(replace(TOY, display_name="ToyServe 2"), replace=True)
    assert servers.get("toy").display_name == "ToyServe 2"

    def respond(path: str) -> tuple[int, str, str]:
        if path == "/toy/about":
            return 200, "application/json", json.dumps({"server": "toyserve", "release": "3.1"})
        if path == "/v1/models":
            return 200, "application/json", json.dumps({"data": [{"id": "toy-1b"}]})
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", TOY_METRICS
        return 404, "text/plain", "no"

    with serve(respond) as url:
        info = identify(url)
        with ServerMetricsSource(url) as src:
            m = src.sample()
    assert (info.kind, info.version, info.model) == ("toy", "3.1", "toy-1b")
    assert info.describe().startswith("ToyServe 2 3.1 serving toy-1b")
    assert m.flavour == "toy"
    assert m.values == {"running_requests": 0.0, "toy_cache_entries": 12.0}
    assert m.requests_total == 130
    assert [(p.pool, p.used_tokens, p.total_tokens, p.running_requests) for p in m.kv] == [
        ("kv", 0.0, 4096.0, 0.0)
    ]
    assert "toy_cache_entries" in stable_names()
    assert servers.title_of(None, ["toyserve::engine_TP1"]) is not None
    assert servers.title_of(None, ["toyserve::engine_TP1"]).role == "toy engine TP1"  # type: ignore[union-attr]
    assert servers.shm_family("toy_ring_77") is not None


def test_unregistered_kind_is_gone_and_pages_fall_back(toy: ServerKind) -> None:
    servers.unregister("toy")
    try:
        assert parse_metrics_text(TOY_METRICS).flavour is None
        with pytest.raises(KeyError):
            servers.unregister("toy")
    finally:
        servers.register(TOY)  # the fixture removes it again


def test_register_refuses_what_is_not_a_kind() -> None:
    with pytest.raises(TypeError):
        servers.register("sglang")  # type: ignore[arg-type]
