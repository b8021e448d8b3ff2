"""The precision agent: TF32 / bf16-compute policies applied to the reference or the board's best.

A *policy* is a wrapper (:func:`kernelarc.proposers.wrap.wrap_solution`) around a base
solution. In order of decreasing precision:

- ``tf32``: ``torch.backends.cuda.matmul.allow_tf32 = True`` and
  ``torch.backends.cudnn.allow_tf32 = True``, set when the solution module is imported.
  The legacy switches are used because they work on every torch this project supports
  (2.11 CUDA and 2.13 CPU; the new ``fp32_precision`` API reflects them). CUDA only: on a
  CPU device TF32 changes nothing, so it is not proposed there.
- ``bf16-matmul``: ``torch.set_float32_matmul_precision("medium")`` at import: float32
  matmuls may run with bfloat16 internally (oneDNN on CPUs with bf16 support; on CUDA torch
  may treat it like TF32).
- ``bf16-autocast``: the call runs under ``torch.autocast(device_type, dtype=bfloat16)``
  (device type of the first tensor argument); the outputs of a non destination-passing base
  are cast back to their declared dtypes (destination tensors already have them). Sets no
  global switch, so the guard sees it only through the error level of float32 outputs.

Global switches are set at import, after the base module was imported (so the policy wins
over the base's own settings): the guard's sentinel records the precision switches when it
arms, before the import, and reports every change with the verdict; by default a change is
accepted when tolerances pass, under ``--strict-precision`` it is REWARD_HACK[precision].
The guard also fails any candidate that misses a workload's tolerance, so a policy is kept
(becomes the incumbent) only when every workload passes.

Bases, most promising first: the best incumbent of another agent on the board (when it is a
Python-group solution), then the reference. A policy on the reference that is still waiting
to be judged when another agent's incumbent reaches the board is rebased onto it
(:meth:`PrecisionAgent.rebase`); the reference's turn comes later. Proposals go policy by
policy, each on the board base then on the reference; the policies most precise first,
except on CUDA when every workload's relative tolerance is at least 1e-2 (bf16 rounding
fits): then least precise first (:func:`policy_order`), stepping up after a tolerance miss.
A policy applies to a base only when the base calls a matmul-like torch operation (matmul,
``@``, mm/bmm/addmm, linear, conv, einsum, attention...) and works in float32 (a float32
input or output, or float32 in its source); on problems without any such work (e.g. an
elementwise bf16 kernel) the agent proposes nothing. Learning: a tolerance failure of a
policy on a base skips the lower-precision policies on that base; a REWARD_HACK[precision]
verdict (strict mode) stops the agent.

Not covered: fp16 policies, per-operation precision (only whole-call policies), Triton
``tl.dot`` input precision (TF32 switches do not reach Triton kernels), C++ bases.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kernelarc.agents.base import AgentStateError, Rebasing
from kernelarc.agents.types import (
    AgentContext,
    CandidateResult,
    Conclusion,
    IncumbentView,
    Proposal,
    WorkloadResult,
)
from kernelarc.problem.reference import reference_solution
from kernelarc.problem.schema import Definition, Solution, Tolerance
from kernelarc.proposers.base import BuiltinAgent
from kernelarc.proposers.common import (
    count_of,
    failure_summary,
    ms_by_uuid,
    notes_of,
    score_text,
)
from kernelarc.proposers.wrap import python_sources, why_not_wrappable, wrap_solution

REFERENCE_BASE = "reference"

LEAD_PRIORITY = 35
"""The agent's leading policy (the first it tries, see :func:`policy_order`) is judged before
the compiler agent's (30) when ready together: on float32 matmul work a precision policy is
among the largest single wins, and its candidate is cheap to judge (no compilation per
shape), so under a time limit it should not wait behind minutes of torch.compile judging."""

LOOSE_RTOL = 1e-2
"""A relative tolerance at least this large on every workload admits bf16 rounding (unit
roundoff 2^-8 = 3.9e-3, with room for the accumulation): on CUDA the agent then tries the
lowest precision first (``policy_order``)."""

_TF32_BODY = """
import torch

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True


def kernelarc_entry(*args):
    return _ka_base(*args)
"""

_MEDIUM_BODY = """
import torch

torch.set_float32_matmul_precision("medium")


def kernelarc_entry(*args):
    return _ka_base(*args)
"""

_AUTOCAST_BODY = """
import torch

