"""The ``compiler`` agent: ``torch.compile`` of the reference, one configuration per call.

:class:`CompilerAgent` proposes the reference wrapped in ``torch.compile``, one fixed
configuration per call (Inductor modes and options, in the order of
:data:`COMPILE_VARIANTS`); on a draft request it jumps to the next untried configuration of
the other family (modes vs options). Before its next configuration it compiles another
agent's incumbent from the board when one qualifies (:mod:`.compile_board`) and is faster,
uncompiled, than the base of its own best compile: strategies combined in one candidate.
Once such a compile becomes its incumbent, the configurations still to try apply to that
base instead of the reference, so the shape-specialised configuration is reached on the
better base too.

Its first proposal is always the reference compiled as torch.compile's baseline is
(``BASELINE``: ``dynamic=False``, one graph per shape, as the guard's compiled reference
compiles it), the figure users compare against, and no better board incumbent displaces it
(``rebase`` leaves it): a compile of a board base is no substitute for that figure, since
it may lose to the compiled reference on some workloads.

``reduce-overhead`` replays Inductor's CUDA graphs, which write every call's outputs into the
same buffers: the entry returns copies (``CompileVariant.fresh_outputs``), else the output of
one call changes under the caller at the next (the guard's re-check of a timed call's
output fails it as REWARD_HACK[recheck]).

Its solutions are real SOL-ExecBench solutions (``languages: ["pytorch"]``, non
destination-passing for the reference's, one file ``solution.py``; wrappers of the base
for board incumbents: :func:`compiled_base_solution`) and it concludes from the guard's
verdict with a short claim, the measured effect by workload class and an outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kernelarc.agents.base import AgentStateError, Rebasing
from kernelarc.agents.types import (
    AgentContext,
    CandidateResult,
    Conclusion,
    IncumbentView,
    Proposal,
)
from kernelarc.guard.compile_pool import RECOMPILE_LIMIT_KEYS, STATIC_RECOMPILE_LIMIT
from kernelarc.problem.reference import make_solution
from kernelarc.problem.schema import Definition, Solution
from kernelarc.proposers.base import BuiltinAgent
from kernelarc.proposers.common import (
    board_parent,
    count_of,
    failure_summary,
    notes_of,
    score_text,
)
from kernelarc.proposers.compile_board import why_not_compilable
from kernelarc.proposers.wrap import wrap_solution

COMPILED_ENTRY = "kernelarc_entry"
Family = Literal["mode", "options"]


@dataclass(frozen=True)
class CompileVariant:
    """One ``torch.compile`` configuration. ``kwargs`` are keyword arguments of
    ``torch.compile`` as (name, value) pairs; ``options`` an Inductor options dict."""

    name: str
    family: Family
    kwargs: tuple[tuple[str, Any], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    cuda_only: bool = False
    fresh_outputs: bool = False
    """The entry returns copies of the compiled function's tensors: it reuses its output
    buffers from one call to the next (CUDA graphs)."""

    def specialises(self) -> bool:
        """True when the configuration compiles one graph per input shape (``dynamic=False``)."""
        return ("dynamic", False) in self.kwargs

    def setup(self) -> str:
        """Source lines to run before the ``torch.compile`` call (after ``import torch``).

        A shape-specialised compile recompiles for every new shape, and Dynamo gives up after
        ``recompile_limit`` (8 by default) and runs the rest eagerly, far slower than the
        default compile. Its limits are raised as the guard raises its torch.compile
        baseline's (``compile_pool.raise_recompile_limits``); a higher limit changes no
        compiled code."""
        if not self.specialises():
            return ""
        lines = ["import torch._dynamo  # noqa: E402", ""]
        for key in RECOMPILE_LIMIT_KEYS:
            lines.append(
                f"torch._dynamo.config.{key} = max({STATIC_RECOMPILE_LIMIT}, "
                f"torch._dynamo.config.{key})"
            )
        return "\n".join(lines) + "\n"

    def arguments(self) -> str:
        """The keyword arguments as Python source, e.g. ``mode='max-autotune'``."""
        parts = [f"{k}={v!r}" for k, v in self.kwargs]
        if self.options:
            parts.append(f"options={dict(self.options)!r}")
        return ", ".join(parts)

    def entry(self, compiled: str) -> str:
        """The source of ``kernelarc_entry``, which calls ``compiled`` (a module-level name)."""
        if not self.fresh_outputs:
            return f"def {COMPILED_ENTRY}(*args):\n    return {compiled}(*args)\n"
        return (
            f"def {COMPILED_ENTRY}(*args):\n"
            f"    # The compiled graphs reuse their output buffers on the next call: copies.\n"
            f"    out = {compiled}(*args)\n"
            "    if isinstance(out, torch.Tensor):\n"
            "        return out.clone()\n"
            "    if isinstance(out, tuple):\n"
            "        return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in out)\n"
            "    return out\n"
        )

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
        "reduce-overhead",
        "mode",
        kwargs=(("mode", "reduce-overhead"),),
        cuda_only=True,
        fresh_outputs=True,
    ),
)


BASELINE = "static"
"""The configuration of torch.compile's baseline (the guard's compiled reference,
``torch.compile(run, dynamic=False)``): the compiler's first proposal on the reference."""


