"""The reference judged as a candidate against itself, per search stage (a fairness probe).

    python benchmarks/self_ratio_probe.py [PROBLEM_DIR] [--guards 3] [--workloads 3]
        [--device cpu]

In each of ``--guards`` fresh ``Guard`` sessions, the reference's own code is judged as a
candidate on the first ``--workloads`` workloads, first with the search's screening
protocol (3 rounds, 3 warm-up + 10 timed calls) and then with the full protocol, both in
one candidate worker as the search does. Prints per stage the median and all readings of
reference_ms / candidate_ms: 1.0 means the guard times both sides alike; below 1 it
favours the reference. Default problem: the bundled RMSNorm example.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.examples import example_dir  # noqa: E402
from kernelarc.guard.evaluator import Guard, GuardConfig  # noqa: E402
from kernelarc.orchestration.config import RunConfig  # noqa: E402
from kernelarc.problem.loader import load_problem  # noqa: E402
from kernelarc.proposers.builtin import reference_solution  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problem", type=Path, nargs="?", default=example_dir("rmsnorm_h512"))
    ap.add_argument("--guards", type=int, default=3)
    ap.add_argument("--workloads", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    problem = load_problem(args.problem)
    ref = reference_solution(problem.definition, agent="probe", description="the reference")
    chosen = list(problem.workloads)[: args.workloads]
    screen = RunConfig.model_fields["screen"].default
    stages = {
        "screen": {
            "rounds": screen.rounds,
            "warmup": screen.warmup,
            "iterations": screen.iterations,
        },
        "full": {},
    }
    ratios: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(args.guards):
        with Guard(problem, GuardConfig(device=args.device)) as guard:
            session = guard.open_session(ref)
            try:
                for name, overrides in stages.items():
                    ev = guard.evaluate(ref, chosen, session=session, **overrides)
                    for o in ev.outcomes:
                        if o.latency and o.reference:
                            ratios[name].append(o.reference["median_ms"] / o.latency["median_ms"])
            finally:
                session.close()
    for name, values in ratios.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        median = statistics.median(values) if values else float("nan")
        print(f"{name:6s} median {median:.3f} over {len(values)}: {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
