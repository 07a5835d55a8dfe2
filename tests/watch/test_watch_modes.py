"""watch end to end against every reference-server mode, on this machine's CPU.

Each mode is a real server process written to the physics (examples/reference_server: real
threads, real PIL decoding, real malloc, a real background thread, a real process of another
owner, two real servers on one virtual GPU served as a real exporter page, dcgm-exporter's MIG
labels, a real restart), states its own truth (GET /reference/info), and gets production-shaped
traffic: rounds of requests with idle gaps between, which watch only observes. The verdict must
be the truth's, by the evidence the truth names; a short run may say INCONCLUSIVE only where
the truth itself says the outside cannot tell (allocator retention without the agent).

Each run is mostly waiting (idle windows are the point), so the runs of the selected tests go
at once, `PARALLEL` at a time, in a pool the module's fixture `ran` starts: a test waits for its
own run's facts (`ran(name)`) and asserts on them; `-k` runs only the selected tests' runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
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
    url: str,
    n: int,
    per_round: int,
    *,
    idle_s: float = 2.4,
    images: bool = False,
    warm: int = 0,
    watcher: Watcher | None = None,
    min_samples: int = 1,
) -> list[dict[str, Any]]:
    """`warm` requests first (a server that ran before watch came), then an idle window (the
    baseline), then `n` rounds of `per_round` requests each followed by `idle_s` of idle.
    With `watcher`, each idle gap lasts until that watch holds it too (`seen_idle`: on a
    loaded machine its samples come late). Returns the server's own GET /reference/info at
    the baseline and at the end."""
    traffic = Traffic(url, concurrency=2) if images else Traffic(url, sizes=(), concurrency=2)
    before = watcher.state.rounds.open if watcher is not None else None
    if warm:
        assert set(traffic.round(warm)) == {200}
    time.sleep(idle_s / 2)
    seen = [requests.get(url + "/reference/info", timeout=30).json()]
    time.sleep(idle_s / 2)
    seen_idle(watcher, before if warm else None, min_samples)
    for _ in range(n):
        before = watcher.state.rounds.open if watcher is not None else None
        assert set(traffic.round(per_round)) == {200}
        time.sleep(idle_s)
        seen_idle(watcher, before, min_samples)
    return [*seen, requests.get(url + "/reference/info", timeout=30).json()]


def seen_idle(w: Watcher | None, before: Any, min_samples: int = 1, cap_s: float = 20.0) -> None:
    """Wait (at most `cap_s`) until `w` holds an idle window of --min-idle other than `before`
    (the one open before the round: traffic always closes it) with `min_samples` settled memory
    samples, and, where watch launched the server with the agent, the agent's record in it.
    Unloaded this returns at once after the idle gap; it only lengthens gaps the sampling
    could not see."""
    if w is None:
        return
    agent = w.launched is not None and w.options.agent
    deadline = time.monotonic() + cap_s
    while time.monotonic() < deadline:
        cur = w.state.rounds.current()
        kept = len(cur.records.get("host", [])) + len(cur.records.get("gpu", [])) if cur else 0
        held = kept >= min_samples
        if cur is not None and held and cur is not before and (not agent or cur.inside):
            return
        time.sleep(0.1)


def at_once(*runs: tuple[str, int, int, dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """`rounds(url, n, per_round, **kw)` for each server at the same time (one thread each)."""
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(rounds, u, n, k, **kw) for u, n, k, kw in runs]
        return [f.result(timeout=600) for f in futures]


def truth(url: str) -> dict[str, Any]:
    return requests.get(url + "/reference/info", timeout=30).json()["truth"]


def _analyse(w: Watcher) -> WatchResult:
    time.sleep(0.3)
    return w.analyse()


Facts = dict[str, Any]
_RUNS: dict[str, Callable[[Path], Facts]] = {}
PARALLEL = 4  # runs at once: ~0.3 of a core each, mostly asleep in idle windows


def run(fn: Callable[[Path], Facts]) -> Callable[[Path], Facts]:
    """Registers a run (`fn(tmp_dir) -> facts`) under its name, for `ran`."""
    _RUNS[fn.__name__] = fn
    return fn


def uses(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Marks a test as asserting on the facts of run `name` (so `ran` starts it)."""

    def mark(test: Callable[..., None]) -> Callable[..., None]:
        setattr(test, "watch_run", name)  # noqa: B010
        return test

    return mark


@pytest.fixture(scope="module")
def ran(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Facts]]:
    """Starts the runs of this module's selected tests at once; `ran(name)` waits for one."""
    names: list[str] = []
    for item in request.session.items:
        name = getattr(getattr(item, "function", None), "watch_run", None)
        if getattr(item, "module", None) is request.module and name and name not in names:
            names.append(name)
    with ThreadPoolExecutor(PARALLEL, thread_name_prefix="watch-run") as pool:
        futures = {n: pool.submit(_RUNS[n], tmp_path_factory.mktemp(n)) for n in names}
        yield lambda n: futures[n].result(timeout=900)
        for f in futures.values():
            f.cancel()