def reference_description(variant: CompileVariant) -> str:
    """The description of the compiler's solution that compiles the reference with
    ``variant`` (the report knows torch.compile's baseline by it: ``report/baseline.py``)."""
    return f"torch.compile of the reference ({variant.label()})."


def compiled_source(reference: str, variant: CompileVariant) -> str:
    """The reference source followed by a ``torch.compile`` of its ``run`` and an entry."""
    args = variant.arguments()
    call = f"torch.compile(run, {args})" if args else "torch.compile(run)"
    return (
        reference.rstrip()
        + "\n\n\n"
        + f"# KernelArc compiler agent: torch.compile of the reference ({variant.name}).\n"
        + "import torch  # noqa: E402\n\n"
        + (f"{setup}\n" if (setup := variant.setup()) else "")
        + f"_compiled = {call}\n\n\n"
        + variant.entry("_compiled")
    )


_BASE_BODY = """
import torch

{setup}_ka_compiled = torch.compile(_ka_base{arguments})


{entry}"""


def compiled_base_solution(
    base: Solution, definition: Definition, variant: CompileVariant, *, name: str, what: str
) -> Solution:
    """``base`` wrapped (:func:`~kernelarc.proposers.wrap.wrap_solution`) in
    ``torch.compile(base_entry, <variant's arguments>)``, after the variant's setup lines,
    with the variant's entry (``CompileVariant.setup``/``entry``); ``what`` names the base."""
    arguments, setup, label = variant.arguments(), variant.setup(), variant.label()
    return wrap_solution(
        base,
        definition,
        agent="compiler",
        name=name,
        description=f"torch.compile ({label}) of {what}.",
        body=_BASE_BODY.format(
            arguments=f", {arguments}" if arguments else "",
            setup=f"{setup}\n" if setup else "",
            entry=variant.entry("_ka_compiled"),
        ),
        stem="kernelarc_compiled",
        docstring=f"KernelArc compiler agent: torch.compile ({label}) of {what}.",
    )


def variant_named(name: str) -> CompileVariant:
    """The configuration of :data:`COMPILE_VARIANTS` called ``name`` (:class:`AgentStateError`
    if none: only a saved state can name an unknown one)."""
    for v in COMPILE_VARIANTS:
        if v.name == name:
            return v
    known = ", ".join(v.name for v in COMPILE_VARIANTS)
    raise AgentStateError(f"compiler agent state names an unknown configuration {name!r} ({known})")


def _dump(view: IncumbentView | None) -> dict[str, Any] | None:
    return None if view is None else view.model_dump(mode="json")


def _load(data: object, what: str) -> IncumbentView | None:
    if data is None:
        return None
    try:
        return IncumbentView.model_validate(data)
    except ValueError as e:
        raise AgentStateError(f"compiler agent state: bad {what}: {e}") from e


