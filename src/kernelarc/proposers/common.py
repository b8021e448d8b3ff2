"""What the built-in agents share when they conclude: workload classes, effects, claims.

- :class:`WorkloadClasses`: small/large workloads split at the (lower) median of the first
  ``var`` axis, the classes every conclusion's ``effect`` is keyed by.
- :func:`effect_by_class`: the measured speedup per class over a baseline.
- :func:`conclusion_of`, :func:`failure_summary`, :func:`notes_of`, :func:`outcome_of`:
  the pieces of a conclusion's claim and its outcome.
- :func:`ms_by_uuid`, :func:`count_of`: checked readers of saved agent state.

Not covered: the agents themselves (:mod:`.base` holds what their classes share).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kernelarc.agents.base import Agent, AgentStateError
from kernelarc.agents.types import (
    CLAIM_MAX,
    AgentContext,
    CandidateResult,
    Conclusion,
    Outcome,
    WorkloadResult,
)
from kernelarc.maths import geomean
from kernelarc.problem.schema import Definition

#: A passing candidate slower than this fraction of its baseline's speed is "regressed".
REGRESSED_BELOW = 0.97


def first_var_axis(definition: Definition) -> str | None:
    """The first axis of type ``var`` in definition order (None when every axis is fixed)."""
    return next((n for n, a in definition.axes.items() if a.type == "var"), None)


@dataclass(frozen=True)
class WorkloadClasses:
    """Small/large workloads split at the (lower) median of one ``var`` axis."""

    axis: str | None = None
    median: int | None = None

    def to_state(self) -> dict[str, object]:
        """JSON-able form, for an agent's :meth:`~kernelarc.agents.base.Agent.state`."""
        return {"axis": self.axis, "median": self.median}

    @classmethod
    def from_state(cls, raw: object, who: str) -> WorkloadClasses:
        """The inverse of :meth:`to_state`; :class:`AgentStateError` naming ``who`` on bad
        input."""
        if not isinstance(raw, dict):
            raise AgentStateError(f"{who} state: 'classes' must be an object, got {raw!r}")
        axis, median = raw.get("axis"), raw.get("median")
        if axis is not None and not isinstance(axis, str):
            raise AgentStateError(f"{who} state: bad classes axis {axis!r}")
        if median is not None and (not isinstance(median, int) or isinstance(median, bool)):
            raise AgentStateError(f"{who} state: bad classes median {median!r}")
        return cls(axis=axis, median=median)

    @classmethod
    def of(cls, definition: Definition, workloads: Sequence[dict[str, int]]) -> WorkloadClasses:
        axis = first_var_axis(definition)
        values = [w[axis] for w in workloads if axis is not None and axis in w]
        if axis is None or not values:
            return cls(axis=None, median=None)
        return cls(axis=axis, median=int(statistics.median_low(values)))

    def label(self, axes: dict[str, int]) -> str:
        if self.axis is None or self.median is None or self.axis not in axes:
            return "all"
        if axes[self.axis] <= self.median:
            return f"small: {self.axis}<={self.median}"
        return f"large: {self.axis}>{self.median}"


def ms_by_uuid(raw: object, who: str, what: str) -> dict[str, float]:
    """A state's ``{uuid: milliseconds}`` map, validated (:class:`AgentStateError` naming
    ``who`` and ``what``)."""
    if not isinstance(raw, dict):
        raise AgentStateError(f"{who} state: {what} must be an object, got {raw!r}")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in raw.values()):
        raise AgentStateError(f"{who} state: {what} values must be numbers")
    return {str(k): float(v) for k, v in raw.items()}


