"""Float32 matmuls of upcast half-precision operands, run as half-precision GEMMs.

``a.to(torch.float32) @ b.to(torch.float32)`` (also ``torch.mm``, ``torch.bmm``,
``torch.matmul``, their methods and ``F.linear`` with an optional float32 bias) where ``a``
and ``b`` are both bfloat16 or both float16 tensors, possibly seen through view operations
after the cast (``t``, ``.T``, ``.mT``, ``transpose``, ``permute``, ``view``/``reshape`` to a
shape, ``unsqueeze``, ``squeeze``): every operand value is a half-precision value, so every
product is exact in float32, and ``torch.mm(a, b, out_dtype=torch.float32)`` (a cuBLAS
half-precision GEMM that accumulates and returns float32; ``bmm`` alike) computes the same
sums as the float32 GEMM. Only the summation order may differ, which the float32 GEMM
leaves free too; hence "same function", not bit-exact. The speed: tensor cores instead
of float32 FMA units (H100/H200 datasheet, dense: 989 bf16 vs 67 fp32 TFLOP/s). Reference
code upcasts this way "for numerical stability" very often.

CUDA only: ``mm``/``bmm`` with ``out_dtype`` exist from torch 2.8 on and have no CPU
kernel; the agent proposes this family only for a CUDA device (:func:`families_for`).
Shapes: ``mm``/``bmm`` on 2-D/3-D operands; ``matmul`` when both operands are 2-D (mm) or
both 3-D (bmm) on every workload; ``linear`` on an input of any rank >= 2 (flattened to
2-D around the GEMM). Not covered: broadcasting batched matmuls of rank > 3, ``addmm``/
``baddbmm``, einsum, operands of mixed half dtypes or one float32 operand computed in
float32 (rounding it to half precision would change the result: that is the precision
agent's bf16 policy, judged by the tolerance).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from kernelarc.proposers.rewrite.casts import cast_target
from kernelarc.proposers.rewrite.graph import Site
from kernelarc.proposers.rewrite.trace import Facts

if TYPE_CHECKING:
    import torch
    import torch.fx

#: View operations that may sit between the cast and the matmul (replayed on the half
#: tensor): method names, and the torch functions with the same meaning.
_VIEW_METHODS = {"t", "transpose", "permute", "view", "reshape", "unsqueeze", "squeeze"}


def _view_functions() -> set[Any]:
    import torch

    return {torch.t, torch.transpose, torch.permute, torch.reshape, torch.unsqueeze, torch.squeeze}


def _is_view(node: Any) -> bool:
    import builtins

    import torch
    import torch.fx

    if not isinstance(node, torch.fx.Node) or node.kwargs or not node.args:
        return False
    if node.op == "call_function" and node.target is builtins.getattr:
        return len(node.args) == 2 and node.args[1] in ("T", "mT")  # x.T, x.mT
    if node.op == "call_method" and node.target in _VIEW_METHODS:
        pass
    elif not (node.op == "call_function" and node.target in _view_functions()):
        return False
    # x.view(torch.int16) reinterprets the bits: not a shape view
    return not any(isinstance(a, torch.dtype) for a in node.args[1:])


def half_source(node: Any, facts: Facts) -> tuple[Any, list[Any], torch.dtype] | None:
    """``(half tensor, view chain outermost first, its dtype)`` when ``node`` is a float32
    cast of a bfloat16/float16 tensor seen through view operations, else None."""
    import torch

    chain: list[Any] = []
    cur = node
    while _is_view(cur):
        chain.append(cur)
        cur = cur.args[0]
    if cast_target(cur, facts) != torch.float32 or not cur.args:
        return None
    src = cur.args[0]
    dtype = facts.dtype(src)
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    return src, [*chain, cur], dtype


def _replay(graph: torch.fx.Graph, src: Any, chain: list[Any]) -> Any:
    """The chain's view operations (the cast, last in ``chain``, left out) on ``src``."""
    cur = src
    for v in reversed(chain[:-1]):
        cur = graph.create_node(v.op, v.target, (cur, *v.args[1:]), dict(v.kwargs))
    return cur


