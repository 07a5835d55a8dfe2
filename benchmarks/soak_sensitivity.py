"""How small a leak does `vramdoctor soak` call LEAK, without calling caching a leak?

Runs the real thing: the reference server (examples/reference_server) as a subprocess, and
`vramdoctor soak --json` against it, side by side in one run:

- a ladder of leak sizes per request (leaking mode), largest first, each against a fresh server;
  the smallest size called LEAK (with every larger one called LEAK too) is the sensitivity;
- N caching runs (plain mode, fresh server each): every LEAK verdict there is a false alarm;
- the wall time of each soak, which is the time to a verdict at these settings.

CPU (default): the leak and the cache are host RAM; the RSS series carries the verdict.
GPU (--gpu): the server keeps --leak-kib KiB on the GPU per request (--leak-kind bytes) next to
the real fast image processor on CUDA; NVML per process carries the verdict.

--layer kv: the KV pool layer. The reference server in kv-leaking mode (SGLang's metric names)
never returns `--kv-leak-tokens` of each request's KV tokens to a `--kv-pool-tokens` pool; a
ladder of tokens per request (largest first) finds the smallest leak in pages per request
that the KV layer calls LEAK, with its rate error; N plain runs with the same metrics must
never give a KV LEAK.

--layer host-arena: host RAM against glibc malloc arenas. N runs of the reference server's
arena mode (a thread per connection, each thread's mallocs in its own arena, freed memory kept
there) with glibc's default arena cap; every host-layer LEAK there is a false alarm (target:
0 of 10).

--layer host-modes: the host layer against the reference server's #21 modes, each run both
with vramdoctor's agent in the server (`soak --launch`: glibc's own counters decide) and
without it (`--launch ... --no-agent`: only the outside series): N runs of `retention` (a
thread per connection decoding PNGs of varying size, glibc's defaults: allocator retention)
and N of `converging` (a tile cache with sampled admission filling towards its bound), each
with its own seed: every host LEAK there is a false alarm (target: 0 of 10 each, with and
without the agent); and `host-leak` (the retention server plus a real malloc leak of
--host-leak-kib KiB per request, at --leak-requests requests a round so that its bounded
feature cache is still filling in round 2): found (host LEAK) in --rounds rounds with the
agent, with its rate error (the issue's target: 256 KiB/request in 4 rounds; measured:
6 rounds when its cache fills first, docs/soak.md).

    python benchmarks/soak_sensitivity.py                 # CPU, 4 rounds x 50 requests
    python benchmarks/soak_sensitivity.py --gpu --idle 5  # on a GPU host
    python benchmarks/soak_sensitivity.py --layer kv --requests 30 --kv-pool-tokens 1000000
    python benchmarks/soak_sensitivity.py --layer host-arena --caching-runs 10
    python benchmarks/soak_sensitivity.py --layer host-modes --caching-runs 10 --leak-runs 5

Prints a table and one JSON line (also written to --out/sensitivity.json when --out is given).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples" / "reference_server" / "server.py"


# The checkout's package, whether or not it is installed (the GPU machine may run it in place).
ENV = {
    **os.environ,
    "NO_COLOR": "1",
    "CI": "1",
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
}
SOAK_HELP = subprocess.run(
    [sys.executable, "-m", "vramdoctor", "soak", "--help"],
    capture_output=True,
    text=True,
    env={**ENV, "COLUMNS": "200"},
).stdout


def layer(d: dict, name: str) -> dict:
    """One layer of a soak --json answer (schema vramdoctor.soak/2)."""
    return d["layers"][name]


def start_server(
    mode: str, device: str, extra: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", "--mode", mode, "--device", device, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**ENV, **(env or {})},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        proc.kill()
        raise SystemExit(
            f"reference server did not start: {line.strip()} {proc.stdout.read()[-500:]}"
        )
    return proc, m.group(1)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def server_options() -> str:
    """The reference server's --help: which modes and flags this checkout has."""
    r = subprocess.run(
        [sys.executable, str(SERVER), "--help"], capture_output=True, text=True, env=ENV
    )
    return r.stdout


