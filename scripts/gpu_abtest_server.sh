#!/usr/bin/env bash
# GPU acceptance of `ab-test --server` and `soak --launch` (issue 24), on one CUDA GPU:
#
#   ref-leak    the reference server, --mode leaking --leak-kind bytes (1 MiB kept on the GPU per
#               request): baseline, malloc-arena-max-2, expandable-segments, and the server's own
#               env fix (REFERENCE_FREE_REQUEST_BUFFERS=1); 4 variants x 4 rounds (+ baseline-again)
#   ref-cache   the same four variants on --mode plain (PyTorch's caching allocator: CACHING)
#   tserve      `transformers serve` (the real third-party server) with a tiny random VLM built from
#               a config (scripts/make_tiny_vlm.py): baseline, malloc-arena-max-2,
#               expandable-segments, PYTORCH_NO_CUDA_MEMORY_CACHING=1
#   launch      `soak --launch` on the reference server (leaking on the GPU): the verdict and the
#               start-up facts read from its own log, nothing left running
#
# Each step's table (terminal and --json), its results folder and its wall time land in $OUT;
# $OUT/abtest_gpu.md is the summary for docs/abtest.md ("Measured on a GPU").
#
#   OUT=/tmp/out bash scripts/gpu_abtest_server.sh [ref-leak] [ref-cache] [tserve] [launch]
#
# Target (issue 24): a 4-variant matrix of 4 rounds in under 10 minutes on one GPU (ref-leak).
# Needs: a CUDA GPU, torch, transformers, nvidia-ml-py; `transformers serve` also needs its
# serving extras (fastapi, uvicorn, openai, pydantic...), installed from .whl-serve/ when that
# folder travels with the repository (as for scripts/gpu_attribute.sh). DEVICE=cpu runs the
# reference-server steps on the CPU (a check of the script itself on a machine without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; export OUT; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  # once per machine: another lane may be importing from /tmp/site right now
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
if ls .whl-serve/*.whl >/dev/null 2>&1; then
  [ -d /tmp/site-serve ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-serve .whl-serve/*.whl
  SERVE_SITE=/tmp/site-serve
else
  SERVE_SITE=
fi
export PYTHONUNBUFFERED=1 NO_COLOR=1 COLUMNS=${COLUMNS:-160}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
ROUNDS=${ROUNDS:-4}
REQS=${REQS:-20}
IDLE=${IDLE:-3}
steps=${*:-ref-leak ref-cache tserve launch}
SUMMARY="$OUT/abtest_gpu.md"

{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv || true
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)' || true
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"
{
  echo "## Measured on a GPU (scripts/gpu_abtest_server.sh)"
  echo
  echo '```'
  cat "$OUT/environment.txt"
  echo '```'
} > "$SUMMARY"

TRAFFIC=(--rounds "$ROUNDS" --requests "$REQS" --concurrency 2 --idle "$IDLE" --interval 0.25
         --stop-grace 20 --startup-timeout 300)

run_abtest() {  # NAME ARGS... : one ab-test --server, its table, JSON, wall time
  local name=$1; shift
  local folder="$OUT/$name"
  rm -rf "$folder"
  echo "=== $name"
  local start; start=$(date +%s)
  $PY -m vramdoctor ab-test --out "$folder" "${TRAFFIC[@]}" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.stderr"
  local rc=$?
  local took=$(( $(date +%s) - start ))
  cat "$OUT/$name.txt"
  tail -3 "$OUT/$name.stderr"
  $PY -m vramdoctor report "$folder/abtest.jsonl" --json >"$OUT/$name.json" 2>/dev/null
  echo "$name: exit $rc, wall time $took s"
  {
    echo
    echo "### $name: exit $rc, wall time $took s"
    echo
    echo '```'
    echo "vramdoctor ab-test ${TRAFFIC[*]} $*"
    echo
    cat "$OUT/$name.txt"
    echo '```'
  } >> "$SUMMARY"
  # nothing it launched may be left: every pid its soaks recorded as the server
  $PY - "$folder" <<'PYEOF' | tee -a "$OUT/$name.txt"
import os, sys, pathlib
from vramdoctor.record import read_run
left = []
for run in pathlib.Path(sys.argv[1]).glob("*.jsonl"):
    r = read_run(run)
    for pid in (r.header.get("config") or {}).get("server_tree", {}):
        if os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split(")")[-1][:3]:
            left.append((run.name, pid))
print("leftover processes:", left or "none")
PYEOF
}

REF=(python3 examples/reference_server/server.py --device "$DEVICE")
VARIANTS=(--preset malloc-arena-max-2 --preset expandable-segments
          --variant fixed=REFERENCE_FREE_REQUEST_BUFFERS=1)

for step in $steps; do
  case $step in
  ref-leak)
    run_abtest ref-leak "${VARIANTS[@]}" \
      -- "${REF[@]}" --port 18301 --mode leaking --leak-kind bytes --leak-kib 1024 ;;
  ref-cache)
    run_abtest ref-cache "${VARIANTS[@]}" -- "${REF[@]}" --port 18302 --mode plain ;;
  tserve)
    exe=$(command -v transformers || echo "$(dirname "$(command -v $PY)")/transformers")
    if [ ! -x "$exe" ]; then echo "tserve: no transformers CLI here: skipped"; continue; fi
    model="$OUT/tinyvlm"
    [ -d "$model" ] || $PY scripts/make_tiny_vlm.py "$model" || { echo "tserve: make_tiny_vlm failed"; continue; }
    mkdir -p "$OUT/hf-cache/hub"
    # the serving extras go on the server's PYTHONPATH only (the agent path is put first by vramdoctor)
    (
      export HF_HUB_OFFLINE=1 HF_HOME="$OUT/hf-cache" HF_HUB_CACHE="$OUT/hf-cache/hub"
      export PYTHONPATH="${SERVE_SITE:+$SERVE_SITE:}$PYTHONPATH"
      run_abtest tserve --model "$model" --image-size 224x224 --image-size 448x336 \
        --preset malloc-arena-max-2 --preset expandable-segments \
        --variant nocache=PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
        -- "$exe" serve "$model" --device "$DEVICE" --host 127.0.0.1 --port 18311
    ) ;;
  launch)
    echo "=== launch"
    start=$(date +%s)
    $PY -m vramdoctor soak --out "$OUT/launch.jsonl" "${TRAFFIC[@]}" --json \
      -- "${REF[@]}" --port 18321 --mode leaking --leak-kind bytes --leak-kib 1024 \
      >"$OUT/launch.json" 2>"$OUT/launch.stderr"
    rc=$?
    $PY -m vramdoctor report "$OUT/launch.jsonl" >"$OUT/launch.txt" 2>&1
    cat "$OUT/launch.txt"
    echo "launch: exit $rc, wall time $(( $(date +%s) - start )) s"
    { echo; echo "### soak --launch: exit $rc"; echo; echo '```'; cat "$OUT/launch.txt"; echo '```'; } >> "$SUMMARY" ;;
  *) echo "unknown step $step (ref-leak ref-cache tserve launch)" ;;
  esac
done
echo "summary for docs/abtest.md: $SUMMARY"
