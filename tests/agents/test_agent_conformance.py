"""The shipped agent conformance checks (``kernelarc.agents.conformance``).

Covered: every agent of the registry (so agents registered later are covered without
editing this file) and the scripted test agent pass ``check_agent`` on the bundled
``rmsnorm_h512`` example on the CPU; and each check catches a deliberately broken agent
(defined here), naming itself in the error.

Not covered: CUDA (agents that only propose on CUDA pass the propose/observe checks
vacuously here), real guard verdicts (see tests/proposers/test_builtin_agents.py).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import pytest

from kernelarc.agents.base import Rebasing
from kernelarc.agents.conformance import check_agent, reference_solution
from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion, Proposal
from kernelarc.examples import example_dir
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.schema import Solution
from kernelarc.proposers.reference import ReferenceAgent
from kernelarc.proposers.registry import available_agents
from kernelarc.proposers.scripted import ScriptedAgent


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


@pytest.mark.parametrize("name", sorted(available_agents()))
def test_registered_agent_conforms(name: str, problem: Problem) -> None:
    check_agent(available_agents()[name], problem, "cpu")


def test_scripted_agent_conforms(problem: Problem) -> None:
    sol = reference_solution(problem, author="scripted")
    check_agent(lambda: ScriptedAgent([sol, sol, None]), problem, "cpu", listed=False)


# ---------------------------------------------------------------- broken agents


class NoDescription(ReferenceAgent):
    description: ClassVar[str] = "two\nlines"


class SpacedName(ReferenceAgent):
    name = "my agent"


class WrongDefinition(ReferenceAgent):
    def propose(self, context: AgentContext) -> Proposal | None:
        p = super().propose(context)
        if p is None:
            return None
        sol = p.solution.model_copy(update={"definition": "some_other_problem"})
        return p.model_copy(update={"solution": sol})


class DoesNotBuild(ReferenceAgent):
    def propose(self, context: AgentContext) -> Proposal | None:
        p = super().propose(context)
        if p is None:
            return None
        data = p.solution.model_dump(mode="json")
        data["sources"][0]["content"] = "def run(x, w):\n    return (\n"
        return p.model_copy(update={"solution": Solution.model_validate(data)})


class MutatesContext(ReferenceAgent):
    def propose(self, context: AgentContext) -> Proposal | None:
        context.bounds_ms["sneaky"] = 0.0  # frozen model, mutable dict inside
        return super().propose(context)


class Slow(ReferenceAgent):
    def propose(self, context: AgentContext) -> Proposal | None:
        time.sleep(0.6)
        return super().propose(context)


class IgnoresDraft(ReferenceAgent):
    def propose(self, context: AgentContext) -> Proposal | None:
        p = super().propose(context)
        return p.model_copy(update={"mode": "refine"}) if p is not None else None


class CodeInClaim(ReferenceAgent):
    def observe(self, result: CandidateResult) -> Conclusion:
        c = super().observe(result)
        return c.model_copy(update={"claim": "use def run(x, w): return x * w instead"})


class AlwaysNoGain(ReferenceAgent):
    def observe(self, result: CandidateResult) -> Conclusion:
        return super().observe(result).model_copy(update={"outcome": "no_gain"})


class NotImprovedWhenImproved(ReferenceAgent):
    def observe(self, result: CandidateResult) -> Conclusion:
        c = super().observe(result)
        return c.model_copy(update={"outcome": "no_gain"}) if result.improved else c


class WrongAgentName(ReferenceAgent):
    def observe(self, result: CandidateResult) -> Conclusion:
        return super().observe(result).model_copy(update={"agent": "someone-else"})


class UnserialisableState(ReferenceAgent):
    def state(self) -> dict[str, object]:
        return {"proposed": self._proposed, "seen": {1, 2}}


class ForgetfulRestore(ReferenceAgent):
    def restore(self, state: dict[str, object]) -> None:
        pass  # accepts the state and ignores it: the restored agent proposes again


class LenientRestore(ReferenceAgent):
    def restore(self, state: dict[str, object]) -> None:
        self._proposed = bool(state.get("proposed", False))


class TypeErrorRestore(ReferenceAgent):
    def restore(self, state: dict[str, object]) -> None:
        proposed: Any = state.get("proposed", False)
        self._proposed = proposed + 0 == 1  # a str raises TypeError, not ValueError


class RebasesBadly(ReferenceAgent, Rebasing):
    """Rebases onto a solution of another problem's definition."""

    def rebase(self, proposal: Proposal, context: AgentContext) -> Proposal | None:
        sol = proposal.solution.model_copy(update={"definition": "some_other_problem"})
        return proposal.model_copy(update={"solution": sol})


class RebaseMutatesContext(ReferenceAgent, Rebasing):
    def rebase(self, proposal: Proposal, context: AgentContext) -> Proposal | None:
        context.bounds_ms["sneaky"] = 0.0
        return None


@pytest.mark.parametrize(
    ("broken", "check", "detail"),
    [
        (NoDescription, "identity", "description"),
        (SpacedName, "identity", "name must be"),
        (WrongDefinition, "propose", "names definition 'some_other_problem'"),
        (DoesNotBuild, "propose", "does not build"),
        (MutatesContext, "propose", "mutated the context"),
        (IgnoresDraft, "must_draft", "asked for a draft"),
        (CodeInClaim, "observe", "looks like code"),
        (AlwaysNoGain, "observe", "passed=False"),
        (NotImprovedWhenImproved, "observe", "observe\\(improved\\)"),
        (WrongAgentName, "observe", "someone-else"),
        (UnserialisableState, "state", "not JSON-serialisable"),
        (ForgetfulRestore, "state", "a restored agent proposes"),
        (LenientRestore, "restore_rejects_garbage", "accepted 'proposed'"),
        (TypeErrorRestore, "restore_rejects_garbage", "raised TypeError"),
        (RebasesBadly, "rebase", "names definition 'some_other_problem'"),
        (RebaseMutatesContext, "rebase", "mutated the context"),
    ],
)
def test_each_check_catches_a_broken_agent(
    broken: type[ReferenceAgent], check: str, detail: str, problem: Problem
) -> None:
    with pytest.raises(AssertionError, match=rf"\[{check}\]: .*{detail}"):
        check_agent(broken, problem, "cpu")


def test_slow_propose_is_caught_unless_a_subprocess_is_documented(problem: Problem) -> None:
    with pytest.raises(AssertionError, match=r"\[propose\]: .*took 0\.\d s"):
        check_agent(Slow, problem, "cpu", max_propose_s=0.3)

    class DocumentedSlow(Slow):
        documented_subprocess: ClassVar[bool] = True

    check_agent(DocumentedSlow, problem, "cpu", max_propose_s=0.3)


def test_agent_exceptions_are_reported_as_the_check_failing(problem: Problem) -> None:
    class Crashes(ReferenceAgent):
        def observe(self, result: CandidateResult) -> Conclusion:
            raise KeyError("boom")

    with pytest.raises(AssertionError, match=r"\[observe\]: observe\(passed\) raised KeyError"):
        check_agent(Crashes, problem, "cpu")
