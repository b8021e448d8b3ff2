"""Axis expressions: the integer arithmetic of expr axes and shape dimensions.

Expressions are parsed with :mod:`ast` and evaluated by walking the tree: only integer
literals, axis names, ``+ - * / // % **``, unary ``+ -`` and parentheses are accepted. No
``eval``, no attribute access, no calls. ``/`` must divide exactly (axes are integers).
Not covered: which axes a workload binds (``axes``).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping

from kernelarc.errors import KernelArcError

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.Div: None,  # exact division, handled below
}


class AxisError(KernelArcError, ValueError):
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