def soak(
    url: str | None,
    args: argparse.Namespace,
    out: Path,
    extra: list[str] | None = None,
    *,
    requests_per_round: int | None = None,
) -> tuple[dict, float]:
    """`vramdoctor soak --json` against `url` (or, with url None, `extra` holds --launch)."""
    cmd = [
        sys.executable,
        "-m",
        "vramdoctor",
        "soak",
        *(["--url", url] if url else []),
        "--json",
        "--out",
        str(out),
        "--rounds",
        str(args.rounds),
        "--requests",
        str(requests_per_round or args.requests),
        "--concurrency",
        str(args.concurrency),
        "--idle",
        str(args.idle),
        "--interval",
        str(args.interval),
        *(extra or []),
    ]
    if "--no-adapt" in SOAK_HELP:
        cmd.append("--no-adapt")  # a fixed number of rounds: the sensitivity at this protocol
    for size in args.image_size:
        cmd += ["--image-size", size]
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    wall = time.monotonic() - start
    if r.returncode not in (0, 1):
        raise SystemExit(f"soak failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout), wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="VRAM on a CUDA GPU instead of host RSS")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--idle", type=float, default=2.0)
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--caching-runs", type=int, default=10)
    p.add_argument(
        "--sizes-kib",
        default=None,
        help="comma-separated leak sizes per request, KiB (default: 512 down to 8)",
    )
    p.add_argument("--image-size", action="append", default=None)
    p.add_argument("--out", type=Path, default=None, help="keep run files and the JSON here")
    p.add_argument(
        "--layer",
        choices=["memory", "kv", "host-arena", "host-modes"],
        default="memory",
        help="memory: VRAM (--gpu) or host RSS leaks; kv: KV pages; host-arena: malloc arenas; "
        "host-modes: retention, converging and host-leak, with and without the agent",
    )
    p.add_argument(
        "--host-leak-kib", type=float, default=256.0, help="--layer host-modes: the real leak"
    )
    p.add_argument(
        "--leak-runs", type=int, default=3, help="--layer host-modes: host-leak runs (agent)"
    )
    p.add_argument(
        "--leak-requests",
        type=int,
        default=30,
        help="--layer host-modes: requests a round of the host-leak runs (30: the server's "
        "40-entry feature cache fills over two rounds, a warm-up in front of the leak)",
    )
    p.add_argument(
        "--malloc-arena-max",
        type=int,
        default=None,
        help="--layer host-arena: MALLOC_ARENA_MAX for the server (e.g. 128 = glibc's default "
        "on a 16-core host), so arenas keep appearing for many rounds as they did there",
    )
    p.add_argument(
        "--kv-pool-tokens", type=int, default=1_000_000, help="--layer kv: pool size in tokens"
    )
    p.add_argument(
        "--kv-leak-tokens-list",
        default=None,
        help="--layer kv: comma-separated leaked tokens per request (default 64,16,8,4,2,1)",
    )
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when piped to a file
    # host-modes: soak's own default sizes (the retention server's allocations vary with them)
    default_sizes = ["448x448", "896x672"] if args.layer == "host-modes" else None
    args.image_size = args.image_size or default_sizes or ["128x128", "256x192"]
    if args.layer == "kv":
        return kv_ladder(args)
    if args.layer == "host-arena":
        return arena_runs(args)
    if args.layer == "host-modes":
        return host_modes(args)
    device = "cuda" if args.gpu else "cpu"
    sizes = [float(x) for x in (args.sizes_kib or "512,256,128,64,32,16,8").split(",")]
    work = args.out or Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-sensitivity-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    extra_leak = ["--leak-kind", "bytes"] if args.gpu else []

    rows = []
    misses = 0
    print(
        f"{'run':<22}{'verdict':<14}{'estimate MiB/req':>18}{'truth MiB/req':>15}{'error':>8}{'wall s':>8}"
    )
    for kib in sizes:
        proc, url = start_server("leaking", device, ["--leak-kib", str(kib), *extra_leak])
        try:
            d, wall = soak(url, args, work / f"leak-{kib:g}.jsonl")
            truth = (
                requests.get(url + "/reference/info", timeout=10).json()["leak_bytes_per_request"]
                / 2**20
            )
        finally:
            stop(proc)
        est = layer(d, "vram" if args.gpu else "host")["rate_mib_per_request"]
        err = None if est is None else (est - truth) / truth
        rows.append(
            {
                "leak_kib": kib,
                "verdict": d["verdict"],
                "estimate_mib": est,
                "truth_mib": truth,
                "rel_error": err,
                "wall_s": wall,
            }
        )
        print(
            f"{'leak ' + format(kib, 'g') + ' KiB/req':<22}{d['verdict']:<14}"
            f"{'-' if est is None else format(est, '.4f'):>18}{truth:>15.4f}"
            f"{'-' if err is None else format(err, '+.0%'):>8}{wall:>8.1f}"
        )
        d["verdict"] = layer(d, "vram" if args.gpu else "host")["verdict"]
        misses = misses + 1 if d["verdict"] != "LEAK" else 0
        if misses >= 2:
            break
    caching = []
    for i in range(args.caching_runs):
        proc, url = start_server("plain", device, [])
        try:
            d, wall = soak(url, args, work / f"caching-{i}.jsonl")
        finally:
            stop(proc)
        caching.append({"verdict": d["verdict"], "wall_s": wall})
        print(
            f"{'caching run ' + str(i + 1):<22}{d['verdict']:<14}{'-':>18}{'-':>15}{'-':>8}{wall:>8.1f}"
        )

    smallest = None
    for r in rows:  # largest first: the sensitivity is the end of the unbroken LEAK run
        if r["verdict"] != "LEAK":
            break
        smallest = r
    false_leaks = sum(1 for c in caching if c["verdict"] == "LEAK")
    summary = {
        "benchmark": "soak_sensitivity",
        "target": "vram" if args.gpu else "host_rss",
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "idle_s": args.idle,
        "concurrency": args.concurrency,
        "smallest_leak_called_kib": None if smallest is None else smallest["leak_kib"],
        "smallest_leak_called_mib_per_request": None if smallest is None else smallest["truth_mib"],
        "rate_error_at_smallest": None if smallest is None else smallest["rel_error"],
        "false_leaks": false_leaks,
        "caching_runs": len(caching),
        "caching_verdicts": {
            v: sum(1 for c in caching if c["verdict"] == v)
            for v in sorted({c["verdict"] for c in caching})
        },
        "time_to_verdict_s_median": sorted(r["wall_s"] for r in rows + caching)[
            len(rows + caching) // 2
        ]
        if rows or caching
        else None,
        "ladder": rows,
    }
    print()
    print(
        f"smallest leak called LEAK: {summary['smallest_leak_called_kib']} KiB/request "
        f"({args.rounds} rounds x {args.requests} requests); false LEAK in caching runs: "
        f"{false_leaks}/{len(caching)}; time to a verdict ~{summary['time_to_verdict_s_median']:.0f} s"
    )
    line = json.dumps(summary)
    print(line)
    if args.out:
        (args.out / "sensitivity.json").write_text(line + "\n")
    return 0 if false_leaks == 0 else 1


