"""Matching for the grouped rewrite (:mod:`.grouped`): which expert loops it batches.

:func:`read_header` reads a loop's head: the expert index (``for V in range(n)``, or
``for V in hit: U = V.item()``), the ``torch.where(mask[U])`` rows, the alias and the
empty-expert ``continue`` it consumes; :func:`bool_form` first turns a boolean-mask loop
(``M = F == V``, ``if M.any():``) into that form. :func:`accumulation` classifies each body
statement. Every refusal raises :class:`LoopRefused` with the reason the agent logs.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from kernelarc.proposers.rewrite.loops import row_of, where_arg


class LoopRefused(Exception):
    """This loop does not match; the message says why (kept for the agent's log)."""


class BodyTransformer(ast.NodeTransformer):
    """Base of the loop-body rewriters for ``vmap``: a name in ``forbidden`` (the loop's own
    index variables, used only in the forms a rewriter matched) refuses the loop."""

    def __init__(self, forbidden: set[str], locals_: set[str]) -> None:
        self.forbidden, self.locals = forbidden, locals_

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.forbidden:
            raise LoopRefused(f"line {node.lineno}: {node.id!r} used other than as matched")
        return node


@dataclass
class Plan:
    var: str
    """The expert index name (the loop variable, or ``U`` of ``U = V.item()``)."""
    mask: str
    rows: list[str]
    loop_var: str
    count: ast.expr | None = None
    """``n`` of ``range(n)``; None for a loop over a tensor of experts (``hit``)."""
    hit: str | None = None
    squeeze: bool = False
    where: int = 0
    skip: set[int] = field(default_factory=set)
    """Body statements the rewrite consumes: the index conversion, alias, where, continue."""
    slices: dict[str, str] = field(default_factory=dict)
    """``Y`` of every ``Y[V]`` → the body's parameter name for its per-expert slice."""
    accs: list[tuple[str, ast.stmt]] = field(default_factory=list)
    outputs: int = 0
    """How many tensors the batched body returns (two per ``A[V] += L @ R``, else one)."""
    eq_of: str | None = None
    """``F`` of a boolean-mask loop (``M = (F == V)``): rows are disjoint across experts."""


def names(node: ast.AST, ctx: type) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def row_index(node: ast.expr, rows: list[str], *, target: bool) -> list[str] | None:
    """The row names of a gather (or accumulation) index, None when it is not one."""
    elts = node.elts if isinstance(node, ast.Tuple) else [node]
    picked: list[str] = []
    tail = False
    for e in elts:
        if isinstance(e, ast.Name) and e.id in rows and not tail:
            picked.append(e.id)
        elif (
            not target
            and picked
            and (
                (isinstance(e, ast.Constant) and e.value is None)
                or (isinstance(e, ast.Slice) and e.lower is e.upper is e.step is None)
            )
        ):
            tail = True
        else:
            return None
    if not picked or len(set(picked)) != len(picked):
        return None
    if target and sorted(picked) != sorted(rows):
        return None
    return picked


def index_of(stmt: ast.stmt, var: str) -> str | None:
    """``U`` when ``stmt`` is ``U = var.item()`` or ``U = int(var)``."""
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and isinstance(call := stmt.value, ast.Call)
        and not call.keywords
    ):
        return None
    f = call.func
    item = (
        isinstance(f, ast.Attribute)
        and f.attr == "item"
        and not call.args
        and isinstance(f.value, ast.Name)
        and f.value.id == var
    )
    cast = (
        isinstance(f, ast.Name)
        and f.id == "int"
        and len(call.args) == 1
        and isinstance(a := call.args[0], ast.Name)
        and a.id == var
    )
    return stmt.targets[0].id if item or cast else None


