#!/usr/bin/env bash
# Issue 4's six problems over device calls, one step per call, with the splits and time
# limits that worked (docs/PERFORMANCE.md, session 43: 393, 347, 508 and 368 s of wall time
# on an H100). Run from the repository root on the device, .whl/ and .devdata/ carried:
#
#   T0=$(date +%s); <pip install, PYTHONPATH: see PERFORMANCE.md>; T0=$T0 bash benchmarks/issue4_calls.sh STEP
#
# STEP 1: L2 025 on workloads 3 and 8, CUPTI off, with its torch.compile baseline
#      2: L2 002
#      3: L1 017, then Q 001
#      4: FIB 002, then FIB 007
#      finish-h200: on an H200 and src SHA-1 b183ead896db only, session 42's four H200 rows
#         completed in one call: L2 025's torch.compile baseline, FIB 002, FIB 007, and the
#         merged table of the six (refused elsewhere: those rows would mix cards or trees).
# LIMIT: the seconds the call may take from T0 (the start of the command: the setup counts;
# default per step below); OUT: the device tool's folder (results go to $OUT/b, at most 8
# files). PLAN_ONLY=1 prints the commands instead of running them (the CPU test's mode).
set -u
step=${1:-}
T0=${T0:-$(date +%s)}
: "${OUT:?set OUT to the folder the results go to (the device tool sets it)}"
H200_ROWS=benchmarks/results/2026-12-07-h200-959a56a
H200_SRC=b183ead896db
run() { if [ "${PLAN_ONLY:-0}" = 1 ]; then echo "+ $*"; else "$@"; fi; }
split() {  # the rest of LIMIT after the setup and anything run before
  local left=$(( LIMIT - ($(date +%s) - T0) ))
  run env OUT="$OUT/b" LIMIT="$left" bash benchmarks/split_calls.sh "$@"
}
case "$step" in
  1) LIMIT=${LIMIT:-588}; split "L2-025:0:110:300:--workloads+3,8+--cupti+off" ;;
  2) LIMIT=${LIMIT:-430}; split "L2-002:0:120:330" ;;
  3) LIMIT=${LIMIT:-590}; split "L1-017:0:100:240" "Q-001:0:15:200" ;;
  # FIB 007 needs about 190 s after FIB 002's 160-170 s (session 43's 405 s cut it short)
  4) LIMIT=${LIMIT:-450}; split "002:0:10:130" "007:0:10:170" ;;
  finish-h200)
    LIMIT=${LIMIT:-588}
    # the hash split_calls.sh prints, and the card: only this step depends on them
    src=$(find src -name '*.py' | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12)
    card=$(command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    if [[ "$card" != *H200* || "$src" != "$H200_SRC" ]]; then
      echo "issue4_calls.sh finish-h200: needs an H200 and src $H200_SRC (here: card" \
        "'${card:-none}', src $src); run steps 1 to 4 instead" >&2
      exit 3
    fi
    run timeout 150 python3 benchmarks/compile_baseline.py \
      .devdata/L2/025_moe_expert_parallel_execution_backward --bench "$H200_ROWS/L2-025.json" \
      --key L2-025 --out "$OUT/L2-025.json" --workloads 3,8 --cupti off --budget 120 \
      || echo "== L2-025 baseline: rc $? (the merge below then stops at its missing file)"
    split "002:0:10:130" "007:0:10:170"
    run rm -f "$OUT"/b/002/trajectory.png "$OUT"/b/007/trajectory.png  # 7 files come back
    run python3 benchmarks/agents_h200.py --merge "$OUT/L2-025.json" "$OUT"/b/00[27]/agents_bench.json \
      "$H200_ROWS/L1-017.json" "$H200_ROWS/L2-002.json" "$H200_ROWS/Q-001.json"
    ;;
  *) echo "issue4_calls.sh: STEP is 1, 2, 3, 4 or finish-h200, not '$step'" >&2; exit 2 ;;
esac
