"""The seed agent: user-given solutions enter the search as they are, once each, in order.

A user's (or a model's) kernel — typically Triton — becomes a judged candidate and, when it
passes, an incumbent on the board, where other agents (the tuner) take it up. ``kernelarc
optimize --seed-solution FILE`` (repeatable) adds one :class:`SeedAgent` holding every file.

Covered: proposing each solution once (mode ``draft`` when the context asks for one: a seed
*is* a fresh approach), conclusions with the measured effect by workload class (against
the agent's previous incumbent, else the reference) and an outcome, state/restore of the
position, checked against the solutions it was built with (a resumed run with other seed
files is an error, not a silent mix).

Not covered: changing the seeds (they are proposed verbatim, name and author kept) or
checking them beyond what ``Solution`` validates: the guard judges them like any candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from kernelarc.agents.base import AgentStateError
from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion, Proposal
from kernelarc.problem.schema import Solution
from kernelarc.proposers.base import BuiltinAgent
from kernelarc.proposers.common import clip, failure_summary, score_text


class SeedAgent(BuiltinAgent):
    """Proposes the given solutions once each, in order, then nothing."""

    name = "seed"
    strategy = "seed"
    who: ClassVar[str] = "seed agent"
    saves_baseline: ClassVar[bool] = True
    description: ClassVar[str] = (
        "user-given solutions (--seed-solution), proposed once each so others can refine them"
    )

    def __init__(self, solutions: Sequence[Solution], *, name: str = "seed") -> None:
        if not solutions:
            raise ValueError("a seed agent needs at least one solution")
        super().__init__()
        self.name = name
        self.solutions = [s.model_copy(deep=True) for s in solutions]
        self._index = 0
        self._pending: int | None = None

    def _hashes(self) -> list[str]:
        return [s.content_hash() for s in self.solutions]

    def propose(self, context: AgentContext) -> Proposal | None:
        if self._index >= len(self.solutions):
            return None
        n = self._index
        self._index += 1
        self._pending = n
        self._classify(context)
        self._measure_against_incumbent(context)
        sol = self.solutions[n]
        langs = ", ".join(lang.value for lang in sol.spec.languages)
        return Proposal(
            solution=sol,
            hypothesis=clip(
                f"user-given solution {sol.name!r} ({langs}), seed {n + 1} of "
                f"{len(self.solutions)}, judged as given",
                1000,
            ),
            mode="draft" if context.must_draft else "refine",
            tags=("seed", *(lang.value for lang in sol.spec.languages)),
        )

    def observe(self, result: CandidateResult) -> Conclusion:
        n, self._pending = self._pending, None
        label = (
            f"seed {self.solutions[n].name!r} ({n + 1}/{len(self.solutions)})"
            if n is not None
            else "seed (none pending)"
        )
        effect, overall = self._effect(result)
        total = len(result.per_workload)
        if result.passed:
            claim = f"{label}: {score_text(result)} over eager on {total}/{total} workloads"
            if effect:
                claim += "; " + "; ".join(f"{v:.2f}x on {k}" for k, v in effect.items())
                claim += " vs " + ("own previous best" if self._baseline_ms else "the reference")
            if result.stage == "screen":
                claim += " (screening stage only)"
        else:
            claim = f"{label}: {failure_summary(result)}"
        # Against the reference, a ratio below 1 is no regression of the seed's own.
        return self._conclude(
            result, claim, effect, ("seed",), overall if self._baseline_ms else None
        )

    def _state(self) -> dict[str, object]:
        return {"index": self._index, "pending": self._pending, "hashes": self._hashes()}

    def _restore(self, state: dict[str, object]) -> None:
        index, pending = state.get("index", 0), state.get("pending")
        hashes = state.get("hashes")
        if not isinstance(index, int) or isinstance(index, bool):
            raise AgentStateError(f"seed agent state: 'index' must be an int, got {index!r}")
        if not 0 <= index <= len(self.solutions):
            raise AgentStateError(
                f"seed agent state: index {index} not within 0..{len(self.solutions)}"
            )
        if pending is not None and (not isinstance(pending, int) or not 0 <= pending < index):
            raise AgentStateError(f"seed agent state: bad 'pending' {pending!r}")
        if hashes is not None and hashes != self._hashes():
            raise AgentStateError(
                "seed agent state was saved with other seed solutions: resume with the "
                "same --seed-solution files, in the same order"
            )
        self._index, self._pending = index, pending


__all__ = ["SeedAgent"]
