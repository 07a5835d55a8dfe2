"""Server /metrics over real HTTP on loopback, in the formats SGLang and vLLM publish."""

from __future__ import annotations

import pytest
from prometheus_client import Gauge
from support.sources import metrics_only, serve, sglang_text, vllm_text

from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.record import RunWriter, make_header, read_run
from vramdoctor.samples import MetricsSample
from vramdoctor.sources.server_metrics import STABLE_NAMES, ServerMetricsSource


def scrape(text: str, **kw) -> MetricsSample:
    with serve(metrics_only(text)) as url, ServerMetricsSource(url, **kw) as src:
        return src.sample()


def test_sglang_059_maps_memory_series_and_keeps_everything_raw() -> None:
    s = scrape(
        sglang_text(
            version="0.5.9",
            token_usage=0.73,
            used_tokens=146000,
            running=9,
            queued=4,
            hit_rate=0.61,
        )
    )
    assert s.flavour == "sglang"
    assert s.values["kv_usage_ratio"] == pytest.approx(0.73)
    assert s.values["used_tokens"] == 146000
    assert s.values["running_requests"] == 9
    assert s.values["queued_requests"] == 4
    assert s.values["cache_hit_rate"] == pytest.approx(0.61)
    assert s.values["max_total_tokens"] == 200000
    assert "weight_memory_gib" not in s.values  # that gauge arrived in 0.5.17
    labels = (
        'engine_type="unified",model_name="Qwen/Qwen2.5-VL-7B-Instruct",pp_rank="0",tp_rank="0"'
    )
    assert s.raw[f"sglang:token_usage{{{labels}}}"] == pytest.approx(0.73)
    # Counters keep their scraped _total name; histograms keep _sum/_count, not buckets.
    assert any(k.startswith("sglang:prompt_tokens_total{") for k in s.raw)
    assert any(k.startswith("sglang:time_to_first_token_seconds_count{") for k in s.raw)
    assert not any("_bucket" in k or "_created" in k for k in s.raw)
    assert s.t > 0 and s.wall > 1.6e9


def test_sglang_0423_only_model_name_label() -> None:
    s = scrape(sglang_text(version="0.4.3", token_usage=0.05, running=1))
    assert s.flavour == "sglang"
    assert s.values["kv_usage_ratio"] == pytest.approx(0.05)
    assert s.values["running_requests"] == 1
    assert "retracted_requests" not in s.values


def test_sglang_all_schedulers_fold_tp_ranks_and_sum_dp_replicas() -> None:
    # --enable-metrics-for-all-schedulers with dp=2, tp=2: each DP replica's two TP ranks
    # report the same batch; the replicas' batches add up.
    ranks = [
        {
            "model_name": "m",
            "engine_type": "unified",
            "dp_rank": str(dp),
            "tp_rank": str(tp),
            "pp_rank": "0",
        }
        for dp in (0, 1)
        for tp in (0, 1)
    ]
    s = scrape(sglang_text(version="0.5.23", ranks=ranks, running=5, queued=2, used_tokens=1000))
    assert s.values["running_requests"] == 10  # 2 replicas x 5, not 4 ranks x 5
    assert s.values["queued_requests"] == 4
    assert s.values["used_tokens"] == 2000
    assert s.values["retractions_total"] == 8  # counter, 4 per replica
    # Memory gauges are per GPU: graph phases add up on one rank; ranks take the max.
    assert s.values["graph_memory_gib"] == pytest.approx(0.126 + 0.314)
    assert s.values["weight_memory_gib"] == pytest.approx(15.284)
    assert s.values["kv_cache_memory_gib"] == pytest.approx(36.2)
    assert s.values["startup_available_gpu_memory_gib"] == pytest.approx(7.5)  # lowest rank
    assert s.values["encoder_cache_mib"] == 1024
    assert s.values["kv_available_tokens"] == 300000
    assert s.values["kv_evictable_tokens"] == 76000


def test_vllm_v0_old_kv_name_and_cache_config() -> None:
    s = scrape(vllm_text(version="0.6.3", kv_usage=[0.875], preemptions=3))
    assert s.flavour == "vllm"
    assert s.values["kv_usage_ratio"] == pytest.approx(0.875)
    assert s.values["preemptions_total"] == 3
    assert s.values["cache_hit_rate"] == pytest.approx(0.5)
    assert s.values["swapped_requests"] == 0
    assert s.values["num_gpu_blocks"] == 27000
    assert s.values["gpu_memory_utilization"] == pytest.approx(0.9)


