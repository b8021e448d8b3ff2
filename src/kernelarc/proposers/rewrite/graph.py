"""Structural matching helpers over ``torch.fx`` graphs, shared by the rewrite families.

:func:`kind` names what a node computes independently of how the reference spelled it
(``torch.mul(a, b)``, ``a.mul(b)`` and ``a * b`` are all ``"mul"``), but only when the call
has no argument that changes the meaning (``alpha=``, ``out=``, ``rounding_mode=``,
``inplace=True``): such calls have no kind and are never matched. :class:`Site` collects the
nodes a match absorbs and removes the ones left without users after the replacement; no
other node is ever erased (in-place calls stay even when their result is unused).

Not covered: matching across graph modules or call_module nodes (traced functions have none).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch.fx

#: Method names and the kind they compute (the method's receiver is the first operand).
_METHODS = {
    "mul": "mul",
    "add": "add",
    "sub": "sub",
    "div": "div",
    "true_divide": "div",
    "pow": "pow",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "erf": "erf",
    "rsqrt": "rsqrt",
    "sqrt": "sqrt",
    "exp": "exp",
    "neg": "neg",
    "square": "square",
    "mean": "mean",
    "var": "var",
    "softmax": "softmax",
    "matmul": "matmul",
    "transpose": "transpose",
    "to": "to",
    "type": "to",
    "float": "to",
    "half": "to",
    "bfloat16": "to",
    "double": "to",
    "contiguous": "contiguous",
    "clone": "clone",
    "expand": "expand",
    "reshape": "reshape",
    "view": "view",
    "dropout": "dropout",
    "masked_fill": "masked_fill",
}
#: Keyword arguments that change what a call computes: such calls are never matched.
_CHANGING_KWARGS = {"alpha", "out", "rounding_mode", "memory_format", "copy", "non_blocking"}
#: Kinds that return a view of (or the same storage as) their first operand.
VIEW_KINDS = {"transpose", "expand", "reshape", "view", "contiguous", "to", "getitem", "permute"}


def _function_kinds() -> dict[Any, str]:
    import torch
    import torch.nn.functional as F

    table: dict[Any, str] = {
        operator.mul: "mul",
        torch.mul: "mul",
        operator.add: "add",
        torch.add: "add",
        operator.sub: "sub",
        torch.sub: "sub",
        operator.truediv: "div",
        torch.div: "div",
        torch.true_divide: "div",
        operator.pow: "pow",
        torch.pow: "pow",
        torch.sigmoid: "sigmoid",
        torch.special.expit: "sigmoid",
        torch.tanh: "tanh",
        torch.erf: "erf",
        torch.special.erf: "erf",
        torch.rsqrt: "rsqrt",
        torch.sqrt: "sqrt",
        torch.exp: "exp",
        operator.neg: "neg",
        torch.neg: "neg",
        torch.square: "square",
        torch.mean: "mean",
        torch.var: "var",
        torch.softmax: "softmax",
        F.softmax: "softmax",
        torch.matmul: "matmul",
        operator.matmul: "matmul",
        torch.bmm: "matmul",
        torch.transpose: "transpose",
        torch.reshape: "reshape",
        F.dropout: "dropout",
        torch.dropout: "dropout",
        operator.getitem: "getitem",
        torch.permute: "permute",
        torch.masked_fill: "masked_fill",
    }
    return table


_FUNCTIONS: dict[Any, str] | None = None


def kind(node: Any) -> str | None:
    """What the node computes (see the module docstring), or None."""
    import torch.fx

    global _FUNCTIONS
    if not isinstance(node, torch.fx.Node):
        return None
    if _CHANGING_KWARGS & set(node.kwargs):
        return None
    if node.kwargs.get("inplace") is True:
        return None
    if node.op == "call_method":
        if node.target == "permute":
            return "permute"
        return _METHODS.get(str(node.target))
    if node.op == "call_function":
        if _FUNCTIONS is None:
            _FUNCTIONS = _function_kinds()
        try:
            return _FUNCTIONS.get(node.target)
        except TypeError:  # unhashable target
            return None
    return None


def operands(node: torch.fx.Node) -> tuple[Any, Any] | None:
    """The two operands of a binary call (receiver first for methods), or None."""
    if len(node.args) == 2 and not (set(node.kwargs) - {"input", "other"}):
        return node.args[0], node.args[1]
    if len(node.args) == 1 and set(node.kwargs) == {"other"}:
        return node.args[0], node.kwargs["other"]
    return None


def binary(node: Any, want: str) -> tuple[Any, Any] | None:
    """``(a, b)`` when ``node`` is the binary op ``want`` (``mul``, ``add``, ...)."""
    if kind(node) != want:
        return None
    return operands(node)


def commuted(node: Any, want: str) -> list[tuple[Any, Any]]:
    """Both operand orders of a commutative binary op (empty when it is not ``want``)."""
    pair = binary(node, want)
    if pair is None:
        return []
    return [pair, (pair[1], pair[0])]


def unary_input(node: Any, want: str) -> Any:
    """The single operand of a unary call of kind ``want`` (or None)."""
    if kind(node) != want or node.kwargs or len(node.args) != 1:
        return None
    return node.args[0]


def arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Positional ``index`` or keyword ``name`` of a call (methods count the receiver)."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def single_use(node: Any) -> bool:
    import torch.fx

    return isinstance(node, torch.fx.Node) and len(node.users) == 1


def is_float_constant(value: Any, target: float, rel: float = 1e-6) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and abs(float(value) - target) <= rel * max(1.0, abs(target))
    )


def aliases_input(node: Any) -> bool:
    """True when ``node`` may share storage with a graph input (a placeholder or a view of
    one): replacing an output by such a node would make the output alias an input."""
    import torch.fx

    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if not isinstance(n, torch.fx.Node) or n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            return True
        if kind(n) in VIEW_KINDS or (n.op == "call_method" and n.target in ("t", "unsqueeze")):
            stack.append(n.args[0] if n.args else None)
    return False


def has_inplace(graph: torch.fx.Graph) -> bool:
    """Any call that may mutate a tensor (``x.add_()``, ``out=``, item assignment)."""
    for n in graph.nodes:
        if n.op == "call_method" and str(n.target).endswith("_") and n.target != "__getitem__":
            return True
        if n.op == "call_function" and (
            "out" in n.kwargs
            or n.kwargs.get("inplace") is True
            or n.target is operator.setitem
            or getattr(n.target, "__name__", "").endswith("_")
        ):
            return True
    return False


class Site:
    """The nodes of one match: ``absorb`` them, then :meth:`replace` the root."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self.nodes: list[torch.fx.Node] = []

    def absorb(self, *nodes: Any) -> None:
        import torch.fx

        self.nodes.extend(n for n in nodes if isinstance(n, torch.fx.Node))

    def replace(self, root: torch.fx.Node, new: Any) -> None:
        """Route every use of ``root`` to ``new``, then erase absorbed nodes left unused."""
        root.replace_all_uses_with(new)
        erase_unused([root, *self.nodes])


def erase_unused(nodes: Iterable[torch.fx.Node]) -> None:
    """Erase nodes without users, repeatedly (only the given nodes, never placeholders)."""
    pending = [n for n in nodes if n.op not in ("placeholder", "output")]
    changed = True
    while changed:
        changed = False
        for n in list(pending):
            if n.graph is not None and not n.users and n in n.graph.nodes:
                n.graph.erase_node(n)
                pending.remove(n)
                changed = True


__all__ = [
    "Site",
    "aliases_input",
    "arg",
    "binary",
    "commuted",
    "erase_unused",
    "has_inplace",
    "is_float_constant",
    "kind",
    "only_user",
    "operands",
    "single_use",
    "unary_input",
]
