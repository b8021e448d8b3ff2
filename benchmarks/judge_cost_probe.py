"""What one judgement of a problem's reference costs, phase by phase, on few workloads.

    python benchmarks/judge_cost_probe.py PROBLEM_DIR [--workloads 1] [--rounds 1]
        [--iterations 3] [--device cuda]

The reference itself is the candidate (an honest solution, so every workload should pass);
``--workloads N`` takes the N smallest by input size. Prints the guard's phase times
(worker start, build, correctness, timing) and per-workload latencies, to say whether the
search's full protocol fits in a time limit before spending one on it (e.g. problems with
gigabytes of outputs: every correctness round moves them from the worker to the judge).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.guard.evaluator import Guard, GuardConfig  # noqa: E402
from kernelarc.problem.inputs import estimate_input_bytes  # noqa: E402
from kernelarc.problem.loader import load_problem  # noqa: E402
from kernelarc.proposers.builtin import reference_solution  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem", type=Path)
    ap.add_argument("--workloads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--cupti", choices=["auto", "on", "off"], default="auto")
    args = ap.parse_args()
    problem = load_problem(args.problem)
    d = problem.definition
    wls = sorted(problem.workloads, key=lambda w: estimate_input_bytes(d, w))[: args.workloads]
    solution = reference_solution(
        d, agent="probe", description="The reference as a candidate (judge cost probe)."
    )
    cfg = GuardConfig(
        device=args.device,
        rounds=args.rounds,
        warmup=args.warmup,
        iterations=args.iterations,
        timeout=args.timeout,
        warm_spare=False,
        cupti=args.cupti,
    )
    t0 = time.monotonic()
    with Guard(problem, cfg) as guard:
        setup = time.monotonic() - t0
        res = guard.evaluate(solution, wls)
    total = time.monotonic() - t0
    rows = [
        {
            "axes": o.workload.axes,
            "status": o.status.value,
            "latency_ms": o.latency_ms,
            "reference_ms": o.reference_ms,
            "log": (o.log or "")[:300],
        }
        for o in res.outcomes
    ]
    report = {
        "problem": d.name,
        "guard_setup_s": round(setup, 2),
        "evaluate_wall_s": round(res.wall_s, 2),
        "total_s": round(total, 2),
        "phases_s": {k: round(v, 2) for k, v in res.phases_s.items()},
        "config": {
            "cupti": args.cupti,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "iterations": args.iterations,
        },
        "workloads": rows,
    }
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
