#!/usr/bin/env bash
# Issue 21 acceptance on a CUDA GPU: every #21 reference-server mode, with and without the agent,
# and a third-party server (`transformers serve` with a tiny VLM built from a config) with and
# without a VRAM leak planted from outside its code; each verdict and the evidence that decided it.
#
#   OUT=/tmp/out bash scripts/gpu_soak_modes21.sh                 # every run, ~40 s each
#   RUNS="retention:agent retention:noagent" OUT=/tmp/out bash scripts/gpu_soak_modes21.sh
#
# Every soak is `vramdoctor soak --launch` (-- CMD): the agent in the server's environment
# (`:agent`) or `--no-agent` (`:noagent`). The reference server runs `--device cuda`. Runs (NAME):
#   retention    thread per connection, PIL decoding, fast processor on CUDA, glibc defaults
#                                  -> host never LEAK (agent: CACHING, arena retention, inside_glibc)
#   host-leak    retention + 256 KiB/request through libc malloc -> host LEAK ~0.25 MiB/request
#   conv-host    converging cache on the host (sampled admission)  -> CACHING (converging)
#   conv-vram    the same cache on the GPU (--admit-probability 0.05) -> CACHING
#   bg-host      background thread, 512 KiB/s on the host           -> LEAK in time (per hour)
#   bg-vram      background thread, 256 KiB/s on the GPU            -> LEAK in time (per hour)
#   vram-leak    1 MiB kept on the GPU per request                   -> VRAM LEAK ~1 MiB/request
#   tenant       plain + another owner's setsid process growing 4 MiB/s on the GPU
#                                                 -> the server not LEAK, the tenant never culprit
#   restart      plain; the serving pid is replaced once at an idle moment (--restart-style
#                handover: a successor on the inherited socket)   -> lives, no LEAK
#   restart-sup  the same with --restart-style supervisor (a master's new worker)
#   two-servers  the soaked server plain; a second reference server (vram-leaking, 1 MiB/request,
#                driven by its own client) on the same GPU -> not the soaked server's
#   tserve       transformers serve, tiny LLaVA from scripts/make_tiny_vlm.py -> no LEAK
#   tserve-leak  the same + scripts/gpu_plant_leak (1 MiB of CUDA memory kept per return of
#                ChatCompletionHandler._build_generation_config)  -> VRAM LEAK ~1 MiB/request
# Each run writes $OUT/NAME_AGENT.{json,stderr,jsonl,truth.json}; $OUT/modes21_summary.txt has
# one block per run: verdict, exit, and per layer verdict, reason, decided_by, rate, culprit.
# Knobs: RUNS, ROUNDS (4), REQS (16), CONC (4), IDLE (3), MAXR (8), CAP_S (100); DEVICE=cpu checks
# the script itself on a machine without a GPU.
# `transformers serve` needs its serving extras: installed from .whl-serve/ when it travels.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./.gpuout}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NO_COLOR=1 PYTHONUNBUFFERED=1
SERVE_SITE=""
if ls .whl-serve/*.whl >/dev/null 2>&1; then
  [ -d /tmp/site-serve ] || $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site-serve .whl-serve/*.whl
  SERVE_SITE=/tmp/site-serve
fi
ALL="retention host-leak conv-host conv-vram bg-host bg-vram vram-leak tenant restart restart-sup two-servers tserve tserve-leak"
if [ -z "${RUNS:-}" ]; then RUNS=""; for r in $ALL; do RUNS="$RUNS $r:agent $r:noagent"; done; fi
ROUNDS=${ROUNDS:-4}; REQS=${REQS:-16}; CONC=${CONC:-4}; IDLE=${IDLE:-3}; MAXR=${MAXR:-8}; CAP_S=${CAP_S:-100}
REF=("$PY" examples/reference_server/server.py --device "${DEVICE:-cuda}")
PLANT_TARGET="transformers.cli.serving.chat_completion:ChatCompletionHandler._build_generation_config"

free_port() { $PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }

wait_port() {  # wait_port PORT SECONDS
  for _ in $(seq 1 $(( $2 * 2 ))); do
    $PY -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 0.5)" "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  return 1
}

truth_later() {  # truth_later PORT FILE: the reference server's own truth, read while it runs
  ( wait_port "$1" 120 && sleep 4 && $PY -c "import json,sys,urllib.request; print(json.dumps(json.load(urllib.request.urlopen(sys.argv[1], timeout=10))))" \
      "http://127.0.0.1:$1/reference/info" >"$2" 2>/dev/null ) &
}

tiny_model() {
  local model="$OUT/tinyvlm"
  [ -f "$model/config.json" ] || $PY scripts/make_tiny_vlm.py "$model" >"$OUT/tinyvlm.build.log" 2>&1 \
    || { tail -5 "$OUT/tinyvlm.build.log"; return 1; }
  echo "$model"
}

soak_launch() {  # soak_launch NAME AGENT [soak args...] -- CMD...
  local name=$1 agent=$2; shift 2
  local sargs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do sargs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  [ "$agent" = noagent ] && sargs+=(--no-agent)
  local start; start=$(date +%s)
  $PY -m vramdoctor soak --out "$OUT/$name.jsonl" --rounds "$ROUNDS" --requests "$REQS" \
      --concurrency "$CONC" --idle "$IDLE" --interval 0.25 --max-rounds "$MAXR" --duration "$CAP_S" \
      --stop-grace 20 --startup-timeout 240 --json "${sargs[@]}" -- "$@" \
      >"$OUT/$name.json" 2>"$OUT/$name.stderr"
  echo "$name: soak exit $? in $(( $(date +%s) - start )) s"
}

for item in $RUNS; do
  run=${item%%:*}; agent=${item#*:}; [ "$agent" = "$item" ] && agent=agent
  name="${run}_${agent}"
  port=$(free_port)
  echo "=== $name (port $port) $(date -u +%T)"
  case $run in
    retention) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" -- "${REF[@]}" --port "$port" --mode retention ;;
    host-leak) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" -- "${REF[@]}" --port "$port" --mode host-leak --leak-kib 256 ;;
    conv-host) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" --rounds 6 -- "${REF[@]}" --port "$port" --mode converging --converge-on host ;;
    conv-vram) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" --rounds 6 -- "${REF[@]}" --port "$port" --mode converging --converge-on vram --admit-probability 0.05 ;;
    bg-host) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" --text-only -- "${REF[@]}" --port "$port" --mode background --background-on host --background-kib-per-s 512 ;;
    bg-vram) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" --text-only -- "${REF[@]}" --port "$port" --mode background --background-on vram --background-kib-per-s 256 ;;
    vram-leak) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" -- "${REF[@]}" --port "$port" --mode vram-leaking --leak-kib 1024 ;;
    tenant) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" -- "${REF[@]}" --port "$port" --mode tenant --tenant-mib-per-s 4 ;;
    restart) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" -- "${REF[@]}" --port "$port" --mode restart --restart-after "$REQS" ;;
    restart-sup) truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" -- "${REF[@]}" --port "$port" --mode restart --restart-after "$REQS" --restart-style supervisor ;;
    two-servers)
      other=$(free_port)
      "${REF[@]}" --port "$other" --mode vram-leaking --leak-kib 1024 >"$OUT/$name.other.log" 2>&1 &
      opid=$!
      wait_port "$other" 120 || tail -5 "$OUT/$name.other.log"
      # the other server's own traffic: 4 requests a second for as long as it runs
      $PY - "$other" >"$OUT/$name.other-client.log" 2>&1 <<'PYEOF' &
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions"
body = json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).encode()
n = 0
while n < 2000:
    try:
        urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}), timeout=30).read()
        n += 1
    except Exception as exc:
        print("other client:", exc, flush=True)
        if "refused" in str(exc):
            break
    time.sleep(0.25)
print("other client sent", n, flush=True)
PYEOF
      cpid=$!
      echo "two-servers: the other server pid $opid on port $other"
      echo "$opid" >"$OUT/$name.other.pid"
      truth_later "$port" "$OUT/$name.truth.json"
      soak_launch "$name" "$agent" -- "${REF[@]}" --port "$port" --mode plain
      kill "$cpid" "$opid" 2>/dev/null; wait "$cpid" "$opid" 2>/dev/null ;;
    tserve|tserve-leak)
      exe=$(command -v transformers || echo "$(dirname "$(command -v "$PY")")/transformers")
      model=$(tiny_model) || { echo "$name: no tiny model"; continue; }
      mkdir -p "$OUT/hf-cache/hub"
      (
        export HF_HUB_OFFLINE=1 HF_HOME="$OUT/hf-cache" HF_HUB_CACHE="$OUT/hf-cache/hub"
        export PYTHONPATH="${SERVE_SITE:+$SERVE_SITE:}$PYTHONPATH"
        if [ "$run" = tserve-leak ]; then
          export PYTHONPATH="$PWD/scripts/gpu_plant_leak:$PYTHONPATH" VD_PLANT_LEAK="$PLANT_TARGET:1024"
        fi
        soak_launch "$name" "$agent" --model "$model" --image-size 224x224 --max-tokens 4 --concurrency 2 \
          --timeout 60 -- "$exe" serve "$model" --device cuda --host 127.0.0.1 --port "$port"
      ) ;;
    *) echo "unknown run $run ($ALL)"; continue ;;
  esac
done

echo "=== summary $(date -u +%T)"
$PY - "$OUT" $RUNS <<'PYEOF' | tee -a "$OUT/modes21_summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for item in sys.argv[2:]:
    run, _, agent = item.partition(":")
    name = f"{run}_{agent or 'agent'}"
    try:
        d = json.loads((out / f"{name}.json").read_text())
    except Exception as exc:
        err = (out / f"{name}.stderr").read_text()[-400:] if (out / f"{name}.stderr").exists() else ""
        print(f"{name}: no result ({type(exc).__name__}) {err!r}")
        continue
    truth = {}
    try:
        t = json.loads((out / f"{name}.truth.json").read_text()).get("truth") or {}
        truth = {k: (v.get("verdict") if isinstance(v, dict) else v) for k, v in (t.get("layers") or t).items()}
    except Exception:
        pass
    print(f"{name}: {d.get('verdict')} exit {d.get('exit_code')} rounds {len(d.get('rounds') or [])} "
          f"lives {len(d.get('lives') or []) if isinstance(d.get('lives'), list) else d.get('lives')} "
          f"replaced {bool(d.get('server_replaced'))} truth {truth}")
    print(f"    headline: {d.get('headline')}")
    for k, v in (d.get("layers") or {}).items():
        rate = v.get("rate_per_request")
        hour = v.get("rate_per_hour")
        cul = v.get("culprit") or {}
        bits = [f"{k}: {v.get('verdict')}", f"reason={v.get('reason')}", f"decided_by={v.get('decided_by')}"]
        if rate is not None:
            bits.append(f"rate={rate:.4g} {v.get('unit')}/req ci={v.get('rate_ci')}")
        if hour is not None:
            bits.append(f"per_hour={hour:.4g} {v.get('unit')}")
        if v.get("explanation"):
            bits.append(f"explanation={v.get('explanation')}")
        if cul:
            bits.append(f"culprit=pid {cul.get('pid')} {cul.get('name')} {cul.get('series')}")
        if v.get("tenants"):
            bits.append(f"tenants={v.get('tenants')}")
        if v.get("caveats"):
            bits.append(f"caveats={v.get('caveats')}")
        print("    " + " ".join(bits))
    for n in (d.get("notes") or [])[:6]:
        print(f"    note: {str(n)[:300]}")
PYEOF
