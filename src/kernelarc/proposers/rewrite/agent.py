"""The built-in ``rewrite`` agent: the reference's fx graph rewritten into fused library calls.

Plan (a deterministic function of the definition, the workloads' axes and the verdicts):
first every family that applies, together (see :mod:`.rewrites`); if that candidate
fails, each family alone, then the union of the families that passed alone. A passing
full set ends the plan. Every candidate is a real one-file PyTorch solution: the
rewritten graph as plain source (:mod:`.codegen`).

``propose`` returns None (and no candidate, so no conclusion is written) when the
reference cannot be traced, when its graph cannot be propagated on meta tensors or
emitted, when no rewrite that gains at run time applies, and when the plan is spent; the
reason is kept in :attr:`RewriteAgent.skipped` and logged (``logging`` at INFO). On a
draft request the agent has no other approach: it proposes its next planned set.

The reference is traced with the workloads known (:mod:`.trace`): Python control flow on
shapes (asserts, shape unpacking, branches every workload takes alike) is evaluated, so
far more references trace than with the plain fx trace.

A reference that does not trace, or gains nothing from the fx families, may still loop over
experts asking ``torch.where(mask[i])`` in every iteration. Two source rewrites then apply,
as alternatives (the first that passes ends the plan): ``grouped`` (:mod:`.grouped`) replaces
the loop by one ``vmap`` of its body over all experts (batched GEMMs, rows padded to the
largest expert; same function, rounding may differ), and ``loops`` (:mod:`.loops`, exact)
computes all iterations' indices with one device wait. Grouped also covers loops over the
experts that have tokens, rows selected by a boolean mask, and expert-sorted tokens walked
in segments (:mod:`.segments`). Not covered:
rewriting other agents' candidates, FP8 ``_scaled_mm`` (see :mod:`.rewrites`).
"""

from __future__ import annotations

import logging
from typing import ClassVar

from kernelarc.agents.base import AgentStateError
from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion, Proposal
from kernelarc.problem.reference import make_solution
from kernelarc.proposers.base import BuiltinAgent
from kernelarc.proposers.common import failure_summary, score_text
from kernelarc.proposers.rewrite.codegen import CodegenError
from kernelarc.proposers.rewrite.grouped import group_loops
from kernelarc.proposers.rewrite.loops import LoopRewriteError, hoist_wheres
from kernelarc.proposers.rewrite.rewrites import (
    FAMILIES,
    RewriteError,
    apply_families,
    families_for,
    solution_source,
)
from kernelarc.proposers.rewrite.trace import UntraceableError

log = logging.getLogger(__name__)
ENTRY = "run"
LOOPS = "loops"
GROUPED = "grouped"
SOURCE = (GROUPED, LOOPS)
"""The source-level families (:mod:`.grouped`, :mod:`.loops`), when no fx family applies:
alternatives, tried in this order until one passes."""
KNOWN = (*FAMILIES, *SOURCE)


_HYPOTHESIS_LOOPS = (
    "The reference waits for the device in every loop iteration (torch.where's length is "
    "data); computing all iterations' indices with one wait ({label}; bit-exact) lets the "
    "host queue the loop's kernels ahead of the device."
)
_HYPOTHESIS_GROUPED = (
    "The reference runs an expert loop: a device wait and a dozen small kernels per expert. "
    "One pass over all experts ({label}) turns each per-expert GEMM into one batched GEMM "
    "and the loop's launches into a few dozen."
)


GROUPED_PRIORITY = 40
"""A grouped-loop proposal is judged before the precision agent's lead policy (35) when ready
together: batching an expert loop is a structural win the precision agent then stacks on
(it wraps the board's best); under a time limit an expert-loop problem leaves room for only
a few full judgements, and the policy on the unbatched reference should not take one of
them first."""


