"""The reference judged as a candidate against itself, per search stage (a fairness probe).

    python benchmarks/self_ratio_probe.py [PROBLEM_DIR] [--guards 3] [--workloads 3]
        [--device cpu] [--compiled]

In each of ``--guards`` fresh ``Guard`` sessions, the reference's own code is judged as a
candidate on the first ``--workloads`` workloads, first with the search's screening
protocol (3 rounds, 3 warm-up + 10 timed calls) and then with the full protocol, both in
one candidate worker as the search does. Prints per stage the median and all readings of
reference_ms / candidate_ms: 1.0 means the guard times both sides alike; below 1 it
favours the reference. Default problem: the bundled RMSNorm example.

With ``--compiled`` the candidate is the compiler agent's baseline configuration
(``torch.compile(run, dynamic=False)`` of the reference, as the agent writes it) and the
other side is the guard's own compile of the reference in the reference worker (the
benchmark's torch.compile baseline): the ratio is then compiled_reference_ms /
candidate_ms, the figure behind a "vs torch.compile" below 1 when the winner is that very
configuration (FIB 002 on the H200, docs/PERFORMANCE.md session 23).
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
from kernelarc.proposers.builtin import make_solution, reference_solution  # noqa: E402
from kernelarc.proposers.compiler import (  # noqa: E402
    BASELINE,
    COMPILED_ENTRY,
    compiled_source,
    variant_named,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problem", type=Path, nargs="?", default=example_dir("rmsnorm_h512"))
    ap.add_argument("--guards", type=int, default=3)
    ap.add_argument("--workloads", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--compiled",
        action="store_true",
        help="judge the compiler agent's baseline compile against the guard's compiled reference",
    )
    args = ap.parse_args()
    problem = load_problem(args.problem)
    if args.compiled:
        candidate = make_solution(
            problem.definition,
            agent="probe",
            name=f"{problem.definition.name}-probe-compiled",
            description="torch.compile of the reference (the baseline configuration)",
            source=compiled_source(problem.definition.reference, variant_named(BASELINE)),
            entry=COMPILED_ENTRY,
        )
    else:
        candidate = reference_solution(
            problem.definition, agent="probe", description="the reference"
        )
    side = "compiled_reference" if args.compiled else "reference"
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
    missing = 0
    for _ in range(args.guards):
        cfg = GuardConfig(device=args.device, time_compiled_reference=args.compiled)
        with Guard(problem, cfg) as guard:
            session = guard.open_session(candidate)
            try:
                for name, overrides in stages.items():
                    ev = guard.evaluate(candidate, chosen, session=session, **overrides)
                    for o in ev.outcomes:
                        other = getattr(o, side)
                        if o.latency and other:
                            ratios[name].append(other["median_ms"] / o.latency["median_ms"])
                        else:  # a failed side is a result to see, not a reading to drop
                            missing += 1
                            why = "; ".join([o.log or "", *o.notes])[:500]
                            print(f"{name}: no reading on {o.workload.uuid}: {o.status.value} "
                                  f"{why}", file=sys.stderr)  # fmt: skip
            finally:
                session.close()
    for name, values in ratios.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        median = statistics.median(values) if values else float("nan")
        print(f"{name:6s} median {median:.3f} over {len(values)}: {shown}")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
