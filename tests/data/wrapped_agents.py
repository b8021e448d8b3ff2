"""Helpers for the built-in agents' tests (``test_wrap_cudagraph.py``,
``test_precision_agent.py``, ``test_builtin_agents.py`` in ``tests/proposers``): example and
reference solutions, boards, the guard's verdict as agents see it."""

from __future__ import annotations

from typing import Any

from _shared import incumbent_view

from kernelarc.agents.memory import code_marker
from kernelarc.agents.types import (
    CLAIM_MAX,
    BoardSnapshot,
    CandidateResult,
    Conclusion,
    IncumbentView,
)
from kernelarc.guard.evaluator import EvalResult
from kernelarc.orchestration.judge import results_of, score_of
from kernelarc.problem.loader import Problem, load_solution
from kernelarc.problem.reference import make_solution
from kernelarc.problem.schema import Solution


def example_solution(problem: Problem, file: str) -> Solution:
    return load_solution(problem.root / file)


def reference_solution_of(problem: Problem) -> Solution:
    d = problem.definition
    return make_solution(d, agent="t", name="ref", description="r", source=d.reference, entry="run")


def board_of(*views: IncumbentView) -> BoardSnapshot:
    return BoardSnapshot(incumbents=views, version=len(views))


def view_of(agent: str, cid: str, score: float, solution: Solution) -> IncumbentView:
    view: IncumbentView = incumbent_view(agent, cid, score, solution)
    return view


def result_of(ev: EvalResult, agent: str, candidate_id: str = "c1") -> CandidateResult:
    """The guard's verdict as agents see it (what the orchestrator's judge hands them)."""
    per = results_of(ev.outcomes, {})
    passed = bool(per) and all(r.status == "PASSED" for r in per)
    return CandidateResult(
        candidate_id=candidate_id,
        agent=agent,
        strategy=agent,
        mode="refine",
        stage="full",
        per_workload=per,
        passed=passed,
        score=score_of(per) if passed else None,
    )


def check_claim(c: Conclusion) -> None:
    assert 0 < len(c.claim) <= CLAIM_MAX, c.claim
    assert code_marker(c.claim) is None, c.claim


def statuses_of(ev: EvalResult) -> list[tuple[str, str | None, str]]:
    return [(o.status.value, o.check, o.log[:600]) for o in ev.outcomes]


def smallest_workloads(problem: Problem, n: int) -> list[Any]:
    axis = next(name for name, a in problem.definition.axes.items() if a.type == "var")
    return sorted(problem.workloads, key=lambda w: w.axes[axis])[:n]
