#!/usr/bin/env bash
# The guard's fused comparison pass inside real judgements: the same judgement of one problem
# (judge_cost_probe.py: its reference as the candidate) with the fused Triton pass, then
# with the torch paths only, in one call on one device. Run from the repository root:
#
#   [LIMIT=<seconds for both>] bash benchmarks/fused_ab.sh PROBLEM_DIR [probe options...]
#
# e.g. bash benchmarks/fused_ab.sh .devdata/L2/025_moe_expert_parallel_execution_backward \
#          --workloads 1 --rounds 5 --cupti off
#
# The torch-only side is a copy of src/ and benchmarks/ in a temporary folder with
# guard/compare.py's FUSED_MIN_ELEMS raised past any tensor, so no chunk takes the fused
# pass; the product has no switch for it (the fused pass is not an option, it is the
# comparison). Each side gets half of LIMIT (default 300 s). Prints, per side, the guard's
# phase seconds of the last judgement (`round.compare` is the comparison) and each
# workload's status; the probes' full JSON goes to $OUT/<side>.json (OUT unset: a new
# temporary folder, named first).
# On a CPU both sides take the torch paths (the fused pass is CUDA only): a check that the
# script runs, not a measurement.
set -u
PROBLEM=${1:?usage: fused_ab.sh PROBLEM_DIR [judge_cost_probe.py options]}
shift
[ -d "$PROBLEM" ] || { echo "fused_ab.sh: no problem folder $PROBLEM" >&2; exit 2; }
LIMIT=${LIMIT:-300}
DEST=${OUT:-$(mktemp -d)}
[ -n "${OUT:-}" ] || echo "(the probes' JSON: $DEST)"
AB=$(mktemp -d)
trap 'rm -rf "$AB"' EXIT
cp -r src benchmarks "$AB"/
sed -i 's/^FUSED_MIN_ELEMS = 1 << 20$/FUSED_MIN_ELEMS = 1 << 62/' "$AB/src/kernelarc/guard/compare.py"
grep -q '^FUSED_MIN_ELEMS = 1 << 62$' "$AB/src/kernelarc/guard/compare.py" || {
  echo "fused_ab.sh: FUSED_MIN_ELEMS not found in guard/compare.py; update this script" >&2
  exit 2
}
# the guard's workers inherit PYTHONPATH: the copy must be what `import kernelarc` finds
PYTHONPATH="$AB/src${PYTHONPATH:+:$PYTHONPATH}" python3 -c \
  'import kernelarc.guard.compare as c; assert c.FUSED_MIN_ELEMS == 1 << 62, c.__file__' || exit 2
rc=0
for side in fused torch; do
  root=$PWD
  [ "$side" = torch ] && root=$AB
  echo "== $side"
  t=$(date +%s)
  PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" timeout $(( LIMIT / 2 )) \
    python3 "$root/benchmarks/judge_cost_probe.py" "$PROBLEM" "$@" \
    > "$DEST/$side.json" 2> "$DEST/$side.err"
  probe_rc=$?
  echo "rc $probe_rc in $(( $(date +%s) - t )) s"
  [ "$probe_rc" -eq 0 ] || rc=1  # a probe that failed or ran out of time fails the script
  python3 - "$DEST/$side.json" <<'PY' || { tail -5 "$DEST/$side.err"; rc=1; }
import json, sys
d = json.load(open(sys.argv[1]))
print("setup", d["guard_setup_s"], "s; evaluate", d["evaluate_wall_s"], "s")
print("phases", json.dumps(d["phases_s"][-1]))
for w in d["workloads"]:
    print(" ", w["axes"], w["status"], w["latency_ms"], "ms", w["notes"][:1])
PY
done
exit $rc
