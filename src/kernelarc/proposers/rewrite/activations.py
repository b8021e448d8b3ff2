"""Written-out activations -> ``F.silu`` / ``F.gelu``.

- ``silu``: ``x * sigmoid(x)`` (either order, ``torch.sigmoid``/``.sigmoid()``) and
  ``x / (1 + exp(-x))`` -> ``F.silu(x)``. Same function; CHANGES ROUNDING: the fused op
  evaluates in fp32 for bf16/fp16 inputs and rounds once, the reference rounds the sigmoid
  and the product separately (differences of about one ulp).
- ``gelu-tanh``: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`` in any
  association and order of the products (``x**3`` also as ``x*x*x``, ``x * x**2``), and
  ``gelu-erf``: ``0.5 * x * (1 + erf(x / sqrt(2)))`` (also ``* 0.7071...``) ->
  ``F.gelu(x, approximate='tanh'|'none')``. Same function; CHANGES ROUNDING as above.

Constants are compared with a relative tolerance of 1e-5 (references write sqrt(2/pi) with
8 or more digits). Intermediate products must have no other user. Not covered:
``x * sigmoid(1.702 * x)`` (quick-GELU), Mish, hardswish, softplus forms.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kernelarc.proposers.rewrite.graph import (
    Site,
    binary,
    commuted,
    is_float_constant,
    kind,
    single_use,
    unary_input,
)
from kernelarc.proposers.rewrite.trace import Facts

if TYPE_CHECKING:
    import torch.fx

_REL = 1e-5
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def factors(node: Any, absorbed: list[Any], root: bool = True) -> tuple[float, list[Any]]:
    """``(constant, [other factors])`` of a product tree below ``node``; inner ``mul``/``div``
    nodes (single use) are flattened and appended to ``absorbed``."""
    if _number(node):
        return float(node), []
    if not root and not single_use(node):
        return 1.0, [node]
    pair = binary(node, "mul")
    if pair is not None:
        if not root:
            absorbed.append(node)
        ca, fa = factors(pair[0], absorbed, root=False)
        cb, fb = factors(pair[1], absorbed, root=False)
        return ca * cb, fa + fb
    pair = binary(node, "div")
    if pair is not None and _number(pair[1]) and pair[1] != 0:
        if not root:
            absorbed.append(node)
        ca, fa = factors(pair[0], absorbed, root=False)
        return ca / float(pair[1]), fa
    return 1.0, [node]


def _one_plus(node: Any) -> Any:
    """``v`` when ``node`` is ``1 + v`` (either order)."""
    for a, b in commuted(node, "add"):
        if is_float_constant(a, 1.0):
            return b
    return None


def _cube_of(node_factors: list[Any], absorbed: list[Any]) -> Any:
    """``x`` when the factors multiply to ``x**3``."""
    base: list[Any] = []
    for f in node_factors:
        pair = binary(f, "pow")
        if pair is not None and pair[1] in (2, 3, 2.0, 3.0) and single_use(f):
            base += [pair[0]] * int(pair[1])
            absorbed.append(f)
        else:
            base.append(f)
    if len(base) == 3 and base[0] is base[1] is base[2]:
        return base[0]
    return None


def _gelu_tanh_arg(t: Any, x: Any, absorbed: list[Any]) -> bool:
    """``t`` is ``tanh(sqrt(2/pi) * (x + 0.044715 * x**3))``."""
    u = unary_input(t, "tanh")
    if u is None or not single_use(u):
        return False
    c, fs = factors(u, absorbed)
    absorbed.append(u)
    if not is_float_constant(c, SQRT_2_OVER_PI, _REL) or len(fs) != 1:
        return False
    for a, w in commuted(fs[0], "add"):
        if a is not x or not single_use(fs[0]):
            continue
        local: list[Any] = []
        cw, fw = factors(w, local)
        if is_float_constant(cw, 0.044715, _REL) and _cube_of(fw, local) is x and single_use(w):
            absorbed += [fs[0], w, *local]
            return True
    return False


def _gelu_erf_arg(e: Any, x: Any, absorbed: list[Any]) -> bool:
    y = unary_input(e, "erf")
    if y is None or not single_use(y):
        return False
    c, fs = factors(y, absorbed)
    absorbed.append(y)
    return is_float_constant(c, INV_SQRT_2, _REL) and fs == [x]


def gelus(gm: torch.fx.GraphModule, facts: Facts) -> int:
    import torch.nn.functional as F

    count = 0
    for node in list(gm.graph.nodes):
        if node not in gm.graph.nodes or kind(node) not in ("mul", "div"):
            continue
        absorbed: list[Any] = []
        c, fs = factors(node, absorbed)
        if not is_float_constant(c, 0.5, _REL) or len(fs) != 2:
            continue
        for x, bracket in ((fs[0], fs[1]), (fs[1], fs[0])):
            inner = _one_plus(bracket)
            if inner is None or not single_use(bracket) or not single_use(inner):
                continue
            if facts.tensors(x) is None or not facts.dtype(x).is_floating_point:  # type: ignore[union-attr]
                continue
            local = list(absorbed)
            if _gelu_tanh_arg(inner, x, local):
                approximate = "tanh"
            elif _gelu_erf_arg(inner, x, local):
                approximate = "none"
            else:
                continue
            site = Site(gm.graph)
            site.absorb(bracket, inner, *local)
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(F.gelu, (x,), {"approximate": approximate})
            site.replace(node, new)
            count += 1
            break
    return count


def _is_neg_of(node: Any, x: Any) -> bool:
    if unary_input(node, "neg") is x:
        return True
    for a, b in commuted(node, "mul"):
        if a is x and is_float_constant(b, -1.0):
            return True
    return False


def silus(gm: torch.fx.GraphModule, facts: Facts) -> int:
    import torch.nn.functional as F

    count = 0
    for node in list(gm.graph.nodes):
        if node not in gm.graph.nodes:
            continue
        x, absorbed = None, []
        for a, s in commuted(node, "mul"):
            if unary_input(s, "sigmoid") is a and a is not s and single_use(s):
                x, absorbed = a, [s]
                break
        pair = binary(node, "div")
        if x is None and pair is not None:
            num, den = pair
            e = _one_plus(den)
            neg = unary_input(e, "exp")
            if e is not None and single_use(den) and single_use(e) and single_use(neg):
                if neg is not None and _is_neg_of(neg, num):
                    x, absorbed = num, [den, e, neg]
        if x is None or facts.tensors(x) is None:
            continue
        dtype = facts.dtype(x)
        if dtype is None or not dtype.is_floating_point:
            continue
        site = Site(gm.graph)
        site.absorb(*absorbed)
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(F.silu, (x,))
        site.replace(node, new)
        count += 1
    return count


__all__ = ["factors", "gelus", "silus"]
