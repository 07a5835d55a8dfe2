"""watch end to end against every reference-server mode of issue #21, on this machine's CPU.

Each mode is a real server process written to the physics (examples/reference_server: real
threads, real PIL decoding, real malloc, a real background thread, a real process of another
owner, two real servers on one virtual GPU served as a real exporter page, dcgm-exporter's MIG
labels, a real restart), states its own truth (GET /reference/info), and gets production-shaped
traffic: rounds of requests with idle gaps between, which watch only observes. The verdict must
be the truth's, by the evidence the truth names; a short run may say INCONCLUSIVE only where
the truth itself says the outside cannot tell (allocator retention without the agent).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from support.procs import free_port, pid_alive, ref_cmd
from support.refserver import RefProc, Traffic
from support.vgpu import VirtualGpu

from vramdoctor.watch import WatchConfig, Watcher, WatchOptions, WatchResult

pytestmark = pytest.mark.skipif(
    not __import__("sys").platform.startswith("linux"), reason="glibc counters: Linux only"
)

# The reference server's /metrics in a known server's words (its own reference_* names are
# no server kind: without a request counter watch could only compare over time).
VLLM = ("--metrics-flavour", "vllm")
SGLANG = ("--metrics-flavour", "sglang")
# The agent is asked at every idle window here (watch's default: at most once a minute, its
# cost bound for weeks; these runs have a round every ~3 s).
CONFIG = WatchConfig(
    bucket_s=0.5, max_buckets=1200, warmup_s=0.0, min_idle_s=1.0, inside_every_s=0.0
)
MIB = 1024 * 1024


@contextmanager
def watching(**options: Any) -> Iterator[Watcher]:
    """A Watcher sampling every 0.1 s in a thread of its own, closed at the end."""
    w = Watcher(
        WatchOptions(
            interval_s=0.1, analyse_every_s=3600, use_nvml=False, listen=None, config=CONFIG,
            **options,
        )
    ).open()  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=w.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield w
    finally:
        stop.set()
        thread.join(30)
        w.close()


def rounds(
    url: str, n: int, per_round: int, *, idle_s: float = 1.8, images: bool = False, warm: int = 0
) -> list[dict[str, Any]]:
    """`warm` requests first (a server that ran before watch came), then an idle window (the
    baseline), then `n` rounds of `per_round` requests each followed by `idle_s` of idle.
    Returns the server's own GET /reference/info at the baseline and at the end."""
    traffic = Traffic(url, concurrency=2) if images else Traffic(url, sizes=(), concurrency=2)
    if warm:
        assert set(traffic.round(warm)) == {200}
    time.sleep(idle_s / 2)
    seen = [requests.get(url + "/reference/info", timeout=30).json()]
    time.sleep(idle_s / 2)
    for _ in range(n):
        assert set(traffic.round(per_round)) == {200}
        time.sleep(idle_s)
    return [*seen, requests.get(url + "/reference/info", timeout=30).json()]


