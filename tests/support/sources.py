"""Real loopback HTTP servers and exposition text in the formats the real servers emit.

SGLang, vLLM and nvitop-exporter all publish through prometheus_client, so their text is
produced here the same way: metric objects with the names, types and label names read off
their source (python/sglang/srt/metrics/collector.py; vllm/engine/metrics.py and
vllm/v1/metrics/loggers.py; nvitop-exporter/nvitop_exporter/exporter.py), rendered by
prometheus_client.generate_latest. dcgm-exporter is Go and renders a text template
(label order gpu, UUID, pci_bus_id, device, modelName, [GPU_I_PROFILE, GPU_I_ID], Hostname,
then extra labels); `dcgm_text` writes that layout.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

Responder = Callable[[str], tuple[int, str, str]]


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


@contextlib.contextmanager
def serve(respond: Responder | str) -> Iterator[str]:
    """Serve on 127.0.0.1 (a free port); yields the base URL. `respond(path)` -> (status, type, body)."""
    if isinstance(respond, str):
        body_text = respond
        respond = lambda path: (200, "text/plain; version=0.0.4; charset=utf-8", body_text)  # noqa: E731
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            status, ctype, body = respond(self.path)  # type: ignore[operator]
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def metrics_only(text: str) -> Responder:
    """Answers /metrics with text and anything else with 404, like the servers do."""

    def respond(path: str) -> tuple[int, str, str]:
        if path.split("?", 1)[0] == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", text
        return 404, "text/plain", "Not Found"

    return respond


# --- SGLang ---------------------------------------------------------------------------


def sglang_text(
    *,
    version: str = "0.5.9",
    ranks: list[dict[str, str]] | None = None,
    token_usage: float = 0.42,
    used_tokens: int = 12000,
    running: int = 3,
    queued: int = 1,
    hit_rate: float = 0.25,
    hicache: tuple[float, float] | None = None,
    lora: tuple[float, float] | None = None,
    encoder_entries: float | None = None,
    extra: Callable[[CollectorRegistry], None] | None = None,
) -> str:
    """/metrics of an SGLang server. `ranks` are the scheduler label sets that report
    (TP rank 0 only by default; every rank with --enable-metrics-for-all-schedulers).
    `hicache` (used, total host KV tokens; --enable-hierarchical-cache, 0.5.15+), `lora`
    (slots used, total; with LoRA) and `encoder_entries` (the encoder-disaggregation server's
    cache, 0.5.15+) add the gauges of sglang/srt/observability/metrics_collector.py (0.5.23)."""
    reg = CollectorRegistry()
    v = _ver(version)
    base = {"model_name": "Qwen/Qwen2.5-VL-7B-Instruct"}
    if v >= (0, 5):
        base |= {"engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
    ranks = ranks or [base]
    names = sorted(ranks[0])

    def gauge(name: str, doc: str, value: Callable[[dict[str, str]], float]) -> None:
        g = Gauge(name, doc, labelnames=names, registry=reg)
        for r in ranks:
            g.labels(**r).set(value(r))

    gauge("sglang:num_running_reqs", "The number of running requests.", lambda r: running)
    gauge("sglang:num_used_tokens", "The number of used tokens.", lambda r: used_tokens)
    gauge("sglang:token_usage", "The token usage.", lambda r: token_usage)
    gauge("sglang:gen_throughput", "The generation throughput (token/s).", lambda r: 812.5)
    gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", lambda r: queued)
    gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", lambda r: hit_rate)
    if v >= (0, 4, 7):
        gauge("sglang:num_retracted_reqs", "The number of retracted requests.", lambda r: 0)
    if v >= (0, 5, 9):
        gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            lambda r: 200000,
        )
    if v >= (0, 5, 12):
        gauge("sglang:kv_available_tokens", "Available tokens.", lambda r: 150000)
        gauge("sglang:kv_evictable_tokens", "Evictable tokens.", lambda r: 38000)
        gauge("sglang:kv_used_tokens", "Used tokens.", lambda r: used_tokens)
        gauge(
            "sglang:startup_available_gpu_memory_gb",
            "Available GPU memory at startup (GB).",
            lambda r: 7.5 + int(r.get("tp_rank", "0")),
        )
        c = Counter(
            "sglang:num_retracted_requests_total",
            "Total number of retracted requests.",
            labelnames=names,
            registry=reg,
        )
        for r in ranks:
            c.labels(**r).inc(4)
    if v >= (0, 5, 15):
        gauge("sglang:encoder_cache_size_mb", "Encoder cache size (MB).", lambda r: 1024)
    if v >= (0, 5, 17):
        gauge("sglang:weight_memory_usage_gb", "Weight memory (GB).", lambda r: 15.284)
        gauge("sglang:kv_cache_memory_usage_gb", "KV cache memory (GB).", lambda r: 36.2)
        g = Gauge(
            "sglang:graph_memory_usage_gb",
            "CUDA graph memory (GB).",
            labelnames=[*names, "phase"],
            registry=reg,
        )
        for r in ranks:
            g.labels(**r, phase="prefill").set(0.126)
            g.labels(**r, phase="decode").set(0.314)
    if hicache is not None and v >= (0, 5, 15):
        gauge(
            "sglang:hicache_host_used_tokens",
            "Number of tokens currently used in the host KV cache.",
            lambda r: hicache[0],
        )
        gauge(
            "sglang:hicache_host_total_tokens",
            "Total capacity of the host KV cache in tokens.",
            lambda r: hicache[1],
        )
    if lora is not None:
        gauge(
            "sglang:lora_pool_slots_used",
            "Number of LoRA adapter slots currently occupied in GPU memory.",
            lambda r: lora[0],
        )
        gauge(
            "sglang:lora_pool_slots_total",
            "Total number of LoRA adapter slots available (max_loras_per_batch).",
            lambda r: lora[1],
        )
        gauge(
            "sglang:lora_pool_utilization",
            "LoRA pool utilization ratio (used/total). 1.0 means pool is full.",
            lambda r: lora[0] / lora[1],
        )
    if encoder_entries is not None and v >= (0, 5, 15):
        gauge(
            "sglang:encoder_cache_entries",
            "Current number of cache entries.",
            lambda r: encoder_entries,
        )
    tok = Counter(
        "sglang:prompt_tokens_total",
        "Number of prefill tokens processed.",
        labelnames=sorted(base),
        registry=reg,
    )
    tok.labels(**base).inc(123456)
    h = Histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        labelnames=sorted(base),
        registry=reg,
        buckets=[0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4],
    )
    h.labels(**base).observe(0.3)
    if extra:
        extra(reg)
    return generate_latest(reg).decode()


# --- vLLM -----------------------------------------------------------------------------


def vllm_text(
    *,
    version: str = "0.12",
    engines: int = 1,
    kv_usage: list[float] | None = None,
    running: int = 2,
    waiting: int = 5,
    preemptions: int = 7,
    sleep_level: list[int | None] | None = None,
    sleep_ops: dict[str, int] | None = None,
    sleep_in_flight: int = 0,
) -> str:
    """/metrics of a vLLM server: V0 (0.6), V1 with both KV names (0.10), new names only (0.12+).

    `sleep_level` per engine (0.12+, vllm/v1/metrics/loggers.py `vllm:engine_sleep_state`):
    None awake, 1 weights offloaded, 2 discard all, 0 a level-0 sleep (all three rows 0).
    `sleep_ops` (0.33, vllm/entrypoints/serve/dev/sleep/metrics.py): finished operations per
    operation name, observed into the duration histogram; `sleep_in_flight` its gauge."""
    reg = CollectorRegistry()
    model = "meta-llama/Llama-3.1-8B-Instruct"
    kv_usage = kv_usage or [0.31] * engines
    v0 = _ver(version) < (0, 7)
    labelnames = ["model_name"] if v0 else ["model_name", "engine"]
    label_sets = (
        [{"model_name": model}]
        if v0
        else [{"model_name": model, "engine": str(i)} for i in range(engines)]
    )

    def gauge(name: str, doc: str, values: list[float]) -> None:
        g = Gauge(name, doc, labelnames=labelnames, registry=reg)
        for labels, v in zip(label_sets, values, strict=False):
            g.labels(**labels).set(v)

    def counter(name: str, doc: str, value: float) -> None:
        c = Counter(name, doc, labelnames=labelnames, registry=reg)
        for labels in label_sets:
            c.labels(**labels).inc(value)

    info = Info("vllm:cache_config", "Information of the LLMEngine CacheConfig", registry=reg)
    info.info(
        {
            "block_size": "16",
            "cache_dtype": "auto",
            "gpu_memory_utilization": "0.9",
            "num_gpu_blocks": "27000",
            "num_cpu_blocks": "2048",
            "enable_prefix_caching": "True",
        }
    )
    gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        [running] * engines,
    )
    gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        [waiting] * engines,
    )
    if v0:
        gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", [0])
        gauge(
            "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", kv_usage
        )
        gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.", [0.0])
        gauge("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", [0.5])
        counter(
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
            preemptions,
        )
    else:
        if _ver(version) < (0, 11):
            gauge(
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage."
                "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                [0.99] * engines,
            )
            counter("vllm:gpu_prefix_cache_queries", "GPU prefix cache queries.", 1000)
            counter("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits.", 250)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_usage)
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            1000,
        )
        counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", 400
        )
        counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", preemptions
        )
    if sleep_level is not None and _ver(version) >= (0, 12):
        g = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            labelnames=[*labelnames, "sleep_state"],
            registry=reg,
        )
        for labels, level in zip(label_sets, sleep_level, strict=False):
            g.labels(**labels, sleep_state="awake").set(1 if level is None else 0)
            g.labels(**labels, sleep_state="weights_offloaded").set(1 if level == 1 else 0)
            g.labels(**labels, sleep_state="discard_all").set(1 if level == 2 else 0)
    if sleep_ops is not None and _ver(version) >= (0, 33):
        hist = Histogram(
            "vllm:sleep_mode_operation_duration_seconds",
            "Duration of sleep mode operations in seconds.",
            labelnames=["operation"],
            registry=reg,
            buckets=[0.01, 0.1, 1.0, 10.0, 60.0, 600.0],
        )
        for op, n in sleep_ops.items():
            for _ in range(n):
                hist.labels(operation=op).observe(0.5)
        Gauge(
            "vllm:sleep_mode_operations_in_flight",
            "Number of sleep mode operations in flight.",
            registry=reg,
        ).set(sleep_in_flight)
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", 5000)
    h = Histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        labelnames=labelnames,
        registry=reg,
        buckets=[0.001, 0.005, 0.01, 0.02, 0.04, 0.1, 1.0],
    )
    h.labels(**label_sets[0]).observe(0.015)
    return generate_latest(reg).decode()


# --- GPU exporters --------------------------------------------------------------------


def dcgm_text(
    gpus: list[dict],
    *,
    uuid_label: str = "UUID",
    fields: tuple[str, ...] = ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"),
) -> str:
    """dcgm-exporter's text layout. Each gpu dict: gpu, uuid, model, host, used, free, and
    optionally reserved, total, mig_profile, mig_id, pod, namespace, container."""
    helps = {
        "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
        "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
        "DCGM_FI_DEV_FB_RESERVED": "Framebuffer memory reserved (in MiB).",
        "DCGM_FI_DEV_FB_TOTAL": "Framebuffer memory total (in MiB).",
        "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    }
    key = {
        "DCGM_FI_DEV_FB_FREE": "free",
        "DCGM_FI_DEV_FB_USED": "used",
        "DCGM_FI_DEV_FB_RESERVED": "reserved",
        "DCGM_FI_DEV_FB_TOTAL": "total",
        "DCGM_FI_DEV_GPU_UTIL": "util",
    }
    lines: list[str] = []
    for field in fields:
        lines.append(f"# HELP {field} {helps[field]}")
        lines.append(f"# TYPE {field} gauge")
        for g in gpus:
            labels = (
                f'gpu="{g["gpu"]}",{uuid_label}="{g["uuid"]}",pci_bus_id="00000000:{0x18 + int(g["gpu"]):02X}:00.0",'
                f'device="nvidia{g["gpu"]}",modelName="{g["model"]}"'
            )
            if g.get("mig_profile"):
                labels += f',GPU_I_PROFILE="{g["mig_profile"]}",GPU_I_ID="{g["mig_id"]}"'
            if g.get("host"):
                labels += f',Hostname="{g["host"]}"'
            labels += ',DCGM_FI_DRIVER_VERSION="570.124.06"'
            for extra in ("container", "namespace", "pod"):
                if extra in g:
                    labels += f',{extra}="{g[extra]}"'
            value = g.get(key[field], 0)
            lines.append(f"{field}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def nvitop_text(host: str, gpus: list[dict], processes: list[dict]) -> str:
    """nvitop-exporter's metrics. gpus: index, name, uuid, total, used, free.
    processes: index (GPU), pid, username, mib, command."""
    reg = CollectorRegistry()
    gl = ["hostname", "index", "devicename", "uuid"]
    pl = [*gl, "pid", "username"]
    total = Gauge(
        "gpu_memory_total", "GPU memory total (MiB).", unit="MiB", labelnames=gl, registry=reg
    )
    used = Gauge(
        "gpu_memory_used", "GPU memory used (MiB).", unit="MiB", labelnames=gl, registry=reg
    )
    free = Gauge(
        "gpu_memory_free", "GPU memory free (MiB).", unit="MiB", labelnames=gl, registry=reg
    )
    util = Gauge(
        "gpu_utilization", "GPU utilization (%).", unit="Percentage", labelnames=gl, registry=reg
    )
    pinfo = Info("process_info", "Process information.", labelnames=pl, registry=reg)
    pmem = Gauge(
        "process_gpu_memory", "Process GPU memory (MiB).", unit="MiB", labelnames=pl, registry=reg
    )
    prss = Gauge(
        "process_rss_memory",
        "Process memory resident set size (MiB).",
        unit="MiB",
        labelnames=pl,
        registry=reg,
    )
    by_index = {str(g["index"]): g for g in gpus}
    for g in gpus:
        labels = {
            "hostname": host,
            "index": str(g["index"]),
            "devicename": g["name"],
            "uuid": g["uuid"],
        }
        total.labels(**labels).set(g["total"])
        used.labels(**labels).set(g["used"])
        free.labels(**labels).set(g["free"])
        util.labels(**labels).set(50.0)
    for p in processes:
        g = by_index[str(p["index"])]
        labels = {
            "hostname": host,
            "index": str(p["index"]),
            "devicename": g["name"],
            "uuid": g["uuid"],
            "pid": str(p["pid"]),
            "username": p.get("username", "root"),
        }
        pinfo.labels(**labels).info({"status": "running", "command": p["command"]})
        pmem.labels(**labels).set(p["mib"])
        prss.labels(**labels).set(2048.0)
    return generate_latest(reg).decode()
