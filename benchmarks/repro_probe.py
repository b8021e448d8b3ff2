"""Does a solution's measured latency reproduce from one guard session to the next?

    python benchmarks/repro_probe.py PROBLEM_DIR A.json [B.json ...] [--reps 3]
        [--smallest 6] [--fresh-cache] [--device cuda]

For ``--reps`` rounds, each solution in turn (interleaved: A B A B ...) is judged in a new
``Guard`` session on the ``--smallest`` workloads by input size, with torch.compile of the
reference (default options, ``dynamic=False``, as the benchmark's baseline) timed in the
same session. ``--fresh-cache`` gives every session its own empty build/Inductor/Triton
cache (by default all share the user's cache, as successive ``kernelarc`` runs do). Prints
one row per session: geomean latency, geomean torch.compile latency and their ratio, so a
solution whose speed depends on a run-time autotuning draw shows up as rows that differ.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.guard.evaluator import Guard, GuardConfig  # noqa: E402
from kernelarc.problem.inputs import estimate_input_bytes  # noqa: E402
from kernelarc.problem.loader import load_problem, load_solution  # noqa: E402


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem", type=Path)
    ap.add_argument("solutions", type=Path, nargs="+")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smallest", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fresh-cache", action="store_true")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    problem = load_problem(args.problem)
    wls = sorted(problem.workloads, key=lambda w: estimate_input_bytes(problem.definition, w))
    wls = wls[: args.smallest]
    rows = []
    for rep in range(args.reps):
        for path in args.solutions:
            with tempfile.TemporaryDirectory() as tmp:
                cfg = GuardConfig(
                    device=args.device,
                    rounds=args.rounds,
                    time_compiled_reference=True,
                    warm_spare=False,
                    cache_dir=Path(tmp) if args.fresh_cache else None,
                )
                t0 = time.monotonic()
                with Guard(problem, cfg) as guard:
                    res = guard.evaluate(load_solution(path), wls)
                wall = time.monotonic() - t0
            lat = [o.latency_ms for o in res.outcomes if o.latency_ms]
            comp = [
                (o.compiled_reference or {}).get("median_ms")
                for o in res.outcomes
                if o.latency_ms and (o.compiled_reference or {}).get("median_ms")
            ]
            bad = [o.status.value for o in res.outcomes if o.status.value != "PASSED"]
            per = " ".join(f"{x * 1000:.2f}" for x in lat)
            rows.append((path.name, rep, geomean(lat), geomean(comp), len(lat), bad, wall, per))
            print(rows[-1], flush=True)
    print(f"\n{'solution':32s} rep {'ours us':>8s} {'compile us':>10s} {'vs compile':>10s}  wall s")
    for name, rep, g, c, n, bad, wall, per in rows:
        print(
            f"{name[:32]:32s} {rep:3d} {g * 1000:8.3f} {c * 1000:10.3f} {c / g:9.3f}x "
            f"{wall:6.0f}  n={n} {'FAILED ' + ','.join(bad) if bad else ''} [{per}]"
        )


if __name__ == "__main__":
    main()