def _work(args: argparse.Namespace, name: str) -> Path:
    work = args.out or Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-{name}-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    return work


def _finish(args: argparse.Namespace, summary: dict) -> None:
    line = json.dumps(summary)
    print(line)
    if args.out:
        (args.out / f"sensitivity-{summary['target']}.json").write_text(line + "\n")


def kv_ladder(args: argparse.Namespace) -> int:
    """Smallest KV leak (pages per request) the KV layer calls LEAK; plain runs never LEAK."""
    help_text = server_options()
    page = 16
    page_flag = []
    if "--kv-page-size" in help_text:
        page = 64
        page_flag = ["--kv-page-size", str(page)]
    pool_flag = "--kv-pool-tokens" if "--kv-pool-tokens" in help_text else "--kv-capacity"
    base = ["--metrics-flavour", "sglang", pool_flag, str(args.kv_pool_tokens), *page_flag]
    work = _work(args, "kv")
    tokens = [float(x) for x in (args.kv_leak_tokens_list or "64,16,8,4,2,1").split(",")]
    rows, misses = [], 0
    print(
        f"{'run':<24}{'KV verdict':<14}{'tokens/req':>11}{'truth':>8}{'pages/req':>11}{'error':>8}{'wall s':>8}"
    )
    for tok in tokens:
        proc, url = start_server("kv-leaking", "cpu", [*base, "--kv-leak-tokens", str(int(tok))])
        try:
            d, wall = soak(url, args, work / f"kv-{tok:g}.jsonl", ["--text-only"])
        finally:
            stop(proc)
        kv = layer(d, "kv")
        pool = next((p for p in kv["pools"] if p["tokens_per_request"] is not None), None)
        est = pool["tokens_per_request"] if pool else None
        err = None if est is None else (est - tok) / tok
        rows.append(
            {
                "leak_tokens": tok,
                "pages_per_request": tok / page,
                "verdict": kv["verdict"],
                "estimate_tokens": est,
                "rel_error": err,
                "wall_s": wall,
                "page_size_tokens": pool["page_size_tokens"] if pool else None,
                "page_size_assumed": pool["page_size_assumed"] if pool else None,
            }
        )
        print(
            f"{'leak ' + format(tok, 'g') + ' tokens/req':<24}{kv['verdict']:<14}"
            f"{'-' if est is None else format(est, '.2f'):>11}{tok:>8g}{tok / page:>11.3g}"
            f"{'-' if err is None else format(err, '+.1%'):>8}{wall:>8.1f}"
        )
        misses = misses + 1 if kv["verdict"] != "LEAK" else 0
        if misses >= 2:
            break
    plain = []
    for i in range(args.caching_runs):
        proc, url = start_server("plain", "cpu", base)
        try:
            d, wall = soak(url, args, work / f"kv-plain-{i}.jsonl", ["--text-only"])
        finally:
            stop(proc)
        plain.append({"verdict": layer(d, "kv")["verdict"], "wall_s": wall})
        print(
            f"{'plain run ' + str(i + 1):<24}{plain[-1]['verdict']:<14}{'-':>11}{'-':>8}{'-':>11}{'-':>8}{wall:>8.1f}"
        )
    smallest = None
    for r in rows:
        if r["verdict"] != "LEAK":
            break
        smallest = r
    false = sum(1 for c in plain if c["verdict"] == "LEAK")
    print(
        f"\nsmallest KV leak called LEAK: "
        f"{'-' if smallest is None else format(smallest['pages_per_request'], 'g')} pages/request "
        f"({'-' if smallest is None else format(smallest['leak_tokens'], 'g')} tokens, page {page} tokens) "
        f"in a {args.kv_pool_tokens:,}-token pool, {args.rounds} rounds x {args.requests} requests; "
        f"false KV LEAK in plain runs: {false}/{len(plain)}"
    )
    _finish(
        args,
        {
            "benchmark": "soak_sensitivity",
            "target": "kv",
            "rounds": args.rounds,
            "requests_per_round": args.requests,
            "pool_tokens": args.kv_pool_tokens,
            "page_size_tokens": page,
            "ladder": rows,
            "plain_runs": plain,
            "smallest_pages_per_request": None
            if smallest is None
            else smallest["pages_per_request"],
            "rate_error_at_smallest": None if smallest is None else smallest["rel_error"],
            "false_leaks": false,
        },
    )
    return 0 if false == 0 and smallest is not None else 1