# -- runs, the longest first -----------------------------------------------------------------
@run
def retention(tmp: Path) -> Facts:
    # thread per connection, PNGs of varying size, glibc defaults: RssAnon climbs, live flat.
    # Two of them at once: one watched from outside, one launched by watch with the agent.
    images = {"images": True, "warm": 48}
    with ExitStack() as stack:
        srv = stack.enter_context(RefProc("retention", *VLLM))
        w_out = stack.enter_context(watching(server_url=srv.url))
        cmd = ref_cmd("retention", free_port(), *VLLM)
        w_in = stack.enter_context(watching(launch=tuple(cmd), out_dir=tmp))
        assert w_in.options.server_url is not None
        seen, _ = at_once(
            (srv.url, 6, 16, {**images, "watcher": w_out}),
            (w_in.options.server_url, 6, 16, {**images, "watcher": w_in}),
        )
        return {"seen": seen, "outside": _analyse(w_out), "inside": _analyse(w_in)}


@run
def host_leak(tmp: Path) -> Facts:
    cmd = ref_cmd("host-leak", free_port(), "--leak-kib", "256", *SGLANG)
    with watching(launch=tuple(cmd), out_dir=tmp) as w:
        assert w.options.server_url is not None
        # 8 rounds and 4 s idle windows: with the suite 4 at a time on 2 cores, an agent
        # reading can come after traffic resumed (then it is left out), and 6 rounds of 2.4 s
        # left the steady in-use line INCONCLUSIVE (seen in 2 of 4 full runs; alone it passes)
        seen = rounds(w.options.server_url, 8, 16, idle_s=4.0, images=True, warm=48, watcher=w)
        return {"seen": seen, "res": _analyse(w)}


@run
def converging(tmp: Path) -> Facts:
    with (
        RefProc("converging", "--admit-probability", "0.3", *VLLM) as srv,
        watching(server_url=srv.url) as w,
    ):
        seen = rounds(srv.url, 7, 12, images=True, watcher=w)
        return {"seen": seen, "res": _analyse(w)}


@run
def background(tmp: Path) -> Facts:
    with (
        RefProc("background", "--background-kib-per-s", "1024", *SGLANG) as srv,
        watching(server_url=srv.url) as w,
    ):
        # growth in time shows inside idle windows: each holds enough samples to show it
        seen = rounds(srv.url, 7, 6, idle_s=3.0, watcher=w, min_samples=12)
        return {"seen": seen, "res": _analyse(w)}


@run
def leaking(tmp: Path) -> Facts:
    cmd = ref_cmd("leaking", free_port(), "--leak-kib", "512", *SGLANG)
    with watching(launch=tuple(cmd), out_dir=tmp, startup_timeout_s=60) as w:
        url = w.options.server_url
        assert url is not None and w.launched is not None
        seen = rounds(url, 7, 8, watcher=w)
        res, launched = _analyse(w), w.launched.pid
    return {"seen": seen, "res": res, "pid": launched, "alive_after": pid_alive(launched)}


@run
def plain(tmp: Path) -> Facts:
    with RefProc("plain", *VLLM) as srv, watching(server_url=srv.url) as w:
        seen = rounds(srv.url, 6, 8, watcher=w)
        return {"seen": seen, "res": _analyse(w)}


@run
def vram_leaking(tmp: Path) -> Facts:
    with (
        VirtualGpu(tmp / "vgpu") as gpu,
        RefProc("vram-leaking", "--leak-kib", "1024", "--vgpu-dir", str(gpu.dir), *VLLM) as srv,
        watching(server_url=srv.url, gpu_metrics=[gpu.metrics_url]) as w,
    ):
        seen = rounds(srv.url, 6, 8, watcher=w)
        return {"seen": seen, "res": _analyse(w), "pid": srv.pid, "windows": _windows(w)}


def _windows(w: Watcher) -> list[tuple[float, list[float | None]]]:
    """Each idle window watch kept: (requests served up to it, every process MiB it sampled),
    for a failure's message."""
    return [
        (iw.served, [p.used_mib for g in iw.records.get("gpu", []) for p in g.processes])
        for iw in w.state.rounds.windows(time.time())
    ]


@run
def tenant(tmp: Path) -> Facts:
    with (
        VirtualGpu(tmp / "vgpu") as gpu,
        RefProc("tenant", "--tenant-mib-per-s", "8", "--vgpu-dir", str(gpu.dir), *VLLM) as srv,
        watching(server_url=srv.url, gpu_metrics=[gpu.metrics_url]) as w,
    ):
        seen = rounds(srv.url, 6, 8, watcher=w)
        return {"seen": seen, "res": _analyse(w)}


