#!/usr/bin/env bash
# GPU acceptance for `soak --attribute` (issue 13) and the agent's inside evidence (issues 21, 22.5,
# 28.5): fixtures for the CPU tests, the reference server and `transformers serve` with the agent,
# soak end to end, the overhead benchmark; the inside evidence per server kind, the MemPool /
# empty_cache fact, torch 2.14 pinned history (when that torch is installed), and the showcase run
# of docs/attribute.md (one server alone on the GPU).
# Run from the repository root on a CUDA host; results land in $OUT (default /tmp/out).
#   bash scripts/gpu_attribute.sh [fixtures] [accept] [bench] [inside] [mempool] [torch214] [showcase] [tests]
set -uo pipefail
OUT=${OUT:-/tmp/out}; export OUT; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  # once per machine: another lane may be importing from /tmp/site right now
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
if ls .whl-serve/*.whl >/dev/null 2>&1; then  # transformers[serving] deps, only for `transformers serve`
  [ -d /tmp/site-serve ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-serve .whl-serve/*.whl
  export ATTR_SERVE_SITE=/tmp/site-serve
fi
steps=${*:-fixtures accept bench}
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
for step in $steps; do
  case $step in
  fixtures)
    # the "server's own" code under /opt/torch/... next to the venv's torch (not a bare /torch/ match)
    app=/opt/torch/vd_app; mkdir -p $app; cp scripts/record_attribute_fixtures.py $app/
    fx=/tmp/fixtures; rm -rf $fx; mkdir -p $fx
    for kind in leak caching escape; do timeout 45 python3 $app/record_attribute_fixtures.py $kind $fx >/dev/null || echo "fixture $kind failed rc=$?"; done
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 45 python3 $app/record_attribute_fixtures.py expandable $fx >/dev/null || echo "fixture expandable failed"
    ls -la $fx ;;
  accept)
    timeout 270 python3 scripts/gpu_attribute.py ${ACCEPT_WHICH:-} ;;
  bench)
    timeout 130 python3 benchmarks/agent_overhead.py --requests 300 --json "$OUT/agent_overhead.json" ;;
  long)
    timeout 200 python3 benchmarks/agent_overhead.py --long --json "$OUT/agent_long.json" ;;
  micro)
    timeout 100 python3 benchmarks/agent_overhead.py --micro-only --json "$OUT/agent_micro.json" ;;
  inside)  # each step's JSON kept under its own name (the script rewrites attribute_inside.json)
    timeout 420 python3 scripts/gpu_attribute_inside.py inside
    cp "$OUT/attribute_inside.json" "$OUT/attribute_inside_$step.json" 2>/dev/null ;;
  tests)
    timeout 300 python3 -m pytest -q -m gpu tests/agent/test_agent_gpu.py 2>&1 | tail -20 | tee "$OUT/agent_gpu_tests.txt" ;;
  mempool|torch214|showcase)
    timeout 240 python3 scripts/gpu_attribute_inside.py "$step"
    cp "$OUT/attribute_inside.json" "$OUT/attribute_inside_$step.json" 2>/dev/null ;;
  esac
done
mkdir -p /tmp/fixtures; cp -r "$OUT/ref-snapshots" /tmp/fixtures/ 2>/dev/null; rm -rf "$OUT/ref-snapshots"
tar czf "$OUT/fixtures.tar.gz" -C /tmp fixtures
for d in soak-e2e soak-tserve showcase fixtures-214; do [ -d "$OUT/$d" ] && tar czf "$OUT/$d.tar.gz" -C "$OUT" $d && rm -rf "$OUT/$d"; done
ls -la "$OUT"
