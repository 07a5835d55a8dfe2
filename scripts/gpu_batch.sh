#!/usr/bin/env bash
# One device call's worth of the GPU checks the open issues need (#21, #22, #24, #25), as run in
# the session of 2026-12-01 (docs/gpu-results.md, "Third session"). Run from the repository root
# on the GPU machine with .whl/ and .whl-serve/ carried; results as a few tarballs in $OUT.
#
#   bash scripts/gpu_batch.sh parallel     # checks that tolerate other processes on the GPU, in
#                                          # 8 lanes at once (each server judged by its own pids)
#   bash scripts/gpu_batch.sh abtest       # ab-test --server and soak --launch: alone on the GPU
#                                          # (ab-test stops when a process it did not start appears)
#   bash scripts/gpu_batch.sh alone        # showcase, NVML sources/census, ab-test GPU tests: alone
#   bash scripts/gpu_batch.sh final        # the reruns: transformers serve's ab-test alone, then
#                                          # the soaks in parallel again (after the NVML-scope fix)
#   bash scripts/gpu_batch.sh session4     # GPU tests alone, then every soak in lanes (2026-12-02)
#   bash scripts/gpu_batch.sh session4b    # the reruns after session4's fixes (2026-12-02)
#   bash scripts/gpu_batch.sh session4c    # the growth-model reruns and allocator-read timings
#
# Knobs: BUDGET_S (550: every lane is cut at this many seconds), W (/tmp/w: work folder).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${W:-/tmp/w}; mkdir -p "$W"
BUDGET_S=${BUDGET_S:-550}
T0=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1; then
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
if ls .whl-serve/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site-serve ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-serve .whl-serve/*.whl
fi
export PYTHONUNBUFFERED=1 NO_COLOR=1 COLUMNS=160
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }

{
  date -u; uname -r; nproc
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
  python3 -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)'
  git log --oneline -1 2>/dev/null || true
} >"$W/environment_$1.txt" 2>&1
cat "$W/environment_$1.txt"

lane() {  # lane NAME CMD...: one lane, cut at the budget, its log in $W/NAME.log
  local name=$1; shift
  ( s=$(date +%s); timeout "$(left)" "$@" >"$W/$name.log" 2>&1; rc=$?
    echo "[lane $name] exit $rc after $(( $(date +%s) - s )) s" | tee -a "$W/$name.log" ) &
}

pack() {  # pack TAR DIR...: DIRs under $W into $OUT/TAR.tar.gz, without model weights
  local tar=$1; shift
  tar czf "$OUT/$tar.tar.gz" -C "$W" --exclude='tinyvlm*' --exclude='hf-cache' --exclude='*.safetensors' "$@" 2>/dev/null
}

case ${1:-} in
parallel)
  M21=scripts/gpu_soak_modes21.sh
  lane vc1 env OUT="$W/vc1" RUNS="vary-vram vary-every cycle-sleep cycle-sleep-ok cycle-release" bash scripts/gpu_soak_vary_cycle.sh
  lane vc2 env OUT="$W/vc2" RUNS="cycle-lora conv-vram bg-vram retention tenant" bash scripts/gpu_soak_vary_cycle.sh
  lane m21a env OUT="$W/m21a" RUNS="retention:agent retention:noagent host-leak:agent host-leak:noagent conv-host:agent conv-host:noagent" bash $M21
  lane m21b env OUT="$W/m21b" RUNS="conv-vram:agent conv-vram:noagent bg-host:agent bg-host:noagent bg-vram:agent bg-vram:noagent restart-sup:noagent" bash $M21
  lane m21c env OUT="$W/m21c" RUNS="vram-leak:agent vram-leak:noagent tenant:agent tenant:noagent restart:agent restart:noagent restart-sup:agent" bash $M21
  lane m21d env OUT="$W/m21d" RUNS="tserve:agent tserve:noagent tserve-leak:agent tserve-leak:noagent two-servers:agent two-servers:noagent" bash $M21
  mkdir -p "$W/attr"
  lane attr env OUT="$W/attr" ATTR_SERVE_SITE=/tmp/site-serve bash scripts/gpu_attribute.sh inside mempool torch214
  mkdir -p "$W/pytest1"
  lane pytest1 python3 -m pytest -p no:cacheprovider -m gpu -rA --junitxml="$W/pytest1/junit.xml" \
      tests/fixes/test_fixes_gpu.py tests/abtest/test_abtest_gpu.py tests/abtest/test_abtest_ipc_gpu.py \
      tests/agent/test_agent_gpu.py tests/soak/test_soak_vary_cycle_gpu.py
  wait
  cp "$W"/*.log "$W/environment_parallel.txt" "$W/pytest1/" 2>/dev/null
  pack soaks vc1 vc2 m21a m21b m21c m21d
  pack attr attr pytest1
  for d in vc1 vc2; do echo "##### $d"; sed -n '/=== summary/,$p' "$W/$d.log"; done
  for d in m21a m21b m21c m21d; do echo "##### $d"; cat "$W/$d/modes21_summary.txt" 2>/dev/null || tail -5 "$W/$d.log"; done
  echo "##### attr"; tail -12 "$W/attr.log"
  echo "##### pytest1"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$W/pytest1.log" | tail -30 ;;
abtest)
  mkdir -p "$W/ab"
  ( timeout "$(left)" env OUT="$W/ab" ROUNDS=4 REQS=16 IDLE=2 bash scripts/gpu_abtest_server.sh ref-leak tserve launch ref-cache \
      >"$W/ab.log" 2>&1; echo "[abtest] exit $?" >>"$W/ab.log" )
  cp "$W/ab.log" "$W/environment_abtest.txt" "$W/ab/"
  pack abtest ab
  cp "$W/ab/abtest_gpu.md" "$OUT/" 2>/dev/null
  grep -E "^=== |: exit |wall time|leftover|^\[abtest\]" "$W/ab.log" ;;
alone)
  mkdir -p "$W/alone/pytest2"
  ( timeout 200 env OUT="$W/alone" bash scripts/gpu_attribute.sh showcase >"$W/showcase.log" 2>&1; echo "[showcase] exit $?" >>"$W/showcase.log" )
  ( timeout 150 env OUT="$W/alone" bash benchmarks/sources_gpu_check.sh >"$W/sources.log" 2>&1; echo "[sources] exit $?" >>"$W/sources.log" )
  ( timeout "$(left)" python3 -m pytest -p no:cacheprovider -m gpu -rA --junitxml="$W/alone/pytest2/junit.xml" \
      tests/abtest/test_abtest_server_gpu.py >"$W/pytest2.log" 2>&1; echo "[pytest2] exit $?" >>"$W/pytest2.log" )
  cp "$W"/*.log "$W/environment_alone.txt" "$W/alone/" 2>/dev/null
  pack alone alone
  tail -8 "$W/showcase.log"; tail -25 "$W/sources.log"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$W/pytest2.log" | tail ;;
final)  # the reruns after the first three calls: transformers serve's ab-test alone, then in
        # parallel every soak that the missing NVML scope (fixed in soak/session.py) had spoiled
  PYTHONPATH=/tmp/site-serve:$PYTHONPATH python3 -c "import fastapi, uvicorn, openai, transformers.cli.serving; print('serving extras import: ok')" \
      >"$W/serve_check.txt" 2>&1; cat "$W/serve_check.txt" | tail -3
  mkdir -p "$W/ab2"
  if grep -q "import: ok" "$W/serve_check.txt"; then
    ( timeout 250 env OUT="$W/ab2" ROUNDS=4 REQS=12 IDLE=2 bash scripts/gpu_abtest_server.sh tserve >"$W/ab2.log" 2>&1
      echo "[abtest tserve] exit $?" >>"$W/ab2.log" )
  fi
  M21=scripts/gpu_soak_modes21.sh
  K=(env REQS=12 IDLE=2.5)
  lane vc1 env OUT="$W/vc1" REQS=8 RUNS="vary-vram vary-every cycle-sleep cycle-sleep-ok cycle-release" bash scripts/gpu_soak_vary_cycle.sh
  lane vc2 env OUT="$W/vc2" REQS=8 RUNS="cycle-lora conv-vram bg-vram retention tenant" bash scripts/gpu_soak_vary_cycle.sh
  lane m21a "${K[@]}" OUT="$W/m21a" RUNS="retention:agent retention:noagent host-leak:agent host-leak:noagent conv-host:agent conv-host:noagent" bash $M21
  lane m21b "${K[@]}" OUT="$W/m21b" RUNS="conv-vram:agent conv-vram:noagent bg-host:agent bg-host:noagent bg-vram:agent bg-vram:noagent" bash $M21
  lane m21c "${K[@]}" OUT="$W/m21c" RUNS="vram-leak:agent vram-leak:noagent tenant:agent tenant:noagent restart:agent restart:noagent" bash $M21
  lane m21d "${K[@]}" OUT="$W/m21d" RUNS="tserve:agent tserve:noagent tserve-leak:agent tserve-leak:noagent" bash $M21
  lane m21e "${K[@]}" OUT="$W/m21e" RUNS="two-servers:agent two-servers:noagent restart-sup:agent restart-sup:noagent" bash $M21
  mkdir -p "$W/attr" "$W/pytest3"
  lane attr env OUT="$W/attr" bash scripts/gpu_attribute.sh inside mempool
  lane pytest3 python3 -m pytest -p no:cacheprovider -m gpu -rA --junitxml="$W/pytest3/junit.xml" \
      tests/agent/test_agent_gpu.py tests/soak/test_soak_vary_cycle_gpu.py
  wait
  cp "$W"/*.log "$W"/*.txt "$W/pytest3/" 2>/dev/null
  pack final-soaks vc1 vc2 m21a m21b m21c m21d m21e
  pack final-rest ab2 attr pytest3
  grep -E "^=== |: exit |wall time|leftover|^\[abtest" "$W/ab2.log" 2>/dev/null
  for d in vc1 vc2; do echo "##### $d"; sed -n '/=== summary/,$p' "$W/$d.log" | cut -c1-400; done
  for d in m21a m21b m21c m21d m21e; do echo "##### $d"; grep -v "note:" "$W/$d/modes21_summary.txt" 2>/dev/null | cut -c1-330 || tail -5 "$W/$d.log"; done
  echo "##### pytest3"; grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest3.log" | tail ;;
session4)  # 2026-12-02: the GPU tests that need the GPU to themselves first (the agent's first
          # memory_stats is timed), then every soak again in lanes: the host rule of #21.1, the
          # agent's PLT check (a02cb93), contrast's NVML scope and the cycle hold (#25)
  mkdir -p "$W/pytest4" "$W/pytest5"
  ( timeout 200 python3 -m pytest -p no:cacheprovider -m gpu -rA --junitxml="$W/pytest4/junit.xml" \
      tests/agent/test_agent_gpu.py tests/fixes/test_fixes_gpu.py tests/abtest/test_abtest_gpu.py \
      tests/sources/test_sources_nvml.py tests/census/test_leftovers_gpu.py >"$W/pytest4.log" 2>&1
    echo "[pytest4] exit $?" >>"$W/pytest4.log" )
  M21=scripts/gpu_soak_modes21.sh
  K=(env REQS=12 IDLE=2.5)
  lane vc1 env OUT="$W/vc1" REQS=8 RUNS="vary-vram vary-every cycle-sleep cycle-sleep-ok cycle-release" bash scripts/gpu_soak_vary_cycle.sh
  lane vc2 env OUT="$W/vc2" REQS=8 RUNS="cycle-lora conv-vram bg-vram retention tenant" bash scripts/gpu_soak_vary_cycle.sh
  lane m21a "${K[@]}" OUT="$W/m21a" RUNS="retention:agent retention:noagent host-leak:agent host-leak:noagent conv-host:agent conv-host:noagent" bash $M21
  lane m21b "${K[@]}" OUT="$W/m21b" RUNS="conv-vram:agent conv-vram:noagent bg-host:agent bg-host:noagent bg-vram:agent bg-vram:noagent" bash $M21
  lane m21c "${K[@]}" OUT="$W/m21c" RUNS="vram-leak:agent vram-leak:noagent tenant:agent tenant:noagent restart:agent restart:noagent" bash $M21
  lane m21d "${K[@]}" OUT="$W/m21d" RUNS="tserve:agent tserve:noagent tserve-leak:agent tserve-leak:noagent" bash $M21
  lane m21e "${K[@]}" OUT="$W/m21e" RUNS="two-servers:agent two-servers:noagent restart-sup:agent restart-sup:noagent" bash $M21
  lane pytest5 python3 -m pytest -p no:cacheprovider -m gpu -rA --junitxml="$W/pytest5/junit.xml" \
      tests/soak/test_soak_vary_cycle_gpu.py
  wait
  cp "$W"/*.log "$W"/*.txt "$W/pytest4/" 2>/dev/null
  pack s4-soaks vc1 vc2 m21a m21b m21c m21d m21e
  pack s4-rest pytest4 pytest5
  echo "##### pytest4"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|\[pytest4\]" "$W/pytest4.log" | tail -40
  for d in vc1 vc2; do echo "##### $d"; sed -n '/=== summary/,$p' "$W/$d.log" | cut -c1-400; done
  for d in m21a m21b m21c m21d m21e; do echo "##### $d"; grep -v "note:" "$W/$d/modes21_summary.txt" 2>/dev/null | cut -c1-330 || tail -5 "$W/$d.log"; done
  echo "##### pytest5"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$W/pytest5.log" | tail ;;
session4b)  # 2026-12-02, after call 1's fixes: the first allocator read timed in a fresh
           # process; the GPU tests alone (agent, --vary/--cycle, ab-test --server); then the
           # soaks the fixes touch (handover successor, transformers serve's blocks, sleep and
           # release returning memory to the driver) in lanes
  mkdir -p "$W/pytest6"
  python3 scripts/gpu_first_snapshot.py >"$W/first_snapshot.json" 2>&1; python3 scripts/gpu_first_snapshot.py >>"$W/first_snapshot.json" 2>&1
  ( timeout 330 python3 -m pytest -p no:cacheprovider -m gpu -rA --junitxml="$W/pytest6/junit.xml" \
      tests/agent/test_agent_gpu.py tests/soak/test_soak_vary_cycle_gpu.py tests/abtest/test_abtest_server_gpu.py \
      >"$W/pytest6.log" 2>&1; echo "[pytest6] exit $?" >>"$W/pytest6.log" )
  M21=scripts/gpu_soak_modes21.sh
  K=(env REQS=12 IDLE=2.5)
  lane vc1 env OUT="$W/vc1" REQS=8 RUNS="cycle-sleep cycle-sleep-ok cycle-release vary-vram" bash scripts/gpu_soak_vary_cycle.sh
  lane m21a "${K[@]}" OUT="$W/m21a" RUNS="restart:agent restart:noagent restart-sup:agent" bash $M21
  lane m21b "${K[@]}" OUT="$W/m21b" RUNS="tserve:agent tserve:noagent tserve-leak:agent" bash $M21
  lane m21c "${K[@]}" OUT="$W/m21c" RUNS="retention:agent retention:noagent host-leak:agent" bash $M21
  lane m21d "${K[@]}" OUT="$W/m21d" RUNS="host-leak:noagent bg-vram:noagent bg-host:agent" bash $M21
  wait
  cp "$W"/*.log "$W"/*.txt "$W"/*.json "$W/pytest6/" 2>/dev/null
  pack s4b-soaks vc1 m21a m21b m21c m21d
  pack s4b-rest pytest6
  echo "##### first snapshot"; cat "$W/first_snapshot.json"
  echo "##### pytest6"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|\[pytest6\]" "$W/pytest6.log" | tail -20
  echo "##### vc1"; sed -n '/=== summary/,$p' "$W/vc1.log" | cut -c1-400
  for d in m21a m21b m21c m21d; do echo "##### $d"; grep -v "note:" "$W/$d/modes21_summary.txt" 2>/dev/null | grep -v "^    kv:" | cut -c1-300 || tail -5 "$W/$d.log"; done ;;
session4c)  # 2026-12-02, after call 2: the allocator reads with the agent's history armed;
           # the host modes whose verdicts the growth-model changes touch, with rounds to spare
  for a in "plain 300" "history 300" "history 3000"; do python3 scripts/gpu_first_snapshot.py $a; done >"$W/first_snapshot.json" 2>&1
  M21=scripts/gpu_soak_modes21.sh
  K=(env REQS=12 IDLE=2.5 MAXR=12)
  lane m21a "${K[@]}" OUT="$W/m21a" RUNS="host-leak:agent retention:agent" bash $M21
  lane m21b "${K[@]}" OUT="$W/m21b" RUNS="host-leak:noagent retention:noagent" bash $M21
  lane m21c "${K[@]}" OUT="$W/m21c" RUNS="vram-leak:agent tserve:agent tserve-leak:agent" bash $M21
  lane m21d "${K[@]}" OUT="$W/m21d" RUNS="conv-host:agent conv-vram:agent bg-host:agent" bash $M21
  mkdir -p "$W/pytest7"
  lane pytest7 python3 -m pytest -p no:cacheprovider -m gpu -rA --junitxml="$W/pytest7/junit.xml" tests/agent/test_agent_gpu.py
  wait
  cp "$W"/*.log "$W"/*.json "$W/pytest7/" 2>/dev/null
  pack s4c-soaks m21a m21b m21c m21d
  pack s4c-rest pytest7
  echo "##### first snapshot"; cat "$W/first_snapshot.json"
  echo "##### pytest7"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$W/pytest7.log" | tail
  for d in m21a m21b m21c m21d; do echo "##### $d"; grep -v "note:" "$W/$d/modes21_summary.txt" 2>/dev/null | grep -v "^    kv:" | cut -c1-300 || tail -5 "$W/$d.log"; done ;;
*) echo "usage: gpu_batch.sh parallel|abtest|alone|final|session4|session4b|session4c"; exit 2 ;;
esac
echo "batch $1 done in $(( $(date +%s) - T0 )) s"; ls -la "$OUT"