def at_once(*runs: tuple[str, int, int, dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """`rounds(url, n, per_round, **kw)` for each server at the same time (one thread each)."""
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(rounds, u, n, k, **kw) for u, n, k, kw in runs]
        return [f.result(timeout=300) for f in futures]


def truth(url: str) -> dict[str, Any]:
    return requests.get(url + "/reference/info", timeout=30).json()["truth"]


def _analyse(w: Watcher) -> WatchResult:
    time.sleep(0.3)
    return w.analyse()


def test_plain_caching_is_not_a_leak_and_exits_0() -> None:
    with RefProc("plain", *VLLM) as srv, watching(server_url=srv.url) as w:
        rounds(srv.url, 6, 8)
        res = _analyse(w)
    assert res.mode == "rounds" and res.idle_windows >= 5, res.notes
    assert res.verdict != "LEAK" and res.exit_code == 0, res.layers


def test_leaking_with_the_agent_is_a_leak_decided_inside_at_its_rate(tmp_path: Path) -> None:
    port = free_port()
    cmd = ref_cmd("leaking", port, "--leak-kib", "512", *SGLANG)
    with watching(launch=tuple(cmd), out_dir=tmp_path, startup_timeout_s=60) as w:
        url = w.options.server_url
        assert url is not None and w.launched is not None
        rounds(url, 7, 8)
        res = _analyse(w)
        launched = w.launched.pid
    host = res.layers["host"]
    assert host.verdict == "LEAK", (host, res.notes)
    assert host.decided_by in ("inside_glibc", "inside_python", "rounds")
    assert host.rate_per_request == pytest.approx(0.5, rel=0.25)
    assert res.culprit is not None and res.culprit.pid == launched
    assert not pid_alive(launched)  # stopped with the watch


def test_retention_is_never_a_leak_and_with_the_agent_it_is_caching(tmp_path: Path) -> None:
    # thread per connection, PNGs of varying size, glibc defaults: RssAnon climbs, live flat.
    # Two of them at once: one watched from outside, one launched by watch with the agent.
    images = {"images": True, "warm": 48}
    with ExitStack() as stack:
        srv = stack.enter_context(RefProc("retention", *VLLM))
        w_out = stack.enter_context(watching(server_url=srv.url))
        cmd = ref_cmd("retention", free_port(), *VLLM)
        w_in = stack.enter_context(watching(launch=tuple(cmd), out_dir=tmp_path))
        assert w_in.options.server_url is not None
        seen, _ = at_once((srv.url, 6, 16, images), (w_in.options.server_url, 6, 16, images))
        outside, inside = _analyse(w_out), _analyse(w_in)
    first, last = seen
    assert last["truth"]["layers"]["host"]["verdict"] == "CACHING"
    in_use = (last["malloc"]["in_use_bytes"] - first["malloc"]["in_use_bytes"]) / MIB
    anon = (last["proc"]["rss_anon_bytes"] - first["proc"]["rss_anon_bytes"]) / MIB
    assert anon > 20.0 and abs(in_use) < 0.1 * anon, (in_use, anon)  # live flat, RSS grew
    assert outside.layers["host"].verdict != "LEAK", outside.layers["host"]
    assert outside.exit_code == 0
    host = inside.layers["host"]
    assert host.verdict in ("CACHING", "STABLE"), (host, inside.notes)
    assert host.decided_by == "inside_glibc"
    assert inside.exit_code == 0


def test_host_leak_with_the_agent_is_found_through_glibcs_bytes_in_use(tmp_path: Path) -> None:
    port = free_port()
    with watching(
        launch=tuple(ref_cmd("host-leak", port, "--leak-kib", "256", *SGLANG)), out_dir=tmp_path
    ) as w:
        assert w.options.server_url is not None
        first, last = rounds(w.options.server_url, 6, 16, images=True, warm=48)
        res = _analyse(w)
    told = last["truth"]["layers"]["host"]
    per_request = told["bytes_per_request"] / MIB
    in_use = (last["malloc"]["in_use_bytes"] - first["malloc"]["in_use_bytes"]) / MIB
    assert told["verdict"] == "LEAK" and in_use > 0.8 * 6 * 16 * per_request, in_use
    host = res.layers["host"]
    assert host.verdict == "LEAK" and host.decided_by == "inside_glibc", (host, res.notes)
    assert host.rate_per_request == pytest.approx(per_request, rel=0.25)
    assert res.exit_code == 1


def test_a_converging_cache_is_caching_never_a_leak() -> None:
    with (
        RefProc("converging", "--admit-probability", "0.3", *VLLM) as srv,
        watching(server_url=srv.url) as w,
    ):
        rounds(srv.url, 7, 12, images=True)
        res = _analyse(w)
    assert res.layers["host"].verdict != "LEAK", res.layers["host"]
    assert res.exit_code == 0


def test_a_background_allocator_is_a_leak_in_time_at_its_hourly_rate() -> None:
    kib_per_s = 1024
    with (
        RefProc("background", "--background-kib-per-s", str(kib_per_s), *SGLANG) as srv,
        watching(server_url=srv.url) as w,
    ):
        rounds(srv.url, 6, 6, idle_s=2.5)
        res = _analyse(w)
    host = res.layers["host"]
    assert host.verdict == "LEAK" and host.reason == "grew_with_time", (host, res.notes)
    assert host.rate_per_hour == pytest.approx(kib_per_s / 1024 * 3600, rel=0.3)
    assert host.rate_per_request is None


def test_a_vram_leak_on_the_exporter_page_is_found_per_request(tmp_path: Path) -> None:
    with (
        VirtualGpu(tmp_path / "vgpu") as gpu,
        RefProc("vram-leaking", "--leak-kib", "1024", "--vgpu-dir", str(gpu.dir), *VLLM) as srv,
        watching(server_url=srv.url, gpu_metrics=[gpu.metrics_url]) as w,
    ):
        rounds(srv.url, 6, 8)
        res = _analyse(w)
        told = truth(srv.url)["layers"]["vram"]
    assert told["verdict"] == "LEAK"
    vram = res.layers["vram"]
    assert vram.verdict == "LEAK" and vram.main_series == f"gpu0/pid{srv.pid}", vram
    assert vram.rate_per_request == pytest.approx(told["bytes_per_request"] / MIB, rel=0.1)


def test_another_owners_process_on_the_gpu_is_a_tenant_never_the_culprit(tmp_path: Path) -> None:
    with (
        VirtualGpu(tmp_path / "vgpu") as gpu,
        RefProc("tenant", "--tenant-mib-per-s", "8", "--vgpu-dir", str(gpu.dir)) as srv,
        watching(server_url=srv.url, gpu_metrics=[gpu.metrics_url]) as w,
    ):
        tenant_pid = requests.get(srv.url + "/reference/info", timeout=10).json()["tenant"]["pid"]
        rounds(srv.url, 6, 8)
        res = _analyse(w)
    vram = res.layers["vram"]
    assert vram.verdict != "LEAK" and res.culprit is None, vram
    assert f"gpu0/pid{tenant_pid}" in vram.tenants
    row = next(s for s in res.series if s.pid == tenant_pid and s.layer == "vram")
    assert row.scope == "tenant" and not row.decides


def test_two_servers_on_one_gpu_each_watch_judges_its_own(tmp_path: Path) -> None:
    with ExitStack() as stack:
        gpu = stack.enter_context(VirtualGpu(tmp_path / "vgpu"))
        leaky = stack.enter_context(
            RefProc("vram-leaking", "--leak-kib", "1024", "--vgpu-dir", str(gpu.dir), *VLLM)
        )
        other = stack.enter_context(RefProc("plain", "--vgpu-dir", str(gpu.dir), *VLLM))
        w_other = stack.enter_context(watching(server_url=other.url, gpu_metrics=[gpu.metrics_url]))
        w_leaky = stack.enter_context(watching(server_url=leaky.url, gpu_metrics=[gpu.metrics_url]))
        at_once((leaky.url, 6, 8, {}), (other.url, 6, 8, {}))
        r_other, r_leaky = _analyse(w_other), _analyse(w_leaky)
    assert r_other.layers["vram"].verdict != "LEAK" and r_other.culprit is None
    assert f"gpu0/pid{leaky.pid}" in r_other.layers["vram"].tenants
    assert r_leaky.layers["vram"].verdict == "LEAK" and r_leaky.culprit.pid == leaky.pid


def test_mig_slices_on_dcgm_exporter_are_judged_apart(tmp_path: Path) -> None:
    common = ["--vgpu-index", "0", "--vgpu-profile", "1g.18gb"]
    with ExitStack() as stack:
        gpu = stack.enter_context(VirtualGpu(tmp_path / "vgpu", flavour="dcgm"))
        leaky = stack.enter_context(
            RefProc(
                "vram-leaking",
                "--leak-kib",
                "1024",
                "--vgpu-dir",
                str(gpu.dir),
                "--vgpu-instance",
                "1",
                *common,
                *VLLM,
            )
        )
        other = stack.enter_context(
            RefProc("plain", "--vgpu-dir", str(gpu.dir), "--vgpu-instance", "2", *common, *SGLANG)
        )
        w = stack.enter_context(watching(server_url=leaky.url, gpu_metrics=[gpu.metrics_url]))
        at_once((leaky.url, 6, 8, {}), (other.url, 6, 8, {}))
        res = _analyse(w)
        told = truth(leaky.url)["layers"]["vram"]
    assert told["verdict"] == "LEAK" and told["gpu_instance"] == 1
    vram = res.layers["vram"]
    assert vram.verdict == "LEAK" and vram.main_series == "gpu0-gi1", vram
    assert res.culprit is not None and res.culprit.gpu_instance == 1
    assert vram.rate_per_request == pytest.approx(told["bytes_per_request"] / MIB, rel=0.15)
    slice2 = next(s for s in res.series if s.key == "gpu0-gi2")
    assert slice2.verdict != "LEAK"


def test_a_restarted_server_is_a_new_life_never_a_leak() -> None:
    with (
        RefProc("restart", "--restart-after", "24", "--restarts", "1", *VLLM) as srv,
        watching(server_url=srv.url) as w,
    ):
        first = srv.pid
        rounds(srv.url, 7, 8)
        res = _analyse(w)
    assert res.verdict != "LEAK", res.layers
    replaced = [e for e in res.events if e["event"] == "server_replaced"]
    assert replaced and replaced[0]["old_pid"] == first, res.events
