"""Source rewrite of data-dependent loops: one device wait for all of a loop's ``torch.where``.

A MoE reference loops over its experts and asks, in every iteration, which (token, slot)
pairs go to expert ``i``: ``torch.where(mask[i])``. The answer's length is data, so every
iteration makes the host wait for the device, and the device idles while the host launches
the next expert's kernels. :func:`hoist_wheres` computes the answers of all iterations
before the loop, with one ``torch.nonzero`` of the whole ``mask`` and one device-to-host
copy of the per-row counts (:data:`RUNTIME`); each iteration takes its slices. Exact:
``nonzero`` lists indices in row-major order, so the rows whose first index is ``i`` are
those of ``where(mask[i])``, in the same order: the slices are bit-identical.

Matched, in the body of a ``for V in range(...)`` loop anywhere in ``run``:
``torch.where(X[V])`` and ``torch.nonzero(X[V], as_tuple=True)``, directly or on a name
``M`` bound once, at the top of the loop body, by ``M = X[V]`` before the call; ``X`` a
plain name. Refused (the loop is left as it is): a loop that assigns ``X``, ``V`` or (more
than once) ``M``, or that uses ``X`` or ``M`` in any other way (a write, an in-place
method, an argument to a call: any of these could change ``X`` between iterations). At run
time an ``X`` that is not a tensor of at least two dimensions, or a non-int index, falls
back to ``torch.where``.

Not covered: masks computed inside the loop (``idx == e``, ``.any()``, boolean-mask
indexing), other waits in the body (``.item()``, ``int(t)``, ``if t.sum() > 0``), writes
to ``X``'s storage through another name (the guard's correctness rounds are the check
there). Grouping the expert loop's GEMMs into batched GEMMs is :mod:`.grouped`'s work.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

HELPER = "_KaRowsOf"
RUNTIME = f'''
import torch


class {HELPER}:
    """``torch.where(x[i])`` for every ``i`` of ``x``'s first dimension, computed with one
    device wait (kernelarc's loop rewrite: one nonzero, slices per row)."""

    def __init__(self, x):
        self.x = x
        self.cols = None
        if isinstance(x, torch.Tensor) and x.dim() >= 2:
            nz = torch.nonzero(x)
            self.cols = [nz[:, d].contiguous() for d in range(1, x.dim())]
            counts = torch.bincount(nz[:, 0], minlength=x.shape[0])
            self.starts = [0] + torch.cumsum(counts, 0).tolist()

    def __call__(self, i):
        if self.cols is None or type(i) is not int or not -len(self.x) <= i < len(self.x):
            return torch.where(self.x[i])
        n = self.x.shape[0]
        i = i % n
        a, b = self.starts[i], self.starts[i + 1]
        return tuple(c[a:b] for c in self.cols)
'''


class LoopRewriteError(Exception):
    """The source cannot be parsed or has no entry function."""


@dataclass
class _Loop:
    """The matches of one ``for V in range(...)`` loop, by mask name ``X``."""

    var: str
    calls: dict[str, list[ast.Call]] = field(default_factory=dict)
    uses: dict[str, int] = field(default_factory=dict)
    """Loads of each ``X`` (and alias ``M``) that belong to a matched pattern."""
    aliases: dict[str, str] = field(default_factory=dict)
    """``M`` → ``X`` for ``M = X[V]`` at the top of the body."""


def _load(name: str) -> ast.Name:
    return ast.Name(name, ast.Load())


def _is_torch(func: ast.expr, name: str) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr == name
        and isinstance(func.value, ast.Name)
        and func.value.id == "torch"
    )


def row_of(node: ast.expr, var: str) -> str | None:
    """``X`` when ``node`` is ``X[var]`` with ``X`` a plain name."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and isinstance(node.slice, ast.Name)
        and node.slice.id == var
    ):
        return node.value.id
    return None


def where_arg(call: ast.Call) -> ast.expr | None:
    """The mask argument of ``torch.where(m)`` / ``torch.nonzero(m, as_tuple=True)``."""
    if len(call.args) != 1 or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    if _is_torch(call.func, "where") and not call.keywords:
        return call.args[0]
    if _is_torch(call.func, "nonzero") and len(call.keywords) == 1:
        kw = call.keywords[0]
        if kw.arg == "as_tuple" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
            return call.args[0]
    return None


def _stores(body: list[ast.stmt]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                counts[n.id] = counts.get(n.id, 0) + 1
    return counts


def load_counts(body: list[ast.stmt]) -> dict[str, int]:
    """How many times each name is read in ``body``."""
    counts: dict[str, int] = {}
    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                counts[n.id] = counts.get(n.id, 0) + 1
    return counts


def _match(loop: ast.For) -> _Loop | None:
    if not (
        isinstance(loop.target, ast.Name)
        and isinstance(loop.iter, ast.Call)
        and isinstance(loop.iter.func, ast.Name)
        and loop.iter.func.id == "range"
    ):
        return None
    found = _Loop(loop.target.id)
    stores = _stores(loop.body)
    if stores.get(found.var):
        return None
    for stmt in loop.body:  # aliases: ``M = X[V]`` at the top of the body
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and (x := row_of(stmt.value, found.var)) is not None
            and stores.get(stmt.targets[0].id) == 1
        ):
            found.aliases[stmt.targets[0].id] = x
    seen_alias: set[str] = set()
    for stmt in loop.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            if stmt.targets[0].id in found.aliases:
                seen_alias.add(stmt.targets[0].id)
        for n in ast.walk(stmt):
            if not isinstance(n, ast.Call) or (arg := where_arg(n)) is None:
                continue
            if (x := row_of(arg, found.var)) is not None:
                found.calls.setdefault(x, []).append(n)
                found.uses[x] = found.uses.get(x, 0) + 1
            elif isinstance(arg, ast.Name) and arg.id in seen_alias:
                x = found.aliases[arg.id]
                found.calls.setdefault(x, []).append(n)
                found.uses[arg.id] = found.uses.get(arg.id, 0) + 1
    for x in found.aliases.values():
        found.uses[x] = found.uses.get(x, 0) + 1  # the alias's own ``X[V]``
    loads = load_counts(loop.body)
    for x in list(found.calls):
        names = [x, *(m for m, mx in found.aliases.items() if mx == x)]
        # X must not be written in the loop, and X and its aliases used only as matched
        if stores.get(x) or any(loads.get(n, 0) != found.uses.get(n, 0) for n in names):
            del found.calls[x]
    return found if found.calls else None


def nested_blocks(stmt: ast.stmt, block: Callable[[list[ast.stmt]], list[ast.stmt]]) -> None:
    """Replace each statement list inside ``stmt`` (bodies, else and finally branches,
    exception handlers) by ``block`` of it."""
    for attr in ("body", "orelse", "finalbody"):
        inner = getattr(stmt, attr, None)
        if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
            setattr(stmt, attr, block(inner))
    for handler in getattr(stmt, "handlers", []):
        handler.body = block(handler.body)


class _Hoister:
    def __init__(self) -> None:
        self.count = 0
        self.helpers = 0

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in stmts:
            nested_blocks(stmt, self.block)
            if isinstance(stmt, ast.For) and (found := _match(stmt)) is not None:
                for x, calls in found.calls.items():
                    self.helpers += 1
                    helper = f"_ka_rows_{self.helpers}_{x}"
                    out.append(
                        ast.Assign(
                            targets=[ast.Name(helper, ast.Store())],
                            value=ast.Call(ast.Name(HELPER, ast.Load()), [_load(x)], []),
                            lineno=stmt.lineno,
                        )
                    )
                    for call in calls:
                        call.func = ast.Name(helper, ast.Load())
                        call.args = [ast.Name(found.var, ast.Load())]
                        call.keywords = []
                        self.count += 1
            out.append(stmt)
        return out


def parse_entry(source: str, entry: str) -> tuple[ast.Module, int]:
    """The parsed ``source`` and the index of ``entry``'s top-level function in its body."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise LoopRewriteError(f"reference: syntax error line {e.lineno}: {e.msg}") from e
    for i, s in enumerate(tree.body):
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == entry:
            return tree, i
    raise LoopRewriteError(f"reference: no top-level function {entry!r}")


def with_runtime(tree: ast.Module, index: int, runtime: str) -> str:
    """``tree``'s source with ``runtime`` inserted before the entry function (at ``index``)."""
    tree.body[index:index] = ast.parse(runtime).body
    ast.fix_missing_locations(tree)
    text = ast.unparse(tree)
    compile(text, "solution.py", "exec")  # a syntax error here is a bug: fail loudly
    return text + "\n"


def vmap_or_loop(
    head: list[str],
    ok: str,
    fn: str,
    body: list[ast.stmt],
    ret: str,
    call: str,
    apply: list[str],
    loop: ast.For,
    again: str,
    prelude: str = "",
) -> list[ast.stmt]:
    """The statements that replace ``loop`` in a batched rewrite: the ``head`` lines, then
    ``if ok:`` the function ``def fn:`` (``fn``: name and parameters) whose body is
    ``prelude``, ``body`` and ``return ret``, the ``call`` line (which runs it under
    ``vmap``) and the ``apply`` lines; else ``for again:`` with ``loop``'s own body (the
    loop as written). Every statement is placed at ``loop``."""
    text = "\n".join(
        [
            *head,
            f"if {ok}:",
            f"    def {fn}:",
            *([f"        {prelude}"] if prelude else []),
            "        pass",
            f"        return {ret}",
            f"    {call}",
            *(f"    {line}" for line in apply),
            "else:",
            f"    for {again}:",
            "        pass",
        ]
    )
    stmts = ast.parse(text).body
    branch = stmts[-1]
    assert isinstance(branch, ast.If)
    body_fn, fallback = branch.body[0], branch.orelse[0]
    assert isinstance(body_fn, ast.FunctionDef) and isinstance(fallback, ast.For)
    at = 1 if prelude else 0
    body_fn.body[at : at + 1] = body
    fallback.body = loop.body
    for s in stmts:
        ast.copy_location(s, loop)
    return stmts


def hoist_wheres(source: str, entry: str = "run") -> tuple[str, int]:
    """``source`` with the matched ``torch.where`` calls of ``entry``'s loops hoisted, and
    how many calls were replaced (0: the source comes back unchanged)."""
    tree, index = parse_entry(source, entry)
    fn = tree.body[index]
    assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
    hoister = _Hoister()
    fn.body = hoister.block(fn.body)
    if not hoister.count:
        return source, 0
    return with_runtime(tree, index, RUNTIME), hoister.count


__all__ = [
    "HELPER",
    "RUNTIME",
    "LoopRewriteError",
    "hoist_wheres",
    "load_counts",
    "nested_blocks",
    "parse_entry",
    "row_of",
    "vmap_or_loop",
    "where_arg",
    "with_runtime",
]
