"""torch.compile of another agent's incumbent: the compiler agent's combination with the board.

The compiler agent's own proposals compile the *reference* under one Inductor configuration
each (``builtin.COMPILE_VARIANTS``). Once another agent holds a Python-group incumbent on
the board that is faster than the base of the compiler's best compile (the reference, else
the board base whose compile won) — a precision policy around the reference, a rewritten
graph, a Triton kernel called from Python — compiling *that* combines both strategies in one
candidate: Inductor fuses the elementwise work around bf16/TF32 GEMMs or rewritten library
calls, which neither the policy nor the compiled reference does alone. The candidate is a
wrapper (:func:`kernelarc.proposers.wrap.wrap_solution`) whose entry is
``torch.compile(base_entry, <variant>)``.

A base qualifies (:func:`why_not_compilable`) when it can be wrapped (Python group), does
not already compile at run time (compiling a compiled function nests two compilers), does
not capture CUDA graphs (a capture inside a compiled region fails), and is not just the
reference's own code (that is what the compiler's variants compile anyway).

A new base is compiled with the default configuration; once that compile is the compiler's
incumbent, its further configurations apply to the same base (``compiler.CompilerAgent``).
Not covered: compiling C++-group bases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelarc.problem.schema import Definition, Solution
from kernelarc.proposers.wrap import python_sources, why_not_wrappable, wrap_solution

if TYPE_CHECKING:
    from kernelarc.proposers.compiler import CompileVariant

#: Source markers of a solution that captures or replays CUDA graphs.
GRAPH_MARKERS = ("CUDAGraph", "torch.cuda.graph", "make_graphed_callables")

_BODY = """
import torch

{setup}_ka_compiled = torch.compile(_ka_base{arguments})


{entry}"""


def why_not_compilable(solution: Solution, definition: Definition) -> str | None:
    """None when ``solution`` is worth compiling as a base, else a one-line reason."""
    reason = why_not_wrappable(solution)
    if reason is not None:
        return reason
    if solution.compiles_at_run_time():
        return "it already compiles at run time (torch.compile / Inductor / export)"
    code = python_sources(solution)
    if any(marker in code for marker in GRAPH_MARKERS):
        return "it captures CUDA graphs, which fails inside a compiled region"
    if [s.content for s in solution.sources] == [definition.reference]:
        return "it is the reference's own code (the compiler's variants compile that)"
    return None


def compiled_base_solution(
    base: Solution, definition: Definition, variant: CompileVariant, *, name: str, what: str
) -> Solution:
    """``base`` wrapped in ``torch.compile(base_entry, <variant's arguments>)``, after the
    variant's setup lines, with the variant's entry (``CompileVariant.setup``/``entry``)."""
    arguments, setup, label = variant.arguments(), variant.setup(), variant.label()
    return wrap_solution(
        base,
        definition,
        agent="compiler",
        name=name,
        description=f"torch.compile ({label}) of {what}.",
        body=_BODY.format(
            arguments=f", {arguments}" if arguments else "",
            setup=f"{setup}\n" if setup else "",
            entry=variant.entry("_ka_compiled"),
        ),
        stem="kernelarc_compiled",
        docstring=f"KernelArc compiler agent: torch.compile ({label}) of {what}.",
    )


__all__ = ["GRAPH_MARKERS", "compiled_base_solution", "why_not_compilable"]
