"""`ab-test --server CMD`: the mitigations A/B-tested on the user's own server.

    from vramdoctor.abtest.server import ServerExperiment, build_variants, report_run
    variants, kind = build_variants(argv, ["arena2=MALLOC_ARENA_MAX=2"], ["expandable-segments"])
    ServerExperiment(argv, variants, traffic=SoakConfig(rounds=4), out=Path("runs/ab"), kind=kind).run()

variants.py (the launch and its changes: `--variant NAME=CHANGE`, `--preset NAME`) ->
experiment.py (one `SoakSession` with `launch` per variant, the same seeded traffic, baseline
first and last, leftovers checked between variants, one record per variant flushed) ->
analysis.py (pure: the table, what each variant stops, makes worse and costs, the
recommendation, drift) -> report.py (terminal and `--json`; `vramdoctor report` offline).
"""

from __future__ import annotations

from vramdoctor.abtest.server.analysis import SCHEMA, server_abtest
from vramdoctor.abtest.server.experiment import ServerExperiment, VariantResult
from vramdoctor.abtest.server.report import render, report_run, result_of
from vramdoctor.abtest.server.variants import (
    Change,
    ServerVariant,
    build_variants,
    kind_of_command,
    parse_variant,
    presets_for,
)

__all__ = [
    "SCHEMA",
    "Change",
    "ServerExperiment",
    "ServerVariant",
    "VariantResult",
    "build_variants",
    "kind_of_command",
    "parse_variant",
    "presets_for",
    "render",
    "report_run",
    "result_of",
    "server_abtest",
]
