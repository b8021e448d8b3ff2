"""Built-in, model-free proposers: the reference baseline and ``torch.compile`` variants.

- :class:`ReferenceAgent` proposes the problem's reference code itself, once: the correct
  baseline every run has (its speedup over eager is ~1 and measures the guard's noise).
- :class:`CompilerAgent` proposes the reference wrapped in ``torch.compile``, one fixed
  configuration per call (Inductor modes and options, in the order of
  :data:`COMPILE_VARIANTS`); on a draft request it jumps to the next untried configuration
  of the other family (modes vs options).

Both produce real SOL-ExecBench solutions (``languages: ["pytorch"]``, non
destination-passing, one file ``solution.py``) and conclude from the guard's verdict with a
short claim, the measured effect by workload class (small/large by the median of the first
``var`` axis) and an outcome.

Not covered here: the other built-ins live in their own modules (``precision``,
``cudagraph``, ``gemm_tables``, ``rewrite/``, ``tuner``; ``wrap`` builds solutions around
another solution). The compiled variants compile the *reference*; they do not compile other
agents' candidates.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

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

COMPILED_ENTRY = "kernelarc_entry"
#: A passing candidate slower than this fraction of its baseline's speed is "regressed".
REGRESSED_BELOW = 0.97

Family = Literal["mode", "options"]


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


# ------------------------------------------------------------------------------ compiler


@dataclass(frozen=True)
class CompileVariant:
    """One ``torch.compile`` configuration. ``kwargs`` are keyword arguments of
    ``torch.compile`` as (name, value) pairs; ``options`` an Inductor options dict."""

    name: str
    family: Family
    kwargs: tuple[tuple[str, Any], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    cuda_only: bool = False

    def arguments(self) -> str:
        """The keyword arguments as Python source, e.g. ``mode='max-autotune'``."""
        parts = [f"{k}={v!r}" for k, v in self.kwargs]
        if self.options:
            parts.append(f"options={dict(self.options)!r}")
        return ", ".join(parts)

    def label(self) -> str:
        """A readable one-line description, e.g. ``mode=max-autotune-no-cudagraphs``."""
        parts = [f"{k}={v}" for k, v in self.kwargs]
        parts += [f"{k}={v}" for k, v in self.options]
        return " ".join(parts) or "default settings"


#: The configurations the compiler agent walks, in order.
COMPILE_VARIANTS: tuple[CompileVariant, ...] = (
    CompileVariant("default", "mode"),
    CompileVariant("static", "mode", kwargs=(("dynamic", False), ("fullgraph", False))),
    CompileVariant(
        "max-autotune-no-cudagraphs", "mode", kwargs=(("mode", "max-autotune-no-cudagraphs"),)
    ),
    CompileVariant("coordinate-descent", "options", options=(("coordinate_descent_tuning", True),)),
    CompileVariant(
        "epilogue-fusion", "options", options=(("epilogue_fusion", True), ("max_autotune", False))
    ),
    CompileVariant(
        "reduce-overhead", "mode", kwargs=(("mode", "reduce-overhead"),), cuda_only=True
    ),
)


def compiled_source(reference: str, variant: CompileVariant) -> str:
    """The reference source followed by a ``torch.compile`` of its ``run`` and an entry."""
    args = variant.arguments()
    call = f"torch.compile(run, {args})" if args else "torch.compile(run)"
    return (
        reference.rstrip()
        + "\n\n\n"
        + f"# KernelArc compiler agent: torch.compile of the reference ({variant.name}).\n"
        + "import torch  # noqa: E402\n\n"
        + f"_compiled = {call}\n\n\n"
        + f"def {COMPILED_ENTRY}(*args):\n"
        + "    return _compiled(*args)\n"
    )


def _variant_named(name: str) -> CompileVariant:
    for v in COMPILE_VARIANTS:
        if v.name == name:
            return v
    known = ", ".join(v.name for v in COMPILE_VARIANTS)
    raise ValueError(f"compiler agent state names an unknown configuration {name!r} ({known})")


class CompilerAgent(Agent):
    """Proposes ``torch.compile`` variants of the reference, one configuration per call."""

    name = "compiler"
    strategy = "compiler"
    priority: ClassVar[int] = 30
    description: ClassVar[str] = (
        "torch.compile of the reference, one Inductor mode/options configuration per call"
    )

    def __init__(self) -> None:
        self._index = 0
        self._tried: list[str] = []
        self._count = 0
        self._pending: str | None = None
        self._baseline_ms: dict[str, float] = {}
        self._classes = WorkloadClasses()

    def _usable(self, device: str) -> list[CompileVariant]:
        return [
            v
            for v in COMPILE_VARIANTS
            if v.name not in self._tried and (not v.cuda_only or device.startswith("cuda"))
        ]

    def _next(self, context: AgentContext) -> CompileVariant | None:
        usable = self._usable(context.device)
        if not usable:
            return None
        order = COMPILE_VARIANTS[self._index :] + COMPILE_VARIANTS[: self._index]
        ranked = [v for v in order if v in usable]
        if context.must_draft and self._tried:
            family = _variant_named(self._tried[-1]).family
            other = [v for v in ranked if v.family != family]
            return other[0] if other else ranked[0]
        return ranked[0]

    def propose(self, context: AgentContext) -> Proposal | None:
        variant = self._next(context)
        if variant is None:
            return None
        definition = context.definition
        self._classes = WorkloadClasses.of(definition, context.workloads)
        self._baseline_ms = dict(context.incumbent.latencies_ms) if context.incumbent else {}
        self._tried.append(variant.name)
        self._index = COMPILE_VARIANTS.index(variant) + 1
        self._pending = variant.name
        self._count += 1
        draft = context.must_draft
        parent = (
            _board_parent(context, self.name)
            if draft
            else (context.incumbent.candidate_id if context.incumbent else None)
        )
        solution = make_solution(
            definition,
            agent=self.name,
            name=f"{definition.name}-compiler-{variant.name}-{self._count}",
            description=f"torch.compile of the reference ({variant.label()}).",
            source=compiled_source(definition.reference, variant),
            entry=COMPILED_ENTRY,
        )
        why = "a different family of settings (draft)" if draft else "the next configuration"
        return Proposal(
            solution=solution,
            hypothesis=f"torch.compile {variant.label()} ({why}): Inductor fuses the "
            f"reference's operations into fewer kernels, which should beat eager.",
            parent_id=parent,
            mode="draft" if draft else "refine",
            tags=("compiler", variant.name),
        )

    def observe(self, result: CandidateResult) -> Conclusion:
        variant = _variant_named(self._pending) if self._pending else None
        self._pending = None
        label = f"torch.compile {variant.label()}" if variant else "torch.compile (unknown)"
        effect = effect_by_class(result.per_workload, self._classes, self._baseline_ms)
        overall = geomean(list(effect.values()))
        n = len(result.per_workload)
        if result.passed:
            score = f"{result.score:.2f}x" if result.score is not None else "unmeasured speedup"
            claim = f"{label}: {score} over eager on {n}/{n} workloads"
            if len(effect) > 1:
                best = max(effect, key=lambda k: effect[k])
                claim += f"; best on {best} ({effect[best]:.2f}x)"
            if self._baseline_ms and overall is not None:
                claim += f"; {overall:.2f}x vs own previous best"
        else:
            claim = f"{label}: {failure_summary(result)}"
        return conclusion_of(
            self,
            result,
            claim=claim + _notes(result),
            effect=effect,
            tags=("compiler", variant.name) if variant else ("compiler",),
            outcome=outcome_of(result, overall),
        )

    def state(self) -> dict[str, object]:
        return {
            "index": self._index,
            "tried": list(self._tried),
            "count": self._count,
            "pending": self._pending,
            "baseline_ms": dict(self._baseline_ms),
            "classes": self._classes.to_state(),
        }

    def restore(self, state: dict[str, object]) -> None:
        index, tried, count = state.get("index", 0), state.get("tried", []), state.get("count", 0)
        pending = state.get("pending")
        if not isinstance(index, int) or not 0 <= index <= len(COMPILE_VARIANTS):
            raise ValueError(f"compiler agent state: bad 'index' {index!r}")
        if not isinstance(tried, list) or not isinstance(count, int):
            raise ValueError("compiler agent state: 'tried' must be a list, 'count' an int")
        base = ms_by_uuid(state.get("baseline_ms", {}), "compiler agent", "'baseline_ms'")
        classes = WorkloadClasses.from_state(state.get("classes", {}), "compiler agent")
        for name in [*tried, *([pending] if pending is not None else [])]:
            _variant_named(str(name))
        self._index, self._tried, self._count = index, [str(t) for t in tried], count
        self._pending = str(pending) if pending is not None else None
        self._baseline_ms, self._classes = base, classes


__all__ = [
    "COMPILE_VARIANTS",
    "conclusion_of",
    "CompileVariant",
    "CompilerAgent",
    "ReferenceAgent",
    "WorkloadClasses",
    "compiled_source",
    "effect_by_class",
    "make_solution",
    "reference_solution",
    "ms_by_uuid",
]