def arena_runs(args: argparse.Namespace) -> int:
    """False host-RAM LEAK rate on glibc arena growth (the reference server's arena mode)."""
    help_text = server_options()
    if "arena" not in help_text:
        print("skipped: this reference server has no --mode arena (examples/reference_server)")
        return 0
    work = _work(args, "arena")
    runs = []
    print(
        f"{'run':<16}{'host verdict':<14}{'explanation':<18}{'RSS growth MiB':>15}{'arenas':>10}{'wall s':>8}"
    )
    for i in range(args.caching_runs):
        env = {"MALLOC_ARENA_MAX": str(args.malloc_arena_max)} if args.malloc_arena_max else None
        proc, url = start_server("arena", "cpu", [], env)
        try:
            d, wall = soak(url, args, work / f"arena-{i}.jsonl")
        finally:
            stop(proc)
        host = layer(d, "host")
        p = next((x for x in host["processes"] if x["series"] == host["main_series"]), None) or {}
        runs.append(
            {
                "verdict": host["verdict"],
                "explanation": host["explanation"],
                "rss_growth_mib": p.get("rss_growth_mib"),
                "arenas_first": p.get("arenas_first"),
                "arenas_last": p.get("arenas_last"),
                "wall_s": wall,
                "vram": layer(d, "vram")["verdict"],
            }
        )
        growth = p.get("rss_growth_mib")
        print(
            f"{'arena run ' + str(i + 1):<16}{host['verdict']:<14}{host['explanation']!s:<18}"
            f"{'-' if growth is None else format(growth, '.1f'):>15}"
            f"{str(p.get('arenas_first')) + '->' + str(p.get('arenas_last')):>10}{wall:>8.1f}"
        )
    false = sum(1 for r in runs if r["verdict"] == "LEAK")
    print(
        f"\nfalse host-RAM LEAK on malloc arena growth: {false}/{len(runs)} "
        f"({args.rounds} rounds x {args.requests} requests)"
    )
    _finish(
        args,
        {
            "benchmark": "soak_sensitivity",
            "target": "host_arena",
            "rounds": args.rounds,
            "malloc_arena_max": args.malloc_arena_max,
            "cpu_count": os.cpu_count(),
            "requests_per_round": args.requests,
            "runs": runs,
            "false_leaks": false,
        },
    )
    return 0 if false == 0 else 1


