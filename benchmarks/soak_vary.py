"""How fast does `soak --vary` name the feature that leaks, and how often does it name one wrongly?

Runs the real thing side by side in one run: the reference server (examples/reference_server)
as a subprocess per soak, `vramdoctor soak --vary ... --json` against it (CPU, host RAM):

1. sensitivity: for each of six features, a server that leaks `--leak-kib` KiB (1 MiB) only on
   requests with that feature (`--mode leak-on-FEATURE`); --vary varies all six. Recorded: the
   rounds the soak took until it stopped (warm-up + blocks, adaptive), whether it named that
   feature and only it, and its rate against the server's own count. Rounds per feature = rounds
   / 6 (goal: no more than 3).
2. false naming: `--runs` servers that leak 1 MiB on EVERY request alike (`leak-on-every`), the
   same six features varied: a run that names a single feature is a false alarm (goal 0 of 10).
3. converging: `--runs` servers whose tile cache fills towards a bound (`converging`, sampled
   admission): a LEAK there is a false alarm.
4. --cycle: servers whose sleep/wake keeps `--cycle-mib` per cycle (`sleep-leak`, vLLM's
   endpoints): the rounds until the operation is named and the rate error; healthy sleep/wake
   (`stable --enable-sleep-mode`): a LEAK is a false alarm.

    python benchmarks/soak_vary.py                       # all parts, 10 runs each
    python benchmarks/soak_vary.py --parts 1,2 --runs 10
    python benchmarks/soak_vary.py --requests 10 --idle 1 --out /tmp/vary

Prints a table per part and one JSON line (also --out/soak_vary.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples" / "reference_server" / "server.py"
ENV = {
    **os.environ,
    "NO_COLOR": "1",
    "CI": "1",
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    "VLLM_SERVER_DEV_MODE": "1",
}
SIX = ("images", "image-size", "multi-image", "stream", "abort", "n")
MODE_OF = {
    "images": "leak-on-images",
    "image-size": "leak-on-large-images",
    "multi-image": "leak-on-multi-image",
    "stream": "leak-on-stream",
    "abort": "leak-on-abort",
    "n": "leak-on-n",
}


class Server:
    def __init__(self, mode: str, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--port", "0", "--mode", mode, "--device", "cpu", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=ENV,
        )
        assert self.proc.stdout is not None
        m = re.search(r"listening on (http://\S+) ", self.proc.stdout.readline())
        if not m:
            self.proc.kill()
            raise SystemExit(f"reference server {mode} did not start")
        self.url = m.group(1)

    def info(self) -> dict:
        return requests.get(self.url + "/reference/info", timeout=30).json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def soak(url: str, out: Path, args: argparse.Namespace, *extra: str) -> tuple[dict, float]:
    cmd = [
        sys.executable, "-m", "vramdoctor", "soak", "--url", url,
        "--requests", str(args.requests), "--concurrency", "4", "--idle", str(args.idle),
        "--interval", "0.2", "--out", str(out), "--json", *extra,
    ]  # fmt: skip
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=1800)
    took = time.monotonic() - t0
    try:
        return json.loads(r.stdout), took
    except json.JSONDecodeError:
        raise SystemExit(f"soak failed (exit {r.returncode}): {r.stderr[-400:]}") from None


def part_sensitivity(args: argparse.Namespace, tmp: Path) -> list[dict]:
    rows = []
    for feature in SIX:
        srv = Server(MODE_OF[feature], "--leak-kib", str(args.leak_kib))
        try:
            d, took = soak(srv.url, tmp / f"sens-{feature}.jsonl", args, "--vary", ",".join(SIX))
            info = srv.info()
        finally:
            srv.stop()
        host = d["vary"]["layers"]["host"]
        truth = info["kept_bytes"] / max(1, info["feature_requests"]) / 2**20
        got = host["features"][feature]["value"]
        rows.append(
            {
                "feature": feature,
                "named": host["culprits"],
                "right": host["culprits"] == [feature],
                "rounds": len(d["rounds"]),
                "rounds_per_feature": len(d["rounds"]) / len(SIX),
                "rate_mib": got,
                "truth_mib": truth,
                "rate_error": (got - truth) / truth if truth else None,
                "seconds": took,
            }
        )
        print(
            f"  {feature:<12} named {','.join(host['culprits']) or '-':<12} rounds {len(d['rounds']):>3} "
            f"({len(d['rounds']) / len(SIX):.2f}/feature)  rate {got:.3f} MiB vs {truth:.3f}  {took:.0f} s",
            flush=True,
        )
    return rows


def part_runs(
    args: argparse.Namespace, tmp: Path, name: str, mode: str, extra: tuple[str, ...], vary: str
) -> list[dict]:
    rows = []
    for k in range(args.runs):
        srv = Server(mode, *extra)
        try:
            d, took = soak(
                srv.url, tmp / f"{name}-{k}.jsonl", args, "--vary", vary, "--seed", str(k)
            )
        finally:
            srv.stop()
        host = d["vary"]["layers"]["host"]
        rows.append(
            {
                "run": k,
                "verdict": host["verdict"],
                "named": host["culprits"],
                "rounds": len(d["rounds"]),
                "control": (host.get("overall") or {}).get("value"),
                "seconds": took,
            }
        )
        print(
            f"  run {k}: {host['verdict']:<12} named {','.join(host['culprits']) or '-':<14} rounds {len(d['rounds'])}  {took:.0f} s",
            flush=True,
        )
    return rows


def part_cycle(args: argparse.Namespace, tmp: Path) -> dict:
    out: dict = {"leak": [], "healthy": []}
    for k in range(max(1, args.runs // 2)):
        for kind, mode in (("leak", "sleep-leak"), ("healthy", "stable")):
            srv = Server(
                mode,
                "--metrics-flavour",
                "vllm",
                "--enable-sleep-mode",
                "--cycle-leak-mib",
                str(args.cycle_mib),
            )
            try:
                d, took = soak(
                    srv.url,
                    tmp / f"cycle-{kind}-{k}.jsonl",
                    args,
                    "--cycle",
                    "sleep",
                    "--text-only",
                    "--seed",
                    str(k),
                )
                info = srv.info()
            finally:
                srv.stop()
            c = d["cycle"]
            anon = c["layers"].get("host_anon", {})
            truth = (
                info["lifecycle"]["leaked_host_bytes"]
                / max(1, info["lifecycle"]["cycles"]["sleep"])
                / 2**20
            )
            out[kind].append(
                {
                    "run": k,
                    "verdict": anon.get("verdict"),
                    "residue_mib": (anon.get("residue") or {}).get("value"),
                    "truth_mib": truth,
                    "rounds": len(d["rounds"]),
                    "cycles": c["cycles"],
                    "seconds": took,
                }
            )
            print(
                f"  {kind:<8} run {k}: {anon.get('verdict')}  residue {(anon.get('residue') or {}).get('value', 0):.2f} MiB/cycle vs {truth:.2f}  rounds {len(d['rounds'])}  {took:.0f} s",
                flush=True,
            )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--parts", default="1,2,3,4")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--requests", type=int, default=10)
    p.add_argument("--idle", type=float, default=1.0)
    p.add_argument("--leak-kib", type=int, default=1024)
    p.add_argument("--cycle-mib", type=float, default=4.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    parts = {int(x) for x in args.parts.split(",") if x.strip()}
    tmp = Path(tempfile.mkdtemp(prefix="soak-vary-"))
    result: dict = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    }
    t0 = time.monotonic()
    if 1 in parts:
        print(
            f"1. sensitivity: a {args.leak_kib} KiB/request leak of one feature among six ({', '.join(SIX)})"
        )
        rows = part_sensitivity(args, tmp)
        result["sensitivity"] = {
            "rows": rows,
            "all_right": all(r["right"] for r in rows),
            "max_rounds_per_feature": max(r["rounds_per_feature"] for r in rows),
            "max_abs_rate_error": max(abs(r["rate_error"] or 0) for r in rows),
        }
    if 2 in parts:
        print(
            f"2. false naming: {args.runs} servers leaking {args.leak_kib} KiB on every request alike"
        )
        rows = part_runs(
            args, tmp, "every", "leak-on-every", ("--leak-kib", str(args.leak_kib)), ",".join(SIX)
        )
        result["every_alike"] = {
            "rows": rows,
            "named_a_feature": sum(1 for r in rows if r["named"]),
            "called_every_alike": sum(1 for r in rows if r["verdict"] == "LEAK" and not r["named"]),
        }
    if 3 in parts:
        print(f"3. converging: {args.runs} tile caches filling towards a bound")
        rows = part_runs(
            args,
            tmp,
            "conv",
            "converging",
            ("--admit-probability", "0.2", "--converge-entry-kib", "256"),
            "image-size,stream",
        )
        result["converging"] = {
            "rows": rows,
            "false_leak": sum(1 for r in rows if r["verdict"] == "LEAK"),
        }
    if 4 in parts:
        print(
            f"4. --cycle sleep: {args.cycle_mib} MiB kept per sleep/wake against healthy sleep/wake"
        )
        c = part_cycle(args, tmp)
        result["cycle"] = {
            **c,
            "named": sum(1 for r in c["leak"] if r["verdict"] == "LEAK"),
            "false_leak": sum(1 for r in c["healthy"] if r["verdict"] == "LEAK"),
        }
    result["seconds"] = time.monotonic() - t0
    line = json.dumps(result)
    print(line)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak_vary.json").write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