def bool_form(loop: ast.For, eq: str) -> tuple[ast.For, str] | None:
    """``loop`` in the where form when its body selects rows with a boolean mask
    ``M = (F == V)``: ``(r,) = torch.where(eq[V])`` and ``if r.numel() == 0: continue``
    stand for ``M`` (and an ``if M.any():`` around the rest of the body); ``X[M]`` becomes
    ``X[r]``. ``eq`` names the ``[n, *F.shape]`` mask built before the loop. Returns the new
    loop and ``F``, or None when the body has no such mask or uses ``M`` otherwise."""
    if not isinstance(loop.target, ast.Name):
        return None
    var, j = loop.target.id, -1
    for i, st in enumerate(loop.body):
        if not (
            isinstance(st, ast.Assign)
            and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Name)
            and isinstance(cmp := st.value, ast.Compare)
            and len(cmp.ops) == 1
            and isinstance(cmp.ops[0], ast.Eq)
        ):
            continue
        sides = [cmp.left, cmp.comparators[0]]
        ids = [x.id for x in sides if isinstance(x, ast.Name)]
        if len(ids) == 2 and var in ids and ids[0] != ids[1]:
            j, mask, f = i, st.targets[0].id, ids[1 - ids.index(var)]
            break
    if j < 0:
        return None
    new = copy.deepcopy(loop)
    rest = new.body[j + 1 :]
    guard = rest[0] if rest else None
    if (
        isinstance(guard, ast.If)
        and len(rest) == 1
        and not guard.orelse
        and isinstance(call := guard.test, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "any"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == mask
        and not call.args
        and not call.keywords
    ):
        rest = guard.body  # ``if M.any():`` around the rest: the empty check below
    row = "_ka_row"
    head = ast.parse(
        f"({row},) = torch.where({eq}[{var}])\nif {row}.numel() == 0:\n    continue"
    ).body

    class _Rows(ast.NodeTransformer):
        def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
            self.generic_visit(node)
            if isinstance(node.slice, ast.Name) and node.slice.id == mask:
                node.slice = ast.Name(row, ast.Load())
            return node

    rest = [_Rows().visit(st) for st in rest]
    new.body = [*new.body[:j], *head, *rest]
    if mask in set().union(*(names(st, ast.Load) for st in new.body)) or row in names(
        loop, ast.Load
    ):
        return None
    return new, f


def read_header(loop: ast.For) -> Plan:
    if loop.orelse or not isinstance(loop.target, ast.Name) or not loop.body:
        raise LoopRefused("not a `for V in range(n)` or `for V in hit` loop")
    var, body = loop.target.id, loop.body
    it = loop.iter
    plan = Plan(var, "", [], loop_var=var)
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "range"
        and len(it.args) == 1
        and not it.keywords
    ):
        plan.count = it.args[0]
    elif isinstance(it, ast.Name) and (index := index_of(body[0], var)) is not None:
        plan.hit, plan.var = it.id, index  # ``for e in hit: i = e.item()``
        plan.skip.add(0)
    else:
        raise LoopRefused("not a `for V in range(n)` loop, nor `for V in hit: U = V.item()`")
    w = next(
        (
            i
            for i, st in enumerate(body)
            if isinstance(st, ast.Assign)
            and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Tuple)
            and all(isinstance(t, ast.Name) for t in st.targets[0].elts)
            and isinstance(st.value, ast.Call)
            and where_arg(st.value) is not None
        ),
        None,
    )
    if w is None:
        raise LoopRefused("no `r1, r2 = torch.where(...)` in the body")
    where = body[w]
    assert isinstance(where, ast.Assign) and isinstance(where.value, ast.Call)
    arg = where_arg(where.value)
    assert arg is not None
    if (
        isinstance(arg, ast.Call)
        and isinstance(arg.func, ast.Attribute)
        and arg.func.attr == "squeeze"
        and len(arg.args) == 1
        and not arg.keywords
        and isinstance(arg.args[0], ast.Constant)
        and arg.args[0].value == 0
    ):
        arg, plan.squeeze = arg.func.value, True  # a no-op on ``X[U]`` unless X.shape[1] == 1
    if (mask := row_of(arg, plan.var)) is None and isinstance(arg, ast.Name):
        for j, st in enumerate(body[:w]):
            if (
                isinstance(st, ast.Assign)
                and len(st.targets) == 1
                and isinstance(st.targets[0], ast.Name)
                and st.targets[0].id == arg.id
                and (mask := row_of(st.value, plan.var)) is not None
            ):
                plan.skip.add(j)  # the alias ``M = X[U]``
                break
    if mask is None:
        raise LoopRefused("torch.where's argument is not `mask[V]`")
    plan.mask = mask
    targets = where.targets[0]
    assert isinstance(targets, ast.Tuple)
    plan.rows = [t.id for t in targets.elts if isinstance(t, ast.Name)]
    if len(set(plan.rows)) != len(plan.rows):
        raise LoopRefused("repeated row names")
    plan.where = w
    plan.skip.add(w)
    if w + 1 < len(body) and empty_check(body[w + 1], plan.rows):
        plan.skip.add(w + 1)
    return plan