@run
def two_servers(tmp: Path) -> Facts:
    with ExitStack() as stack:
        gpu = stack.enter_context(VirtualGpu(tmp / "vgpu"))
        leaky = stack.enter_context(
            RefProc("vram-leaking", "--leak-kib", "1024", "--vgpu-dir", str(gpu.dir), *VLLM)
        )
        other = stack.enter_context(RefProc("plain", "--vgpu-dir", str(gpu.dir), *VLLM))
        w_other = stack.enter_context(watching(server_url=other.url, gpu_metrics=[gpu.metrics_url]))
        w_leaky = stack.enter_context(watching(server_url=leaky.url, gpu_metrics=[gpu.metrics_url]))
        at_once((leaky.url, 6, 8, {"watcher": w_leaky}), (other.url, 6, 8, {"watcher": w_other}))
        return {"other": _analyse(w_other), "leaky": _analyse(w_leaky), "leaky_pid": leaky.pid}


@run
def mig(tmp: Path) -> Facts:
    common = ["--vgpu-dir", "", "--vgpu-index", "0", "--vgpu-profile", "1g.18gb"]
    with ExitStack() as stack:
        gpu = stack.enter_context(VirtualGpu(tmp / "vgpu", flavour="dcgm"))
        common[1] = str(gpu.dir)
        leaky = stack.enter_context(
            RefProc("vram-leaking", "--leak-kib", "1024", "--vgpu-instance", "1", *common, *VLLM)
        )
        other = stack.enter_context(RefProc("plain", "--vgpu-instance", "2", *common, *SGLANG))
        w = stack.enter_context(watching(server_url=leaky.url, gpu_metrics=[gpu.metrics_url]))
        seen, _ = at_once((leaky.url, 6, 8, {"watcher": w}), (other.url, 6, 8, {}))
        return {"seen": seen, "res": _analyse(w)}


@run
def restart(tmp: Path) -> Facts:
    with (
        RefProc("restart", "--restart-after", "24", "--restarts", "1", *VLLM) as srv,
        watching(server_url=srv.url) as w,
    ):
        first = srv.pid
        seen = rounds(srv.url, 7, 8, watcher=w)
        return {"seen": seen, "res": _analyse(w), "first_pid": first}


def _growth(seen: list[dict[str, Any]], *path: str) -> float:
    """MiB a field of /reference/info grew from the baseline to the end."""
    first, last = seen
    for key in path:
        first, last = first[key], last[key]
    return float(last - first) / MIB


# -- tests ----------------------------------------------------------------------------------
@uses("retention")
def test_retention_with_the_agent_is_caching_decided_by_glibcs_bytes_in_use(ran: Any) -> None:
    f = ran("retention")
    assert f["seen"][-1]["truth"]["layers"]["host"]["verdict"] == "CACHING"
    in_use = _growth(f["seen"], "malloc", "in_use_bytes")
    anon = _growth(f["seen"], "proc", "rss_anon_bytes")
    # The server's own shape: what it grows is mostly kept, not live. How much the arenas keep
    # depends on how the threads meet them; under the suite's load one CI run kept only +12.3
    # MiB (+4.0 in use, its bounded live cache): then only the verdict below is asserted.
    if anon > 20.0:
        assert abs(in_use) < 0.25 * anon, (in_use, anon)
    inside = f["inside"]
    host = inside.layers["host"]
    assert host.verdict in ("CACHING", "STABLE"), (host, inside.notes)
    assert host.decided_by == "inside_glibc"
    assert inside.exit_code == 0


@uses("retention")
def test_retention_seen_from_outside_is_never_a_leak(ran: Any) -> None:
    outside = ran("retention")["outside"]
    assert outside.layers["host"].verdict != "LEAK", outside.layers["host"]
    assert outside.exit_code == 0


@uses("host_leak")
def test_host_leak_with_the_agent_is_found_through_glibcs_bytes_in_use(ran: Any) -> None:
    f = ran("host_leak")
    told = f["seen"][-1]["truth"]["layers"]["host"]
    per_request = told["bytes_per_request"] / MIB
    in_use = _growth(f["seen"], "malloc", "in_use_bytes")
    assert told["verdict"] == "LEAK" and in_use > 0.8 * 8 * 16 * per_request, in_use
    res = f["res"]
    host = res.layers["host"]
    inside = [
        (s.get("malloc") or {}).get("in_use_bytes", 0) / MIB for s in f["seen"]
    ]  # what the server itself said at each idle end
    why = (host.verdict, host.reason, host.decided_by, res.rounds, res.notes, inside)
    assert host.verdict == "LEAK" and host.decided_by == "inside_glibc", why
    assert host.rate_per_request == pytest.approx(per_request, rel=0.25)
    assert res.exit_code == 1