def effect_by_class(
    per_workload: Sequence[WorkloadResult],
    classes: WorkloadClasses,
    baseline_ms: dict[str, float],
) -> dict[str, float]:
    """Geomean speedup per workload class over ``baseline_ms`` (by uuid), falling back to the
    reference latency for workloads without a baseline. Only measured workloads count."""
    ratios: dict[str, list[float]] = {}
    for r in per_workload:
        base = baseline_ms.get(r.uuid) or r.reference_ms
        if r.status != "PASSED" or not r.latency_ms or not base:
            continue
        ratios.setdefault(classes.label(r.axes), []).append(base / r.latency_ms)
    out = {k: geomean(v) for k, v in sorted(ratios.items())}
    return {k: round(v, 4) for k, v in out.items() if v is not None}


def clip(text: str, limit: int = CLAIM_MAX) -> str:
    """``text`` shortened to ``limit`` characters (an ellipsis marks a cut)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def conclusion_of(
    agent: Agent,
    result: CandidateResult,
    *,
    claim: str,
    effect: dict[str, float],
    tags: tuple[str, ...],
    outcome: Outcome,
) -> Conclusion:
    """``agent``'s conclusion on ``result``: the claim clipped to the allowed length."""
    return Conclusion(
        agent=agent.name,
        strategy=agent.strategy,
        candidate_id=result.candidate_id,
        claim=clip(claim),
        effect=effect,
        tags=tags,
        outcome=outcome,
    )


def score_text(result: CandidateResult, unmeasured: str = "unmeasured") -> str:
    """The candidate's speedup over eager as ``1.23x``, or ``unmeasured`` when it has none."""
    return f"{result.score:.2f}x" if result.score is not None else unmeasured


def failure_summary(result: CandidateResult) -> str:
    """``failed on k/n workloads (STATUS[check]: first log line)`` for a failed candidate."""
    bad = [r for r in result.per_workload if r.status != "PASSED"]
    n = len(result.per_workload)
    if not bad:
        why = result.stopped_early or "no workload was judged"
        return f"did not pass ({why})"
    first = bad[0]
    status = first.status + (f"[{first.check}]" if first.check else "")
    line = next((ln.strip() for ln in first.log.splitlines() if ln.strip()), "")
    detail = f"{status}: {clip(line, 120)}" if line else status
    return f"failed on {len(bad)}/{n} workloads ({detail})"


def outcome_of(result: CandidateResult, overall_effect: float | None) -> Outcome:
    """``failed`` unless passed; ``improved`` when it became the incumbent; ``regressed``
    when clearly slower than its baseline; otherwise ``no_gain``."""
    if not result.passed:
        return "failed"
    if result.improved:
        return "improved"
    if overall_effect is not None and overall_effect < REGRESSED_BELOW:
        return "regressed"
    return "no_gain"


def notes_of(result: CandidateResult) -> str:
    """`` (screening stage only; cached verdict; stopped early: why)``, or ``""``: what a
    claim should say about how far the verdict went."""
    notes = []
    if result.stage == "screen":
        notes.append("screening stage only")
    if result.cached:
        notes.append("cached verdict")
    if result.stopped_early and result.passed:
        notes.append(f"stopped early: {result.stopped_early}")
    return f" ({'; '.join(notes)})" if notes else ""


def board_parent(context: AgentContext, me: str) -> str | None:
    """The candidate id of the best incumbent of another agent than ``me`` (the parent of a
    draft built beside it), None without a board or other incumbents."""
    if context.board is None:
        return None
    others = context.board.others(me)
    best = max(others, key=lambda i: i.score, default=None)
    return best.candidate_id if best is not None else None


def count_of(raw: object, who: str, what: str = "'count'") -> int:
    """A state's non-negative count, validated (:class:`AgentStateError` naming ``who`` and
    ``what``)."""
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 0:
        raise AgentStateError(f"{who} state: {what} must be a count, got {raw!r}")
    return raw


__all__ = [
    "REGRESSED_BELOW",
    "WorkloadClasses",
    "board_parent",
    "clip",
    "conclusion_of",
    "count_of",
    "effect_by_class",
    "failure_summary",
    "first_var_axis",
    "ms_by_uuid",
    "notes_of",
    "outcome_of",
    "score_text",
]
