#!/usr/bin/env bash
# Soak per memory layer on a real GPU host: `transformers serve` with a tiny random VLM, then the
# reference server's modes on CUDA (kv-leaking in a 1,000,000-token pool with 64-token pages,
# arena with glibc's defaults and with MALLOC_ARENA_MAX=2, pinned, worker-churn, plain, leaking,
# fixed). Each soak writes $OUT/<name>.json (schema vramdoctor.soak/2) and .stderr; the summary
# prints each layer's verdict and figures.
#
#   OUT=/tmp/out bash scripts/gpu_soak_layers.sh
#
# Knobs: RUNS (names, in order), ROUNDS (4), REQS (30), IDLE (3), CONC (4), MAXR (6), CAP_S (75).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./.gpuout}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NO_COLOR=1 PYTHONUNBUFFERED=1
# transformers[serving]'s own needs (fastapi, uvicorn, ...) for `transformers serve` only, carried
# as wheels in .whl-serve (the GPU image lacks them; see docs/attribute.md for the list).
SERVE_SITE=""
if ls .whl-serve/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-serve .whl-serve/*.whl \
    && SERVE_SITE=/tmp/site-serve
fi
RUNS=${RUNS:-"tserve kv arena arena-max2 pinned churn plain leaking fixed"}
ROUNDS=${ROUNDS:-4}; REQS=${REQS:-30}; IDLE=${IDLE:-3}; CONC=${CONC:-4}; MAXR=${MAXR:-6}; CAP_S=${CAP_S:-75}
SOAK=(--rounds "$ROUNDS" --requests "$REQS" --concurrency "$CONC" --idle "$IDLE" --max-rounds "$MAXR"
      --duration "$CAP_S" --image-size 448x448 --image-size 896x672 --json)

wait_port() {  # wait_port PORT PID LOG
  for _ in $(seq 1 360); do
    $PY -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 0.5)" "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { tail -20 "$3"; return 1; }
    sleep 0.5
  done
  return 1
}

soak_ref() {  # soak_ref NAME MODE PORT [server args...] -- [soak args...]
  local name=$1 mode=$2 port=$3; shift 3
  local sargs=() kargs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do sargs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  kargs=("$@")
  echo "=== $name: reference server --mode $mode ${sargs[*]}"
  $PY examples/reference_server/server.py --port "$port" --mode "$mode" --device cuda "${sargs[@]}" \
      >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  if wait_port "$port" "$spid" "$OUT/$name.server.log"; then
    local start; start=$(date +%s)
    $PY -m vramdoctor soak --url "http://127.0.0.1:$port" "${SOAK[@]}" "${kargs[@]}" \
        --out "$OUT/$name.jsonl" >"$OUT/$name.json" 2>"$OUT/$name.stderr"
    echo "$name: soak exit $? in $(( $(date +%s) - start )) s"
    $PY -c "import json,sys,urllib.request; print(json.dumps(json.load(urllib.request.urlopen(sys.argv[1], timeout=5))))" \
        "http://127.0.0.1:$port/reference/info" >"$OUT/$name.truth.json" 2>/dev/null
  fi
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
}

for run in $RUNS; do
  case $run in
    tserve)
      echo "=== tserve: transformers serve with a tiny random VLM"
      exe=$(command -v transformers || echo "$(dirname "$(command -v $PY)")/transformers")
      "$exe" serve --help >"$OUT/tserve.help.txt" 2>&1; head -40 "$OUT/tserve.help.txt"
      $PY scripts/make_tiny_vlm.py "$OUT/tinyvlm" >"$OUT/tserve.build.log" 2>&1 || tail -5 "$OUT/tserve.build.log"
      # A fresh host without a Hugging Face cache directory: /v1/models answers 500 (facts.md).
      HF_HUB_OFFLINE=1 HF_HOME="$OUT/no-hf-home" HF_HUB_CACHE="$OUT/no-hf-home/hub" \
        PYTHONPATH="$PYTHONPATH${SERVE_SITE:+:$SERVE_SITE}" "$exe" serve "$OUT/tinyvlm" --device cuda --port 18200 --host 127.0.0.1 >"$OUT/tserve.server.log" 2>&1 &
      tp=$!
      if wait_port 18200 "$tp" "$OUT/tserve.server.log"; then
        $PY -c "import urllib.request as u
try: print('/v1/models', u.urlopen('http://127.0.0.1:18200/v1/models', timeout=10).status)
except Exception as e: print('/v1/models', e)"
        start=$(date +%s)
        $PY -m vramdoctor soak --url http://127.0.0.1:18200 --model "$OUT/tinyvlm" --rounds "$ROUNDS" \
            --requests 20 --concurrency 2 --idle "$IDLE" --max-rounds "$MAXR" --duration 90 --timeout 60 \
            --image-size 224x224 --json --out "$OUT/tserve.jsonl" >"$OUT/tserve.json" 2>"$OUT/tserve.stderr"
        echo "tserve: soak exit $? in $(( $(date +%s) - start )) s"
      fi
      kill "$tp" 2>/dev/null; wait "$tp" 2>/dev/null ;;
    kv) soak_ref kv kv-leaking 18201 --metrics-flavour sglang --kv-pool-tokens 1000000 --kv-page-size 64 \
          --kv-leak-tokens 64 -- --text-only ;;
    arena) soak_ref arena arena 18202 ;;
    arena-max2) MALLOC_ARENA_MAX=2 soak_ref arena-max2 arena 18203 ;;
    pinned) soak_ref pinned pinned 18204 ;;
    churn) soak_ref churn worker-churn 18205 ;;
    plain|fixed) soak_ref "$run" "$run" 18206 ;;
    leaking) soak_ref leaking leaking 18207 ;;
  esac
done

echo "=== summary (per layer)"
$PY - "$OUT" $RUNS <<'PYEOF' | tee "$OUT/summary.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in sys.argv[2:]:
    try:
        d = json.loads((out / f"{name}.json").read_text())
    except Exception as exc:
        err = (out / f"{name}.stderr").read_text()[-300:] if (out / f"{name}.stderr").exists() else ""
        print(f"{name:11} no result ({type(exc).__name__}) {err!r}"); continue
    lay = d.get("layers", {})
    parts = []
    for k in ("vram", "kv", "host"):
        v = lay.get(k, {})
        r = v.get("rate_per_request")
        parts.append(f"{k}={v.get('verdict')}" + (f"({r:.4g} {v.get('unit')}/req)" if r else "")
                     + (f"[{v.get('explanation')}]" if v.get("explanation") else ""))
    print(f"{name:11} {d.get('verdict'):13} exit={d.get('exit_code')} rounds={len(d.get('rounds', []))} "
          + " ".join(parts))
    for k in ("vram", "kv", "host"):
        s = lay.get(k, {}).get("summary")
        if s:
            print(f"{'':11} {s}")
    for p in lay.get("host", {}).get("processes", []):
        print(f"{'':11} host pid {p.get('pid')} {p.get('name')}: rss +{p.get('rss_growth_mib')} MiB "
              f"(anon +{p.get('anon_growth_mib')}, shmem +{p.get('shmem_growth_mib')}), arenas "
              f"{p.get('arenas_first')}->{p.get('arenas_last')}, kind {p.get('growth_kind')}")
    print(f"{'':11} notes: {d.get('notes')} changes: {len(d.get('process_changes') or [])}")
PYEOF
