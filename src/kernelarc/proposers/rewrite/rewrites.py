"""The rewrite catalogue and the pipeline that applies a chosen set of families.

Families, in application order (each module's docstring says which rewrites are exact and
which change rounding): ``casts`` (exact), ``norms``, ``activations``, ``attention``,
``matmul`` (CUDA only: :func:`families_for`). The
exact no-gain rewrites (identity casts, contiguous on contiguous) always run: they do not
change a single bit and expose patterns to the others. LayerNorm is matched before
RMSNorm (a written-out LayerNorm contains an RMSNorm of the centred input). The pipeline
makes two passes (a fusion can expose a fold), re-propagating facts after every change,
and finally checks on meta tensors that every workload's outputs keep their shapes and
dtypes; a mismatch is a :class:`RewriteError` (a bug in a pattern, never silently proposed).

Not covered: FP8 ``_scaled_mm`` (no pattern; the ``fp8-gemm`` agent replaces the FP8
helper's GEMM instead) and MoE grouped GEMM (the expert loops are data-dependent, hence
untraceable: :mod:`.grouped` rewrites their source), concatenating GEMMs that
share an input (that copies weights on every call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelarc.problem.schema import Definition
from kernelarc.proposers.rewrite.activations import gelus, silus
from kernelarc.proposers.rewrite.attention import attentions
from kernelarc.proposers.rewrite.casts import (
    dead_clones,
    identity_casts,
    identity_contiguous,
    round_trip_casts,
)
from kernelarc.proposers.rewrite.codegen import emit_source
from kernelarc.proposers.rewrite.graph import erase_unused
from kernelarc.proposers.rewrite.matmul import half_matmuls
from kernelarc.proposers.rewrite.norms import layer_norms, rms_norm_fold_casts, rms_norms
from kernelarc.proposers.rewrite.trace import (
    Facts,
    propagate,
    run_decorators,
    trace_reference,
)

if TYPE_CHECKING:
    import torch.fx

FAMILIES = ("casts", "norms", "activations", "attention", "matmul")
#: Families whose replacement ops only have CUDA kernels.
CUDA_ONLY = ("matmul",)
PASSES = 2


class RewriteError(Exception):
    """A rewrite broke the graph's output shapes or dtypes (a pattern bug)."""


@dataclass(frozen=True)
class Rewrite:
    name: str
    family: str
    exact: bool
    """Bit-identical results (otherwise: the same function, different rounding)."""
    gain: bool
    """Removes or fuses kernels at run time (otherwise: graph normalisation only)."""
    apply: Callable[[torch.fx.GraphModule, Facts], int]


REWRITES: tuple[Rewrite, ...] = (
    Rewrite("identity-cast", "casts", True, False, identity_casts),
    Rewrite("identity-contiguous", "casts", True, False, identity_contiguous),
    Rewrite("round-trip-cast", "casts", True, True, round_trip_casts),
    Rewrite("dead-clone", "casts", True, True, dead_clones),
    Rewrite("layer_norm", "norms", False, True, layer_norms),
    Rewrite("rms_norm", "norms", False, True, rms_norms),
    Rewrite("rms_norm-fold-cast", "norms", False, True, rms_norm_fold_casts),
    Rewrite("silu", "activations", False, True, silus),
    Rewrite("gelu", "activations", False, True, gelus),
    Rewrite("sdpa", "attention", False, True, attentions),
    Rewrite("half-matmul", "matmul", False, True, half_matmuls),
)


def families_for(device: str) -> tuple[str, ...]:
    """The families whose rewritten code runs on ``device`` (``cpu``, ``cuda``, ``cuda:1``)."""
    if device.startswith("cuda"):
        return FAMILIES
    return tuple(f for f in FAMILIES if f not in CUDA_ONLY)


def rewrite_named(name: str) -> Rewrite:
    for r in REWRITES:
        if r.name == name:
            return r
    raise KeyError(name)


@dataclass
class Rewritten:
    """A rewritten graph and what was applied (rewrite name -> number of sites)."""

    gm: torch.fx.GraphModule
    applied: dict[str, int] = field(default_factory=dict)

    @property
    def families(self) -> tuple[str, ...]:
        """Families with at least one rewrite that gains at run time, in catalogue order."""
        fams = {rewrite_named(n).family for n in self.applied if rewrite_named(n).gain}
        return tuple(f for f in FAMILIES if f in fams)

    @property
    def exact(self) -> bool:
        return all(rewrite_named(n).exact for n in self.applied)

    def label(self) -> str:
        """``sdpa x1, rms_norm x2`` (gaining rewrites only)."""
        parts = [f"{n} x{c}" for n, c in self.applied.items() if rewrite_named(n).gain]
        return ", ".join(parts) or "nothing"


def _outputs(gm: torch.fx.GraphModule, facts: Facts) -> Any:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return facts.values.get(out)


def apply_families(
    definition: Definition,
    workloads: Sequence[dict[str, int]],
    families: Iterable[str],
    scalars: Sequence[dict[str, Any]] | None = None,
) -> Rewritten:
    """Trace the reference and apply every rewrite of ``families`` (plus the exact
    normalisations); ``scalars``: the workloads' scalar input values (same order).
    Raises UntraceableError or RewriteError."""
    chosen = set(families)
    unknown = chosen - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown rewrite families {sorted(unknown)} (known: {FAMILIES})")
    gm = trace_reference(definition, workloads, scalars)
    facts = propagate(gm, definition, workloads, scalars)
    before = _outputs(gm, facts)
    result = Rewritten(gm)
    for _ in range(PASSES):
        for rw in REWRITES:
            if rw.family not in chosen and rw.gain:
                continue
            n = rw.apply(gm, facts)
            if n:
                gm.graph.lint()
                gm.recompile()
                result.applied[rw.name] = result.applied.get(rw.name, 0) + n
                facts = propagate(gm, definition, workloads, scalars)
    after = _outputs(gm, facts)
    if after != before:
        raise RewriteError(
            f"rewrites {result.label()} changed the outputs' shapes/dtypes: {before} -> {after}"
        )
    if result.applied:
        _drop_dead_reads(gm)
    return result


def _drop_dead_reads(gm: torch.fx.GraphModule) -> None:
    """Erase unused attribute reads and indexing (``x.dtype``, ``shape[0]``): pure nodes a
    rewrite left without users."""
    import builtins
    import operator

    pure = (builtins.getattr, operator.getitem)
    erase_unused([n for n in gm.graph.nodes if n.op == "call_function" and n.target in pure])
    gm.graph.lint()
    gm.recompile()


def solution_source(definition: Definition, rewritten: Rewritten) -> str:
    """The rewritten graph as a standalone ``solution.py`` (see :mod:`.codegen`)."""
    exactness = "bit-exact" if rewritten.exact else "same function, rounding may differ"
    header = (
        f"KernelArc rewrite agent: the reference of {definition.name} traced with torch.fx, "
        f"with {rewritten.label()} ({exactness}). Generated code."
    )
    return emit_source(
        rewritten.gm, list(definition.inputs), run_decorators(definition.reference), header
    )


__all__ = [
    "FAMILIES",
    "REWRITES",
    "Rewrite",
    "RewriteError",
    "Rewritten",
    "apply_families",
    "families_for",
    "rewrite_named",
    "solution_source",
]