class RewriteAgent(BuiltinAgent):
    """Proposes the reference rewritten by fx patterns; returns None when nothing applies
    or the reference does not trace (see the module docstring)."""

    name = "rewrite"
    strategy = "rewrite"
    who: ClassVar[str] = "rewrite agent"
    saves_baseline: ClassVar[bool] = True
    priority: ClassVar[int] = 20
    description: ClassVar[str] = (
        "torch.fx rewrites of the reference into fused library calls (SDPA, rms/layer norm, "
        "silu/gelu, half-precision GEMMs, redundant casts); MoE expert loops batched "
        "(grouped GEMMs) or their waits hoisted"
    )

    def __init__(self) -> None:
        super().__init__()
        self.skipped: str | None = None
        self._families: list[str] | None = None
        self._tried: list[dict[str, object]] = []

    # ------------------------------------------------------------------ planning
    def _skip(self, reason: str) -> None:
        self.skipped = reason
        log.info("rewrite agent proposes nothing: %s", reason)

    def _analyse(self, context: AgentContext) -> list[str] | None:
        try:
            full = apply_families(
                context.definition,
                context.workloads,
                families_for(context.device),
                context.scalars,
            )
        except (UntraceableError, RewriteError, CodegenError) as e:
            return self._loops_or_skip(context, str(e))
        if not full.families:
            return self._loops_or_skip(
                context, "no rewrite that gains at run time applies to the reference's graph"
            )
        return list(full.families)

    def _loops_or_skip(self, context: AgentContext, why: str) -> list[str] | None:
        try:
            _, grouped, refused = group_loops(context.definition.reference, ENTRY)
            _, hoisted = hoist_wheres(context.definition.reference, ENTRY)
        except LoopRewriteError as e:
            self._skip(f"{why}; loops: {e}")
            return None
        if not grouped and not hoisted:
            self._skip(f"{why}; no expert loop to batch ({'; '.join(refused) or 'no loop'})")
            return None
        if not grouped:
            log.info("rewrite agent: no expert loop to batch: %s", "; ".join(refused))
        return [GROUPED] * bool(grouped) + [LOOPS] * bool(hoisted)

    def next_set(self) -> list[str] | None:
        """The next family set of the plan (None when it is spent)."""
        fams = self._families or []
        tried = [t["families"] for t in self._tried]
        if not fams:
            return None
        if set(fams) <= set(SOURCE):  # alternatives, in order, until one passes
            if any(t["passed"] is not False for t in self._tried):
                return None
            return next(([f] for f in fams if [f] not in tried), None)
        if not tried:
            return fams
        if self._tried[0]["passed"] is not False or len(fams) == 1:
            return None
        for f in fams:
            if [f] not in tried:
                return [f]
        passed = [
            f
            for f in fams
            if any(t["families"] == [f] and t["passed"] is True for t in self._tried)
        ]
        if len(passed) >= 2 and passed not in tried:
            return passed
        return None

    # ------------------------------------------------------------------ ask / tell
    def propose(self, context: AgentContext) -> Proposal | None:
        if self.skipped is not None:
            return None
        definition = context.definition
        if self._families is None:
            self._families = self._analyse(context)
            if self._families is None:
                return None
        chosen = self.next_set()
        if chosen is None:
            return None
        try:
            if chosen == [LOOPS]:
                source, hoisted = hoist_wheres(definition.reference, ENTRY)
                label, is_exact = f"{hoisted} torch.where of expert loops hoisted", True
            elif chosen == [GROUPED]:
                source, grouped, _ = group_loops(definition.reference, ENTRY)
                label = f"{grouped} expert loop(s) batched over all experts with torch.func.vmap"
                is_exact = False
            else:
                rewritten = apply_families(definition, context.workloads, chosen, context.scalars)
                source = solution_source(definition, rewritten)
                label, is_exact = rewritten.label(), rewritten.exact
        except (UntraceableError, RewriteError, CodegenError, LoopRewriteError) as e:
            self._skip(f"families {chosen}: {e}")
            return None
        self._classify(context)
        self._measure_against_incumbent(context)
        self._tried.append({"families": chosen, "label": label, "passed": None})
        n = len(self._tried)
        exact = "bit-exact" if is_exact else "same function, rounding may differ"
        if chosen == [LOOPS]:
            hypothesis = _HYPOTHESIS_LOOPS.format(label=label)
        elif chosen == [GROUPED]:
            hypothesis = _HYPOTHESIS_GROUPED.format(label=label)
        else:
            hypothesis = (
                f"Rewriting the reference graph ({label}; {exact}) replaces chains of eager "
                "kernels by fused library calls, cutting launches and memory traffic."
            )
        solution = make_solution(
            definition,
            agent=self.name,
            name=f"{definition.name}-rewrite-{'+'.join(chosen)}-{n}",
            description=f"The reference with {label} ({exact}).",
            source=source,
            entry=ENTRY,
        )
        return Proposal(
            solution=solution,
            hypothesis=hypothesis,
            parent_id=context.incumbent.candidate_id if context.incumbent else None,
            mode="draft" if context.must_draft else "refine",
            tags=("rewrite", *chosen),
            priority=GROUPED_PRIORITY if chosen == [GROUPED] else None,
        )

    def observe(self, result: CandidateResult) -> Conclusion:
        entry = self._tried[-1] if self._tried else None
        if entry is not None and entry["passed"] is None:
            entry["passed"] = bool(result.passed)
        label = str(entry["label"]) if entry else "unknown rewrites"
        families = [str(f) for f in entry["families"]] if entry else []  # type: ignore[attr-defined]
        effect, overall = self._effect(result)
        n = len(result.per_workload)
        kind = "source rewrite" if set(families) <= set(SOURCE) else "fx rewrite"
        head = f"{kind} of the reference ({label})"
        if result.passed:
            score = score_text(result, "unmeasured speedup")
            claim = f"{head}: passed, {score} over eager on {n}/{n} workloads"
            if self._baseline_ms and overall is not None:
                claim += f"; {overall:.2f}x vs own previous best"
        else:
            claim = f"{head}: {failure_summary(result)}"
            if families == [GROUPED]:
                claim += "; next: the loop as written, its torch.where hoisted"
            elif len(families) > 1:
                claim += "; next: each rewrite family alone"
        if result.stage == "screen":
            claim += " (screening stage only)"
        return self._conclude(result, claim, effect, ("rewrite", *families), overall)

    # ------------------------------------------------------------------ state
    def _state(self) -> dict[str, object]:
        return {
            "skipped": self.skipped,
            "families": list(self._families) if self._families is not None else None,
            "tried": [dict(t) for t in self._tried],
        }

    def _restore(self, state: dict[str, object]) -> None:
        skipped, families = state.get("skipped"), state.get("families")
        tried = state.get("tried", [])
        if skipped is not None and not isinstance(skipped, str):
            raise AgentStateError(
                f"rewrite agent state: 'skipped' must be a string, got {skipped!r}"
            )
        if families is not None and (
            not isinstance(families, list) or any(f not in KNOWN for f in families)
        ):
            raise AgentStateError(f"rewrite agent state: bad 'families' {families!r}")
        if not isinstance(tried, list):
            raise AgentStateError("rewrite agent state: 'tried' must be a list")
        checked: list[dict[str, object]] = []
        for t in tried:
            if not isinstance(t, dict) or set(t) != {"families", "label", "passed"}:
                raise AgentStateError(f"rewrite agent state: bad 'tried' entry {t!r}")
            fams, label, passed = t["families"], t["label"], t["passed"]
            if not isinstance(fams, list) or any(f not in KNOWN for f in fams):
                raise AgentStateError(f"rewrite agent state: bad families in {t!r}")
            if not isinstance(label, str) or passed not in (None, True, False):
                raise AgentStateError(f"rewrite agent state: bad label/passed in {t!r}")
            checked.append({"families": [str(f) for f in fams], "label": label, "passed": passed})
        self.skipped = skipped
        self._families = [str(f) for f in families] if families is not None else None
        self._tried = checked


__all__ = ["ENTRY", "RewriteAgent"]
