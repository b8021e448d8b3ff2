"""Axis resolution: const, var (bound by the workload) and expr axes.

Expressions are parsed with :mod:`ast` and evaluated by walking the tree: only integer
literals, axis names, ``+ - * / // % **``, unary ``+ -`` and parentheses are accepted. No
``eval``, no attribute access, no calls. ``/`` must divide exactly (axes are integers).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernelarc.problem.schema import Definition, Workload

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.Div: None,  # exact division, handled below
}


class AxisError(ValueError):
    """An axis cannot be resolved: missing, cyclic, negative or a bad expression."""


def _parse(expression: str) -> ast.expr:
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise AxisError(f"bad axis expression {expression!r}: {e.msg}") from e
    for node in ast.walk(tree):
        ok = (
            isinstance(
                node,
                ast.Expression | ast.BinOp | ast.UnaryOp | ast.Constant | ast.Name | ast.Load,
            )
            or type(node) in _BINOPS
            or isinstance(node, ast.UAdd | ast.USub)
        )
        if not ok:
            raise AxisError(
                f"axis expression {expression!r} uses {type(node).__name__}, which is not allowed"
            )
        if isinstance(node, ast.Constant) and (
            not isinstance(node.value, int) or isinstance(node.value, bool)
        ):
            raise AxisError(f"axis expression {expression!r}: only integer literals allowed")
    return tree.body


def expression_names(expression: str) -> set[str]:
    """Axis names an expression refers to (raises AxisError on a bad expression)."""
    return {n.id for n in ast.walk(_parse(expression)) if isinstance(n, ast.Name)}


def evaluate(expression: str, env: Mapping[str, int]) -> int:
    """Evaluate an axis expression over already-resolved axes."""

    def ev(node: ast.expr) -> int:
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int)  # _parse admits integer literals only
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise AxisError(f"axis expression {expression!r}: {node.id!r} is unresolved")
            return int(env[node.id])
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and b == 0:
                raise AxisError(f"axis expression {expression!r} divides by zero")
            if isinstance(node.op, ast.Div):
                if a % b:
                    raise AxisError(f"axis expression {expression!r}: {a}/{b} is not an integer")
                return a // b
            if isinstance(node.op, ast.Pow) and (b < 0 or b > 64):
                raise AxisError(f"axis expression {expression!r}: exponent {b} out of range")
            fn = _BINOPS[type(node.op)]
            assert fn is not None
            return int(fn(a, b))
        raise AxisError(f"axis expression {expression!r}: unsupported node")

    return ev(_parse(expression))


def resolve_axes(definition: Definition, workload: Workload) -> dict[str, int]:
    """All axis values of one workload: const, var (from the workload) and expr."""
    from kernelarc.problem.schema import ConstAxis, ExprAxis, VarAxis

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