def test_vllm_010_prefers_new_kv_name_and_sums_engines() -> None:
    # 0.10 exports both names; the deprecated one here carries a different value on purpose.
    s = scrape(vllm_text(version="0.10.1", engines=2, kv_usage=[0.2, 0.6], running=3, waiting=1))
    assert s.values["kv_usage_ratio"] == pytest.approx(0.6)  # fullest engine, new name
    assert s.values["running_requests"] == 6
    assert s.values["queued_requests"] == 2
    assert s.values["preemptions_total"] == 14
    assert s.values["cache_hit_rate"] == pytest.approx(0.4)  # hits/queries from V1 counters
    assert (
        'vllm:gpu_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
        in s.raw
    )


def test_vllm_012_new_name_only() -> None:
    s = scrape(vllm_text(version="0.12.0", kv_usage=[0.11]))
    assert s.values["kv_usage_ratio"] == pytest.approx(0.11)
    assert not any(k.startswith("vllm:gpu_cache_usage_perc") for k in s.raw)


def test_unknown_series_kept_raw_and_buckets_on_request() -> None:
    def extra(reg) -> None:
        Gauge("sglang:some_future_gauge", "not known to vramdoctor", registry=reg).set(17)
        Gauge("my_sidecar_bytes", "unrelated", ["shard"], registry=reg).labels(shard="a").set(9)

    text = sglang_text(version="0.5.9", extra=extra)
    s = scrape(text)
    assert s.raw["sglang:some_future_gauge"] == 17
    assert s.raw['my_sidecar_bytes{shard="a"}'] == 9
    assert "some_future_gauge" not in s.values
    with_buckets = scrape(text, keep_buckets=True)
    assert any("_bucket{" in k for k in with_buckets.raw)


def test_no_known_flavour_is_kept_not_rejected() -> None:
    s = scrape("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n")
    assert s.flavour is None
    assert s.values == {}
    assert s.raw == {"process_cpu_seconds_total": 12.5}


def test_stable_names_cover_both_servers() -> None:
    for name in (
        "kv_usage_ratio",
        "running_requests",
        "queued_requests",
        "cache_hit_rate",
        "used_tokens",
        "retractions_total",
        "preemptions_total",
        "weight_memory_gib",
    ):
        assert name in STABLE_NAMES


def test_url_without_path_gets_metrics() -> None:
    with serve(metrics_only(vllm_text())) as url:
        host_port = url.removeprefix("http://")
        with ServerMetricsSource(host_port) as src:
            assert src.shown_url == f"{url}/metrics"
            assert src.sample().flavour == "vllm"


def test_404_says_metrics_may_be_off() -> None:
    with (
        serve(lambda path: (404, "text/plain", "Not Found")) as url,
        ServerMetricsSource(url) as src,
        pytest.raises(SourceUnavailable, match=r"404.*--enable-metrics"),
    ):
        src.sample()


def test_html_page_is_a_clear_error() -> None:
    page = "<!doctype html><html><body>Welcome</body></html>"
    with (
        serve(lambda path: (200, "text/html", page)) as url,
        ServerMetricsSource(url) as src,
        pytest.raises(SourceUnavailable, match="did not return Prometheus metrics"),
    ):
        src.sample()


def test_refused_connection_and_bad_urls() -> None:
    with serve(metrics_only("")) as url:
        pass  # closed now: nothing listens on that port any more
    with ServerMetricsSource(url) as src, pytest.raises(SourceUnavailable, match="cannot connect"):
        src.sample()
    with pytest.raises(InputError, match="scheme"):
        ServerMetricsSource("ftp://example.org/metrics")
    with pytest.raises(InputError, match=r"(?i)port out of range"):
        ServerMetricsSource("http://localhost:99999999/metrics")


def test_credentials_never_in_errors() -> None:
    with serve(lambda path: (401, "text/plain", "no")) as url:
        secret_url = (
            url.replace("http://", "http://admin:hunter2secret@")
            + "/metrics?api_key=sk-live-abcdefgh"
        )
        with ServerMetricsSource(secret_url) as src, pytest.raises(SourceUnavailable) as err:
            src.sample()
    message = str(err.value)
    assert "401" in message
    assert "hunter2secret" not in message and "sk-live-abcdefgh" not in message
    assert src.shown_url.startswith("http://127.0.0.1:")