@uses("converging")
def test_a_converging_cache_is_caching_never_a_leak(ran: Any) -> None:
    f = ran("converging")
    assert f["seen"][-1]["truth"]["layers"]["host"]["verdict"] == "CACHING"
    res = f["res"]
    assert res.layers["host"].verdict != "LEAK", res.layers["host"]
    assert res.exit_code == 0


@uses("background")
def test_a_background_allocator_is_a_leak_in_time_at_its_hourly_rate(ran: Any) -> None:
    f = ran("background")
    told = f["seen"][-1]["truth"]["layers"]["host"]
    assert told["verdict"] == "LEAK"
    res = f["res"]
    host = res.layers["host"]
    why = (host, res.rounds, res.events, res.notes)
    assert host.verdict == "LEAK" and host.reason == "grew_with_time", why
    assert host.rate_per_hour == pytest.approx(told["bytes_per_hour"] / MIB, rel=0.3)
    assert host.rate_per_request is None


@uses("leaking")
def test_leaking_with_the_agent_is_a_leak_decided_inside_at_its_rate(ran: Any) -> None:
    f = ran("leaking")
    told = f["seen"][-1]["truth"]["layers"]["host"]
    res = f["res"]
    host = res.layers["host"]
    assert host.verdict == "LEAK", (host, res.notes)
    assert host.decided_by in ("inside_glibc", "inside_python", "rounds")
    assert host.rate_per_request == pytest.approx(told["bytes_per_request"] / MIB, rel=0.25)
    assert res.culprit is not None and res.culprit.pid == f["pid"]
    assert not f["alive_after"]  # stopped with the watch


@uses("plain")
def test_plain_caching_is_not_a_leak_and_exits_0(ran: Any) -> None:
    res = ran("plain")["res"]
    assert res.mode == "rounds" and res.idle_windows >= 5, res.notes
    assert res.verdict != "LEAK" and res.exit_code == 0, res.layers


@uses("vram_leaking")
def test_a_vram_leak_on_the_exporter_page_is_found_per_request(ran: Any) -> None:
    f = ran("vram_leaking")
    told = f["seen"][-1]["truth"]["layers"]["vram"]
    assert told["verdict"] == "LEAK"
    vram = f["res"].layers["vram"]
    assert vram.verdict == "LEAK" and vram.main_series == f"gpu0/pid{f['pid']}", (
        vram,
        f["windows"],
    )
    assert vram.rate_per_request == pytest.approx(told["bytes_per_request"] / MIB, rel=0.1)


@uses("tenant")
def test_another_owners_process_on_the_gpu_is_a_tenant_never_the_culprit(ran: Any) -> None:
    f = ran("tenant")
    tenant_pid = f["seen"][0]["tenant"]["pid"]
    res = f["res"]
    vram = res.layers["vram"]
    assert vram.verdict != "LEAK" and res.culprit is None, vram
    assert f"gpu0/pid{tenant_pid}" in vram.tenants
    row = next(s for s in res.series if s.pid == tenant_pid and s.layer == "vram")
    assert row.scope == "tenant" and not row.decides


@uses("two_servers")
def test_two_servers_on_one_gpu_each_watch_judges_its_own(ran: Any) -> None:
    f = ran("two_servers")
    r_other, r_leaky, leaky_pid = f["other"], f["leaky"], f["leaky_pid"]
    assert r_other.layers["vram"].verdict != "LEAK" and r_other.culprit is None
    assert f"gpu0/pid{leaky_pid}" in r_other.layers["vram"].tenants
    assert r_leaky.layers["vram"].verdict == "LEAK"
    assert r_leaky.culprit is not None and r_leaky.culprit.pid == leaky_pid


@uses("mig")
def test_mig_slices_on_dcgm_exporter_are_judged_apart(ran: Any) -> None:
    f = ran("mig")
    told = f["seen"][-1]["truth"]["layers"]["vram"]
    assert told["verdict"] == "LEAK" and told["gpu_instance"] == 1
    res = f["res"]
    vram = res.layers["vram"]
    assert vram.verdict == "LEAK" and vram.main_series == "gpu0-gi1", vram
    assert res.culprit is not None and res.culprit.gpu_instance == 1
    assert vram.rate_per_request == pytest.approx(told["bytes_per_request"] / MIB, rel=0.15)
    slice2 = next(s for s in res.series if s.key == "gpu0-gi2")
    assert slice2.verdict != "LEAK"


@uses("restart")
def test_a_restarted_server_is_a_new_life_never_a_leak(ran: Any) -> None:
    f = ran("restart")
    res = f["res"]
    assert res.verdict != "LEAK", res.layers
    replaced = [e for e in res.events if e["event"] == "server_replaced"]
    assert replaced and replaced[0]["old_pid"] == f["first_pid"], res.events
