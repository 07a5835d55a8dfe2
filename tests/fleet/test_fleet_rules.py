"""The shipped monitoring examples: rules Prometheus accepts, and only metric names that exist.

examples/monitoring/vramdoctor-fleet.rules.yml is generated from fleet's families and the
server registry (`vramdoctor.fleet.promql.rules_yaml`): the test fails when it drifts, and
`python tests/fleet/test_fleet_rules.py --write` regenerates it. The recording rules are then
backfilled into a real Prometheus (`promtool tsdb create-blocks-from rules`) and a real
VictoriaMetrics (`vmalert -replay`), and fleet must read them and give every row the verdict
it gives from the raw samples.

`promtool check rules` validates the rules file; then every metric name in the rules and in
the Grafana dashboard must be one that `vramdoctor watch` exports (its EXPORTED_METRICS, as
scraped: counters with `_total`) or one of the named exporters publishes (what fleet reads),
or a recording rule the file itself defines. A typo in a metric name makes an alert that
never fires; this catches it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vramdoctor.fleet import metric_names_used
from vramdoctor.fleet.promql import rules_yaml
from vramdoctor.watch import EXPORTED_METRICS

EXAMPLES = Path(__file__).parents[2] / "examples" / "monitoring"
RULES = EXAMPLES / "vramdoctor.rules.yml"
FLEET_RULES = EXAMPLES / "vramdoctor-fleet.rules.yml"
DASHBOARD = EXAMPLES / "grafana-dashboard.json"

# PromQL words that look like names: functions, aggregations, keywords, durations' units.
_PROMQL = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "topk",
    "bottomk",
    "quantile",
    "stddev",
    "stdvar",
    "group",
    "rate",
    "irate",
    "increase",
    "deriv",
    "predict_linear",
    "delta",
    "idelta",
    "min_over_time",
    "max_over_time",
    "avg_over_time",
    "last_over_time",
    "sum_over_time",
    "count_over_time",
    "stddev_over_time",
    "resets",
    "changes",
    "timestamp",
    "label_values",
    "abs",
    "clamp_min",
    "clamp_max",
    "humanizeDuration",
    "printf",
    "vector",
    "scalar",
    "time",
    "absent",
    "label_replace",
    "sort_desc",
}
_NAME = re.compile(
    r"(?<![\w:\"'.$])([A-Za-z_:][A-Za-z0-9_:]*)\s*(?=[{\[(]|\s*(?:[<>=!*/+-]|and\b|or\b|unless\b|$|\)))"
)


def names_in(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside label matchers and strings."""
    expr = re.sub(r"\{[^}]*\}", "{}", expr)  # drop label matchers and their values
    expr = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", " ", expr)  # and grouping labels
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)
    found = set()
    for m in _NAME.finditer(expr):
        word = m.group(1)
        if word in _PROMQL or re.fullmatch(r"\d+[smhdwy]?", word):
            continue
        found.add(word)
    return found


def _known() -> set[str]:
    exported = set(EXPORTED_METRICS)
    return exported | metric_names_used()


def test_promtool_accepts_the_shipped_rules() -> None:
    if shutil.which("promtool") is None:
        pytest.skip("needs promtool (apt-get install prometheus; CI installs it)")
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 12 rules found" in done.stdout
    n = len(yaml.safe_load(FLEET_RULES.read_text())["groups"][0]["rules"])
    done = subprocess.run(
        ["promtool", "check", "rules", str(FLEET_RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {n} rules found" in done.stdout


def test_the_fleet_rules_file_is_what_the_registry_makes() -> None:
    assert FLEET_RULES.read_text() == rules_yaml(), (
        "examples/monitoring/vramdoctor-fleet.rules.yml is stale: "
        "python tests/fleet/test_fleet_rules.py --write"
    )
    doc = yaml.safe_load(FLEET_RULES.read_text())
    exprs = [r["expr"] for r in doc["groups"][0]["rules"]]
    used = set().union(*(names_in(e) for e in exprs))
    used |= {n for e in exprs for n in re.findall(r'__name__="([^"]+)"', e)}
    assert {"DCGM_FI_DEV_FB_USED", "sglang:num_used_tokens", "vllm:kv_cache_usage_perc"} <= used
    assert used <= _known(), sorted(used - _known())


def test_every_metric_in_the_rules_is_exported_by_watch_or_a_named_exporter() -> None:
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    for rec in recorded:
        level, metric, operation = rec.split(":")
        assert level and metric and operation  # level:metric:operation
    used = set().union(*(names_in(r["expr"]) for r in rules))
    assert used, "no metric names parsed"
    unknown = used - recorded - _known()
    assert not unknown, f"rules use metrics nobody exports: {sorted(unknown)}"
    assert {
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "vramdoctor_process_memory_verdict",
    } <= used
    alerts = [r for r in rules if "alert" in r]
    filling = [r for r in alerts if r["alert"].startswith("GpuMemoryFillingUp")]
    assert filling and all(
        "predict_linear(" in r["expr"] and "[6h]" in r["expr"] and r["for"] == "1h" for r in filling
    )


def test_every_metric_in_the_dashboard_exists() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dash["templating"]["list"] if v.get("type") == "query"]
    recorded = {
        r["record"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    # label_values(METRIC, LABEL): only METRIC is a metric name
    used = set().union(
        *(names_in(e.split(",")[0] if e.startswith("label_values(") else e) for e in exprs)
    )
    assert {
        "vramdoctor_process_memory_bytes",
        "DCGM_FI_DEV_FB_USED",
        "process_gpu_memory_MiB",
    } <= used
    unknown = used - recorded - _known()
    assert not unknown, f"dashboard uses metrics nobody exports: {sorted(unknown)}"


def test_the_name_parser_finds_names_and_ignores_labels() -> None:
    assert names_in(
        'max by (instance, gpu) (vramdoctor_process_memory_verdict{verdict="LEAK"}) == 1'
    ) == {"vramdoctor_process_memory_verdict"}
    assert names_in(
        "predict_linear(DCGM_FI_DEV_FB_FREE[6h], 4*60*60) < 0 and gpu:dcgm_fb_free:ratio * 100 < 15"
    ) == {"DCGM_FI_DEV_FB_FREE", "gpu:dcgm_fb_free:ratio"}


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write"]:
        FLEET_RULES.write_text(rules_yaml())
        print(f"wrote {FLEET_RULES}")
