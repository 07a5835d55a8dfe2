#!/usr/bin/env bash
# GPU-machine check for the measurement sources and census (issue 2), run from the repo root:
#   bash benchmarks/sources_gpu_check.sh            # results under $OUT (or ./.gpuout)
# Runs the `gpu`-marked NVML tests (real CUDA contexts through libcuda; the stray-context
# test needs 2 GPUs, e.g. the nvidia-h200-x2 machine, and skips on one; reachable memory and
# the memory-limits call on the real driver; scope and title of real contexts; a real orphaned
# worker flagged by census), the NVML-vs-nvidia-smi
# cost benchmark with the 10 Hz sampler CPU measurement, and one `vramdoctor census --json`.
# Uses the installed vramdoctor if importable, else this checkout via PYTHONPATH (needs
# typer, rich, nvidia-ml-py, prometheus-client, requests, psutil, pytest on that machine).
set -uo pipefail
OUT=${OUT:-.gpuout}
mkdir -p "$OUT"
PY=${PY:-python3}
if ! "$PY" -c "import vramdoctor.sources.nvml" 2>/dev/null; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" - <<'PYEOF' 2>&1 | tee "$OUT/sources_env.txt"
import importlib, sys
print(sys.version)
for m in ("typer", "rich", "pynvml", "prometheus_client", "requests", "psutil", "pytest"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "ok"))
    except Exception as exc:  # noqa: BLE001
        print(m, "MISSING", exc)
PYEOF
nvidia-smi -L 2>&1 | tee "$OUT/sources_gpus.txt"
"$PY" -m pytest -p no:cacheprovider -m gpu tests/sources/test_sources_nvml.py tests/census/test_leftovers_gpu.py -v -s -rs 2>&1 | tee "$OUT/sources_gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}
"$PY" benchmarks/sources_nvml_cost.py --json-out "$OUT/sources_nvml_cost.json" 2>&1 | tee "$OUT/sources_nvml_cost.txt"
bench_rc=${PIPESTATUS[0]}
"$PY" -m vramdoctor census --json > "$OUT/sources_census.json" 2> "$OUT/sources_census.err"
echo "census rc=$?" | tee -a "$OUT/sources_census.err"
"$PY" -m vramdoctor census > "$OUT/sources_census.txt" 2>&1
"$PY" -c "import pynvml; print('nvmlDeviceGetMemoryLimits_v1 in binding:', hasattr(pynvml, 'nvmlDeviceGetMemoryLimits_v1'))" 2>&1 | tee -a "$OUT/sources_env.txt"
echo "gpu tests rc=$tests_rc, benchmark rc=$bench_rc (0 = targets met)"
exit $(( tests_rc != 0 || bench_rc != 0 ))
