"""The built-in agents by name: what ``--agents reference,compiler`` resolves to.

Covered: the model-free built-ins (reference in :mod:`kernelarc.proposers.reference`,
compiler, precision, cuda-graph, gemm-tables, fp8-gemm, rewrite, tuner). Not
covered: LLM-backed agents, the seed agent (it needs the user's solutions: ``optimize
--seed-solution``) and the test-only :class:`~kernelarc.proposers.scripted.ScriptedAgent`
(construct those directly). Every registered agent is run through
:func:`kernelarc.agents.conformance.check_agent` in the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kernelarc.agents.base import Agent
from kernelarc.errors import KernelArcError
from kernelarc.proposers.compiler import CompilerAgent
from kernelarc.proposers.cudagraph import CudaGraphAgent
from kernelarc.proposers.fp8_gemm import Fp8GemmAgent
from kernelarc.proposers.gemm_tables import GemmTablesAgent
from kernelarc.proposers.precision import PrecisionAgent
from kernelarc.proposers.reference import ReferenceAgent
from kernelarc.proposers.rewrite import RewriteAgent
from kernelarc.proposers.tuner import TunerAgent

_BUILTINS: tuple[type[Agent], ...] = (
    ReferenceAgent,
    CompilerAgent,
    RewriteAgent,
    PrecisionAgent,
    CudaGraphAgent,
    GemmTablesAgent,
    Fp8GemmAgent,
    TunerAgent,
)
#: What ``kernelarc optimize`` runs when ``--agents`` is not given: every built-in.
DEFAULT_AGENTS: tuple[str, ...] = tuple(cls.name for cls in _BUILTINS)


def available_agents() -> dict[str, Callable[[], Agent]]:
    """Name -> factory of a fresh agent, for every built-in agent (a new dict each call)."""
    return {cls.name: cls for cls in _BUILTINS}


def make_agents(names: Sequence[str]) -> list[Agent]:
    """Fresh agents for ``names``, in that order. An unknown or repeated name is a
    :class:`KernelArcError` listing the available names."""
    factories = available_agents()
    unknown = [n for n in names if n not in factories]
    if unknown:
        raise KernelArcError(
            f"unknown agent name(s): {', '.join(repr(n) for n in unknown)}; "
            f"available agents: {', '.join(sorted(factories))}"
        )
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise KernelArcError(f"agent name(s) given twice: {', '.join(repeated)}; give each once")
    return [factories[n]() for n in names]


def describe() -> list[tuple[str, str]]:
    """(name, one-line description) of every built-in agent, in registry order."""
    return [(cls.name, str(getattr(cls, "description", ""))) for cls in _BUILTINS]


__all__ = ["DEFAULT_AGENTS", "available_agents", "describe", "make_agents"]
