#!/usr/bin/env bash
# `vramdoctor watch` on a real GPU host: the reference server on CUDA (leaking, then plain), real
# traffic from a soak in the background (watch itself sends none), watch sampling NVML per process
# with short windows, and its exporter scraped mid-run. Results in $OUT (default ./.gpuout).
#   OUT=/tmp/out bash scripts/gpu_watch.sh
# The traffic's idle windows (IDLE s) must outlast watch's --min-idle (MIN_IDLE): they are its
# rounds, and a verdict needs about four of them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./.gpuout}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NO_COLOR=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
for mode in ${MODES:-leaking plain}; do
  port=18300; [ "$mode" = plain ] && port=18301
  $PY examples/reference_server/server.py --port $port --mode $mode --device ${DEVICE:-cuda} --metrics-flavour vllm >"$OUT/watch-$mode.server.log" 2>&1 &
  spid=$!
  for _ in $(seq 1 120); do $PY -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.5)" 2>/dev/null && break; sleep 0.5; done
  $PY -m vramdoctor watch --server http://127.0.0.1:$port --interval 1s --window 10m --bucket 2s \
      --warmup 5s --analyse-every 5s --min-idle ${MIN_IDLE:-4s} --listen 127.0.0.1:9841 \
      --duration ${DURATION:-95s} --json \
      --out "$OUT/watch-$mode" >"$OUT/watch-$mode.json" 2>"$OUT/watch-$mode.stderr" &
  wpid=$!
  sleep 3
  $PY -m vramdoctor soak --url http://127.0.0.1:$port --rounds ${ROUNDS:-6} --requests 30 --concurrency 4 --idle ${IDLE:-6} \
      --no-adapt --image-size 448x448 --out "$OUT/watch-$mode-traffic.jsonl" >/dev/null 2>&1
  $PY -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9841/metrics', timeout=5).read().decode())" \
      | grep -E '^vramdoctor_(process|verdict|growth|hours|sampler)' | head -30 | tee "$OUT/watch-$mode.metrics.txt"
  wait $wpid; echo "watch $mode exit $?"
  $PY - "$OUT/watch-$mode.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("verdict", d.get("verdict"), "| notes:", d.get("notes"))
for s in d.get("series", [])[:8]:
    print("  ", {k: s.get(k) for k in ("layer", "pid", "process", "gpu", "verdict", "mode", "level", "growth_per_request", "growth_per_hour", "reason")})
PYEOF
  kill $spid 2>/dev/null; wait $spid 2>/dev/null
done
