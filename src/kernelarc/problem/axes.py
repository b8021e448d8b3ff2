"""Axis resolution: const, var (bound by the workload) and expr axes, and tensor shapes.

The arithmetic of expr axes and shape dimensions is :mod:`kernelarc.problem.expressions`.
"""

from __future__ import annotations

from collections.abc import Mapping

from kernelarc.problem.expressions import AxisError, evaluate, expression_names
from kernelarc.problem.schema import ConstAxis, Definition, ExprAxis, VarAxis, Workload


def resolve_axes(definition: Definition, workload: Workload) -> dict[str, int]:
    """All axis values of one workload: const, var (from the workload) and expr."""
    env: dict[str, int] = {}
    for name, axis in definition.axes.items():
        if isinstance(axis, ConstAxis):
            env[name] = axis.value
        elif isinstance(axis, VarAxis):
            if name not in workload.axes:
                raise AxisError(f"workload {workload.uuid}: var axis {name!r} has no value")
            env[name] = int(workload.axes[name])
    # Axes a workload names beyond the definition's are passed through (custom input
    # entrypoints read them, e.g. flags); they never override a definition axis.
    for name, value in workload.axes.items():
        env.setdefault(name, int(value))
    pending = {n: a for n, a in definition.axes.items() if isinstance(a, ExprAxis)}
    while pending:
        ready = {n: a for n, a in pending.items() if expression_names(a.expression) <= set(env)}
        if not ready:
            raise AxisError(f"axis expressions are cyclic or unresolvable: {sorted(pending)}")
        for n, a in ready.items():
            env[n] = evaluate(a.expression, env)
            del pending[n]
    for name, value in env.items():
        if value < 0:
            raise AxisError(f"workload {workload.uuid}: axis {name} resolves to {value} < 0")
    return env


def resolve_shape(shape: list[str] | None, env: Mapping[str, int]) -> tuple[int, ...] | None:
    """Concrete shape of a tensor spec: each dim is an axis name, an integer literal or an
    axis expression. ``None`` (a Python scalar) stays ``None``."""
    if shape is None:
        return None
    dims = []
    for dim in shape:
        if dim in env:
            dims.append(int(env[dim]))
        elif dim.strip().isdigit():
            dims.append(int(dim))
        else:
            dims.append(evaluate(dim, env))
    return tuple(dims)
