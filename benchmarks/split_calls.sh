#!/usr/bin/env bash
# Issue 4's benchmark one problem at a time within one device call's time (the six problems
# do not fit one call: docs/PERFORMANCE.md). Run from the repository root on the device:
#
#   LIMIT=<seconds this call may take> [PROBLEMS=.devdata] [OUT=<dir>] \
#       bash benchmarks/split_calls.sh "ID:COMPILE_SAMPLE:COMPILE_EST:MIN_START[:EXTRA]" ...
#
# ID is a key of agents_h200.py's SIX (007, 002, L1-017, L2-002, Q-001, L2-025);
# COMPILE_SAMPLE its --compile-sample (0: all workloads); COMPILE_EST the seconds kept for the
# torch.compile baseline after the search, its --compile-budget (agents_h200.py's --deadline,
# past which the baseline is not started, is the SIGTERM's time, below, minus this, minus 5:
# a baseline that starts ends before the SIGTERM; one that would not fit is skipped instead
# of started and killed);
# MIN_START the fewest seconds left to start it at all (46 at least); EXTRA more
# agents_h200.py options, '+' standing for spaces (e.g. --workloads+3,8+--cupti+off). Each
# problem writes $OUT/ID/agents_bench.json and a report; the merged table is printed last. A
# problem still running 45 s before the call's end gets SIGTERM: its search stops and its
# row is kept.
set -u
: "${LIMIT:?set LIMIT to the seconds this call may take}"
: "${OUT:?set OUT to the folder the results go to (the device tool sets it)}"
PROBLEMS=${PROBLEMS:-.devdata}
# every spec checked before the first runs: a typo in the last must not surface minutes in
for spec in "$@"; do
  IFS=: read -r id cs cest minstart extra <<< "$spec"
  if [ -z "$id" ] || ! [[ "$cs" =~ ^[0-9]+$ && "$cest" =~ ^[0-9]+$ && "$minstart" =~ ^[0-9]+$ ]]; then
    echo "split_calls.sh: '$spec' is not ID:COMPILE_SAMPLE:COMPILE_EST:MIN_START[:EXTRA]" \
      "with whole seconds (e.g. L2-002:0:120:330)" >&2
    exit 2
  fi
done
T0=$(date +%s)
# run directories of this call's own: a warm machine keeps /tmp between calls, and a
# problem run again there was refused ("run-Q-001 exists", session 33)
RUNS=$(mktemp -d /tmp/ka-runs.XXXXXX)
echo "src SHA-1 $(find src -name '*.py' | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12)"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
for spec in "$@"; do
  IFS=: read -r id cs cest minstart extra <<< "$spec"
  left=$(( LIMIT - ($(date +%s) - T0) ))
  # at least 46 s: the SIGTERM comes 45 s before the end ("timeout 0" would never send it)
  [ "$minstart" -lt 46 ] && minstart=46
  if [ "$left" -lt "$minstart" ]; then echo "== $id: skipped, $left s left < $minstart"; continue; fi
  term=$(( left - 45 ))
  # the baseline ends before the SIGTERM: with "left - cest - 5" it could be started and
  # killed 40 s short of its estimate (session 42: L2 025's, 105 s of device time lost)
  dl=$(( term - cest - 5 ))
  echo "== $id: $left s left, deadline $dl, SIGTERM at $term"
  t=$(date +%s)
  # SIGTERM 45 s before the call's end stops the search and keeps its row; SIGKILL 20 s
  # later if it has not exited; the report gets the last 20 s
  timeout -k 20 "$term" python3 benchmarks/agents_h200.py --problems "$PROBLEMS" --only "$id" \
    --budget 16 --time-limit 240 --compile-sample "$cs" --compile-budget "$cest" \
    --deadline "$dl" --out "$OUT/$id" --runs-dir "$RUNS" ${extra//+/ }
  echo "== $id: rc $? in $(( $(date +%s) - t )) s"
  [ -d "$RUNS/run-$id" ] && timeout 20 python3 -m kernelarc.cli.main report "$RUNS/run-$id" \
    -o "$OUT/$id/report.md" > /dev/null 2>&1 || echo "(no report for $id)"
done
rmdir "$RUNS" 2> /dev/null  # kept when a problem ran: its run directory, for a look later
ls "$OUT"/*/agents_bench.json > /dev/null 2>&1 && python3 benchmarks/agents_h200.py --merge "$OUT"/*/agents_bench.json
exit 0
