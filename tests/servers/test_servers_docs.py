"""docs/sources.md lists every stable name and every server metric name the registry reads."""

from __future__ import annotations

from pathlib import Path

from vramdoctor import servers

DOC = (Path(__file__).resolve().parents[2] / "docs" / "sources.md").read_text(encoding="utf-8")


def test_every_stable_name_and_metric_name_is_in_the_docs() -> None:
    missing = [
        f"`{n}`" for k in servers.kinds() for n in k.metrics.stable_names if f"`{n}`" not in DOC
    ]
    missing += [f"`{n}`" for n in servers.metric_names() if n not in DOC]
    assert not missing, f"docs/sources.md does not list {missing}"
