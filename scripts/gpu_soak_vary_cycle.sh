#!/usr/bin/env bash
# soak --vary and --cycle, and the #21 reference-server modes' GPU twins, on a real CUDA GPU.
# Every server is examples/reference_server/server.py --device cuda (torch + transformers);
# memory lives in real CUDA tensors (NVML per process sees it) and real pinned host memory.
#
#   OUT=/tmp/out bash scripts/gpu_soak_vary_cycle.sh           # all runs, about 9 minutes
#   RUNS="vary-vram cycle-sleep" OUT=/tmp/out bash scripts/gpu_soak_vary_cycle.sh
#
# Runs (each writes $OUT/NAME.json = soak --json, NAME.stderr, NAME.truth.json = the server's
# GET /reference/info after the soak, NAME.server.log):
#   vary-vram     leak-on-large-images, 1 MiB of VRAM per request with an image > 1024 px;
#                 --vary image-size,stream,n          -> vram culprit image-size, ~1.0 MiB/request
#   vary-every    leak-on-every, 1 MiB of VRAM on every request; --vary image-size,stream,n
#                                                     -> no feature named: every request alike
#   cycle-sleep   sleep-leak (vLLM endpoints), 16 MiB of PINNED host memory kept per wake
#                                                     -> host_pinned LEAK ~16 MiB/cycle; VRAM
#                                                        freed while asleep (weights + KV)
#   cycle-sleep-ok  stable --enable-sleep-mode      -> no LEAK (pinned cache: one rise at most)
#   cycle-release release-leak (SGLang endpoints), 8 MiB of VRAM per resume -> vram LEAK ~8 MiB/cycle
#   cycle-lora    lora-leak (vLLM), 2 MiB host per unload -> host LEAK ~2 MiB/cycle
#   conv-vram     converging --converge-on vram (a CUDA tile cache filling to its bound) -> CACHING
#   bg-vram       background --background-on vram, 256 KiB/s in time -> LEAK in time (per hour)
#   retention     retention with the fast image processor on CUDA -> host never LEAK
#   tenant        tenant: another owner's process (uid nobody if possible) growing 4 MiB/s on
#                 the same GPU -> the server CACHING/STABLE, the tenant not its culprit
# Knobs: RUNS, REQS (10), IDLE (2), CONC (4).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./.gpuout}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NO_COLOR=1 PYTHONUNBUFFERED=1
RUNS=${RUNS:-"vary-vram vary-every cycle-sleep cycle-sleep-ok cycle-release cycle-lora conv-vram bg-vram retention tenant"}
REQS=${REQS:-10}; IDLE=${IDLE:-2}; CONC=${CONC:-4}
COMMON=(--requests "$REQS" --concurrency "$CONC" --idle "$IDLE" --interval 0.25 --json)
ADAPTER="$PWD/examples/reference_server/adapters/tiny-lora"

wait_port() {  # wait_port PORT PID LOG
  for _ in $(seq 1 360); do
    $PY -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 0.5)" "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { tail -20 "$3"; return 1; }
    sleep 0.5
  done
  return 1
}

free_port() { $PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }

run() {  # run NAME MODE [server args...] -- [soak args...]
  local name=$1 mode=$2; shift 2
  local sargs=() kargs=() port; port=$(free_port)
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do sargs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  kargs=("$@")
  echo "=== $name: --mode $mode ${sargs[*]} | soak ${kargs[*]}"
  $PY examples/reference_server/server.py --port "$port" --mode "$mode" --device cuda "${sargs[@]}" \
      >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  if wait_port "$port" "$spid" "$OUT/$name.server.log"; then
    local start; start=$(date +%s)
    $PY -m vramdoctor soak --url "http://127.0.0.1:$port" "${COMMON[@]}" "${kargs[@]}" \
        --out "$OUT/$name.jsonl" >"$OUT/$name.json" 2>"$OUT/$name.stderr"
    echo "$name: soak exit $? in $(( $(date +%s) - start )) s"
    $PY -c "import json,sys,urllib.request; print(json.dumps(json.load(urllib.request.urlopen(sys.argv[1], timeout=10))))" \
        "http://127.0.0.1:$port/reference/info" >"$OUT/$name.truth.json" 2>/dev/null
  fi
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
}

export VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=true
for r in $RUNS; do
  case $r in
    vary-vram) run "$r" leak-on-large-images --leak-layer vram --leak-kib 1024 -- --vary image-size,stream,n ;;
    vary-every) run "$r" leak-on-every --leak-layer vram --leak-kib 1024 -- --vary image-size,stream,n ;;
    cycle-sleep) run "$r" sleep-leak --metrics-flavour vllm --enable-sleep-mode --weights-mib 256 --cycle-leak-mib 16 -- --cycle sleep --text-only ;;
    cycle-sleep-ok) run "$r" stable --metrics-flavour vllm --enable-sleep-mode --weights-mib 256 -- --cycle sleep --text-only ;;
    cycle-release) run "$r" release-leak --metrics-flavour sglang --enable-memory-saver --cycle-leak-mib 8 -- --cycle release --text-only ;;
    cycle-lora) run "$r" lora-leak --metrics-flavour vllm --enable-lora -- --cycle "lora:tiny=$ADAPTER" --text-only ;;
    conv-vram) run "$r" converging --converge-on vram --admit-probability 0.05 -- --rounds 6 --max-rounds 8 ;;
    bg-vram) run "$r" background --background-on vram --background-kib-per-s 256 -- --rounds 4 --max-rounds 6 --text-only ;;
    retention) run "$r" retention -- --rounds 5 --max-rounds 8 ;;
    tenant) run "$r" tenant --tenant-mib-per-s 4 -- --rounds 4 --max-rounds 6 ;;
    *) echo "unknown run $r" ;;
  esac
done

echo "=== summary"
$PY - "$OUT" $RUNS <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in sys.argv[2:]:
    try:
        d = json.loads((out / f"{name}.json").read_text())
    except Exception as exc:
        print(f"{name}: no result ({exc})"); continue
    truth = {}
    try:
        truth = json.loads((out / f"{name}.truth.json").read_text()).get("truth", {})
    except Exception:
        pass
    line = f"{name}: soak {d.get('verdict')}"
    for key in ("vary", "cycle"):
        if key in d:
            v = d[key]
            line += f" | {key} {v['verdict']}: {v['headline'][:160]}"
    layers = {k: v.get("verdict") for k, v in (d.get("layers") or {}).items()}
    line += f" | layers {layers} | truth {(truth.get('layers') and {k: v['verdict'] for k, v in truth['layers'].items()})}"
    print(line)
PY