def empty_check(stmt: ast.stmt, rows: list[str]) -> bool:
    if not (
        isinstance(stmt, ast.If)
        and not stmt.orelse
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], ast.Continue)
        and isinstance(stmt.test, ast.Compare)
        and len(stmt.test.ops) == 1
        and isinstance(stmt.test.ops[0], ast.Eq)
        and isinstance(c := stmt.test.comparators[0], ast.Constant)
        and c.value == 0
    ):
        return False
    left = stmt.test.left
    if not isinstance(left, ast.Call) or left.keywords:
        return False
    if isinstance(left.func, ast.Attribute) and left.func.attr == "numel" and not left.args:
        return isinstance(left.func.value, ast.Name) and left.func.value.id in rows
    return (
        isinstance(left.func, ast.Name)
        and left.func.id == "len"
        and len(left.args) == 1
        and isinstance(left.args[0], ast.Name)
        and left.args[0].id in rows
    )


def accumulation(stmt: ast.stmt, plan: Plan) -> tuple[str, str, ast.expr] | None:
    """``(kind, A, e)`` of an accumulation statement, None for an assignment."""
    if isinstance(stmt, ast.AugAssign):
        t = stmt.target
        if not (isinstance(stmt.op, ast.Add) and isinstance(t, ast.Subscript)):
            raise LoopRefused(
                f"line {stmt.lineno}: an augmented assignment that is not `A[...] +=`"
            )
        if not isinstance(t.value, ast.Name):
            raise LoopRefused(f"line {stmt.lineno}: accumulation into an expression")
        if isinstance(t.slice, ast.Name) and t.slice.id == plan.var:
            return "expert", t.value.id, stmt.value
        if row_index(t.slice, plan.rows, target=True) is not None:
            return "pairs", t.value.id, stmt.value
        raise LoopRefused(f"line {stmt.lineno}: `A[...] +=` indexed by neither V nor all rows")
    if isinstance(stmt, ast.Expr) and isinstance(call := stmt.value, ast.Call):
        f = call.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "index_add_"
            and isinstance(f.value, ast.Name)
            and len(call.args) == 3
            and not call.keywords
            and isinstance(call.args[0], ast.Constant)
            and call.args[0].value == 0
            and isinstance(call.args[1], ast.Name)
            and call.args[1].id in plan.rows
        ):
            return f"index:{call.args[1].id}", f.value.id, call.args[2]
        raise LoopRefused(
            f"line {stmt.lineno}: a call statement other than `A.index_add_(0, r, e)`"
        )
    if (
        plan.eq_of is not None
        and isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(sub := stmt.targets[0], ast.Subscript)
        and isinstance(sub.value, ast.Name)
        and isinstance(sub.slice, ast.Name)
        and sub.slice.id in plan.rows
    ):
        return f"set:{sub.slice.id}", sub.value.id, stmt.value  # disjoint rows: order-free
    if isinstance(stmt, ast.Assign) and all(
        isinstance(t, ast.Name)
        or (isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts))
        for t in stmt.targets
    ):
        return None
    raise LoopRefused(f"line {stmt.lineno}: {type(stmt).__name__} statements are not batched")


__all__ = [
    "BodyTransformer",
    "Plan",
    "LoopRefused",
    "accumulation",
    "bool_form",
    "names",
    "read_header",
    "row_index",
]
