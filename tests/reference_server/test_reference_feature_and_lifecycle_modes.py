"""The server side of soak --vary and --cycle: a leak that only requests with one feature have,
and a leak of one lifecycle operation, through the servers' real endpoints and request fields (vLLM 0.33 /
SGLang 0.5.23 shapes), checked from inside the process (what it kept, /proc/self/status)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import requests
from support.refserver import MIB, ROOT, RefProc, Traffic, png_data_url

ADAPTER = str(ROOT / "examples" / "reference_server" / "adapters" / "tiny-lora")
SMALL = png_data_url(448, 448, 1)
LARGE = png_data_url(1280, 720, 2)
LONG_PREFIX = "You are a careful assistant. " * 100  # 2,900 characters


def _chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {
        "model": "vramdoctor-reference",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        **extra,
    }


def _img(*urls: str) -> list[dict[str, Any]]:
    return [
        *({"type": "image_url", "image_url": {"url": u}} for u in urls),
        {"type": "text", "text": "Describe."},
    ]


PLAIN = _chat("Write a haiku.")
# feature -> (mode, a request WITH the feature, the same request WITHOUT it, extra server args)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], tuple[str, ...]]] = {
    "images": ("leak-on-images", _chat(_img(SMALL)), PLAIN, ()),
    "image-size": ("leak-on-large-images", _chat(_img(LARGE)), _chat(_img(SMALL)), ()),
    "multi-image": ("leak-on-multi-image", _chat(_img(SMALL, SMALL)), _chat(_img(SMALL)), ()),
    "stream": ("leak-on-stream", {**PLAIN, "stream": True}, PLAIN, ()),
    "max-tokens": (
        "leak-on-max-tokens-1",
        {**PLAIN, "max_tokens": 1},
        {**PLAIN, "max_tokens": 64},
        (),
    ),
    "prefix": ("leak-on-prefix", _chat(LONG_PREFIX + "Question 1?"), PLAIN, ()),
    "structured-schema": (
        "leak-on-structured",
        {
            **PLAIN,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"type": "object"}},
            },
        },
        {**PLAIN, "response_format": {"type": "text"}},
        (),
    ),
    "structured-regex": ("leak-on-structured", {**PLAIN, "regex": "[a-z]+"}, PLAIN, ()),
    "structured-vllm": (
        "leak-on-structured",
        {**PLAIN, "structured_outputs": {"json": {"type": "object"}}},
        PLAIN,
        (),
    ),
    "n": ("leak-on-n", {**PLAIN, "n": 2}, PLAIN, ()),
    "lora-vllm": (
        "leak-on-lora",
        {**PLAIN, "model": "tiny"},
        PLAIN,
        ("--enable-lora", "--lora-modules", f"tiny={ADAPTER}", "--metrics-flavour", "vllm"),
    ),
    "lora-sglang": (
        "leak-on-lora",
        {**PLAIN, "model": "vramdoctor-reference:tiny"},
        PLAIN,
        ("--enable-lora", "--lora-paths", f"tiny={ADAPTER}", "--metrics-flavour", "sglang"),
    ),
}


def _send(url: str, body: dict[str, Any], n: int) -> None:
    s = requests.Session()
    for _ in range(n):
        r = s.post(
            url + "/v1/chat/completions", json=body, timeout=60, stream=bool(body.get("stream"))
        )
        assert r.status_code == 200, r.text
        r.content  # noqa: B018  (read the whole answer, streams included)


@pytest.mark.parametrize("case", sorted(CASES))
def test_only_requests_with_the_feature_leak(case: str) -> None:
    mode, with_it, without, extra = CASES[case]
    with RefProc(mode, "--leak-kib", "512", *extra) as srv:
        _send(srv.url, without, 6)
        time.sleep(0.2)
        quiet = srv.info()
        _send(srv.url, with_it, 6)
        time.sleep(0.2)
        after = srv.info()
    assert quiet["kept_bytes"] == 0, quiet
    assert after["kept_bytes"] == 6 * 512 * 1024  # n=2: the one extra choice's state
    assert after["feature_requests"] == 6 and after["other_requests"] == 6
    assert after["proc"]["rss_anon_bytes"] - quiet["proc"]["rss_anon_bytes"] > 2.5 * MIB
    host = after["truth"]["layers"]["host"]
    assert host["verdict"] == "LEAK" and host["feature"] == after["feature"]


def test_abort_leak_needs_the_client_to_go_away() -> None:
    with RefProc("leak-on-abort", "--leak-kib", "512", "--stream-token-s", "0.02") as srv:
        body = {**PLAIN, "stream": True, "max_tokens": 50}
        _send(srv.url, body, 3)  # read to the end: no leak
        time.sleep(0.2)
        assert srv.info()["kept_bytes"] == 0
        for _ in range(3):
            r = requests.post(srv.url + "/v1/chat/completions", json=body, stream=True, timeout=30)
            lines = r.iter_lines()
            next(lines)
            r.close()  # the client goes away after the first chunk
        deadline = time.monotonic() + 5
        while srv.info()["aborted"] < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)
        info = srv.info()
    assert info["aborted"] == 3 and info["kept_bytes"] == 3 * 512 * 1024


def test_a_kv_layer_feature_leak_shows_in_used_tokens_at_idle() -> None:
    with RefProc(
        "leak-on-stream",
        "--leak-layer",
        "kv",
        "--kv-leak-tokens",
        "64",
        "--metrics-flavour",
        "sglang",
    ) as srv:
        _send(srv.url, PLAIN, 5)
        _send(srv.url, {**PLAIN, "stream": True}, 5)
        time.sleep(0.2)
        info = srv.info()
        page = requests.get(srv.url + "/metrics", timeout=10).text
    assert info["kv_used_tokens"] == 5 * 64 and info["kept_bytes"] == 0
    assert (
        'sglang:kv_used_tokens{engine_type="unified",model_name="vramdoctor-reference",pp_rank="0",tp_rank="0"} 320.0'
        in page
    )


def test_vram_feature_leak_counts_on_the_device() -> None:
    with RefProc("leak-on-n", "--leak-layer", "vram", "--leak-kib", "1024") as srv:
        _send(srv.url, {**PLAIN, "n": 3}, 4)
        time.sleep(0.2)
        info = srv.info()
    assert info["device_memory"]["allocated_bytes"] == 4 * 2 * MIB  # (n - 1) per request


# --- lifecycle ------------------------------------------------------------------------------


def _vllm_env() -> dict[str, str]:
    return {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}


def _sleep_cycle(url: str, level: int = 1) -> None:
    r = requests.post(url + f"/sleep?level={level}", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "sleeping", "level": level}
    assert requests.get(url + "/is_sleeping", timeout=10).json() == {"is_sleeping": True}
    r = requests.post(url + "/wake_up", timeout=10)
    assert r.json() == {"status": "awake", "tags": None}


def test_vllm_routes_are_gated_like_vllm() -> None:
    with RefProc("stable", "--metrics-flavour", "vllm", "--enable-sleep-mode") as srv:
        assert requests.post(srv.url + "/sleep?level=1", timeout=10).status_code == 404
        assert (
            requests.post(
                srv.url + "/v1/load_lora_adapter",
                json={"lora_name": "a", "lora_path": ADAPTER},
                timeout=10,
            ).status_code
            == 404
        )


@pytest.mark.parametrize(("mode", "grows"), [("stable", False), ("sleep-leak", True)])
def test_sleep_wake_residue_per_cycle(mode: str, grows: bool) -> None:
    with RefProc(
        mode,
        "--metrics-flavour",
        "vllm",
        "--enable-sleep-mode",
        "--weights-mib",
        "48",
        "--cycle-leak-mib",
        "16",
        env=_vllm_env(),
    ) as srv:
        levels = []
        for _ in range(3):
            r = requests.post(srv.url + "/sleep?level=1", timeout=10)
            assert r.status_code == 200
            during = srv.info()
            assert during["lifecycle"]["host_backup_bytes"] == 48 * MIB  # the offload, on the host
            assert (
                during["device_memory"]["allocated_bytes"] == 8 * MIB
            )  # graphs stay; weights+KV freed
            status = requests.post(
                srv.url + "/v1/chat/completions", json=PLAIN, timeout=10
            ).status_code
            assert status == 503
            requests.post(srv.url + "/wake_up", timeout=10)
            after = srv.info()
            levels.append(after["proc"]["rss_anon_bytes"])
            assert after["lifecycle"]["host_backup_bytes"] == 0
            assert after["device_memory"]["allocated_bytes"] == (48 + 64 + 8) * MIB
        page = requests.get(srv.url + "/metrics", timeout=10).text
    assert 'sleep_state="awake"} 1.0' in page
    residue = (levels[-1] - levels[0]) / MIB
    assert after["lifecycle"]["cycles"]["sleep"] == 3
    if grows:
        assert residue == pytest.approx(32, abs=4)  # 16 MiB kept per cycle, two cycles apart
        assert after["lifecycle"]["leaked_host_bytes"] == 48 * MIB
        assert after["truth"]["layers"]["host"]["operation"] == "sleep"
    else:
        assert abs(residue) < 4


@pytest.mark.parametrize(("mode", "grows"), [("stable", False), ("release-leak", True)])
def test_release_resume_residue_on_the_device(mode: str, grows: bool) -> None:
    with RefProc(mode, "--metrics-flavour", "sglang", "--enable-memory-saver") as srv:
        used = []
        for _ in range(3):
            r = requests.post(
                srv.url + "/release_memory_occupation", json={"tags": None}, timeout=10
            )
            assert r.status_code == 200 and r.json() is None
            released = srv.info()
            # everything tagged is freed; what earlier cycles leaked stays
            assert (
                released["device_memory"]["allocated_bytes"]
                == (released["lifecycle"]["leaked_device_bytes"])
            )
            r = requests.get(srv.url + "/resume_memory_occupation", timeout=10)
            assert r.status_code == 200
            used.append(srv.info()["device_memory"]["used_bytes"])
    assert (used[-1] - used[0]) == (16 * MIB if grows else 0)


def test_release_refuses_while_a_request_runs() -> None:
    with RefProc(
        "stable", "--metrics-flavour", "sglang", "--enable-memory-saver", "--stream-token-s", "0.05"
    ) as srv:
        r = requests.post(
            srv.url + "/v1/chat/completions",
            json={**PLAIN, "stream": True, "max_tokens": 40},
            stream=True,
            timeout=30,
        )
        next(r.iter_lines())
        answer = requests.post(srv.url + "/release_memory_occupation", json={}, timeout=10)
        r.close()
    assert answer.status_code == 400
    assert "only when server is idle" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("mode", "flavour", "residue_mib"),
    [
        ("stable", "vllm", 2.0),
        ("stable", "sglang", 0.0),
        ("lora-leak", "vllm", 6.0),
        ("lora-leak", "sglang", 6.0),
    ],
)
def test_lora_load_unload_residue(mode: str, flavour: str, residue_mib: float) -> None:
    """vLLM's unload keeps the weights in its LRU (one rise, then flat: caching); SGLang frees
    them; lora-leak keeps every unloaded copy (2 MiB a cycle for tiny-lora)."""
    load = "/v1/load_lora_adapter" if flavour == "vllm" else "/load_lora_adapter"
    unload = "/v1/unload_lora_adapter" if flavour == "vllm" else "/unload_lora_adapter"
    model = "tiny" if flavour == "vllm" else "vramdoctor-reference:tiny"
    with RefProc(mode, "--metrics-flavour", flavour, "--enable-lora", env=_vllm_env()) as srv:
        start = srv.info()["proc"]["rss_anon_bytes"]
        for _ in range(3):
            r = requests.post(
                srv.url + load, json={"lora_name": "tiny", "lora_path": ADAPTER}, timeout=10
            )
            assert r.status_code == 200, r.text
            ids = [m["id"] for m in requests.get(srv.url + "/v1/models", timeout=10).json()["data"]]
            assert "tiny" in ids
            ok = requests.post(
                srv.url + "/v1/chat/completions", json={**PLAIN, "model": model}, timeout=10
            )
            assert ok.status_code == 200
            r = requests.post(srv.url + unload, json={"lora_name": "tiny"}, timeout=10)
            assert r.status_code == 200, r.text
        info = srv.info()
        gone = requests.post(
            srv.url + "/v1/chat/completions", json={**PLAIN, "model": model}, timeout=10
        )
    if flavour == "vllm":
        assert r.text == "Success: LoRA adapter 'tiny' removed successfully."
        assert gone.status_code == 404
    else:
        assert r.json()["success"] is True and r.json()["loaded_adapters"] == {}
        assert gone.status_code == 400
    grown = (info["proc"]["rss_anon_bytes"] - start) / MIB
    assert grown == pytest.approx(residue_mib, abs=1.0)
    assert info["lifecycle"]["cycles"]["lora"] == 3


def test_lifecycle_leak_modes_refuse_to_start_without_their_switch() -> None:
    for mode, needs in (
        ("sleep-leak", "--enable-sleep-mode"),
        ("release-leak", "--enable-memory-saver"),
        ("lora-leak", "--enable-lora"),
    ):
        srv = RefProc(mode, expect_start=False)
        assert srv.wait(60) != 0
        srv.stop()
        assert any(needs in line for line in srv.stderr_lines), srv.stderr_lines


def test_threaded_cycles_and_traffic_keep_the_counts_consistent() -> None:
    """Lifecycle calls at idle between rounds of real traffic: nothing lost, nothing kept."""
    with RefProc(
        "stable", "--metrics-flavour", "vllm", "--enable-sleep-mode", env=_vllm_env()
    ) as srv:
        traffic = Traffic(srv.url, sizes=((448, 448),))
        errors: list[str] = []
        for _ in range(3):
            assert set(traffic.round(8)) == {200}
            t = threading.Thread(target=lambda: _sleep_cycle(srv.url))
            t.start()
            t.join(20)
        info = srv.info()
    assert not errors and info["requests"] == 24 and info["kv_used_tokens"] == 0
    assert info["lifecycle"]["cycles"]["sleep"] == 3 and not info["lifecycle"]["sleeping"]
