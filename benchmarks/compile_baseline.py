"""A solution vs the eager reference vs torch.compile of the reference, in one guard session.

    python benchmarks/compile_baseline.py PROBLEM_DIR SOLUTION.json [--sample 2] [--device cuda]

The same protocol as the last step of ``agents_h200.py`` (``--sample`` workloads spread over
the input sizes; 0 = all), for a solution judged earlier (e.g. the best solution of a search
whose call ran out of time before its baseline). Prints one row per workload and the
geometric means.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agents_h200 import compile_baseline, geomean


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem", type=Path)
    ap.add_argument("solution", type=Path)
    ap.add_argument("--sample", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    res = compile_baseline(args.problem, args.solution, args.sample, args.device)
    print(json.dumps(res, indent=1, default=str))
    ok = [
        w
        for w in res["workloads"]
        if w["status"] == "PASSED" and w["latency_ms"] and w["compiled_ms"] and w["reference_ms"]
    ]
    print(
        f"\n{'ours ms':>10s} {'eager ms':>10s} {'compile ms':>11s} "
        f"{'vs eager':>9s} {'vs compile':>11s}"
    )
    for w in ok:
        print(
            f"{w['latency_ms']:10.4f} {w['reference_ms']:10.4f} {w['compiled_ms']:11.4f} "
            f"{w['reference_ms'] / w['latency_ms']:8.2f}x "
            f"{w['compiled_ms'] / w['latency_ms']:10.2f}x"
        )
    ve = geomean([w["reference_ms"] / w["latency_ms"] for w in ok])
    vc = geomean([w["compiled_ms"] / w["latency_ms"] for w in ok])
    print(
        f"geomean over {len(ok)}/{len(res['workloads'])}: vs eager {ve}, vs compile {vc}; "
        f"wall {res['wall_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
