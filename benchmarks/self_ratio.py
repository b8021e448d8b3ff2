"""The reference judged as a candidate against itself: how even the guard's timing is.

    python benchmarks/self_ratio.py [PROBLEM_DIR] [--guards 10] [--workloads 3]
        [--device cpu]

In each of ``--guards`` fresh ``Guard`` sessions, the reference's own code is judged as a
candidate on the first ``--workloads`` workloads, first with the search's screening
protocol and then with the full protocol, both in one candidate session as the search
does. Prints per stage the median, min and max of reference_ms / candidate_ms over the
readings, and each guard's median (the figure the symmetric-timing rule of docs/GUARD.md
is held to: 1.0 means the guard times both sides alike; below 1 it favours the
reference). Default problem: the bundled RMSNorm example. Exit status 1 when a workload
gave no reading (the reason is printed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.examples import example_dir  # noqa: E402
from kernelarc.guard.evaluator import Guard, GuardConfig  # noqa: E402
from kernelarc.orchestration.config import RunConfig  # noqa: E402
from kernelarc.problem.loader import load_problem  # noqa: E402
from kernelarc.problem.reference import reference_solution  # noqa: E402


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("problem", type=Path, nargs="?", default=example_dir("rmsnorm_h512"))
    ap.add_argument("--guards", type=_positive, default=10, help="fresh Guard sessions")
    ap.add_argument("--workloads", type=_positive, default=3, help="first N workloads")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if not args.problem.exists():
        ap.error(f"{args.problem}: no such problem directory or definition file")
    return args


def summary(values: list[float]) -> str:
    """``median M  min A  max B  (n)`` of ``values`` (``no readings`` when empty)."""
    if not values:
        return "no readings"
    return (
        f"median {statistics.median(values):.3f}  min {min(values):.3f}  "
        f"max {max(values):.3f}  ({len(values)} readings)"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = load_problem(args.problem)
    candidate = reference_solution(problem.definition, agent="probe", description="the reference")
    chosen = list(problem.workloads)[: args.workloads]
    screen = RunConfig.model_fields["screen"].default
    stages: dict[str, dict[str, int]] = {
        "screen": {
            "rounds": screen.rounds,
            "warmup": screen.warmup,
            "iterations": screen.iterations,
        },
        "full": {},
    }
    ratios: dict[str, list[float]] = {name: [] for name in stages}
    per_guard: dict[str, list[float]] = {name: [] for name in stages}
    missing = 0
    t0 = time.monotonic()
    for _ in range(args.guards):
        with Guard(problem, GuardConfig(device=args.device)) as guard:
            session = guard.open_session(candidate)
            try:
                for name, overrides in stages.items():
                    ev = guard.evaluate(candidate, chosen, session=session, **overrides)
                    mine = []
                    for o in ev.outcomes:
                        if o.latency and o.reference:
                            mine.append(o.reference["median_ms"] / o.latency["median_ms"])
                        else:  # a failed side is a result to see, not a reading to drop
                            missing += 1
                            why = "; ".join([o.log or "", *o.notes])[:500]
                            print(f"{name}: no reading on {o.workload.uuid}: "
                                  f"{o.status.value} {why}", file=sys.stderr)  # fmt: skip
                    ratios[name] += mine
                    if mine:
                        per_guard[name].append(statistics.median(mine))
            finally:
                session.close()
    for name in stages:
        print(f"{name:6s} all     {summary(ratios[name])}")
        print(f"{name:6s} guards  {summary(per_guard[name])}")
    print(f"{args.guards} guards x {len(chosen)} workloads in {time.monotonic() - t0:.0f} s")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
