"""Which references the rewrite agent can trace, and which get a rewrite that gains.

    python benchmarks/rewrite_survey.py ROOT [--device cuda|cpu] [--plain-trace]

For every problem below ROOT: trace the reference with the workloads (and their scalar
values) known, propagate on meta tensors, apply every rewrite family for the device
(``--device cuda``, the default, includes the CUDA-only ``matmul`` family). Prints the
counts, then one line per problem with a gaining rewrite. ``--plain-trace`` traces without
evaluating shape control flow (the tracer before 2026-12-01), for comparison. CPU only: it
runs nothing but meta tensors.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import kernelarc.proposers.rewrite.rewrites as rewrites
from kernelarc.problem.discover import find_problems
from kernelarc.problem.loader import load_problem


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--plain-trace", action="store_true")
    args = ap.parse_args()
    if args.plain_trace:
        plain = rewrites.trace_reference
        rewrites.trace_reference = lambda d, w=None, s=None: plain(d)  # type: ignore[assignment]
    dirs = find_problems(args.root)
    traced, gaining, why = 0, [], collections.Counter()
    for d in dirs:
        p = load_problem(d)
        try:
            r = rewrites.apply_families(
                p.definition,
                [dict(w.axes) for w in p.workloads],
                rewrites.families_for(args.device),
                [w.scalar_inputs() for w in p.workloads],
            )
        except Exception as e:  # counted by its first words: why the agent would skip
            why[str(e)[:70]] += 1
            continue
        traced += 1
        if r.families:
            gaining.append(f"{d.parent.name}/{d.name}: {r.label()}")
    print(f"{len(dirs)} problems; {traced} trace and propagate; {len(gaining)} gain")
    for line in gaining:
        print(" ", line)
    print("not traced, by reason:")
    for reason, n in why.most_common():
        print(f"  {n:3d}  {reason}")


if __name__ == "__main__":
    main()
