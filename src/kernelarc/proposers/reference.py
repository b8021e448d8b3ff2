"""The reference agent: the problem's reference code proposed as a solution, once.

It is the correct baseline every run has: its speedup over eager is ~1, and its deviation
from 1 measures the guard's noise. Not covered: any other built-in (each lives in its own
module; their shared parts are in :mod:`.base` and :mod:`.common`).
"""

from __future__ import annotations

from typing import ClassVar

from kernelarc.agents.base import AgentStateError
from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion, Proposal
from kernelarc.problem.reference import reference_solution
from kernelarc.proposers.base import BuiltinAgent
from kernelarc.proposers.common import failure_summary, notes_of, score_text


class ReferenceAgent(BuiltinAgent):
    """Proposes the reference itself as a solution, once: the baseline of every run."""

    name = "reference"
    strategy = "reference"
    who: ClassVar[str] = "reference agent"
    saves_classes: ClassVar[bool] = False
    priority: ClassVar[int] = -10  # the baseline: the guard times the reference anyway
    description: ClassVar[str] = (
        "the problem's reference code as a solution, once: the correct eager baseline"
    )

    def __init__(self) -> None:
        super().__init__()
        self._proposed = False

    def propose(self, context: AgentContext) -> Proposal | None:
        if self._proposed:
            return None
        self._proposed = True
        self._classify(context)
        solution = reference_solution(
            context.definition,
            agent=self.name,
            description="The problem's reference implementation, unchanged (eager baseline).",
        )
        return Proposal(
            solution=solution,
            hypothesis="The reference itself: correct by construction, speedup ~1 over eager; "
            "the baseline every other candidate is measured against.",
            mode="draft" if context.must_draft else "refine",
            tags=("reference", "baseline"),
        )

    def observe(self, result: CandidateResult) -> Conclusion:
        effect, _ = self._effect(result)
        n = len(result.per_workload)
        if result.passed:
            claim = (
                f"reference as solution (eager baseline): geomean speedup {score_text(result)} "
                f"over eager on {n}/{n} workloads; this is the baseline, deviations from 1 are "
                f"measurement noise{notes_of(result)}"
            )
        elif not any(r.status != "PASSED" for r in result.per_workload) and result.stopped_early:
            # Stopped as hopeless against a faster incumbent: every judged workload passed.
            claim = (
                f"reference as solution (eager baseline): passed what was judged, then "
                f"stopped early ({result.stopped_early}): other agents already beat eager"
                f"{notes_of(result)}"
            )
        else:
            claim = (
                f"reference as solution (eager baseline): {failure_summary(result)}; the "
                f"baseline itself does not pass the guard, so check the problem{notes_of(result)}"
            )
        # The baseline cannot regress against itself: a ratio below 1 is noise.
        return self._conclude(result, claim, effect, ("reference", "baseline"), None)

    def _state(self) -> dict[str, object]:
        return {"proposed": self._proposed}

    def _restore(self, state: dict[str, object]) -> None:
        proposed = state.get("proposed", False)
        if not isinstance(proposed, bool):
            raise AgentStateError(
                f"reference agent state: 'proposed' must be a bool, got {proposed!r}"
            )
        self._proposed = proposed


__all__ = ["ReferenceAgent"]
