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
#      (The finish-h200 steps that completed the H200 table with session 42's rows ran in
#      session 45 from d2026c5's tree and were removed after: docs/PERFORMANCE.md.)
# LIMIT: the seconds the call may take from T0 (the start of the command: the setup counts;
# default per step below); OUT: the device tool's folder (results go to $OUT/b, at most 8
# files). PLAN_ONLY=1 prints the commands instead of running them (the CPU test's mode).
set -u
step=${1:-}
T0=${T0:-$(date +%s)}
: "${OUT:?set OUT to the folder the results go to (the device tool sets it)}"
run() { if [ "${PLAN_ONLY:-0}" = 1 ]; then echo "+ $*"; else "$@"; fi; }
split() {  # the rest of LIMIT after the setup and anything run before
  local left=$(( LIMIT - ($(date +%s) - T0) ))
  run env OUT="$OUT/b" LIMIT="$left" bash benchmarks/split_calls.sh "$@"
}
case "$step" in
  1) LIMIT=${LIMIT:-588}; split "L2-025:0:110:300:--workloads+3,8+--cupti+off" ;;
  2) LIMIT=${LIMIT:-430}; split "L2-002:0:120:330" ;;
  3) LIMIT=${LIMIT:-590}; split "L1-017:0:100:240" "Q-001:0:15:200" ;;
  # FIB 002 took 160-215 s and FIB 007 needs about 260 s for its 240 s and confirmation
  # (405 s in session 43 and 450 s in session 44 cut it short)
  4) LIMIT=${LIMIT:-595}; split "002:0:10:130" "007:0:10:170" ;;
  *) echo "issue4_calls.sh: STEP is 1, 2, 3 or 4, not '$step'" >&2; exit 2 ;;
esac
