"""Merge the JSON files of ``kernelarc check-problems --json`` into one markdown table.

    python benchmarks/check_problems_table.py OUT/check-*.json

Prints a summary per subset (ok / failed, and failures per category), then one row per
failed problem (subset, name, category, reason) and the count of problems that ran.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def main(paths: list[str]) -> None:
    rows = []
    for p in paths:
        text = Path(p).read_text()
        if not text.strip():
            print(f"{p}: empty (the shard crashed or timed out; see its .log)")
            continue
        rows += json.loads(text)
    by_subset: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in rows:
        c = by_subset[r.get("subset") or "-"]
        c["problems"] += 1
        c["ok" if r["status"] == "ok" else f"failed: {r.get('category')}"] += 1
    print("| subset | problems | ok | failures by category |\n|---|---|---|---|")
    for subset, c in sorted(by_subset.items()):
        fails = ", ".join(f"{k[8:]} {v}" for k, v in sorted(c.items()) if k.startswith("failed"))
        print(f"| {subset} | {c['problems']} | {c['ok']} | {fails or '-'} |")
    total_ok = sum(c["ok"] for c in by_subset.values())
    print(f"\n{total_ok}/{len(rows)} problems ran their reference.\n")
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        print("| subset | problem | category | reason |\n|---|---|---|---|")
        for r in sorted(failed, key=lambda r: (r.get("subset") or "", r["name"])):
            reason = str(r.get("reason") or "").replace("|", "\\|")[:160]
            print(f"| {r.get('subset')} | {r['name']} | {r.get('category')} | {reason} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="the shards' check-N.json files")
    main(ap.parse_args().files)
