"""fleet's cost at 1,000 and 10,000 GPUs, the screen against pulling everything, in one run.

Two fleets, generated from the exporters' formats (dcgm-exporter 4.8.2 labels, one SGLang
server per host of 8 GPUs with its gauges and request counter) with a mix written down below,
loaded into a real Prometheus (promtool backfill) and a real VictoriaMetrics (its JSON import):

- **1k**: 1,000 GPUs x 7 days of raw samples at a 30-s scrape (dcgm-exporter's default
  collect interval), no recording rules. ~30 M samples.
- **10k**: 10,000 GPUs x 30 days WITH the shipped recording rules: the hourly floors the rules
  record (examples/monitoring/vramdoctor-fleet.rules.yml) for the 30 days, and the last 3 hours
  of raw samples. The raw 30 days themselves (1.7 G samples at 15 s) are not written: they
  would take hours to generate on 2 cores, and fleet with the rules never reads them (every
  query it makes is listed in the output: the recorded floors, and raw samples of the last
  hour only).

Mix (seeded; per GPU unless said): 1 % leak steadily (8-60 MiB/h), 1 % start leaking inside
the range (30-200 MiB/h from 30-90 % of it), 5 % cache steps mid-range (+0.5-2 GiB), 3 %
give a cache back every 2-3 hours, a quarter of the hosts restart weekly (the GPU empties for
10 minutes, the next life fills 2 GiB in an hour), the rest hold still under bursty traffic
with idle moments; 2 % of the SGLang servers keep one 64-token page per hour at idle.

Each row is `run_fleet` end to end (queries, transfer, parsing, analysis), in this process,
best of `--repeat`; "cli s" runs `vramdoctor fleet --json` in a fresh process (start-up
included). Both strategies in the same run: `screen` (the database ranks; only candidates'
hourly floors come back) and `pull` (every series' 5-minute minima, or with the rules every
recorded floor, judged here).

    python3 benchmarks/fleet_scale.py --case 1k            # ~15 min the first time on 2 cores
    python3 benchmarks/fleet_scale.py --case 10k           # ~20 min the first time
    python3 benchmarks/fleet_scale.py --case 1k --cache ~/.cache/vd-fleet-bench   # reuse data
    python3 benchmarks/fleet_scale.py --startup            # import cost only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vramdoctor.fleet import run_fleet  # noqa: E402
from vramdoctor.fleet.families import family  # noqa: E402
from vramdoctor.fleet.promql import rule_name  # noqa: E402

HOUR = 3600.0
DCGM_RULE = rule_name(family("DCGM_FI_DEV_FB_USED"))  # gpu:DCGM_FI_DEV_FB_USED:min_over_time1h
KV_RULE = "instance:sglang_num_used_tokens_idle:min_over_time1h"
RESETS_RULE = "instance:sglang_num_requests_total:resets1h"
TOTAL_MIB = 81_559.0


@dataclass(frozen=True)
class Case:
    name: str
    gpus: int
    days: float
    scrape_s: float
    rules: bool  # write the recorded floors (and raw samples for the last hours only)


CASES = {
    "1k": Case("1k", 1000, 7.0, 30.0, False),
    "10k": Case("10k", 10_000, 30.0, 30.0, True),
}
RAW_TAIL_H = 3.0  # with rules: raw samples only for the last hours


@dataclass
class Truth:
    leaks: set[str]
    kv_leaks: set[str]


def _kind(rng: np.random.Generator) -> str:
    x = rng.random()
    for name, share in (("leak", 0.01), ("late", 0.01), ("steps", 0.05), ("release", 0.03)):
        if x < share:
            return name
        x -= share
    return "flat"


def _dcgm_labels(host: str, gpu: int) -> str:
    return (
        f'{{gpu="{gpu}",UUID="GPU-{host}-{gpu}",pci_bus_id="00000000:{gpu + 0x18:02X}:00.0",'
        f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",'
        f'instance="{host}:9400",job="dcgm"}}'
    )


def _busy(n: int, h: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    shape = 0.55 + 0.45 * np.sin(2 * math.pi * (h - 6) / 24)
    busy = rng.random(n) < 0.6 * (0.5 + shape / 2)
    return np.asarray(busy * rng.random(n) * shape)


def gpu_level(
    kind: str, h: np.ndarray, span_h: float, restarts: list[float], rng: np.random.Generator
) -> np.ndarray:
    """MiB used by one GPU at hours `h` (the whole range), by its kind (module doc)."""
    n = len(h)
    base = 60_000.0 + rng.normal(0, 2000)
    v = np.full(n, base)
    if kind == "leak":
        v += rng.uniform(8, 60) * h
    elif kind == "late":
        at = rng.uniform(0.3, 0.9) * span_h
        v += rng.uniform(30, 200) * np.maximum(h - at, 0)
    elif kind == "steps":
        for _ in range(int(rng.integers(1, 3))):
            v += rng.uniform(512, 2048) * (h >= rng.uniform(0.2, 0.8) * span_h)
    elif kind == "release":
        period = rng.uniform(2, 3)
        cycle = (h % period) / (period * 0.8)
        v += 2048 * np.minimum(cycle, 1.0) * (cycle <= 1.0)
    for r in restarts:  # the GPU empties, the next life fills its cache again
        after = h >= r
        v = np.where(after & (h < r + 10 / 60), 300.0, v)
        fill = np.clip((h - r - 10 / 60) / 1.0, 0, 1)
        v = np.where(after & (h >= r + 10 / 60), v - 2048 * (1 - fill), v)
    v += 600 * _busy(n, h, rng) + rng.normal(0, 3, n)
    return np.round(v)


def _hourly_floor(t: np.ndarray, v: np.ndarray, end: float) -> tuple[np.ndarray, np.ndarray]:
    """What the rule `min_over_time(X[1h])` records every hour (evaluated at end - k hours)."""
    k = np.floor((end - t) / HOUR)
    order = np.lexsort((v, k))
    k, v = k[order], v[order]
    first = np.r_[True, k[1:] != k[:-1]]
    # k counts hours back from the end: reversed, the samples are in time order (promtool's
    # backfill refuses a series whose samples go back in time: "out of order sample")
    return (end - k[first] * HOUR)[::-1], v[first][::-1]


def series(case: Case, end: float) -> Iterator[tuple[str, str, np.ndarray, np.ndarray]]:
    """(name, labels, t, v) of every series the case stores, and fills TRUTH."""
    rng = np.random.default_rng(26)
    kinds = np.random.default_rng(27)  # the mix on its own stream: exactly the shares above
    n = int(case.days * 86400 / case.scrape_s)
    t = end - case.scrape_s * np.arange(n)[::-1]
    h = (t - t[0]) / HOUR
    span_h = float(h[-1])
    tail = t >= end - RAW_TAIL_H * HOUR
    hosts = case.gpus // 8
    truth = Truth(set(), set())
    for host_i in range(hosts):
        host = f"h{host_i:05d}"
        weekly = kinds.random() < 0.25
        phase = kinds.uniform(0, 168)
        restarts = [float(x) for x in np.arange(phase, span_h, 168.0)] if weekly else []
        for gpu in range(8):
            kind = _kind(kinds)
            v = gpu_level(kind, h, span_h, restarts, rng)
            lab = _dcgm_labels(host, gpu)
            if kind in ("leak", "late"):
                truth.leaks.add(f"{host}/device/gpu={gpu}")
            if case.rules:
                ft, fv = _hourly_floor(t, v, end)
                yield DCGM_RULE, lab, ft, fv
                yield "DCGM_FI_DEV_FB_USED", lab, t[tail], v[tail]
            else:
                yield "DCGM_FI_DEV_FB_USED", lab, t, v
            yield "DCGM_FI_DEV_FB_FREE", lab, t[tail], TOTAL_MIB - v[tail]
        # one SGLang server (TP8) per host
        leaky = kinds.random() < 0.02
        running = np.round(_busy(n, h, rng) * 8)
        held = np.floor(h) * 64.0 if leaky else np.zeros(n)
        used = running * 700.0 + held
        if leaky:
            truth.kv_leaks.add(host)
        lab = (
            f'{{model_name="Qwen/Qwen2.5-VL-72B-Instruct",engine_type="unified",tp_rank="0",'
            f'pp_rank="0",instance="{host}:30000",job="sglang"}}'
        )
        reqs = np.floor(np.cumsum(running * case.scrape_s / 4))
        if case.rules:
            idle = running == 0
            ft, fv = _hourly_floor(t[idle], used[idle], end)
            kvl = f'{{instance="{host}:30000",job="sglang"}}'
            yield KV_RULE, kvl, ft, fv
            hours = end - HOUR * np.arange(int(case.days * 24))[::-1]
            yield RESETS_RULE, kvl, hours, np.zeros(len(hours))  # these servers never restart
            sl = tail
        else:
            sl = np.ones(n, dtype=bool)
        yield "sglang:num_used_tokens", lab, t[sl], used[sl]
        yield "sglang:num_running_reqs", lab, t[sl], running[sl]
        yield "sglang:num_queue_reqs", lab, t[sl], np.zeros(int(sl.sum()))
        yield "sglang:max_total_num_tokens", lab, t[sl], np.full(int(sl.sum()), 1_200_000.0)
        yield "sglang:num_requests_total", lab, t[sl], reqs[sl]
    TRUTH[case.name] = truth


TRUTH: dict[str, Truth] = {}


def write_openmetrics(case: Case, end: float, path: Path) -> int:
    count = 0
    by_name: dict[str, Path] = {}
    handles = {}
    tmp = path.parent / "parts"
    tmp.mkdir(exist_ok=True)
    for name, lab, t, v in series(case, end):
        if name not in handles:
            by_name[name] = tmp / f"{len(by_name)}.om"
            handles[name] = by_name[name].open("w")
        ts = [f"{x:.0f}" for x in t.tolist()]
        handles[name].write(
            "".join(f"{name}{lab} {y:.17g} {s}\n" for y, s in zip(v.tolist(), ts, strict=True))
        )
        count += len(t)
    for fh in handles.values():
        fh.close()
    with path.open("w") as out:
        for name, part in by_name.items():
            out.write(f"# TYPE {name} gauge\n")
            with part.open() as fh:
                shutil.copyfileobj(fh, out, 1 << 20)
            part.unlink()
        out.write("# EOF\n")
    tmp.rmdir()
    return count


def _labels_json(name: str, lab: str) -> dict[str, str]:
    out = {"__name__": name}
    for item in lab.strip("{}").split('",'):
        k, v = item.split('="', 1)
        out[k] = v.rstrip('"')
    return out


def import_vm(case: Case, end: float, url: str) -> int:
    count, buf, size = 0, [], 0
    for name, lab, t, v in series(case, end):
        line = json.dumps(
            {
                "metric": _labels_json(name, lab),
                "values": v.tolist(),
                "timestamps": (t * 1000).astype(np.int64).tolist(),
            }
        )
        buf.append(line + "\n")
        size += len(line)
        count += len(t)
        if size > 16_000_000:
            requests.post(
                url + "/api/v1/import", data="".join(buf).encode(), timeout=600
            ).raise_for_status()
            buf, size = [], 0
    if buf:
        requests.post(
            url + "/api/v1/import", data="".join(buf).encode(), timeout=600
        ).raise_for_status()
    requests.get(url + "/internal/force_flush", timeout=600).raise_for_status()
    return count


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str, path: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"the database exited {proc.returncode}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url + path, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    sys.exit("the database did not become ready")


@contextlib.contextmanager
def engine(kind: str, case: Case, end: float, work: Path) -> Iterator[str]:
    port = _port()
    url = f"http://127.0.0.1:{port}"
    stamp = work / f"{kind}-{case.name}.end"
    if kind == "prometheus":
        data = work / f"prom-{case.name}"
        if not (data.exists() and stamp.exists() and float(stamp.read_text()) == end):
            shutil.rmtree(data, ignore_errors=True)
            om = work / f"{case.name}.om"
            t0 = time.perf_counter()
            n = write_openmetrics(case, end, om)
            t1 = time.perf_counter()
            subprocess.run(
                [
                    "promtool",
                    "tsdb",
                    "create-blocks-from",
                    "openmetrics",
                    "--max-block-duration=2400h",
                    "-q",
                    str(om),
                    str(data),
                ],
                check=True,
            )
            om.unlink()
            print(
                f"  {kind}: {n:,} samples written in {t1 - t0:.0f} s, backfilled in {time.perf_counter() - t1:.0f} s",
                flush=True,
            )
            stamp.write_text(str(end))
        (work / "p.yml").write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={work / 'p.yml'}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=3650d",
                "--query.max-samples=500000000",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _ready(url, "/-/ready", proc)
    else:
        data = work / f"vm-{case.name}"
        fresh = not (data.exists() and stamp.exists() and float(stamp.read_text()) == end)
        if fresh:
            shutil.rmtree(data, ignore_errors=True)
        proc = subprocess.Popen(
            [
                "victoria-metrics"
                if shutil.which("victoria-metrics")
                else "/usr/bin/victoria-metrics",
                f"-storageDataPath={data}",
                f"-httpListenAddr=127.0.0.1:{port}",
                "-retentionPeriod=100y",
                "-search.disableCache",
                "-search.latencyOffset=0s",
                "-loggerLevel=ERROR",
                "-search.maxUniqueTimeseries=1000000",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _ready(url, "/health", proc)
        if fresh:
            t0 = time.perf_counter()
            n = import_vm(case, end, url)
            print(
                f"  {kind}: {n:,} samples imported in {time.perf_counter() - t0:.0f} s", flush=True
            )
            stamp.write_text(str(end))
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def _cli(url: str, case: Case, end: float, strategy: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vramdoctor",
            "fleet",
            "--prometheus",
            url,
            "--since",
            f"{case.days:g}d",
            "--until",
            f"{end:.0f}",
            "--json",
            "--strategy",
            strategy,
            "--query-timeout",
            "600s",
            "--max-candidates",
            "20000",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        cwd=ROOT,
    )
    took = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        sys.exit(f"fleet failed: {done.stderr[-500:]}")
    return took, json.loads(done.stdout)


def bench(case: Case, kinds: list[str], work: Path, repeat: int) -> None:
    stamp = work / f"{case.name}.end-time"
    # a cached history keeps its own end (its data is not moved in time)
    end = float(stamp.read_text()) if stamp.exists() else (time.time() // HOUR) * HOUR - HOUR
    stamp.write_text(str(end))
    if case.name not in TRUTH:  # the scenario's truth (generated again: nothing is kept)
        for _ in series(case, end):
            pass
    truth = TRUTH[case.name]
    print(
        f"\n{case.gpus:,} GPUs x {case.days:g} days ({'recording rules' if case.rules else 'raw samples'}; {len(truth.leaks)} GPUs and {len(truth.kv_leaks)} KV pools leak)"
    )
    print(
        f"{'engine':<16} {'strategy':<8} {'run s':>7} {'cli s':>7} {'queries':>8} {'points':>12} {'MiB':>7} {'cand.':>6} {'rows':>6} {'leaks':>6} {'found':>6} {'false':>6}"
    )
    for kind in kinds:
        with engine(kind, case, end, work) as url:
            for strategy in ("screen", "pull"):
                best = math.inf
                res = None
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    got = run_fleet(
                        url,
                        since_s=case.days * 86400,
                        end=end,
                        strategy=strategy,
                        timeout_s=600,
                        max_candidates=20000,
                    )
                    took = time.perf_counter() - t0
                    if took < best:
                        best, res = took, got
                assert res is not None
                cli_s, _doc = _cli(url, case, end, strategy)
                leaks = {r.key for r in res.leaks if r.layer == "device"}
                kv = {r.host for r in res.leaks if r.layer == "kv"}
                found = len(leaks & truth.leaks) + len(kv & truth.kv_leaks)
                false = len(leaks - truth.leaks) + len(kv - truth.kv_leaks)
                points = sum(q["points"] for q in res.queries)
                mib = sum(q["bytes"] for q in res.queries) / 2**20
                print(
                    f"{kind:<16} {strategy:<8} {best:>7.2f} {cli_s:>7.2f} {len(res.queries):>8} {points:>12,} {mib:>7.1f} "
                    f"{int(res.seconds.get('candidates', 0)):>6} {len(res.rows):>6} {len(res.leaks):>6} "
                    f"{found:>3}/{len(truth.leaks) + len(truth.kv_leaks):<2} {false:>6}",
                    flush=True,
                )
                missed = sorted(truth.leaks - leaks) + sorted(truth.kv_leaks - kv)
                if missed:
                    # which planted leaks the run did not call LEAK, and what it said of each
                    said = {r.key: r for r in res.rows} | {
                        r.host: r for r in res.rows if r.layer == "kv"
                    }
                    for key in missed[:10]:
                        row = said.get(key)
                        what = f"{row.verdict} ({row.reason})" if row is not None else "no row"
                        print(f"    missed {key}: {what}", flush=True)


def startup() -> None:
    """What importing `vramdoctor fleet`'s modules costs before its first query: wall time and
    CPU time (user + system, which other load on the machine disturbs less), median of 5
    fresh interpreters each, against a bare interpreter."""

    def cost(code: str) -> tuple[float, float]:
        walls, cpus = [], []
        for _ in range(5):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        return sorted(walls)[2], sorted(cpus)[2]

    bare = cost("pass")
    rows = [
        (
            "fleet's modules",
            "import vramdoctor.fleet, vramdoctor.fleet.collect, vramdoctor.fleet.report, vramdoctor.sources.prometheus",
        ),
        ("the whole CLI", "import vramdoctor.cli"),
        (
            "`vramdoctor fleet`'s imports",
            "import vramdoctor.cli, vramdoctor.fleet, vramdoctor.fleet.collect, vramdoctor.fleet.report, vramdoctor.sources.prometheus",
        ),
        ("scipy.stats (on a thread, during the queries)", "import scipy.stats"),
    ]
    print(
        f"start-up, median of 5 (wall s / CPU s), over a bare interpreter ({bare[0]:.3f} / {bare[1]:.3f}):"
    )
    for what, code in rows:
        wall, cpu = cost(code)
        print(f"  + {what}: {wall - bare[0]:.3f} / {cpu - bare[1]:.3f}")
    mods = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, vramdoctor.fleet, vramdoctor.fleet.collect, vramdoctor.fleet.report, vramdoctor.sources.prometheus; print('scipy' in sys.modules, 'scipy.stats' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.split()
    print(f"  scipy imported by fleet's modules: {mods[0]}; scipy.stats: {mods[1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=[*CASES, "all"], default="all")
    ap.add_argument("--engine", choices=["prometheus", "victoriametrics", "both"], default="both")
    ap.add_argument("--cache", type=Path, help="keep the generated databases here between runs")
    ap.add_argument(
        "--repeat", type=int, default=1, help="run each row this many times (best shown)"
    )
    ap.add_argument("--startup", action="store_true", help="only the import cost")
    args = ap.parse_args()
    print(f"cpu cores: {os.cpu_count()}; load average {os.getloadavg()[0]:.1f}")
    startup()
    if args.startup:
        return
    kinds = ["prometheus", "victoriametrics"] if args.engine == "both" else [args.engine]
    for k in kinds:
        if k == "prometheus" and not (shutil.which("prometheus") and shutil.which("promtool")):
            sys.exit("needs prometheus and promtool (apt-get install prometheus)")
    work = args.cache or Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for name in [*CASES] if args.case == "all" else [args.case]:
            bench(CASES[name], kinds, work, args.repeat)
    finally:
        if args.cache is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
