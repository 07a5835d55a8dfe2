#!/usr/bin/env bash
# Soak on a real GPU: the reference server preprocesses images with a real transformers fast
# image processor on CUDA, in plain (caching), leaking (a tensor escaping a request-scoped
# MemPool) and fixed (vramdoctor.fixes.request_scoped_pool + outputs_to_cpu) modes in turn;
# `vramdoctor soak` runs against each with NVML per process. Run files, JSON, HTML and PNG
# reports go to $OUT; the verdicts, rates and culprit processes are printed at the end.
#
#   OUT=/tmp/out bash scripts/gpu_soak.sh          # whole script: about 3-4 minutes
#
# Needs: a CUDA GPU, torch, transformers, nvidia-ml-py and the package's deps (no network).
# Knobs: MODES ("plain leaking fixed"), ROUNDS (4), REQS (30), IDLE (5), CONC (2), DEVICE, PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./.gpuout}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NO_COLOR=1 PYTHONUNBUFFERED=1
MODES=${MODES:-"plain leaking fixed"}
ROUNDS=${ROUNDS:-4}
REQS=${REQS:-30}
IDLE=${IDLE:-5}
CONC=${CONC:-2}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu checks the script itself on a machine without a GPU

{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv || true
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)' || true
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

port=18180
for mode in $MODES; do
  port=$((port + 1))
  log="$OUT/server-$mode.log"
  echo "=== $mode: starting reference server on :$port ($DEVICE)"
  $PY examples/reference_server/server.py --port "$port" --mode "$mode" --device "$DEVICE" >"$log" 2>&1 &
  spid=$!
  for _ in $(seq 1 240); do
    grep -q "listening on" "$log" 2>/dev/null && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.5
  done
  if ! grep -q "listening on" "$log"; then
    echo "server for $mode did not start:"; tail -20 "$log"
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    continue
  fi
  head -1 "$log"
  start=$(date +%s)
  $PY -m vramdoctor soak --url "http://127.0.0.1:$port" --rounds "$ROUNDS" --requests "$REQS" \
      --concurrency "$CONC" --idle "$IDLE" --image-size 448x448 --image-size 896x672 \
      --out "$OUT/soak-$mode.jsonl" --report "$OUT/soak-$mode.html" --json \
      >"$OUT/soak-$mode.json" 2>"$OUT/soak-$mode.stderr"
  rc=$?
  echo "soak exit code $rc after $(( $(date +%s) - start )) s"
  $PY - "$port" >"$OUT/truth-$mode.json" <<'PYEOF'
import json, sys, urllib.request
print(json.dumps(json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/reference/info", timeout=10))))
PYEOF
  $PY -m vramdoctor report "$OUT/soak-$mode.jsonl" --report "$OUT/soak-$mode.png" >"$OUT/report-$mode.txt" 2>&1
  cat "$OUT/report-$mode.txt"
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
done

echo "=== summary"
$PY - "$OUT" $MODES <<'PYEOF' | tee "$OUT/summary.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = []
for mode in sys.argv[2:]:
    try:
        d = json.loads((out / f"soak-{mode}.json").read_text())
    except Exception as exc:
        print(f"{mode:8} no result ({type(exc).__name__})"); continue
    try:
        truth = json.loads((out / f"truth-{mode}.json").read_text())
    except Exception:
        truth = {}
    t = truth.get("leak_bytes_per_request")
    c = d.get("culprit") or {}
    rate = d.get("leak_mib_per_request")
    line = (f"{mode:8} {d['verdict']:13} rate={rate if rate is None else round(rate, 2)} MiB/req "
            f"truth={None if t is None else round(t / 2**20, 2)} MiB/req "
            f"culprit=pid {c.get('pid')} ({c.get('name')}) gpu {c.get('gpu')} layer {c.get('layer')} "
            f"server_pid={truth.get('pid')} processor={truth.get('processor')}")
    print(line)
    settled = {s["key"]: [None if v is None else round(v) for v in s["settled"]] for s in d["series"]
               if s["kind"] in ("gpu", "gpu_process")}
    print("         settled MiB per round:", json.dumps(settled))
    rows.append({"mode": mode, "verdict": d["verdict"], "leak_mib_per_request": rate,
                 "truth_mib_per_request": None if t is None else t / 2**20, "culprit": c,
                 "settled": settled})
(out / "summary.json").write_text(json.dumps(rows, indent=2))
PYEOF