#: Method names of the matmul calls taken, and their form.
_METHOD_FORMS = {"mm": "mm", "bmm": "bmm", "matmul": "matmul"}


def _function_forms() -> dict[Any, str]:
    import torch

    return {torch.mm: "mm", torch.bmm: "bmm", torch.matmul: "matmul", operator.matmul: "matmul"}


def _linear_operands(node: Any, facts: Facts) -> tuple[str, Any, Any, Any] | None:
    extra = [node.kwargs[k] for k in ("weight", "bias") if k in node.kwargs]
    args = [*node.args, *extra]
    if set(node.kwargs) - {"weight", "bias"} or not 2 <= len(args) <= 3:
        return None
    if (facts.ndim(args[0]) or 0) < 2:
        return None
    return "linear", args[0], args[1], args[2] if len(args) == 3 else None


def _matmul_operands(node: Any, facts: Facts) -> tuple[str, Any, Any, Any] | None:
    """``(form, a, b, bias)`` for a matmul-like call this family can take, else None."""
    import torch.nn.functional as F

    if node.op == "call_function" and node.target is F.linear:
        return _linear_operands(node, facts)
    if node.op == "call_method":
        form = _METHOD_FORMS.get(str(node.target))
    elif node.op == "call_function":
        form = _function_forms().get(node.target)
    else:
        return None
    if form is None or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    if form == "matmul":
        na, nb = facts.ndim(a), facts.ndim(b)
        if na == nb == 2:
            form = "mm"
        elif na == nb == 3 and _same_batch(facts, a, b):
            form = "bmm"
        else:
            return None
    return form, a, b, None


def _same_batch(facts: Facts, a: Any, b: Any) -> bool:
    ta, tb = facts.tensors(a), facts.tensors(b)
    if not ta or not tb:
        return False
    return all(x.shape[0] == y.shape[0] for x, y in zip(ta, tb, strict=True))


def half_matmuls(gm: torch.fx.GraphModule, facts: Facts) -> int:
    """Rewrite every matching matmul (see the module docstring); the number rewritten."""
    import torch

    graph = gm.graph
    count = 0
    for node in list(graph.nodes):  # only casts and views are erased: never a later matmul
        got = _matmul_operands(node, facts)
        if got is None:
            continue
        form, a, b, bias = got
        ha, hb = half_source(a, facts), half_source(b, facts)
        if ha is None or hb is None or ha[2] != hb[2]:
            continue
        if facts.dtype(node) != torch.float32:
            continue
        if bias is not None and facts.dtype(bias) != torch.float32:
            continue
        site = Site(graph)
        site.absorb(*ha[1], *hb[1])
        with graph.inserting_before(node):
            x = _replay(graph, ha[0], ha[1])
            w = _replay(graph, hb[0], hb[1])
            new = _emit(graph, form, x, w, bias)
        site.replace(node, new)
        count += 1
    return count


def _emit(graph: torch.fx.Graph, form: str, x: Any, w: Any, bias: Any) -> Any:
    import torch

    f32: dict[str, Any] = {"out_dtype": torch.float32}
    if form == "mm":
        return graph.call_function(torch.mm, (x, w), f32)
    if form == "bmm":
        return graph.call_function(torch.bmm, (x, w), f32)
    # linear: y = x @ w.T (+ bias) over the last dimension of x, any leading dimensions
    lead = graph.call_function(operator.getitem, (graph.call_method("size", (x,)), slice(-1)))
    flat = graph.call_method("flatten", (x, 0, -2))
    out = graph.call_function(torch.mm, (flat, graph.call_method("t", (w,))), f32)
    out = graph.call_method("unflatten", (out, 0, lead))
    if bias is not None:
        out = graph.call_function(operator.add, (out, bias))
    return out


__all__ = ["half_matmuls", "half_source"]
