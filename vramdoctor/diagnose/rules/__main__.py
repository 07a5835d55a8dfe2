"""`python -m vramdoctor.diagnose.rules --markdown`: print the rules table for docs/rules.md."""

from __future__ import annotations

import sys

from vramdoctor.diagnose.rules import all_rules, markdown


def main(argv: list[str]) -> int:
    if "--markdown" in argv:
        sys.stdout.write(markdown())
        return 0
    for r in all_rules():
        print(f"{r.id:40} {r.severity:8} {r.title}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
