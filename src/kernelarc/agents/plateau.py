"""Plateau detection and the seed of a fresh draft.

Covered: counting, per agent, consecutive evaluations without a significant gain
(:class:`PlateauTracker`), the "must draft" signal once that count reaches the patience,
its reset when the orchestrator hands out a drafting context, JSON-able state for
``--resume``, and the board entry a draft should start from (:func:`drafting_seed`).

Not covered: what counts as a significant gain (``orchestration/judge.py::significant``
decides; the orchestrator passes the verdict as ``improved``), and how an agent drafts
(its proposer).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError

from kernelarc.agents.types import BoardSnapshot, IncumbentView


class PlateauState(BaseModel):
    """The persisted form of a :class:`PlateauTracker`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    patience: int = Field(gt=0)
    counts: dict[str, NonNegativeInt] = Field(default_factory=dict)
    """Consecutive evaluations without a significant gain, per agent."""


class PlateauTracker:
    """Per agent: evaluations since the last significant gain (or the last draft handed out).

    ``must_draft(agent)`` is true once that count reaches ``patience``; it stays true until
    the agent improves or the orchestrator calls :meth:`reset` on handing out the draft.
    """

    def __init__(self, patience: int) -> None:
        if isinstance(patience, bool) or not isinstance(patience, int) or patience <= 0:
            raise ValueError(
                f"plateau patience must be a positive integer (evaluations without a gain "
                f"before drafting), got {patience!r}"
            )
        self.patience = patience
        self._counts: dict[str, int] = {}

    def record(self, agent: str, improved: bool) -> None:
        """Count one evaluation of ``agent``'s candidate: a gain clears the count."""
        self._counts[agent] = 0 if improved else self._counts.get(agent, 0) + 1

    def count(self, agent: str) -> int:
        """Consecutive evaluations of ``agent`` without a significant gain."""
        return self._counts.get(agent, 0)

    def must_draft(self, agent: str) -> bool:
        """``agent`` has plateaued: its next proposal should be a fresh draft."""
        return self.count(agent) >= self.patience

    def reset(self, agent: str) -> None:
        """Clear ``agent``'s count (called when a must-draft context is handed out)."""
        self._counts[agent] = 0

    def state(self) -> dict[str, Any]:
        """JSON-able state for :meth:`restore`."""
        return PlateauState(patience=self.patience, counts=dict(self._counts)).model_dump()

    def restore(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` returned. ValueError when it is malformed, has
        negative counts, or was saved with another patience (a resumed run keeps its
        original configuration)."""
        try:
            parsed = PlateauState.model_validate(state)
        except ValidationError as exc:
            raise ValueError(f"malformed plateau state: {exc}") from None
        if parsed.patience != self.patience:
            raise ValueError(
                f"plateau state was saved with patience {parsed.patience}, this tracker has "
                f"{self.patience}; resume with the run's original configuration"
            )
        self._counts = dict(parsed.counts)


def drafting_seed(snapshot: BoardSnapshot, agent: str, strategy: str) -> IncumbentView | None:
    """The board entry a fresh draft by ``agent`` (of ``strategy``) should start from.

    The best-scoring incumbent of another agent with a different strategy; if there is
    none, the best of another agent (same strategy); else None (draft from scratch). The
    agent's own incumbent is never the seed. Equal scores: the first in board order."""
    others = snapshot.others(agent)
    different = [v for v in others if v.strategy != strategy]
    pool = different or list(others)
    return max(pool, key=lambda v: v.score, default=None)
