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
#      finish-h200: on an H200 and src SHA-1 b183ead896db only (refused elsewhere, exit 3:
#         the rows would mix cards or trees), the first of two calls completing session 42's
#         four H200 rows: L2 025's torch.compile baseline and FIB 002;
#      finish-h200-007: the second, on the same terms: FIB 007 with time for its full 240 s
#         and its confirmation (session 44: 233 s left after FIB 002 in one call cut it
#         short), then the merged table of the six. PREV is a folder of the tree holding the
#         first call's b/002/agents_bench.json (required) and L2-025.json (without it FIB 007
#         still runs and the merge stops at the missing file);
#      finish-h200-all: both in one call of up to 590 s (FIB 007 gets what FIB 002 and the
#         baseline leave: about 290 s where they take 300 s), PREV being this call's OUT.
#      The finish-h200 steps ran in session 45 (PERFORMANCE.md), from a copy of d2026c5's
#         tree (git archive d2026c5 into .frozen/, carried): src has changed since, so from
#         the repository root they now refuse (exit 3); steps 1 to 4 run on any src.
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
  # FIB 002 took 160-215 s and FIB 007 needs about 260 s for its 240 s and confirmation
  # (405 s in session 43 and 450 s in session 44 cut it short)
  4) LIMIT=${LIMIT:-595}; split "002:0:10:130" "007:0:10:170" ;;
  finish-h200-all)
    T0=$T0 LIMIT=${LIMIT_A:-430} bash "$0" finish-h200 || exit
    run rm -f "$OUT/b/002/trajectory.png"  # at most 8 files come back: 1 + 3 + 4
    T0=$T0 LIMIT=${LIMIT:-590} PREV=$OUT bash "$0" finish-h200-007 || exit
    run rm -f "$OUT/b/007/trajectory.png"
    ;;
  finish-h200 | finish-h200-007)
    # the hash split_calls.sh prints, and the card: only these steps depend on them
    src=$(find src -name '*.py' | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12)
    card=$(command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    if [[ "$card" != *H200* || "$src" != "$H200_SRC" ]]; then
      echo "issue4_calls.sh $step: needs an H200 and src $H200_SRC (here: card" \
        "'${card:-none}', src $src); run steps 1 to 4 instead" >&2
      exit 3
    fi
    if [ "$step" = finish-h200 ]; then
      LIMIT=${LIMIT:-430}
      run timeout 150 python3 benchmarks/compile_baseline.py \
        .devdata/L2/025_moe_expert_parallel_execution_backward --bench "$H200_ROWS/L2-025.json" \
        --key L2-025 --out "$OUT/L2-025.json" --workloads 3,8 --cupti off --budget 120 \
        || echo "== L2-025 baseline: rc $? (finish-h200-007's merge then stops at its missing file)"
      split "002:0:10:130"
      exit 0
    fi
    : "${PREV:?set PREV to the folder holding the L2-025.json and b/002/ of finish-h200}"
    # FIB 002's row is needed; without L2 025's baseline (it can fail) FIB 007 still runs and
    # the merge stops at the missing file. FIB 002's is checked when run, not when planned.
    f=$PREV/b/002/agents_bench.json
    if [ ! -f "$f" ] && [ "${PLAN_ONLY:-0}" != 1 ]; then
      echo "issue4_calls.sh $step: $f is missing (finish-h200's output)" >&2; exit 2
    fi
    [ -f "$PREV/L2-025.json" ] || echo "== $PREV/L2-025.json is missing: FIB 007 runs, the merge will stop at it"
    LIMIT=${LIMIT:-590}
    split "007:0:10:170"
    run python3 benchmarks/agents_h200.py --merge "$PREV/L2-025.json" "$PREV/b/002/agents_bench.json" \
      "$OUT/b/007/agents_bench.json" "$H200_ROWS/L1-017.json" "$H200_ROWS/L2-002.json" \
      "$H200_ROWS/Q-001.json"
    ;;
  *) echo "issue4_calls.sh: STEP is 1, 2, 3, 4, finish-h200, finish-h200-007 or finish-h200-all, not '$step'" >&2; exit 2 ;;
esac
