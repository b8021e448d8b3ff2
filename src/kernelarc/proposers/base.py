"""The base class of the built-in agents: what every built-in strategy keeps and concludes.

:class:`BuiltinAgent` holds the workload classes of the problem (the keys of every
conclusion's ``effect``) and the latencies the agent's next candidate is measured against,
saves and restores them beside the agent's own fields, and builds conclusions from them.
A subclass holds only its strategy: ``propose``, ``observe``, and its own fields in
``_state``/``_restore``.

Not covered: the plug-in point itself (:class:`kernelarc.agents.base.Agent`, which any
agent may implement directly) and the helpers that need no agent (:mod:`.common`).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

from kernelarc.agents.base import Agent
from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion
from kernelarc.maths import geomean
from kernelarc.proposers.common import (
    WorkloadClasses,
    conclusion_of,
    effect_by_class,
    ms_by_uuid,
    outcome_of,
)


class BuiltinAgent(Agent):
    """A built-in agent: workload classes, a baseline, saved state and conclusions.

    State: :meth:`state` is the subclass's :meth:`_state` plus ``classes`` (when
    :attr:`saves_classes`) and ``baseline_ms`` (when :attr:`saves_baseline`);
    :meth:`restore` checks those two first, then lets :meth:`_restore` check and set the
    rest, and sets them last, so a bad state changes nothing."""

    who: ClassVar[str]
    """How errors about the agent's saved state name it (``"<who> state: ..."``)."""
    saves_classes: ClassVar[bool] = True
    """The workload classes are part of the saved state."""
    saves_baseline: ClassVar[bool] = False
    """The baseline latencies (``_baseline_ms``) are part of the saved state."""

    def __init__(self) -> None:
        self._classes = WorkloadClasses()
        self._baseline_ms: dict[str, float] = {}
        """Latencies by workload uuid the pending candidate is measured against (empty: the
        reference's)."""

    # ------------------------------------------------------------------ asking
    def _classify(self, context: AgentContext) -> None:
        """Take the workload classes of the problem ``context`` shows."""
        self._classes = WorkloadClasses.of(context.definition, context.workloads)

    def _measure_against_incumbent(self, context: AgentContext) -> None:
        """Measure the next candidate against the agent's own incumbent (else the reference)."""
        self._baseline_ms = dict(context.incumbent.latencies_ms) if context.incumbent else {}

    # ------------------------------------------------------------------ concluding
    def _effect(
        self, result: CandidateResult, baseline_ms: dict[str, float] | None = None
    ) -> tuple[dict[str, float], float | None]:
        """The speedup by workload class over ``baseline_ms`` (default: ``_baseline_ms``),
        and its geomean over the classes."""
        base = self._baseline_ms if baseline_ms is None else baseline_ms
        effect = effect_by_class(result.per_workload, self._classes, base)
        return effect, geomean(effect.values())

    def _conclude(
        self,
        result: CandidateResult,
        claim: str,
        effect: dict[str, float],
        tags: tuple[str, ...],
        overall: float | None,
    ) -> Conclusion:
        """The conclusion on ``result``, its outcome judged from ``overall``
        (:func:`~kernelarc.proposers.common.outcome_of`)."""
        return conclusion_of(
            self,
            result,
            claim=claim,
            effect=effect,
            tags=tags,
            outcome=outcome_of(result, overall),
        )

    # ------------------------------------------------------------------ state
    @abstractmethod
    def _state(self) -> dict[str, object]:
        """The subclass's own fields, JSON-able."""

    @abstractmethod
    def _restore(self, state: dict[str, object]) -> None:
        """Check the subclass's own fields in ``state`` (:class:`AgentStateError` naming
        :attr:`who`), then set them; set nothing when one is bad."""

    def state(self) -> dict[str, object]:
        out = self._state()
        if self.saves_baseline:
            out["baseline_ms"] = dict(self._baseline_ms)
        if self.saves_classes:
            out["classes"] = self._classes.to_state()
        return out

    def restore(self, state: dict[str, object]) -> None:
        base = (
            ms_by_uuid(state.get("baseline_ms", {}), self.who, "'baseline_ms'")
            if self.saves_baseline
            else self._baseline_ms
        )
        classes = (
            WorkloadClasses.from_state(state.get("classes", {}), self.who)
            if self.saves_classes
            else self._classes
        )
        self._restore(state)
        self._baseline_ms, self._classes = base, classes


__all__ = ["BuiltinAgent"]
