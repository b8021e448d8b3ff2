"""Removal of redundant casts and copies. Every rewrite here is EXACT (bit-identical).

- ``identity-cast``: ``x.to(d)`` (also ``.float()``, ``.half()``, ``.bfloat16()``,
  ``.double()``, ``.type(d)``) when ``x`` already has dtype ``d`` on every workload: torch
  returns ``x`` itself, so using ``x`` is the same tensor. No speed gain by itself; it
  exposes patterns to the other families.
- ``identity-contiguous``: ``x.contiguous()`` when ``x`` is contiguous on every workload
  (torch returns ``x`` itself). No gain by itself.
- ``round-trip-cast``: ``x.to(wide).to(d)`` with ``x`` of dtype ``d`` and ``d -> wide``
  exact (bf16/fp16 -> fp32/fp64, fp32 -> fp64, narrower -> wider integers, bool -> any):
  the value comes back bit for bit, so ``x`` replaces it. Saves two elementwise kernels.
- ``dead-clone``: ``y = x.clone()`` when the graph mutates nothing, ``x`` is not (a view
  of) an input and ``y`` is not an output: values are equal and no one writes either.

Never applied when the replacement would make an output alias an input (the guard's
``output-aliases-input`` check) or when the call carries ``copy=``/``memory_format=``.
Not covered: casts with a device argument, ``type_as``, casts whose removal changes
rounding (e.g. ``a.float() @ b.float()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernelarc.proposers.rewrite.graph import Site, aliases_input, has_inplace, kind
from kernelarc.proposers.rewrite.trace import Facts

if TYPE_CHECKING:
    import torch
    import torch.fx

_METHOD_DTYPES = {
    "float": "float32",
    "half": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
}


def cast_target(node: Any, facts: Facts) -> torch.dtype | None:
    """The dtype a pure dtype cast converts to (None for anything else, e.g. device moves)."""
    import torch

    if kind(node) != "to":
        return None
    name = str(node.target)
    if name in _METHOD_DTYPES:
        if len(node.args) != 1 or node.kwargs:
            return None
        dt = getattr(torch, _METHOD_DTYPES[name])
        return dt if isinstance(dt, torch.dtype) else None
    rest, kwargs = node.args[1:], dict(node.kwargs)
    if len(rest) == 1 and not kwargs:
        target = rest[0]
    elif not rest and set(kwargs) == {"dtype"}:
        target = kwargs["dtype"]
    else:
        return None
    try:
        value = facts.constant(target)
    except KeyError:
        return None
    return value if isinstance(value, torch.dtype) else None


def cast_source(node: torch.fx.Node) -> Any:
    return node.args[0]


def _exact_widening(src: torch.dtype, wide: torch.dtype) -> bool:
    import torch

    floats = {torch.bfloat16: 1, torch.float16: 1, torch.float32: 2, torch.float64: 3}
    ints = {torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4}
    if src == torch.bool:
        return wide != torch.bool
    if src in floats and wide in floats:
        return floats[wide] > floats[src]
    if src in ints and wide in ints:
        return ints[wide] > ints[src]
    if src == torch.uint8 and wide in (torch.int16, torch.int32, torch.int64):
        return True
    if src in ints and wide == torch.float64:
        return ints[src] <= 3
    return False


def _feeds_output(node: torch.fx.Node) -> bool:
    return any(u.op == "output" for u in node.users)


def _safe_to_replace(node: torch.fx.Node, by: Any) -> bool:
    return not (_feeds_output(node) and aliases_input(by))


def _drop_identities(
    gm: torch.fx.GraphModule, source_if_identity: Callable[[torch.fx.Node], Any]
) -> int:
    """Replace every node that ``source_if_identity`` maps to its unchanged source."""
    count = 0
    for node in list(gm.graph.nodes):
        src = source_if_identity(node)
        if src is None or not _safe_to_replace(node, src):
            continue
        Site(gm.graph).replace(node, src)
        count += 1
    return count


def identity_casts(gm: torch.fx.GraphModule, facts: Facts) -> int:
    def source(node: torch.fx.Node) -> Any:
        target = cast_target(node, facts)
        src = node.args[0] if node.args else None
        return src if target is not None and facts.dtype(src) == target else None

    return _drop_identities(gm, source)


def identity_contiguous(gm: torch.fx.GraphModule, facts: Facts) -> int:
    def source(node: torch.fx.Node) -> Any:
        if kind(node) != "contiguous" or len(node.args) != 1 or node.kwargs:
            return None
        ts = facts.tensors(node.args[0])
        return node.args[0] if ts and all(t.contiguous for t in ts) else None

    return _drop_identities(gm, source)


def round_trip_casts(gm: torch.fx.GraphModule, facts: Facts) -> int:
    count = 0
    for node in list(gm.graph.nodes):
        if node.graph is None or node not in gm.graph.nodes:
            continue
        outer = cast_target(node, facts)
        inner: Any = node.args[0] if node.args else None
        wide = cast_target(inner, facts) if outer is not None else None
        if outer is None or wide is None:
            continue
        src = inner.args[0]
        src_dtype = facts.dtype(src)
        if src_dtype != outer or not _exact_widening(src_dtype, wide):
            continue
        if not _safe_to_replace(node, src):
            continue
        site = Site(gm.graph)
        site.absorb(inner)
        site.replace(node, src)
        count += 1
    return count


def dead_clones(gm: torch.fx.GraphModule, facts: Facts) -> int:
    if has_inplace(gm.graph):
        return 0
    count = 0
    for node in list(gm.graph.nodes):
        if kind(node) != "clone" or len(node.args) != 1 or node.kwargs:
            continue
        src = node.args[0]
        if facts.tensors(src) is None or aliases_input(src) or _feeds_output(node):
            continue
        Site(gm.graph).replace(node, src)
        count += 1
    return count


__all__ = [
    "cast_source",
    "cast_target",
    "dead_clones",
    "identity_casts",
    "identity_contiguous",
    "round_trip_casts",
]
