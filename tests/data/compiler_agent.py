"""Helpers for the compiler agent's tests (``test_builtin_agents.py``,
``test_compiler_agent.py`` in ``tests/proposers``): synthetic verdicts, the board other
agents show, a compiler whose first proposal was judged."""

from __future__ import annotations

from _shared import agent_context, incumbent_view

from kernelarc.agents.types import CandidateResult, IncumbentView, Proposal, WorkloadResult
from kernelarc.orchestration.judge import score_of
from kernelarc.problem.loader import Problem
from kernelarc.proposers.compiler import COMPILE_VARIANTS, CompilerAgent
from kernelarc.proposers.reference import ReferenceAgent


def wr(uuid: str, batch: int, latency: float | None, ref: float, status: str = "PASSED"):
    """One workload's result as agents see it (batch size as its only axis)."""
    return WorkloadResult(
        uuid=uuid, axes={"batch_size": batch}, status=status, latency_ms=latency, reference_ms=ref
    )


def all_proposals(agent, problem: Problem, device: str = "cpu") -> list[Proposal]:
    """Everything ``agent`` proposes until it stops (at most one more than the variants)."""
    out = []
    while (p := agent.propose(agent_context(problem, device=device))) is not None:
        out.append(p)
        assert len(out) <= len(COMPILE_VARIANTS) + 1, "the agent never stops proposing"
    return out


def board_views(problem: Problem) -> tuple[IncumbentView, ...]:
    """A precision wrapper (2.0x), a CUDA-graph wrapper (3.0x) and the plain reference
    (5.0x) of other agents, as the board shows them."""
    from kernelarc.proposers.cudagraph import graph_solution
    from kernelarc.proposers.precision import policy_named, policy_solution

    d = problem.definition
    ref = ReferenceAgent().propose(agent_context(problem))
    assert ref is not None
    tf32 = policy_solution(ref.solution, d, policy_named("tf32"), name="p-tf32", what="ref")
    graph = graph_solution(ref.solution, d, name="g", what="ref")

    return (
        incumbent_view("precision", "c3", 2.0, tf32),
        incumbent_view("cuda-graph", "c5", 3.0, graph),
        incumbent_view("reference", "c1", 5.0, ref.solution),
    )


MAX_AUTOTUNE = "max-autotune-no-cudagraphs"
"""The reference's configuration after the baseline's (static) in the compiler's walk."""


def after_plain(problem: Problem, **ctx: object) -> CompilerAgent:
    """A compiler agent whose first proposal, the reference's default compile (never
    displaced by a board base), was judged: not an improvement."""
    agent = CompilerAgent()
    plain = agent.propose(agent_context(problem, **ctx))
    assert plain is not None and plain.tags == ("compiler", "static") and plain.mode == "refine"
    assert "torch.compile(run, dynamic=False, fullgraph=False)" in plain.solution.sources[0].content
    agent.observe(synthetic([wr("w1", 1, 0.9, 1.0)]))
    return agent


def compiler_after_one_proposal(problem: Problem, **ctx: object) -> CompilerAgent:
    agent = CompilerAgent()
    assert agent.propose(agent_context(problem, **ctx)) is not None
    return agent


def synthetic(per, *, improved: bool = False) -> CandidateResult:
    passed = all(r.status == "PASSED" for r in per)
    score = score_of(per) if passed else None
    return CandidateResult(
        candidate_id="c7",
        agent="compiler",
        strategy="compiler",
        mode="refine",
        stage="full",
        per_workload=tuple(per),
        passed=passed,
        score=score,
        improved=improved,
    )