def _host_row(d: dict) -> dict:
    host = layer(d, "host")
    return {
        "verdict": host["verdict"],
        "reason": host.get("reason"),
        "explanation": host.get("explanation"),
        "decided_by": host.get("decided_by"),
        "rate_mib_per_request": host.get("rate_mib_per_request"),
    }


def host_modes(args: argparse.Namespace) -> int:
    """False host LEAK on retention and converging caches (with and without the agent) and
    the rounds to find a real malloc leak behind a warming cache (with the agent)."""
    help_text = server_options()
    missing = [m for m in ("retention", "converging", "host-leak") if m not in help_text]
    if missing:
        print(f"skipped: this reference server has no --mode {', '.join(missing)}")
        return 0
    work = _work(args, "host-modes")
    print(
        f"{'run':<26}{'agent':<7}{'host verdict':<14}{'reason':<22}{'decided by':<14}"
        f"{'MiB/req':>9}{'wall s':>8}"
    )
    runs: list[dict] = []

    def one(mode: str, i: int, agent: bool, extra: list[str], requests_per_round: int) -> dict:
        launch = (
            f"{sys.executable} {SERVER} --port {free_port()} --mode {mode} --device cpu "
            + " ".join(extra)
        )
        flags = ["--launch", launch, "--startup-timeout", "120", "--stop-grace", "5"]
        if not agent:
            flags.append("--no-agent")
        name = f"{mode}-{i}-{'agent' if agent else 'outside'}"
        d, wall = soak(
            None, args, work / f"{name}.jsonl", flags, requests_per_round=requests_per_round
        )
        row = {"mode": mode, "run": i, "agent": agent, **_host_row(d), "wall_s": wall}
        rate = row["rate_mib_per_request"]
        print(
            f"{mode + ' ' + str(i + 1):<26}{'yes' if agent else 'no':<7}{row['verdict']:<14}"
            f"{row['reason']!s:<22}{row['decided_by']!s:<14}"
            f"{'-' if rate is None else format(rate, '.4f'):>9}{wall:>8.1f}"
        )
        runs.append(row)
        return row

    truth = args.host_leak_kib / 1024.0
    for i in range(args.leak_runs):
        one(
            "host-leak",
            i,
            True,
            ["--leak-kib", format(args.host_leak_kib, "g"), "--retention-seed", str(i)],
            args.leak_requests,
        )
    for i in range(args.caching_runs):
        for agent in (True, False):
            one("retention", i, agent, ["--retention-seed", str(i)], args.requests)
            one("converging", i, agent, ["--converge-seed", str(i)], args.requests)

    def count(mode: str, agent: bool, verdict: str) -> int:
        return sum(
            1 for r in runs if r["mode"] == mode and r["agent"] is agent and r["verdict"] == verdict
        )

    def total(mode: str, agent: bool) -> int:
        return sum(1 for r in runs if r["mode"] == mode and r["agent"] is agent)

    leaks = [r for r in runs if r["mode"] == "host-leak"]
    found = [r for r in leaks if r["verdict"] == "LEAK"]
    errors = [
        (r["rate_mib_per_request"] - truth) / truth
        for r in found
        if r["rate_mib_per_request"] is not None
    ]
    false = {
        f"{mode}_{'agent' if agent else 'outside'}": (
            f"{count(mode, agent, 'LEAK')}/{total(mode, agent)}"
        )
        for mode in ("retention", "converging")
        for agent in (True, False)
    }
    print(
        f"\nfalse host LEAK: retention {false['retention_agent']} with the agent, "
        f"{false['retention_outside']} without; converging {false['converging_agent']} with, "
        f"{false['converging_outside']} without ({args.rounds} rounds x {args.requests} requests). "
        f"host-leak {args.host_leak_kib:g} KiB/request found in {args.rounds} rounds "
        f"({args.leak_requests} requests a round) with the agent: {len(found)}/{len(leaks)}"
        + (f", rate error {min(errors):+.1%} to {max(errors):+.1%}" if errors else "")
    )
    _finish(
        args,
        {
            "benchmark": "soak_sensitivity",
            "target": "host_modes",
            "rounds": args.rounds,
            "requests_per_round": args.requests,
            "leak_requests_per_round": args.leak_requests,
            "idle_s": args.idle,
            "host_leak_kib": args.host_leak_kib,
            "false_leaks": false,
            "host_leak_found": f"{len(found)}/{len(leaks)}",
            "host_leak_rate_errors": errors,
            "runs": runs,
        },
    )
    bad = sum(count(m, a, "LEAK") for m in ("retention", "converging") for a in (True, False))
    return 0 if bad == 0 and len(found) == len(leaks) else 1


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
