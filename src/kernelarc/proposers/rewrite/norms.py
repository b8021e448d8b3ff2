"""Written-out RMSNorm / LayerNorm subgraphs -> ``F.rms_norm`` / ``F.layer_norm``.

- ``rms_norm``: ``x * rsqrt(mean(x**2, -1, keepdim=True) + eps)`` (also ``x / sqrt(...)``,
  ``x*x``, ``x.square()``, either operand order) -> ``F.rms_norm(x, (D,), None, eps)``; a
  following ``* w`` with ``w`` of shape ``(D,)`` and ``x``'s dtype is folded in as the
  weight. Same formula; CHANGES ROUNDING only through the reduction order of the mean.
- ``rms_norm-fold-cast``: the common mixed-precision form ``rms_norm(x.to(fp32)).to(x.dtype)
  [* w]`` with ``x`` (and ``w``) bf16/fp16 -> ``F.rms_norm(x, (D,), w, eps)``: the fused op
  computes in fp32 internally and rounds once, where the reference rounds before the
  weight multiply; results differ by at most about one bf16/fp16 ulp.
- ``layer_norm``: ``(x - mean(x)) / sqrt(var(x, unbiased=False) + eps)`` (also ``* rsqrt``,
  the variance written as ``mean((x - mean)**2)``) with optional ``* w`` and ``+ b`` of
  shape ``(D,)`` -> ``F.layer_norm(x, (D,), w, b, eps)``. CHANGES ROUNDING (the fused op
  accumulates in fp32 and uses a different reduction order).

Every reduction must be over the last dimension with ``keepdim=True``; ``eps`` must be a
Python number (a literal or a scalar input), never a tensor; every absorbed intermediate
must have no other user. Not covered: GroupNorm/InstanceNorm, norms over several
dimensions, ``torch.var_mean``, biased/unbiased flags given as ``correction=``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernelarc.proposers.rewrite.casts import cast_target
from kernelarc.proposers.rewrite.graph import (
    Site,
    arg,
    binary,
    commuted,
    kind,
    only_user,
    single_use,
    unary_input,
)
from kernelarc.proposers.rewrite.trace import Facts

if TYPE_CHECKING:
    import torch.fx


def _last_dim_size(x: Any, facts: Facts) -> int | None:
    ts = facts.tensors(x)
    if not ts or any(not t.shape for t in ts) or len({t.shape[-1] for t in ts}) != 1:
        return None
    if not ts[0].dtype.is_floating_point:
        return None
    return ts[0].shape[-1]


def _is_last_dim(dim: Any, ndim: int | None) -> bool:
    if isinstance(dim, list | tuple) and len(dim) == 1:
        dim = dim[0]
    return isinstance(dim, int) and (dim == -1 or (ndim is not None and dim == ndim - 1))


def _last_dim_mean(node: Any, facts: Facts) -> Any:
    """The operand of ``mean(v, -1, keepdim=True)`` (None when ``node`` is not that)."""
    if kind(node) != "mean" or "dtype" in node.kwargs or not node.args:
        return None
    src = node.args[0]
    if (
        not _is_last_dim(arg(node, 1, "dim"), facts.ndim(src))
        or arg(node, 2, "keepdim") is not True
    ):
        return None
    if len(node.args) > 3 or set(node.kwargs) - {"dim", "keepdim"}:
        return None
    return src


def _squared(node: Any) -> Any:
    """``v`` when ``node`` is ``v**2``, ``v.square()`` or ``v*v``."""
    pair = binary(node, "pow")
    if pair is not None and pair[1] == 2:
        return pair[0]
    sq = unary_input(node, "square")
    if sq is not None:
        return sq
    pair = binary(node, "mul")
    if pair is not None and pair[0] is pair[1]:
        return pair[0]
    return None


def _plus_scalar(node: Any, facts: Facts) -> tuple[Any, Any] | None:
    """``(v, eps)`` when ``node`` is ``v + eps`` (either order) with a Python-number eps."""
    for v, eps in commuted(node, "add"):
        if facts.is_scalar(eps) and not facts.is_scalar(v):
            return v, eps
    return None


def _inverse_root(node: Any, facts: Facts) -> tuple[Any, Any, str] | None:
    """``(inner, eps, how)`` for ``rsqrt(inner + eps)`` (how="mul") or ``sqrt(...)``
    (how="div"), with ``inner + eps`` used only there."""
    for how, k in (("mul", "rsqrt"), ("div", "sqrt")):
        arg0 = unary_input(node, k)
        if arg0 is None or not single_use(arg0):
            continue
        found = _plus_scalar(arg0, facts)
        if found is not None:
            return found[0], found[1], how
    return None


def _applied(root: torch.fx.Node, how: str) -> list[tuple[torch.fx.Node, Any]]:
    """``(user, other operand)`` for users computing ``other * root`` or ``other / root``."""
    out = []
    for user in root.users:
        if how == "mul":
            out += [(user, a) for a, b in commuted(user, "mul") if b is root]
        else:
            pair = binary(user, "div")
            if pair is not None and pair[1] is root:
                out.append((user, pair[0]))
    return out


def _affine(node: torch.fx.Node, op: str, d: int, dtype: Any, facts: Facts) -> Any:
    """The ``(D,)``-shaped operand of ``node``'s only user when that user is ``op``."""
    user = only_user(node)
    if user is None:
        return None, None
    for a, b in commuted(user, op):
        if a is node and b is not node and facts.dtype(b) == dtype:
            ts = facts.tensors(b)
            if ts and all(t.shape == (d,) for t in ts):
                return user, b
    return None, None


