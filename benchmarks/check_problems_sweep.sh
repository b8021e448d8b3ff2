#!/usr/bin/env bash
# `kernelarc check-problems` over a problem tree in parallel shards, one JSON file per shard.
#
#   benchmarks/check_problems_sweep.sh ROOT OUTDIR [SHARDS] [--workloads smallest] ...
#
# Every problem directory (one holding definition.json) below ROOT goes to one of SHARDS
# (default 6) shard folders (copies under SHARD/<subset folder>/<problem>, so the subset
# still reads from the parent folder's name), round robin in sorted order; each shard runs
# `python3 -m kernelarc check-problems SHARD --json` with the remaining arguments, stdout to
# OUTDIR/check-N.json and its progress to OUTDIR/check-N.log. Then
# `python3 benchmarks/check_problems_table.py OUTDIR/check-*.json` prints the merged table.
set -euo pipefail
case ${1:-} in -h | --help | "") sed -n '2,11p' "$0" | cut -c3-; [ -n "${1:-}" ]; exit;; esac
root=$1 out=${2:?usage: check_problems_sweep.sh ROOT OUTDIR [SHARDS] [check-problems options]} shards=${3:-6}
shift $(( $# >= 3 ? 3 : $# ))
mkdir -p "$out"
tmp=$(mktemp -d)
i=0
while IFS= read -r def; do
  d=$(dirname "$def")
  dest="$tmp/shard-$((i % shards))/$(basename "$(dirname "$d")")"
  mkdir -p "$dest"
  cp -r "$d" "$dest/"
  i=$((i + 1))
done < <(find "$root" -name definition.json | sort)
for s in $(seq 0 $((shards - 1))); do
  [ -d "$tmp/shard-$s" ] || continue
  python3 -m kernelarc check-problems "$tmp/shard-$s" --json "$@" \
    >"$out/check-$s.json" 2>"$out/check-$s.log" &
done
wait || true
rm -rf "$tmp"
