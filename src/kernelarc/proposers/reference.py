"""The reference baseline agent and the helpers every built-in agent concludes with.

- :class:`ReferenceAgent` proposes the problem's reference code itself, once: the correct
  baseline every run has (its speedup over eager is ~1 and measures the guard's noise).
- Shared helpers: workload classes (small/large by the median of the first ``var`` axis),
  the measured effect by class, claims, outcomes and failure summaries of a verdict.

Not covered here: the other built-ins live in their own modules (``compiler``,
``precision``, ``cudagraph``, ``gemm_tables``, ``rewrite/``, ``tuner``; ``wrap`` builds
solutions around another solution).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kernelarc.agents.base import Agent
from kernelarc.agents.types import (
    CLAIM_MAX,
    AgentContext,
    CandidateResult,
    Conclusion,
    Outcome,
    Proposal,
    WorkloadResult,
)
from kernelarc.problem.reference import make_solution, reference_solution
from kernelarc.problem.schema import Definition

#: A passing candidate slower than this fraction of its baseline's speed is "regressed".
REGRESSED_BELOW = 0.97


# ------------------------------------------------------------------------------ helpers


def geomean(values: Sequence[float]) -> float | None:
    """Geometric mean of the positive values (None when there are none)."""
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


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
        """The inverse of :meth:`to_state`; ``ValueError`` (naming ``who``) on bad input."""
        if not isinstance(raw, dict):
            raise ValueError(f"{who} state: 'classes' must be an object, got {raw!r}")
        axis, median = raw.get("axis"), raw.get("median")
        if axis is not None and not isinstance(axis, str):
            raise ValueError(f"{who} state: bad classes axis {axis!r}")
        if median is not None and (not isinstance(median, int) or isinstance(median, bool)):
            raise ValueError(f"{who} state: bad classes median {median!r}")
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
    """A state's ``{uuid: milliseconds}`` map, validated; ``ValueError`` names ``who``/``what``."""
    if not isinstance(raw, dict):
        raise ValueError(f"{who} state: {what} must be an object, got {raw!r}")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in raw.values()):
        raise ValueError(f"{who} state: {what} values must be numbers")
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


def _notes(result: CandidateResult) -> str:
    notes = []
    if result.stage == "screen":
        notes.append("screening stage only")
    if result.cached:
        notes.append("cached verdict")
    if result.stopped_early and result.passed:
        notes.append(f"stopped early: {result.stopped_early}")
    return f" ({'; '.join(notes)})" if notes else ""


def _board_parent(context: AgentContext, me: str) -> str | None:
    if context.board is None:
        return None
    others = context.board.others(me)
    best = max(others, key=lambda i: i.score, default=None)
    return best.candidate_id if best is not None else None


# ------------------------------------------------------------------------------ reference


class ReferenceAgent(Agent):
    """Proposes the reference itself as a solution, once: the baseline of every run."""

    name = "reference"
    strategy = "reference"
    priority: ClassVar[int] = -10  # the baseline: the guard times the reference anyway
    description: ClassVar[str] = (
        "the problem's reference code as a solution, once: the correct eager baseline"
    )

    def __init__(self) -> None:
        self._proposed = False
        self._classes = WorkloadClasses()

    def propose(self, context: AgentContext) -> Proposal | None:
        if self._proposed:
            return None
        self._proposed = True
        definition = context.definition
        self._classes = WorkloadClasses.of(definition, context.workloads)
        solution = reference_solution(
            definition,
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
        effect = effect_by_class(result.per_workload, self._classes, {})
        n = len(result.per_workload)
        if result.passed:
            score = f"{result.score:.2f}x" if result.score is not None else "unmeasured"
            claim = (
                f"reference as solution (eager baseline): geomean speedup {score} over eager "
                f"on {n}/{n} workloads; this is the baseline, deviations from 1 are "
                f"measurement noise{_notes(result)}"
            )
        elif not any(r.status != "PASSED" for r in result.per_workload) and result.stopped_early:
            # Stopped as hopeless against a faster incumbent: every judged workload passed.
            claim = (
                f"reference as solution (eager baseline): passed what was judged, then "
                f"stopped early ({result.stopped_early}): other agents already beat eager"
                f"{_notes(result)}"
            )
        else:
            claim = (
                f"reference as solution (eager baseline): {failure_summary(result)}; the "
                f"baseline itself does not pass the guard, so check the problem{_notes(result)}"
            )
        # The baseline cannot regress against itself: a ratio below 1 is noise.
        return conclusion_of(
            self,
            result,
            claim=claim,
            effect=effect,
            tags=("reference", "baseline"),
            outcome=outcome_of(result, None),
        )

    def state(self) -> dict[str, object]:
        return {"proposed": self._proposed}

    def restore(self, state: dict[str, object]) -> None:
        proposed = state.get("proposed", False)
        if not isinstance(proposed, bool):
            raise ValueError(f"reference agent state: 'proposed' must be a bool, got {proposed!r}")
        self._proposed = proposed


__all__ = [
    "REGRESSED_BELOW",
    "ReferenceAgent",
    "WorkloadClasses",
    "clip",
    "conclusion_of",
    "effect_by_class",
    "failure_summary",
    "first_var_axis",
    "geomean",
    "make_solution",
    "ms_by_uuid",
    "outcome_of",
    "reference_solution",
]