class CompilerAgent(BuiltinAgent, Rebasing):
    """Proposes ``torch.compile`` variants of the reference, one configuration per call, and
    compiles better board incumbents first; a pending proposal made before a better
    incumbent appeared is rebased onto it (:meth:`rebase`)."""

    name = "compiler"
    strategy = "compiler"
    who: ClassVar[str] = "compiler agent"
    saves_baseline: ClassVar[bool] = True
    priority: ClassVar[int] = 30
    description: ClassVar[str] = (
        "torch.compile of the reference, one Inductor mode/options configuration per call, "
        "and of other agents' better Python incumbents from the board"
    )

    def __init__(self) -> None:
        super().__init__()
        self._index = 0
        self._tried: list[str] = []
        self._count = 0
        self._pending: str | None = None
        self._bases: list[str] = []
        """Candidate ids of the board incumbents compiled so far."""
        self._pending_base: str | None = None
        self._pending_view: IncumbentView | None = None
        """The board incumbent the pending proposal compiles for the first time."""
        self._on: IncumbentView | None = None
        """The board incumbent the configurations apply to (None: the reference); ``_tried``
        and ``_index`` are about this base."""
        self._plain = False
        """The reference's compile in the baseline's configuration (``BASELINE``) has been
        proposed."""

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
            family = variant_named(self._tried[-1]).family
            other = [v for v in ranked if v.family != family]
            return other[0] if other else ranked[0]
        return ranked[0]

    def _board_base(self, context: AgentContext) -> IncumbentView | None:
        """Another agent's incumbent to compile (``compile_board``), not compiled by it yet,
        better (uncompiled) than the base of this agent's best compile: the board base whose
        compile won, else the reference (1.0x). Bases are compared with bases: a compiled
        result is no floor for an uncompiled base, since compiling the base combines both.
        Former incumbents count: an agent's newer incumbent may not be compilable where its
        older one was (a policy around a CUDA graph replacing the plain policy)."""
        if context.board is None or context.must_draft:
            return None
        floor = self._on.score if self._on is not None else 1.0
        views = context.board.others(self.name, former=True)
        for view in sorted(views, key=lambda v: -v.score):
            if view.score <= floor:
                return None
            if view.candidate_id not in self._bases and (
                why_not_compilable(view.solution, context.definition) is None
            ):
                return view
        return None

    def _propose_on(
        self, context: AgentContext, base: IncumbentView, variant: CompileVariant | None = None
    ) -> Proposal:
        """A compile of ``base``: a new board base under the default configuration, or (with
        ``variant``) the next configuration of the base the agent walks (``_on``)."""
        new = variant is None
        variant = variant or COMPILE_VARIANTS[0]
        definition = context.definition
        self._classify(context)
        self._measure_against_incumbent(context)
        if new:
            self._bases.append(base.candidate_id)
        self._pending, self._pending_base = variant.name, base.candidate_id
        self._pending_view = base if new else None
        self._count += 1
        what = f"{base.agent}'s incumbent {base.candidate_id}"
        solution = compiled_base_solution(
            base.solution,
            definition,
            variant,
            name=f"{definition.name}-compiler-{variant.name}-on-{base.agent}-{self._count}",
            what=what,
        )
        why = (
            "Inductor fuses the work around what that strategy changed, which neither does alone"
            if new
            else "the next configuration, on the base whose compile is this agent's best"
        )
        return Proposal(
            solution=solution,
            hypothesis=f"torch.compile ({variant.label()}) of {what} ({base.score:.2f}x): {why}.",
            parent_id=base.candidate_id,
            mode="refine",
            tags=("compiler", variant.name, "board"),
        )

    def propose(self, context: AgentContext) -> Proposal | None:
        plain = not self._plain and not self._tried and self._on is None
        plain = plain and not context.must_draft
        base = None if plain else self._board_base(context)
        if base is not None:
            return self._propose_on(context, base)
        variant = variant_named(BASELINE) if plain else self._next(context)
        if variant is None:
            return None
        self._tried.append(variant.name)
        self._index = COMPILE_VARIANTS.index(variant) + 1
        if self._on is not None and not context.must_draft:  # a draft starts from the reference
            return self._propose_on(context, self._on, variant)
        self._pending_base, self._pending_view = None, None
        definition = context.definition
        self._classify(context)
        self._measure_against_incumbent(context)
        self._pending = variant.name
        self._plain = self._plain or variant.name == BASELINE
        self._count += 1
        draft = context.must_draft
        parent = (
            board_parent(context, self.name)
            if draft
            else (context.incumbent.candidate_id if context.incumbent else None)
        )
        solution = make_solution(
            definition,
            agent=self.name,
            name=f"{definition.name}-compiler-{variant.name}-{self._count}",
            description=reference_description(variant),
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
            reference_point=variant.name == BASELINE,  # the report compares with it
        )

    def rebase(self, proposal: Proposal, context: AgentContext) -> Proposal | None:
        """The pending proposal, made before the board last changed, replaced by a compile of
        the board's best qualifying incumbent when one is better than what it compiles (the
        reference, or a weaker base); the replaced configuration or base is tried later."""
        if self._pending is None or proposal.mode == "draft":
            return None
        if self._pending_base is None and self._pending == BASELINE:
            return None  # the reference's compile as torch.compile's baseline, never displaced
        base = self._board_base(context)
        if base is None:
            return None
        views = context.board.others(self.name, former=True) if context.board else ()
        pending = [v.score for v in views if v.candidate_id == self._pending_base]
        if pending and base.score <= pending[0]:  # the pending base is still the better one
            return None
        if self._pending_view is None:  # a configuration of the walk: put it back
            self._tried.remove(self._pending)
            self._index = COMPILE_VARIANTS.index(variant_named(self._pending))
        else:  # a first compile of a board base: that base may be compiled later
            self._bases.remove(self._pending_view.candidate_id)
        self._count -= 1
        return self._propose_on(context, base)

    def observe(self, result: CandidateResult) -> Conclusion:
        variant = variant_named(self._pending) if self._pending else None
        base, self._pending, self._pending_base = self._pending_base, None, None
        view, self._pending_view = self._pending_view, None
        if view is not None and result.passed and result.improved and variant is not None:
            # This base's compile is now the agent's best: the rest of the walk applies to it.
            self._on, self._tried = view, [variant.name]
            self._index = COMPILE_VARIANTS.index(variant) + 1
        label = f"torch.compile {variant.label()}" if variant else "torch.compile (unknown)"
        if base is not None:
            label += f" of {base}"
        effect, overall = self._effect(result)
        n = len(result.per_workload)
        if result.passed:
            score = score_text(result, "unmeasured speedup")
            claim = f"{label}: {score} over eager on {n}/{n} workloads"
            if len(effect) > 1:
                best = max(effect, key=lambda k: effect[k])
                claim += f"; best on {best} ({effect[best]:.2f}x)"
            if self._baseline_ms and overall is not None:
                claim += f"; {overall:.2f}x vs own previous best"
        else:
            claim = f"{label}: {failure_summary(result)}"
        tags = ("compiler", variant.name) if variant else ("compiler",)
        return self._conclude(result, claim + notes_of(result), effect, tags, overall)

    def _state(self) -> dict[str, object]:
        return {
            "index": self._index,
            "tried": list(self._tried),
            "count": self._count,
            "pending": self._pending,
            "bases": list(self._bases),
            "pending_base": self._pending_base,
            "pending_view": _dump(self._pending_view),
            "on": _dump(self._on),
            "plain": self._plain,
        }

    def _restore(self, state: dict[str, object]) -> None:
        index, tried, pending = state.get("index", 0), state.get("tried", []), state.get("pending")
        if not isinstance(index, int) or not 0 <= index <= len(COMPILE_VARIANTS):
            raise AgentStateError(f"compiler agent state: bad 'index' {index!r}")
        if not isinstance(tried, list):
            raise AgentStateError(f"compiler agent state: 'tried' must be a list, got {tried!r}")
        count = count_of(state.get("count", 0), self.who)
        for name in [*tried, *([pending] if pending is not None else [])]:
            variant_named(str(name))
        bases, pending_base = state.get("bases", []), state.get("pending_base")
        plain = state.get("plain", False)
        if not isinstance(plain, bool):
            raise AgentStateError(f"compiler agent state: bad 'plain' {plain!r}")
        if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
            raise AgentStateError("compiler agent state: 'bases' must be a list of candidate ids")
        if pending_base is not None and not isinstance(pending_base, str):
            raise AgentStateError(f"compiler agent state: bad 'pending_base' {pending_base!r}")
        pending_view = _load(state.get("pending_view"), "'pending_view'")
        on = _load(state.get("on"), "'on'")
        self._plain, self._bases, self._pending_base = plain, list(bases), pending_base
        self._pending_view, self._on = pending_view, on
        self._index, self._tried, self._count = index, [str(t) for t in tried], count
        self._pending = str(pending) if pending is not None else None


__all__ = [
    "BASELINE",
    "COMPILED_ENTRY",
    "COMPILE_VARIANTS",
    "CompileVariant",
    "CompilerAgent",
    "compiled_base_solution",
    "compiled_source",
    "variant_named",
]
