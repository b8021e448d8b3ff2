"""What one judgement of a problem's reference costs, phase by phase, on few workloads.

    python benchmarks/judge_cost_probe.py PROBLEM_DIR [--workloads 1] [--rounds 1]
        [--iterations 3] [--device cuda] [--solution SOLUTION.json] [--repeat 1]

The reference itself is the candidate (an honest solution, so every workload should pass),
or ``--solution``'s; ``--repeat N`` judges it N times in one guard (later ones reuse the
cached reference timings, as the search's later candidates do);
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
from kernelarc.problem.loader import load_problem, load_solution  # noqa: E402
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
    ap.add_argument("--solution", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--files", action="store_true", help="outputs through files, not CUDA IPC")
    args = ap.parse_args()
    problem = load_problem(args.problem)
    d = problem.definition
    wls = sorted(problem.workloads, key=lambda w: estimate_input_bytes(d, w))[: args.workloads]
    if args.solution is not None:
        solution = load_solution(args.solution)
    else:
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
        gpu_exchange=not args.files,
    )
    t0 = time.monotonic()
    results = []
    with Guard(problem, cfg) as guard:
        setup = time.monotonic() - t0
        for _ in range(max(1, args.repeat)):
            results.append(guard.evaluate(solution, wls))
        exchange = "cuda-ipc" if guard.gpu_exchange else "files"
    total = time.monotonic() - t0
    res = results[-1]
    rows = [
        {
            "axes": o.workload.axes,
            "status": o.status.value,
            "latency_ms": o.latency_ms,
            "reference_ms": o.reference_ms,
            "pool": (o.latency or {}).get("pool"),
            "timed_calls": (o.latency or {}).get("n"),
            "timing_method": (o.latency or {}).get("method"),
            "reference_phases_s": (o.reference or {}).get("phases_s"),
            "notes": o.notes[:4],
            "log": (o.log or "")[:300],
        }
        for o in res.outcomes
    ]
    report = {
        "problem": d.name,
        "solution": solution.name,
        "guard_setup_s": round(setup, 2),
        "evaluate_wall_s": [round(r.wall_s, 2) for r in results],
        "total_s": round(total, 2),
        "exchange": exchange,
        "phases_s": [{k: round(v, 2) for k, v in r.phases_s.items()} for r in results],
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
