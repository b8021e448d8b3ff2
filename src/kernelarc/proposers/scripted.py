"""A scripted agent: a FAKE strategy for tests, which plays a fixed list of steps.

It lets the orchestrator's tests drive the whole search loop offline and deterministically
(no model, no randomness). It is not a search strategy and is not offered by the registry.

Covered: replaying steps (a ready ``Solution``, a callable building a proposal from the
context, or ``None`` for "nothing more"), recording every context and result it is given,
plain conclusions, and state/restore of the step position. Not covered: anything
adaptive; the steps do not react to results unless a callable step does so itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kernelarc.agents.base import Agent, AgentStateError
from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion, Outcome, Proposal
from kernelarc.problem.schema import Solution

Step = Solution | Callable[[AgentContext], Proposal | None] | None


class ScriptedAgent(Agent):
    """FAKE agent for tests: proposes ``steps`` in order, one per ``propose`` call.

    A ``Solution`` step becomes a proposal (mode ``draft`` when the context asks for one);
    a callable step is called with the context and its answer is returned as is; a ``None``
    step, or the end of the list, means "nothing more" (and stays so). ``contexts`` holds
    every context received and ``results`` every result observed, in order.
    """

    def __init__(
        self, steps: Sequence[Step], *, name: str = "scripted", strategy: str = "scripted"
    ) -> None:
        self.name = name
        self.strategy = strategy
        self.steps: list[Step] = list(steps)
        self.contexts: list[AgentContext] = []
        self.results: list[CandidateResult] = []
        self._index = 0
        self._done = False
        self._last_step: int | None = None

    def propose(self, context: AgentContext) -> Proposal | None:
        self.contexts.append(context)
        if self._done or self._index >= len(self.steps):
            self._done = True
            return None
        n = self._index
        step = self.steps[n]
        self._index += 1
        if step is None:
            self._done = True
            return None
        self._last_step = n
        if isinstance(step, Solution):
            return Proposal(
                solution=step,
                hypothesis=f"scripted step {n}",
                mode="draft" if context.must_draft else "refine",
                tags=("scripted",),
            )
        proposal = step(context)
        if proposal is not None and not isinstance(proposal, Proposal):
            raise TypeError(
                f"scripted step {n} returned {type(proposal).__name__}; a step callable must "
                "return a Proposal or None"
            )
        return proposal

    def observe(self, result: CandidateResult) -> Conclusion:
        self.results.append(result)
        score = f"{result.score:.3f}" if result.score is not None else "None"
        outcome: Outcome = (
            "failed" if not result.passed else "improved" if result.improved else "no_gain"
        )
        step = "?" if self._last_step is None else str(self._last_step)
        return Conclusion(
            agent=self.name,
            strategy=self.strategy,
            candidate_id=result.candidate_id,
            claim=f"scripted step {step}: passed={result.passed} score={score}",
            tags=("scripted",),
            outcome=outcome,
        )

    def state(self) -> dict[str, object]:
        return {"index": self._index, "done": self._done, "last_step": self._last_step}

    def restore(self, state: dict[str, object]) -> None:
        index, done, last = state.get("index", 0), state.get("done", False), state.get("last_step")
        if not isinstance(index, int) or not 0 <= index <= len(self.steps):
            raise AgentStateError(
                f"scripted agent state: 'index' {index!r} is not within its {len(self.steps)} steps"
            )
        if not isinstance(done, bool) or not (last is None or isinstance(last, int)):
            raise AgentStateError("scripted agent state: 'done' must be a bool, 'last_step' an int")
        self._index, self._done, self._last_step = index, done, last


__all__ = ["ScriptedAgent", "Step"]