def test_metrics_sample_round_trips_through_a_run_file(tmp_path) -> None:
    s = scrape(sglang_text(version="0.5.23"))
    path = tmp_path / "run.jsonl"
    with RunWriter(path, make_header("soak", argv=["vramdoctor", "soak"])) as w:
        w.write(s)
    back = read_run(path).of(MetricsSample)
    assert back == [s]


def test_utf8_label_values_without_a_charset_header() -> None:
    text = 'sglang:token_usage{model_name="Qwen/通义千问-VL",tp_rank="0"} 0.5\n'
    with serve(lambda path: (200, "text/plain", text)) as url, ServerMetricsSource(url) as src:
        s = src.sample()
    assert s.raw == {'sglang:token_usage{model_name="Qwen/通义千问-VL",tp_rank="0"}': 0.5}


# --- KV pools in tokens and request counters ------------------------------------------------------

SGLANG_0523_HYBRID = """\
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 0.4
sglang:num_used_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 1920
sglang:max_total_num_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 200000
sglang:kv_used_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 1920
sglang:kv_available_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 190000
sglang:kv_evictable_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 8080
sglang:swa_used_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 64
sglang:swa_available_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 49936
sglang:swa_evictable_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 0
sglang:mamba_used_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 0
sglang:mamba_available_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 0
sglang:mamba_evictable_tokens{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 0
sglang:kv_cache_memory_usage_gb{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 12.5
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 0
# TYPE sglang:num_requests counter
sglang:num_requests_total{model_name="m"} 1234
"""


def test_sglang_pools_in_tokens_full_and_swa_with_evictable_beside_used() -> None:
    s = scrape(SGLANG_0523_HYBRID, page_size_tokens=64)
    pools = {p.pool: p for p in s.kv}
    assert set(pools) == {"full", "swa"}  # the mamba gauges are all 0: a pool this model lacks
    full = pools["full"]
    assert (full.used_tokens, full.total_tokens, full.evictable_tokens) == (1920, 200000, 8080)
    assert full.source == "sglang:kv_used_tokens" and full.page_size_tokens == 64
    assert (full.running_requests, full.queued_requests) == (0, 0)
    assert full.bytes_per_token == pytest.approx(12.5 * 2**30 / 200000)
    assert pools["swa"].used_tokens == 64 and pools["swa"].total_tokens == 50000
    assert s.requests_total == 1234


def test_sglang_older_pools_fall_back_to_num_used_tokens_then_ratio() -> None:
    s = scrape(sglang_text(version="0.5.9", token_usage=0.25, used_tokens=5000))
    assert [(p.pool, p.used_tokens, p.source) for p in s.kv] == [
        ("full", 5000, "sglang:num_used_tokens")
    ]
    ratio_only = (
        "\n".join(
            line
            for line in sglang_text(version="0.5.9", token_usage=0.25).splitlines()
            if "num_used_tokens" not in line
        )
        + "\n"
    )
    s = scrape(ratio_only)
    assert s.kv[0].used_tokens == pytest.approx(0.25 * 200000)
    assert s.kv[0].source == "sglang:token_usage*max_total_num_tokens"


VLLM_V1 = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.01
vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.02
vllm:cache_config_info{block_size="16",num_gpu_blocks="5000",gpu_memory_utilization="0.9",engine="0"} 1
vllm:num_requests_running{model_name="m",engine="0"} 0
vllm:num_requests_waiting{model_name="m",engine="0"} 0
# TYPE vllm:request_success counter
vllm:request_success_total{model_name="m",engine="0",finished_reason="stop"} 90
vllm:request_success_total{model_name="m",engine="0",finished_reason="length"} 9
vllm:request_success_total{model_name="m",engine="1",finished_reason="abort"} 1
"""


def test_vllm_usage_times_the_pool_size_from_cache_config_labels_per_engine() -> None:
    s = scrape(VLLM_V1)
    (pool,) = s.kv
    assert pool.pool == "kv" and pool.page_size_tokens == 16
    assert pool.total_tokens == 2 * 5000 * 16
    assert pool.used_tokens == pytest.approx((0.01 + 0.02) * 5000 * 16)
    assert s.requests_total == 100
    # A non-finite pool size in the labels is no pool size (the ratio stays in values).
    bad = VLLM_V1.replace('num_gpu_blocks="5000"', 'num_gpu_blocks="nan"')
    s = scrape(bad)
    assert s.kv == [] and s.values["kv_usage_ratio"] == pytest.approx(0.02)
