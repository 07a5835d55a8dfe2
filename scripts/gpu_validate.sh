#!/usr/bin/env bash
# One batch of every GPU check the repository has, for a GPU machine with no network:
#   1. soak against the reference server on VRAM (plain, leaking, fixed)   scripts/gpu_soak.sh
#   2. NVML source tests, NVML vs nvidia-smi cost, 10 Hz sampler CPU cost   benchmarks/sources_gpu_check.sh
#   3. soak sensitivity on VRAM, with whatever time is left                 benchmarks/soak_sensitivity.py --gpu
#   4. every other gpu-marked test                                          pytest -m gpu
# Everything lands in $OUT/gpu-validate.tgz (plus summary files), so it fits the few files a
# remote runner brings back.   Usage: OUT=/tmp/out BUDGET_S=560 bash scripts/gpu_validate.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./.gpuout}
BUDGET_S=${BUDGET_S:-560}
W=$(mktemp -d /tmp/vramdoctor-gpu.XXXX)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 NO_COLOR=1
start=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
step() { echo; echo "##### $1 (t=$(( $(date +%s) - start ))s, $(left)s left)"; }

step "environment"
{ nvidia-smi -L; nvidia-smi topo -m; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } 2>&1 | tee "$W/environment.txt"

step "soak on VRAM"
OUT="$W/soak" timeout 300 bash scripts/gpu_soak.sh 2>&1 | tee "$W/soak.log" | tail -60
cp "$W/soak/summary.txt" "$OUT/soak-summary.txt" 2>/dev/null

step "sources: NVML tests, cost benchmark, census"
OUT="$W/sources" PY=python3 timeout 150 bash benchmarks/sources_gpu_check.sh 2>&1 | tee "$W/sources.log" | tail -40

step "other gpu tests"
timeout 120 python3 -m pytest -p no:cacheprovider -m gpu -q -rs tests/fixes/test_fixes_gpu.py tests/abtest/test_abtest_gpu.py 2>&1 | tee "$W/gpu-tests.log" | tail -15

t=$(( $(left) - 25 ))
if [ "$t" -gt 60 ]; then
  step "soak sensitivity on VRAM (${t}s)"
  timeout "$t" python3 benchmarks/soak_sensitivity.py --gpu --idle 3 --sizes-kib 1024,256 --caching-runs 4 --out "$W/sens" 2>&1 | tee "$W/sensitivity.log" | tail -30
else
  echo "no time left for the sensitivity benchmark" | tee "$W/sensitivity.log"
fi

step "pack"
tar czf "$OUT/gpu-validate.tgz" -C "$W" . && ls -la "$OUT"
