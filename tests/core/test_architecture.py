"""The floor plan holds: each room of the package imports only the rooms docs/architecture.md
allows (every import counted, also those inside functions), so nothing imports upward.

The table here and the one in docs/architecture.md are one rule: the test reads the doc's table.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vramdoctor"
DOC = ROOT / "docs" / "architecture.md"
# The shared core: modules at the package's top level.
CORE = {"units", "errors", "samples", "record", "verdicts", "redact", "_optional", "_lazy"}


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) < 2:
        return "core"
    if parts[1] == "__main__":
        return "cli"
    return "core" if parts[1] in CORE or parts[1] == "_version" else parts[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, dict[str, list[str]]]:
    """room -> {room it imports: [module that does, ...]} over every .py file of the package
    (the agent's stdlib-only pythonpath/ included: it must import nothing of vramdoctor)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        src = _room(module)
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    targets = [".".join(base + ([node.module] if node.module else []))]
                elif node.module:
                    targets = [node.module]
            for target in targets:
                if target == "vramdoctor" or target.startswith("vramdoctor."):
                    dst = _room(target) if "." in target else "core"
                    if dst != src:
                        graph[src][dst].append(module)
    return graph


def allowed_from_doc() -> dict[str, set[str]]:
    """The doc's table: | `room/` | holds | may import | (the last cell: rooms in backticks)."""
    allowed: dict[str, set[str]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\|\s*`([a-z_]+)/?`\s*\|[^|]*\|([^|]*)\|\s*$", line)
        if m:
            allowed[m.group(1)] = set(re.findall(r"`([a-z_]+)/?`", m.group(2)))
    return allowed


def test_the_doc_lists_every_room_of_the_package() -> None:
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} | {"core"}
    assert rooms - set(allowed_from_doc()) == set(), "a room missing from docs/architecture.md"
    assert set(allowed_from_doc()) - rooms == set(), "docs/architecture.md lists a room gone"


def test_every_import_between_rooms_is_one_the_floor_plan_allows() -> None:
    allowed = allowed_from_doc()
    wrong = [
        f"{src} imports {dst} (in {', '.join(sorted(set(mods))[:3])})"
        for src, dsts in import_graph().items()
        for dst, mods in dsts.items()
        if src != "cli" and dst not in allowed.get(src, set())
    ]
    assert wrong == []


def test_the_core_and_the_agent_import_no_command() -> None:
    graph = import_graph()
    assert set(graph.get("core", {})) == set()
    assert set(graph.get("agent", {})) <= {"core"}
    agent_files = (PACKAGE / "agent" / "pythonpath").rglob("*.py")
    for path in agent_files:  # runs inside the user's server: the standard library only
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(from|import) vramdoctor\b", text, re.M), path


# A function longer than this is split into named steps (docs/architecture.md). The one exception
# is the diagnose reader's per-candidate loop: a helper call per line costs more than the split
# is worth on a 256 MiB log (diagnose's throughput targets).
MAX_FUNCTION_LINES = 80
LONG_ON_PURPOSE = {"vramdoctor.diagnose.reader._emit"}


def test_no_function_is_longer_than_the_house_allows() -> None:
    long: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                name = f"{_module_name(path)}.{node.name}"
                if lines > MAX_FUNCTION_LINES and name not in LONG_ON_PURPOSE:
                    long.append(f"{name}: {lines} lines")
    assert not long, "split into named steps: " + "; ".join(long)
