"""The agent plug-in point: a strategy that proposes candidates and concludes from verdicts.

Ask/tell: the orchestrator owns the loop; it *asks* ``propose(context)`` and *tells*
``observe(result)``. An agent never calls the guard, the store or another agent. Shipped
conformance checks for any agent: ``kernelarc.agents.conformance``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion, Proposal
from kernelarc.errors import KernelArcError


class AgentStateError(KernelArcError, ValueError):
    """A saved agent state that :meth:`Agent.restore` refuses. A ``ValueError``, as
    ``restore`` promises, and a :class:`~kernelarc.errors.KernelArcError`: the message (which
    names the agent and the field) reaches the user of ``--resume`` as it is."""


class Agent(ABC):
    """One strategy. ``name`` is unique in a run; ``strategy`` names the family."""

    name: str
    strategy: str
    priority: ClassVar[int] = 0
    """Order of judging among proposals that are ready at the same time (higher first)."""
    waits_for_board: ClassVar[bool] = False
    """True for strategies that build on other agents' incumbents: a None from
    :meth:`propose` then means "nothing yet", and the orchestrator asks again once the board
    has changed, instead of retiring the agent."""

    @abstractmethod
    def propose(self, context: AgentContext) -> Proposal | None:
        """A candidate to judge, or None when the strategy has nothing (more) to try.
        When ``context.must_draft`` is set, return a fresh approach (mode "draft")."""

    @abstractmethod
    def observe(self, result: CandidateResult) -> Conclusion:
        """The lesson of one judged candidate (at most 300 characters of claim, no code)."""

    def state(self) -> dict[str, object]:
        """JSON-able state to persist for ``--resume`` (default: stateless)."""
        return {}

    def restore(self, state: dict[str, object]) -> None:  # noqa: B027 (optional hook)
        """Restore what :meth:`state` returned (default: nothing to restore); a
        ``ValueError`` (preferably :class:`AgentStateError`) when it is malformed."""


class Rebasing(ABC):
    """An optional capability, beside :class:`Agent`, of strategies that build on the board.

    A proposal is made when its agent is asked, but may be judged much later (under a time
    limit an expensive one waits for cheap ones). When the board has changed in between,
    the orchestrator calls :meth:`rebase` just before judging: the agent may replace the
    proposal by one built on the board as it is now (the compiler: compile the new best
    incumbent instead of the bare reference). The agent's own bookkeeping for the replaced
    proposal is its business (it is never judged, and never observed)."""

    @abstractmethod
    def rebase(self, proposal: Proposal, context: AgentContext) -> Proposal | None:
        """A replacement for ``proposal``, or None to judge it as it is."""