def _widened_from(x: Any, other: Any, facts: Facts) -> bool:
    """``x`` is ``other.to(fp32)`` from bf16/fp16: ``other * r`` promotes to exactly
    ``x * r``, so the normalised value is the same."""
    import torch

    return (
        cast_target(x, facts) == torch.float32
        and x.args[0] is other
        and facts.dtype(other) in (torch.bfloat16, torch.float16)
    )


def rms_norms(gm: torch.fx.GraphModule, facts: Facts) -> int:
    import torch.nn.functional as F

    count = 0
    for node in list(gm.graph.nodes):
        if node not in gm.graph.nodes:
            continue
        found = _inverse_root(node, facts)
        if found is None or not single_use(node):
            continue
        inner, eps, how = found
        sq = _last_dim_mean(inner, facts)
        x = _squared(sq)
        if x is None or not single_use(inner) or not single_use(sq):
            continue
        d = _last_dim_size(x, facts)
        users = [(u, o) for u, o in _applied(node, how) if o is x or _widened_from(x, o, facts)]
        if d is None or len(users) != 1:
            continue
        out = users[0][0]
        site = Site(gm.graph)
        site.absorb(sq, inner, node.args[0], node)
        weight_user, w = _affine(out, "mul", d, facts.dtype(x), facts)
        root, weight = (weight_user, w) if weight_user is not None else (out, None)
        if weight_user is not None:
            site.absorb(out)
        with gm.graph.inserting_before(root):
            new = gm.graph.call_function(F.rms_norm, (x, (d,), weight, eps))
        site.replace(root, new)
        count += 1
    return count


def rms_norm_fold_casts(gm: torch.fx.GraphModule, facts: Facts) -> int:
    """``F.rms_norm(x.to(fp32), (D,), None, eps).to(x.dtype) [* w]`` -> one fused call."""
    import torch
    import torch.nn.functional as F

    count = 0
    for node in list(gm.graph.nodes):
        if node not in gm.graph.nodes or node.target is not F.rms_norm or len(node.args) != 4:
            continue
        up, shape, weight, eps = node.args
        if weight is not None or cast_target(up, facts) != torch.float32 or not single_use(up):
            continue
        x = up.args[0]
        low = facts.dtype(x)
        if low not in (torch.bfloat16, torch.float16) or facts.dtype(up.args[0]) != low:
            continue
        down = only_user(node)
        if down is None or cast_target(down, facts) != low:
            continue
        site = Site(gm.graph)
        site.absorb(node, up)
        weight_user, w = _affine(down, "mul", shape[0], low, facts)
        root, weight = (weight_user, w) if weight_user is not None else (down, None)
        if weight_user is not None:
            site.absorb(down)
        with gm.graph.inserting_before(root):
            new = gm.graph.call_function(F.rms_norm, (x, shape, weight, eps))
        site.replace(root, new)
        count += 1
    return count


def _biased_var(node: Any, x: Any, mean: Any, facts: Facts) -> bool:
    """``node`` is the biased variance of ``x`` over the last dim (keepdim)."""
    if kind(node) == "var" and node.args and node.args[0] is x:
        if not _is_last_dim(arg(node, 1, "dim"), facts.ndim(x)):
            return False
        if node.kwargs.get("keepdim") is not True or node.kwargs.get("unbiased") is not False:
            return False
        return (
            len(node.args) == 2
            and set(node.kwargs) == {"keepdim", "unbiased"}
            or (len(node.args) == 1 and set(node.kwargs) == {"dim", "keepdim", "unbiased"})
        )
    centred = _squared(_last_dim_mean(node, facts))
    pair = binary(centred, "sub")
    return pair is not None and pair[0] is x and pair[1] is mean


def layer_norms(gm: torch.fx.GraphModule, facts: Facts) -> int:
    import torch.nn.functional as F

    count = 0
    for node in list(gm.graph.nodes):
        if node not in gm.graph.nodes:
            continue
        found = _inverse_root(node, facts)
        if found is None or not single_use(node):
            continue
        var, eps, how = found
        users = _applied(node, how)
        if len(users) != 1:
            continue
        out, centred = users[0]
        pair = binary(centred, "sub")
        if pair is None:
            continue
        x, mean = pair
        if _last_dim_mean(mean, facts) is not x or not _biased_var(var, x, mean, facts):
            continue
        d = _last_dim_size(x, facts)
        if d is None or not single_use(var):
            continue
        # The centred value feeds the output (and, in the written-out variance, the square).
        sq_node = var.args[0] if kind(var) == "mean" else None
        inner_sub = sq_node.args[0] if sq_node is not None else None
        allowed = {out} | ({sq_node} if inner_sub is centred else set())
        if set(centred.users) - allowed:
            continue
        site = Site(gm.graph)
        site.absorb(node.args[0], node, centred, mean, var, sq_node, inner_sub)
        dtype = facts.dtype(x)
        root, weight, bias = out, None, None
        w_user, w = _affine(out, "mul", d, dtype, facts)
        if w_user is not None:
            site.absorb(out)
            root, weight = w_user, w
            b_user, b = _affine(w_user, "add", d, dtype, facts)
            if b_user is not None:
                site.absorb(w_user)
                root, bias = b_user, b
        with gm.graph.inserting_before(root):
            new = gm.graph.call_function(F.layer_norm, (x, (d,), weight, bias, eps))
        site.replace(root, new)
        count += 1
    return count


__all__ = ["layer_norms", "rms_norm_fold_casts", "rms_norms"]
