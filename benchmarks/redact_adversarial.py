"""Time of `vramdoctor.redact.redact_text` on adversarial 1 MiB inputs: no shape may be quadratic.

redact_text runs on every evidence text, event text and output string (docs/diagnose.md,
Performance), so a hostile log line must not stall it. Each input is a pattern that makes a
scanner re-read the text: quotes that never close, thousands of escaped quotes in one value,
brackets that never close, shell words chained with '\\'', prose words before pairs. Each is timed
at 1/2, 1 and 2 MiB: linear time doubles with the size (a ratio near 2), quadratic quadruples it.

With --baseline DIR (a directory holding an older `vramdoctor` package, e.g. from
`git archive <commit> vramdoctor | tar -x -C DIR`), that code runs on the same inputs in the same
run, side by side.

Usage: python benchmarks/redact_adversarial.py [--baseline DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def load(root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"redact_{id(root)}", root / "vramdoctor" / "redact.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rep(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


# name -> (prefix, repeated unit, suffix)
CASES: dict[str, tuple[str, str, str]] = {
    "api_key=' never closed, repeated": ("", "api_key='", ""),
    "api_key=\"a' quotes of both kinds": ("", "api_key=\"a' ", ""),
    "one value of escaped quotes": ("api_key='", "\\'", "'"),
    "--api-key 'a'\\'' chained shell word": ("--api-key ", "'a'\\'", ""),
    "api_key=[ never closed, repeated": ("", "api_key=[", ""),
    "api_key=[' nested": ("api_key=", "['", ""),
    "token=' + 1 MiB + one closing quote": ("token='", "a", "'"),
    "lines of token='x, one quote at the end": ("", "token='x\n", "'"),
    "argv lists, '--api-key', ' repeated": ("[", "'--api-key', '", "]"),
    "quoted flags without a value, repeated": ("", "'--a', ", ""),
    "prose words (key value key value)": ("", "key value ", ""),
    "a=b=c=... one word": ("", "a=", ""),
    "one 1 MiB word": ("x ", "a", ""),
    # review 12b: curl/wget credentials and quoted secret headers (redact._redact_credentials)
    '"api-key: never closed, repeated': ("", '"api-key: a ', ""),
    '-H "x-api-key: a" headers, repeated': ("", '-H "x-api-key: a b" ', ""),
    "-u 'a: never closed, repeated": ("", "-u 'a:", ""),
    "-u a:b words, repeated": ("", "-u a:b ", ""),
    "-u + 1 MiB user name without a colon": ("-u ", "a", ""),
    "--header=Cookie:x, repeated": ("", "--header=Cookie:x ", ""),
    '"key: prose in quotes, repeated': ("", '"key: see ', ""),
    "argument dumps, repeated": (
        "",
        "args: Namespace(host=None, port=8000, api_key='correct horse battery staple', "
        "model='m', gpu_memory_utilization=0.95) ",
        "",
    ),
}


def time_one(mod: ModuleType, text: str) -> float:
    mod.forget_secrets()
    t0 = time.perf_counter()
    mod.redact_text(text)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--baseline", type=Path, help="a directory holding an older vramdoctor package")
    a = ap.parse_args()
    mods = [("now", load(ROOT))]
    if a.baseline:
        mods.append(("baseline", load(a.baseline)))
    sizes = (MIB // 2, MIB, 2 * MIB)
    print(f"{'input':42s} " + "  ".join(f"{n:>8s} 0.5/1/2 MiB (s)  ratio" for n, _ in mods))
    worst = 0.0
    for name, (pre, unit, post) in CASES.items():
        cells = []
        for label, mod in mods:
            ts = [time_one(mod, pre + rep(unit, n) + post) for n in sizes]
            ratio = ts[2] / ts[1] if ts[1] > 0 else 0.0
            if label == "now":
                worst = max(worst, ts[1])
            cells.append(f"{ts[0]:6.3f} {ts[1]:6.3f} {ts[2]:6.3f}        {ratio:4.1f}")
        print(f"{name:42s} " + "  ".join(cells))
    print(f"slowest 1 MiB input now: {worst:.3f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
