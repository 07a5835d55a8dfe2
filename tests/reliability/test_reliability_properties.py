"""Property-based tests (hypothesis) of the readers of outside input.

Whatever the bytes, the Prometheus-text reader raises only `SourceUnavailable` (the
documented "not Prometheus metrics" error) and the run-file reader only `InputError`; what
they return is well-formed (finite numbers, typed records in time order).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vramdoctor.errors import InputError, SourceUnavailable
from vramdoctor.record import SCHEMA, read_run
from vramdoctor.samples import SAMPLE_TYPES, GpuSample, MetricsSample
from vramdoctor.sources.exporter import flavour_of, parse_dcgm, parse_nvitop
from vramdoctor.sources.http import parse_exposition
from vramdoctor.sources.server_metrics import parse_metrics_text

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Lines that look like exposition text, mixed with noise, so the parser gets past line one.
NAMES = st.sampled_from(
    [
        "vllm:cache_config_info",
        "vllm:kv_cache_usage_perc",
        "sglang:num_used_tokens",
        "sglang:token_usage",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "gpu_memory_used_MiB",
        "process_gpu_memory_MiB",
        "x",
    ]
)
LABEL_VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e999", "0", "16", "", "\x1b[2J", "9" * 400]),
    st.text(max_size=12),
)
VALUES = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "-0", "1", "0.5", "abc"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


@st.composite
def exposition_line(draw: st.DrawFn) -> str:
    name = draw(NAMES)
    labels = draw(
        st.dictionaries(
            st.sampled_from(
                [
                    "num_gpu_blocks",
                    "block_size",
                    "gpu",
                    "UUID",
                    "index",
                    "pid",
                    "tp_rank",
                    "engine",
                    "model_name",
                ]
            ),
            LABEL_VALUES,
            max_size=4,
        )
    )
    inner = ",".join(f'{k}="{json.dumps(v)[1:-1]}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {draw(VALUES)}" if labels else f"{name} {draw(VALUES)}"


PAGES = st.one_of(
    st.text(max_size=400),
    st.lists(st.one_of(exposition_line(), st.text(max_size=40)), max_size=12).map("\n".join),
    st.binary(max_size=300).map(lambda b: b.decode("utf-8", errors="replace")),
)


@SETTINGS
@given(PAGES)
@example('vllm:cache_config_info{num_gpu_blocks="inf"} 0.0')  # found by hypothesis 6.80 in CI
def test_the_prometheus_reader_raises_only_its_documented_error(text: str) -> None:
    try:
        sample = parse_metrics_text(text)
    except SourceUnavailable:
        return
    assert isinstance(sample, MetricsSample)
    for value in [*sample.values.values(), *sample.raw.values()]:
        assert isinstance(value, float)
        assert math.isfinite(value) or value != value  # NaN may reach the writer; it drops them
    try:
        families = parse_exposition(text, what="GPU exporter", shown_url="x")
    except SourceUnavailable:
        return
    if flavour_of(families) == "dcgm":
        parse_dcgm(families)
    else:
        parse_nvitop(families)


# --- the run-file reader ------------------------------------------------------------------

HEADER = json.dumps({"kind": "header", "schema": SCHEMA, "command": "soak"})
RECORD_KINDS = st.sampled_from([*SAMPLE_TYPES, "end", "result", None, 3])
JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def record_line(draw: st.DrawFn) -> str:
    rec = draw(
        st.dictionaries(
            st.sampled_from(
                [
                    "t",
                    "wall",
                    "source",
                    "gpus",
                    "processes",
                    "values",
                    "raw",
                    "kv",
                    "name",
                    "data",
                    "flavour",
                    "index",
                    "used_mib",
                ]
            ),
            JSONISH,
            max_size=6,
        )
    )
    rec["kind"] = draw(RECORD_KINDS)
    if draw(st.booleans()):
        rec.setdefault("t", draw(st.floats(allow_nan=True, allow_infinity=True)))
    return json.dumps(rec)  # NaN/Infinity written as Python writes them


RUN_FILES = st.one_of(
    st.binary(max_size=600),
    st.lists(st.one_of(record_line(), st.text(max_size=30)), max_size=10).map(
        lambda lines: "\n".join([HEADER, *lines]).encode()
    ),
    st.tuples(st.lists(record_line(), max_size=6), st.binary(max_size=60)).map(
        lambda p: ("\n".join([HEADER, *p[0]]) + "\n").encode() + p[1]
    ),
)


@SETTINGS
@given(RUN_FILES)
def test_the_run_file_reader_raises_only_input_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.jsonl"
        path.write_bytes(data)
        try:
            run = read_run(path)
        except InputError:
            return
    ts = [r.t if not isinstance(r, dict) else r.get("t") for r in run.records]
    numeric = [t for t in ts if isinstance(t, (int, float))]
    assert numeric == sorted(numeric)
    for rec in run.records:
        if isinstance(rec, GpuSample):
            assert all(
                isinstance(g.used_mib, float) and math.isfinite(g.used_mib) for g in rec.gpus
            )
        if isinstance(rec, MetricsSample):
            assert all(isinstance(v, float) and math.isfinite(v) for v in rec.values.values())
    assert len(run.problems) <= 3
