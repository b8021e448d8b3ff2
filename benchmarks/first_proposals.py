"""Each built-in agent's first proposal for a problem, without judging anything.

    python benchmarks/first_proposals.py PROBLEM_DIR [--device cuda] [--agents a,b]

Asks every agent once with the context the orchestrator gives at the start of a run (no
incumbent, empty board) and prints one line per agent: the seconds ``propose`` took, the
proposed solution's name and hypothesis, or why it proposed nothing (the rewrite agent's
``skipped`` reason) or the exception it raised. A diagnostic for "why did agent X never
get a candidate judged": it shows what each agent would put in front of the guard and how
long it takes to get it ready. Nothing is run on the device except what an agent's
``propose`` itself runs (the gemm-tables agent tunes GEMMs there).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.agents.types import AgentContext  # noqa: E402
from kernelarc.problem.loader import load_problem  # noqa: E402
from kernelarc.proposers.registry import DEFAULT_AGENTS, make_agents  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problem", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--agents", default=",".join(DEFAULT_AGENTS))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="  log: %(name)s: %(message)s")
    problem = load_problem(args.problem)
    workloads = problem.workloads
    context = AgentContext(
        problem=problem.definition.name,
        definition=problem.definition,
        device=args.device,
        workloads=tuple(dict(w.axes) for w in workloads),
        scalars=tuple(w.scalar_inputs() for w in workloads),
        tolerances=tuple(w.tolerance for w in workloads),
        budget_left=16,
    )
    for agent in make_agents([a for a in args.agents.split(",") if a]):
        t0 = time.monotonic()
        try:
            proposal = agent.propose(context)
        except Exception as e:  # a diagnostic: show the failure, go on with the next agent
            print(f"{agent.name:12s} {time.monotonic() - t0:6.2f}s  raised {type(e).__name__}: {e}")
            continue
        took = time.monotonic() - t0
        if proposal is None:
            why = getattr(agent, "skipped", None) or "(no reason given)"
            print(f"{agent.name:12s} {took:6.2f}s  nothing: {why}")
        else:
            prio = proposal.priority if proposal.priority is not None else agent.priority
            print(f"{agent.name:12s} {took:6.2f}s  {proposal.solution.name} (priority {prio})")
            print(f"{'':21s}{proposal.hypothesis[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