_KA_CASTABLE = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def _ka_device_type(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def _ka_cast(value, dtype_name):
    want = _KA_CASTABLE.get(dtype_name)
    if want is None or not isinstance(value, torch.Tensor) or value.dtype == want:
        return value
    return value.to(want)


def kernelarc_entry(*args):
    with torch.autocast(device_type=_ka_device_type(args), dtype=torch.bfloat16):
        ret = _ka_base(*args)
    if _KA_DPS:
        return ret
    if isinstance(ret, (tuple, list)):
        if len(ret) != len(_KA_OUTPUT_DTYPES):
            return ret
        return tuple(_ka_cast(v, d) for v, d in zip(ret, _KA_OUTPUT_DTYPES))
    return _ka_cast(ret, _KA_OUTPUT_DTYPES[0]) if _KA_OUTPUT_DTYPES else ret
"""


@dataclass(frozen=True)
class PrecisionPolicy:
    """One whole-call precision policy. ``level`` grows as precision drops."""

    name: str
    label: str
    level: int
    cuda_only: bool
    switches: str
    """What it changes, for claims (no code)."""
    body: str


#: The policies, most precise first.
POLICIES: tuple[PrecisionPolicy, ...] = (
    PrecisionPolicy("tf32", "TF32 matmul+cuDNN", 1, True, "TF32 switches", _TF32_BODY),
    PrecisionPolicy(
        "bf16-matmul", "float32 matmul precision medium", 2, False, "matmul precision", _MEDIUM_BODY
    ),
    PrecisionPolicy("bf16-autocast", "bf16 autocast", 3, False, "no switch", _AUTOCAST_BODY),
)

_MATMUL_CALL = re.compile(
    r"\b(?:matmul|mm|bmm|addmm|baddbmm|addbmm|addmv|mv|linear|bilinear|conv[123]d"
    r"|conv_transpose[123]d|einsum|tensordot|scaled_dot_product_attention|chain_matmul"
    r"|multi_dot)\s*\(",
    re.IGNORECASE,
)
_MATMUL_OPERATOR = re.compile(r"[\w)\]][ \t]*@=?[ \t]*[\w(\[]")
_FLOAT32 = re.compile(r"float32|\.float\(\)|torch\.float\b")


def policy_order(device: str, tolerances: Sequence[Tolerance] = ()) -> tuple[PrecisionPolicy, ...]:
    """The policies the agent tries on ``device``, in order: most precise first, unless the
    device is CUDA and every workload's ``max_rtol`` is at least :data:`LOOSE_RTOL` — then
    the least precise first (bf16 on tensor cores is the largest gain and the tolerance says
    it may pass; a miss costs one screening and steps up, see ``observe``). TF32 only on
    CUDA (on a CPU it changes nothing)."""
    cuda = device.startswith("cuda")
    usable = [p for p in POLICIES if cuda or not p.cuda_only]
    if cuda and tolerances and all(t.max_rtol >= LOOSE_RTOL for t in tolerances):
        usable.reverse()
    return tuple(usable)


def policy_named(name: str) -> PrecisionPolicy:
    for p in POLICIES:
        if p.name == name:
            return p
    known = ", ".join(p.name for p in POLICIES)
    raise AgentStateError(f"precision agent: unknown policy {name!r} ({known})")


def why_not_applicable(definition: Definition, source: str) -> str | None:
    """None when precision policies can change the float32 matmul work of ``source``."""
    if not (_MATMUL_CALL.search(source) or _MATMUL_OPERATOR.search(source)):
        return "no matmul-like torch operation"
    specs = [*definition.inputs.values(), *definition.outputs.values()]
    if not (any(s.dtype.value == "float32" for s in specs) or _FLOAT32.search(source)):
        return "no float32 tensors"
    return None


def policy_solution(
    base: Solution, definition: Definition, policy: PrecisionPolicy, *, name: str, what: str
) -> Solution:
    """``base`` wrapped in ``policy`` (``what`` names the base in the description)."""
    return wrap_solution(
        base,
        definition,
        agent=PrecisionAgent.name,
        name=name,
        description=f"{policy.label} policy applied to {what}.",
        body=policy.body,
        stem="kernelarc_precision",
        docstring=f"KernelArc precision agent: {policy.label} around {what}.",
    )


@dataclass(frozen=True)
class _Base:
    key: str
    label: str
    solution: Solution
    parent_id: str | None
    baseline_ms: dict[str, float]


def workload_names(results: list[WorkloadResult], var_axes: list[str], limit: int = 4) -> str:
    """``M=17, M=200`` (var axes of each workload; uuid prefix when there are none)."""
    names = []
    for r in results:
        parts = [f"{a}={r.axes[a]}" for a in var_axes if a in r.axes]
        names.append(",".join(parts) if parts else r.uuid[:12])
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" +{more} more" if more > 0 else "")


class PrecisionAgent(BuiltinAgent, Rebasing):
    """TF32 / bf16 precision policies on the board's best and on the reference."""

    name = "precision"
    strategy = "precision"
    who: ClassVar[str] = "precision agent"
    waits_for_board: ClassVar[bool] = True
    priority: ClassVar[int] = 20
    description: ClassVar[str] = (
        "TF32 / bf16-matmul / bf16-autocast policies on float32 matmul work, on the board's "
        "best and the reference"
    )

    def __init__(self) -> None:
        super().__init__()
        self._tried: list[str] = []
        self._hashes: list[str] = []
        self._floors: dict[str, int] = {}
        self._stopped = False
        self._count = 0
        self._pending: dict[str, Any] | None = None
        self._var_axes: list[str] = []

    # ------------------------------------------------------------------ proposing
    def _bases(self, context: AgentContext) -> list[_Base]:
        definition = context.definition
        bases: list[_Base] = []
        others: tuple[IncumbentView, ...] = context.board.others(self.name) if context.board else ()
        best = max(others, key=lambda i: i.score, default=None)
        if (
            best is not None
            and why_not_wrappable(best.solution) is None
            and why_not_applicable(definition, python_sources(best.solution)) is None
        ):
            bases.append(
                _Base(
                    key=best.candidate_id,
                    label=f"{best.agent}'s incumbent {best.candidate_id}",
                    solution=best.solution,
                    parent_id=best.candidate_id,
                    baseline_ms=dict(best.latencies_ms),
                )
            )
        if why_not_applicable(definition, definition.reference) is None:
            reference = reference_solution(
                definition, agent=self.name, description="The problem's reference implementation."
            )
            bases.append(_Base(REFERENCE_BASE, "the reference", reference, None, {}))
        return bases

    def _plans(
        self, context: AgentContext, order: Sequence[PrecisionPolicy]
    ) -> list[tuple[PrecisionPolicy, _Base]]:
        bases = self._bases(context)
        return [
            (policy, base)
            for policy in order
            for base in bases
            if f"{policy.name}@{base.key}" not in self._tried
            and policy.level < self._floors.get(base.key, len(POLICIES) + 1)
        ]

    def propose(self, context: AgentContext) -> Proposal | None:
        if self._stopped:
            return None
        definition = context.definition
        self._classify(context)
        self._var_axes = [n for n, a in definition.axes.items() if a.type == "var"]
        order = policy_order(context.device, context.tolerances)
        plans, lead = self._plans(context, order), order[0]
        if context.must_draft and self._tried and plans:
            last = self._tried[-1].split("@", 1)[0]
            plans.sort(key=lambda pb: pb[0].name == last)  # another policy first (stable)
        for policy, base in plans:
            self._tried.append(f"{policy.name}@{base.key}")
            digest = f"{policy.name}:{base.solution.content_hash()}"
            if digest in self._hashes:  # e.g. the board's best is the reference itself
                continue
            self._hashes.append(digest)
            return self._proposal(context, policy, base, lead)
        return None

    def _proposal(
        self, context: AgentContext, policy: PrecisionPolicy, base: _Base, lead: PrecisionPolicy
    ) -> Proposal:
        definition = context.definition
        self._count += 1
        solution = policy_solution(
            base.solution,
            definition,
            policy,
            name=f"{definition.name}-precision-{policy.name}-{self._count}",
            what=base.label,
        )
        self._pending = {
            "policy": policy.name,
            "base": base.key,
            "label": base.label,
            "baseline_ms": dict(base.baseline_ms),
            "digest": f"{policy.name}:{base.solution.content_hash()}",
        }
        on = "the board's best" if base.key != REFERENCE_BASE else "the reference"
        return Proposal(
            solution=solution,
            hypothesis=f"{policy.label} on {on}: float32 matmul work at lower precision "
            "runs on faster units; kept only if every workload's tolerance passes.",
            parent_id=base.parent_id,
            mode="draft" if context.must_draft else "refine",
            tags=("precision", policy.name, "board" if base.parent_id else "reference"),
            priority=LEAD_PRIORITY if policy is lead else None,
        )

    def rebase(self, proposal: Proposal, context: AgentContext) -> Proposal | None:
        """The pending policy on the reference, made before another agent's incumbent reached
        the board, replaced by the same policy on that incumbent (the policy on the
        reference is put back in the plan, to be tried later). Anything else is judged as
        it is: under a time limit the combination with the better base should not wait
        behind the policy on the reference."""
        pending = self._pending
        if self._stopped or pending is None or pending["base"] != REFERENCE_BASE:
            return None
        policy = policy_named(str(pending["policy"]))
        board = [b for _, b in self._plans(context, [policy]) if b.key != REFERENCE_BASE]
        if not board:  # no board base, or this policy is tried or below its floor there
            return None
        base = board[0]
        digest = f"{policy.name}:{base.solution.content_hash()}"
        if digest in self._hashes:
            return None
        reference = f"{policy.name}@{REFERENCE_BASE}"
        if reference in self._tried:
            self._tried.remove(reference)
        if pending.get("digest") in self._hashes:
            self._hashes.remove(str(pending["digest"]))
        self._count -= 1
        self._tried.append(f"{policy.name}@{base.key}")
        self._hashes.append(digest)
        lead = policy_order(context.device, context.tolerances)[0]
        return self._proposal(context, policy, base, lead)

    # ------------------------------------------------------------------ concluding
    def observe(self, result: CandidateResult) -> Conclusion:
        pending, self._pending = self._pending, None
        if pending is None:
            policy_name, base_key, label, baseline = "unknown", REFERENCE_BASE, "a base", {}
            title = "precision policy (no record of this proposal)"
        else:
            policy_name, base_key = str(pending["policy"]), str(pending["base"])
            label, baseline = str(pending["label"]), dict(pending["baseline_ms"])
            title = f"{policy_named(policy_name).label} on {label}"
        effect, overall = self._effect(result, baseline)
        per = list(result.per_workload)
        n = len(per)
        strict = [r for r in per if r.status == "REWARD_HACK" and r.check == "precision"]
        missed = [r for r in per if r.status == "INCORRECT_NUMERICAL"]
        if strict:
            self._stopped = True
            claim = (
                f"{title}: rejected as REWARD_HACK[precision] on {len(strict)}/{n} workloads: "
                "this run forbids reduced precision (strict mode), so the precision agent stops"
            )
        elif missed:
            if pending is not None:
                level = policy_named(policy_name).level
                self._floors[base_key] = min(self._floors.get(base_key, level), level)
            ok = [r for r in per if r.status == "PASSED"]
            claim = (
                f"{title}: tolerance missed on {workload_names(missed, self._var_axes)} "
                f"({len(missed)}/{n}); passed on {workload_names(ok, self._var_axes) or 'none'}; "
                "lower-precision policies on this base are skipped"
            )
        elif result.passed:
            score = score_text(result)
            claim = f"{title}: every workload's tolerance passed ({n}/{n}), {score} over eager"
            if overall is not None:
                claim += f", {overall:.2f}x vs its base"
            if pending is not None:
                claim += f"; changes {policy_named(policy_name).switches} (reported by the guard)"
        else:
            claim = f"{title}: {failure_summary(result)}"
        return self._conclude(
            result, claim + notes_of(result), effect, ("precision", policy_name), overall
        )

    # ------------------------------------------------------------------ persistence
    def _state(self) -> dict[str, object]:
        return {
            "tried": list(self._tried),
            "hashes": list(self._hashes),
            "floors": dict(self._floors),
            "stopped": self._stopped,
            "count": self._count,
            "pending": dict(self._pending) if self._pending is not None else None,
            "var_axes": list(self._var_axes),
        }

    def _restore(self, state: dict[str, object]) -> None:
        def strings(key: str) -> list[str]:
            value = state.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise AgentStateError(f"precision agent state: {key!r} must be a list of strings")
            return list(value)

        tried, hashes, var_axes = strings("tried"), strings("hashes"), strings("var_axes")
        for key in tried:
            policy_named(key.split("@", 1)[0])
        floors, stopped = state.get("floors", {}), state.get("stopped", False)
        if not isinstance(floors, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in floors.items()
        ):
            raise AgentStateError("precision agent state: 'floors' must map base keys to levels")
        if not isinstance(stopped, bool):
            raise AgentStateError(
                f"precision agent state: 'stopped' must be a bool, got {stopped!r}"
            )
        count = count_of(state.get("count", 0), self.who)
        pending = state.get("pending")
        if pending is not None:
            if not isinstance(pending, dict) or not {"policy", "base", "label"} <= set(pending):
                raise AgentStateError(
                    "precision agent state: 'pending' must name policy/base/label"
                )
            policy_named(str(pending["policy"]))
            base_ms = ms_by_uuid(
                pending.get("baseline_ms", {}), "precision agent", "pending 'baseline_ms'"
            )
            pending = {**pending, "baseline_ms": base_ms}
        self._tried, self._hashes, self._var_axes = tried, hashes, var_axes
        self._floors = dict(floors)
        self._stopped, self._count, self._pending = stopped, count, pending


__all__ = [
    "POLICIES",
    "PrecisionAgent",
    "PrecisionPolicy",
    "policy_named",
    "policy_order",
    "policy_solution",
    "why_not_applicable",
    "workload_names",
]
