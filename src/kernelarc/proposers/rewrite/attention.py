"""Written-out attention -> ``F.scaled_dot_product_attention`` (SDPA).

Matched (structurally, from the final product backwards)::

    P = softmax(S, dim=-1 [, dtype=...]) [.to(v.dtype)] [dropout(training=False)]
    S = [(q @ k^T) * scale | (q @ k^T) / c | q @ k^T] [+ mask | .masked_fill(m, -inf)]
        [.to(float32)]
    out = P @ v

with ``k^T`` a ``transpose``/``permute`` of the last two dimensions, ``q`` optionally
``q0 * c`` (the factor moves into SDPA's ``scale``), and GQA key/value repetition
(``k0[:, :, None].expand(b, h, n, s, d).reshape(b, h*n, s, d)`` or
``repeat_interleave(k0, n, dim=1)``, the same ``n`` for k and v) turned into
``enable_gqa=True`` on the unrepeated tensors (query head ``i`` reads kv head ``i // n``
in both). Conditions checked on every propagated workload: q, k, v of one floating dtype,
at least 3 dimensions, equal leading (batch, head) dimensions; an additive mask of the
scores' dtype whose broadcast with the scores leaves their shape unchanged; a boolean
``masked_fill`` mask becomes ``attn_mask=~m``; every intermediate used only here.

Numerics: the same function; CHANGES ROUNDING (SDPA's kernels accumulate the softmax in
fp32 and need not round the probabilities to the input dtype before ``P @ v``). One
semantic edge: a row masked entirely with -inf gives NaN in the explicit softmax and may
give 0 in SDPA's kernels. Not covered: dropout in training mode, softcapping
(``tanh(S / c) * c`` is not part of SDPA), ``is_causal`` detection (a causal mask stays an
explicit mask), attention over 2-D tensors.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelarc.proposers.rewrite.casts import cast_target
from kernelarc.proposers.rewrite.graph import Site, arg, binary, commuted, kind, single_use
from kernelarc.proposers.rewrite.trace import Facts

if TYPE_CHECKING:
    import torch.fx


@dataclass
class _Scores:
    q: Any
    k: Any
    scale: Any  # a number, a scalar node, or a ("mul"/"div", a, b) recipe
    mask: Any
    bool_mask: bool
    absorbed: list[Any]


def _single(node: Any) -> bool:
    return single_use(node)


def _softmax_input(node: Any, facts: Facts) -> Any:
    if kind(node) != "softmax" or not node.args:
        return None
    src = node.args[0]
    dim = arg(node, 1, "dim")
    if set(node.kwargs) - {"dim", "dtype", "_stacklevel"} or len(node.args) > 3:
        return None
    ndim = facts.ndim(src)
    if not (dim == -1 or (ndim is not None and dim == ndim - 1)):
        return None
    return src


def _strip_identity_dropout(node: Any) -> Any:
    """The input of ``dropout(x, p, training=False)`` (None when not such a call)."""
    if kind(node) != "dropout":
        return None
    training = arg(node, 2, "training", arg(node, 2, "train", True))
    return node.args[0] if training is False else None


def _transposed_last_two(node: Any, facts: Facts) -> Any:
    """``k`` when ``node`` is ``k`` with its last two dimensions swapped."""
    src = node.args[0] if kind(node) in ("transpose", "permute") and node.args else None
    ndim = facts.ndim(src)
    if src is None or ndim is None or ndim < 2:
        return None
    if kind(node) == "transpose":
        dims = {d % ndim for d in node.args[1:3] if isinstance(d, int)}
        return src if len(node.args) == 3 and dims == {ndim - 2, ndim - 1} else None
    perm = list(node.args[1:]) if len(node.args) > 2 else node.args[1]
    want = [*range(ndim - 2), ndim - 1, ndim - 2]
    return src if list(perm) == want else None


def _scores(s: Any, facts: Facts) -> _Scores | None:
    absorbed: list[Any] = []
    if cast_target(s, facts) is not None and _single(s):
        absorbed.append(s)
        s = s.args[0]
    mask, bool_mask = None, False
    for a, b in commuted(s, "add"):
        if facts.tensors(b) is not None and facts.dtype(b) == facts.dtype(a) and _single(a):
            mask, absorbed, s = b, [*absorbed, s], a
            break
    if mask is None and kind(s) == "masked_fill" and len(s.args) == 3 and not s.kwargs:
        import torch

        base, m, value = s.args
        neg_inf = not _is_node(value) and value == float("-inf")
        if facts.dtype(m) == torch.bool and neg_inf and _single(base):
            mask, bool_mask, absorbed, s = m, True, [*absorbed, s], base
    scale: Any = 1.0
    if kind(s) != "matmul":
        mm = None
        for a, c in commuted(s, "mul"):
            if facts.is_scalar(c) and kind(a) == "matmul" and _single(a):
                mm, scale = a, c
                break
        pair = binary(s, "div")
        if mm is None and pair is not None:
            a, c = pair
            if facts.is_scalar(c) and kind(a) == "matmul" and _single(a):
                mm = a
                scale = ("div", 1.0, c) if _is_node(c) else 1.0 / float(c)
        if mm is None:
            return None
        absorbed.append(s)
        s = mm
    if kind(s) != "matmul" or len(s.args) != 2 or s.kwargs:
        return None
    q, kt = s.args
    k = _transposed_last_two(kt, facts)
    if k is None or not _single(kt):
        return None
    absorbed += [s, kt]
    for qa, c in commuted(q, "mul"):
        if facts.is_scalar(c) and facts.tensors(qa) is not None and _single(q):
            absorbed.append(q)
            scale = ("mul", scale, c)
            q = qa
            break
    if mask is not None:
        for ms, ts in zip(facts.tensors(mask) or [], facts.tensors(s) or [], strict=False):
            import torch

            try:
                if tuple(torch.broadcast_shapes(ts.shape, ms.shape)) != ts.shape:
                    return None
            except RuntimeError:
                return None
    return _Scores(q, k, scale, mask, bool_mask, absorbed)


def _is_node(x: Any) -> bool:
    import torch.fx

    return isinstance(x, torch.fx.Node)


def _unrepeated(node: Any, facts: Facts) -> tuple[Any, int, list[Any]] | None:
    """``(kv0, n, absorbed)`` when ``node`` repeats each head of ``kv0`` ``n`` times."""
    import torch

    if node.op == "call_function" and node.target is torch.repeat_interleave:
        n, dim = arg(node, 1, "repeats"), arg(node, 2, "dim")
        if isinstance(n, int) and dim == 1 and set(node.kwargs) <= {"repeats", "dim"}:
            return node.args[0], n, [node]
        return None
    if kind(node) != "reshape" or not _single(node.args[0] if node.args else None):
        return None
    ex = node.args[0]
    if kind(ex) != "expand" or not ex.args or not _single(ex.args[0]):
        return None
    gi = ex.args[0]
    if kind(gi) != "getitem" or not isinstance(gi.args[1], tuple):
        return None
    index = gi.args[1]
    if sum(i is None for i in index) != 1 or not all(
        i is None or i is Ellipsis or i == slice(None) for i in index
    ):
        return None
    kv0 = gi.args[0]
    base, g, e, r = facts.tensors(kv0), facts.tensors(gi), facts.tensors(ex), facts.tensors(node)
    if not (base and g and e and r):
        return None
    ns = set()
    for b0, g0, e0, r0 in zip(base, g, e, r, strict=True):
        if len(b0.shape) != 4 or g0.shape != (*b0.shape[:2], 1, *b0.shape[2:]):
            return None
        n = e0.shape[2]
        if e0.shape != (*b0.shape[:2], n, *b0.shape[2:]):
            return None
        if r0.shape != (b0.shape[0], b0.shape[1] * n, *b0.shape[2:]):
            return None
        ns.add(n)
    if len(ns) != 1:
        return None
    return kv0, ns.pop(), [node, ex, gi]


def _emit_scale(graph: torch.fx.Graph, scale: Any) -> Any:
    if isinstance(scale, tuple):
        op, a, b = scale
        a, b = _emit_scale(graph, a), _emit_scale(graph, b)
        if not _is_node(a) and not _is_node(b):
            return a * b if op == "mul" else a / b
        return graph.call_function(operator.mul if op == "mul" else operator.truediv, (a, b))
    return float(scale) if not _is_node(scale) else scale


def attentions(gm: torch.fx.GraphModule, facts: Facts) -> int:
    import torch
    import torch.nn.functional as F

    count = 0
    for node in list(gm.graph.nodes):
        if node not in gm.graph.nodes or kind(node) != "matmul" or len(node.args) != 2:
            continue
        p, v = node.args
        absorbed: list[Any] = []
        if cast_target(p, facts) is not None and _single(p):
            absorbed.append(p)
            p = p.args[0]
        inner = _strip_identity_dropout(p)
        if inner is not None and _single(p):
            absorbed.append(p)
            p = inner
        s = _softmax_input(p, facts)
        if s is None or not _single(p) or not _single(s):
            continue
        absorbed.append(p)
        sc = _scores(s, facts)
        if sc is None:
            continue
        q, k = sc.q, sc.k
        gqa = False
        rk, rv = _unrepeated(k, facts), _unrepeated(v, facts)
        if rk is not None and rv is not None and rk[1] == rv[1]:
            k, v, gqa = rk[0], rv[0], True
            extra = rk[2] + rv[2]
        elif rk is None and rv is None:
            extra = []
        else:
            continue
        dts = {facts.dtype(t) for t in (q, k, v)}
        dtype = dts.pop() if len(dts) == 1 else None
        if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            continue
        if facts.dtype(node) != dtype or not _shapes_fit(q, k, v, gqa, facts):
            continue
        site = Site(gm.graph)
        site.absorb(*absorbed, *sc.absorbed, *extra)
        with gm.graph.inserting_before(node):
            mask = sc.mask
            if mask is not None and sc.bool_mask:
                mask = gm.graph.call_function(torch.logical_not, (mask,))
            kwargs: dict[str, Any] = {"attn_mask": mask, "scale": _emit_scale(gm.graph, sc.scale)}
            if gqa:
                kwargs["enable_gqa"] = True
            new = gm.graph.call_function(F.scaled_dot_product_attention, (q, k, v), kwargs)
        site.replace(node, new)
        count += 1
    return count


def _shapes_fit(q: Any, k: Any, v: Any, gqa: bool, facts: Facts) -> bool:
    tq, tk, tv = facts.tensors(q), facts.tensors(k), facts.tensors(v)
    if not (tq and tk and tv):
        return False
    for a, b, c in zip(tq, tk, tv, strict=True):
        if len(a.shape) < 3 or not len(a.shape) == len(b.shape) == len(c.shape):
            return False
        if a.shape[-1] != b.shape[-1] or b.shape[-2] != c.shape[-2]:
            return False
        if b.shape[:-2] != c.shape[:-2]:
            return False
        if gqa:
            if a.shape[:-3] != b.shape[:-3] or a.shape[-3] % b.shape[-3]:
                return False
        elif a.shape[:-2] != b.shape[:-2]:
            return False
    return True


__all__ = ["attentions"]
