"""Which board incumbents the compiler agent may compile: its combination with the board.

The compiler agent's own proposals compile the *reference* under one Inductor configuration
each (``compiler.COMPILE_VARIANTS``). Once another agent holds a Python-group incumbent on
the board that is faster than the base of the compiler's best compile (the reference, else
the board base whose compile won) — a precision policy around the reference, a rewritten
graph, a Triton kernel called from Python — compiling *that* combines both strategies in one
candidate: Inductor fuses the elementwise work around bf16/TF32 GEMMs or rewritten library
calls, which neither the policy nor the compiled reference does alone. The candidate is a
wrapper whose entry is ``torch.compile(base_entry, <variant>)``
(``compiler.compiled_base_solution``).

A base qualifies (:func:`why_not_compilable`) when it can be wrapped (Python group), does
not already compile at run time (compiling a compiled function nests two compilers), does
not capture CUDA graphs (a capture inside a compiled region fails), and is not just the
reference's own code (that is what the compiler's variants compile anyway).

Not covered: compiling C++-group bases.
"""

from __future__ import annotations

from kernelarc.problem.schema import Definition, Solution
from kernelarc.proposers.wrap import python_sources, why_not_wrappable

#: Source markers of a solution that captures or replays CUDA graphs.
GRAPH_MARKERS = ("CUDAGraph", "torch.cuda.graph", "make_graphed_callables")


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


__all__ = ["GRAPH_MARKERS", "why_not_compilable"]
