"""Source rewrite of an expert loop into one batched (grouped) pass over all experts.

A MoE reference loops over its experts: ``rows = torch.where(mask[e])`` picks the tokens
of expert ``e``, the body gathers them, multiplies them by ``W[e]`` and accumulates the
result. Every expert costs the host a device wait and a dozen launches of small GEMMs.
:func:`group_loops` replaces such a loop by one call of the body under
``torch.func.vmap`` over the experts: each expert's rows are padded to the largest
expert's count, ``W[e]`` becomes a batch of all ``W``, and the GEMMs become batched GEMMs
(one launch for all experts). The per-expert accumulations are applied once, after it.

Matched, in ``entry`` (top level or nested blocks), a ``for V in range(n)`` loop whose body
is, in this order:

1. optionally ``M = X[V]``, then ``r1, r2, ... = torch.where(M)`` (or ``X[V]``, or
   ``torch.nonzero(..., as_tuple=True)``), ``X`` a plain name;
2. optionally ``if r.numel() == 0: continue`` (or ``len(r) == 0``);
3. assignments to plain names (the body's locals); every read of ``r1, r2, ...`` is a
   gather ``Y[ri, rj, ...]`` whose index is row names then ``None``/``:``; every read of
   ``V`` is ``Y[V]``;
4. accumulations: ``A[V] += e``, ``A[ri, rj, ...] += e`` (all row names, any order: the
   pairs are unique), ``A.index_add_(0, ri, e)``; ``A`` is read nowhere else in the body.

Refused (the loop is left as it is): anything else in the body (another statement kind, a
``continue`` or ``break`` elsewhere, a local read before it is assigned or read after the
loop, ``X`` or ``V`` used another way). At run time the original loop runs instead when
``X`` is not a tensor of at least two dimensions with ``n`` rows or more, when no expert has
rows, or when padding would more than double the rows (one expert takes most tokens).

Not exact in two ways, which the guard's tolerance check judges: batched GEMMs round
differently from per-expert ones, and padding rows are gathered as zeros, so an
``A[V] += e`` that sums over rows is right only when the body maps zero rows to zero
contributions (true for linear layers, SwiGLU MLPs and their backward passes, not for a
bias or ``exp``). Data-dependent Python control flow in the body fails under ``vmap``,
and the candidate with it. Not covered: loops over anything but ``range``, masks computed
in the loop (``idx == e``), bodies that call ``.item()``, nested expert loops.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from kernelarc.proposers.rewrite.loops import LoopRewriteError, _row_of, _where_arg

HELPER = "_KaGroups"
RUNTIME = f'''
import torch


class {HELPER}:
    """The rows of ``torch.where(x[e])`` for every ``e < n`` (``n`` None: all of ``x``),
    padded to one length: ``rows`` (one ``[n, m]`` index tensor per column), ``valid``
    (``[n, m]``); ``ok`` is False when the loop should run as written: also when ``hit``
    (the tensor a loop runs over) is not exactly the experts that have rows, in order
    (kernelarc's grouped-expert rewrite)."""

    def __init__(self, x, n, hit=None, squeeze=False, waste=2.0):
        self.ok = False
        if not (isinstance(x, torch.Tensor) and x.dim() >= 2 + squeeze):
            return
        if squeeze and x.shape[1] == 1:  # x[e].squeeze(0) would drop a dimension
            return
        n = x.shape[0] if n is None else n
        if type(n) is not int or not 0 < n <= x.shape[0]:
            return
        nz = torch.nonzero(x[:n])
        counts = torch.bincount(nz[:, 0], minlength=n)
        if hit is not None:  # the loop runs over exactly the experts that have rows
            if not isinstance(hit, torch.Tensor) or hit.is_floating_point():
                return
            want = torch.nonzero(counts).flatten()
            got = hit.flatten().to(want.device, want.dtype)
            if got.shape != want.shape or not torch.equal(got, want):
                return
        m = int(counts.max()) if nz.shape[0] else 0
        if m == 0 or n * m > waste * nz.shape[0] + n:
            return
        group = nz[:, 0]
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(nz.shape[0], device=nz.device) - starts[group]
        self.sel = (group, pos)
        self.cols = [nz[:, d] for d in range(1, x.dim())]
        self.valid = torch.zeros(n, m, dtype=torch.bool, device=nz.device)
        self.valid[self.sel] = True
        self.rows = tuple(
            torch.zeros(n, m, dtype=nz.dtype, device=nz.device).index_put_(self.sel, c)
            for c in self.cols
        )
        self.n = n
        self.ok = True

    @staticmethod
    def zero(g, valid):
        """``g`` (rows first) with the padding rows set to zero (inside ``vmap``)."""
        v = valid.reshape(valid.shape + (1,) * (g.dim() - valid.dim()))
        return torch.where(v, g, torch.zeros((), dtype=g.dtype, device=g.device))

    def kept(self, out):
        """The real rows of a batched per-row result, in ``torch.where`` order."""
        return out[self.sel]

    def add_rows(self, a, out):
        """``a[e] += out[e]`` for every expert ``e``."""
        part = a[: self.n]
        lead = part.dim() - out.dim()
        if lead < 0:
            raise RuntimeError("grouped rewrite: a per-expert result has more dims than its target")
        part += out.reshape(out.shape[:1] + (1,) * lead + out.shape[1:])

    def addmm_rows(self, a, left, right):
        """``a[e] += left[e] @ right[e]`` for every expert ``e``: one batched GEMM that adds
        into ``a`` when the shapes and dtypes allow it, else the product then ``add_rows``."""
        part = a[: self.n]
        fused = part.dim() == left.dim() == right.dim() == 3
        if fused and part.dtype == left.dtype == right.dtype and part.is_floating_point():
            part.baddbmm_(left, right)
        else:
            self.add_rows(a, torch.matmul(left, right))
'''


class _Refused(Exception):
    """This loop does not match; the message says why (kept for the agent's log)."""


@dataclass
class _Plan:
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


def _names(node: ast.AST, ctx: type) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _row_index(node: ast.expr, rows: list[str], *, target: bool) -> list[str] | None:
    """The row names of a gather (or accumulation) index, None when it is not one."""
    elts = node.elts if isinstance(node, ast.Tuple) else [node]
    names: list[str] = []
    tail = False
    for e in elts:
        if isinstance(e, ast.Name) and e.id in rows and not tail:
            names.append(e.id)
        elif (
            not target
            and names
            and (
                (isinstance(e, ast.Constant) and e.value is None)
                or (isinstance(e, ast.Slice) and e.lower is e.upper is e.step is None)
            )
        ):
            tail = True
        else:
            return None
    if not names or len(set(names)) != len(names):
        return None
    if target and sorted(names) != sorted(rows):
        return None
    return names


def _index_of(stmt: ast.stmt, var: str) -> str | None:
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


def _header(loop: ast.For) -> _Plan:
    if loop.orelse or not isinstance(loop.target, ast.Name) or not loop.body:
        raise _Refused("not a `for V in range(n)` or `for V in hit` loop")
    var, body = loop.target.id, loop.body
    it = loop.iter
    plan = _Plan(var, "", [], loop_var=var)
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "range"
        and len(it.args) == 1
        and not it.keywords
    ):
        plan.count = it.args[0]
    elif isinstance(it, ast.Name) and (index := _index_of(body[0], var)) is not None:
        plan.hit, plan.var = it.id, index  # ``for e in hit: i = e.item()``
        plan.skip.add(0)
    else:
        raise _Refused("not a `for V in range(n)` loop, nor `for V in hit: U = V.item()`")
    w = next(
        (
            i
            for i, st in enumerate(body)
            if isinstance(st, ast.Assign)
            and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Tuple)
            and all(isinstance(t, ast.Name) for t in st.targets[0].elts)
            and isinstance(st.value, ast.Call)
            and _where_arg(st.value) is not None
        ),
        None,
    )
    if w is None:
        raise _Refused("no `r1, r2 = torch.where(...)` in the body")
    where = body[w]
    assert isinstance(where, ast.Assign) and isinstance(where.value, ast.Call)
    arg = _where_arg(where.value)
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
    if (mask := _row_of(arg, plan.var)) is None and isinstance(arg, ast.Name):
        for j, st in enumerate(body[:w]):
            if (
                isinstance(st, ast.Assign)
                and len(st.targets) == 1
                and isinstance(st.targets[0], ast.Name)
                and st.targets[0].id == arg.id
                and (mask := _row_of(st.value, plan.var)) is not None
            ):
                plan.skip.add(j)  # the alias ``M = X[U]``
                break
    if mask is None:
        raise _Refused("torch.where's argument is not `mask[V]`")
    plan.mask = mask
    targets = where.targets[0]
    assert isinstance(targets, ast.Tuple)
    plan.rows = [t.id for t in targets.elts if isinstance(t, ast.Name)]
    if len(set(plan.rows)) != len(plan.rows):
        raise _Refused("repeated row names")
    plan.where = w
    plan.skip.add(w)
    if w + 1 < len(body) and _empty_check(body[w + 1], plan.rows):
        plan.skip.add(w + 1)
    return plan


def _empty_check(stmt: ast.stmt, rows: list[str]) -> bool:
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


def _accumulation(stmt: ast.stmt, plan: _Plan) -> tuple[str, str, ast.expr] | None:
    """``(kind, A, e)`` of an accumulation statement, None for an assignment."""
    if isinstance(stmt, ast.AugAssign):
        t = stmt.target
        if not (isinstance(stmt.op, ast.Add) and isinstance(t, ast.Subscript)):
            raise _Refused(f"line {stmt.lineno}: an augmented assignment that is not `A[...] +=`")
        if not isinstance(t.value, ast.Name):
            raise _Refused(f"line {stmt.lineno}: accumulation into an expression")
        if isinstance(t.slice, ast.Name) and t.slice.id == plan.var:
            return "expert", t.value.id, stmt.value
        if _row_index(t.slice, plan.rows, target=True) is not None:
            return "pairs", t.value.id, stmt.value
        raise _Refused(f"line {stmt.lineno}: `A[...] +=` indexed by neither V nor all rows")
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
        raise _Refused(f"line {stmt.lineno}: a call statement other than `A.index_add_(0, r, e)`")
    if isinstance(stmt, ast.Assign) and all(
        isinstance(t, ast.Name)
        or (isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts))
        for t in stmt.targets
    ):
        return None
    raise _Refused(f"line {stmt.lineno}: {type(stmt).__name__} statements are not batched")


class _Body(ast.NodeTransformer):
    """One body expression for ``vmap``: ``Y[V]`` → the slice parameter, gathers masked."""

    def __init__(self, plan: _Plan, forbidden: set[str], locals_: set[str]) -> None:
        self.plan = plan
        self.forbidden = forbidden
        self.locals = locals_

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        plan = self.plan
        if isinstance(node.slice, ast.Name) and node.slice.id == plan.var:
            if not isinstance(node.value, ast.Name) or node.value.id in self.locals:
                raise _Refused(f"line {node.lineno}: `[V]` on a body local or an expression")
            if isinstance(node.ctx, ast.Store):
                raise _Refused(f"line {node.lineno}: a write to `Y[V]`")
            y = node.value.id
            param = plan.slices.setdefault(y, f"_ka_slice_{len(plan.slices)}_{y}")
            return ast.Name(param, ast.Load())
        if _row_index(node.slice, plan.rows, target=False) is not None:
            node.value = self.visit(node.value)
            return ast.Call(
                ast.Attribute(ast.Name(HELPER, ast.Load()), "zero", ast.Load()),
                [node, ast.Name("_ka_valid", ast.Load())],
                [],
            )
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.forbidden:
            raise _Refused(f"line {node.lineno}: {node.id!r} used other than as matched")
        return node


def _count_loads(node: ast.AST) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            counts[n.id] = counts.get(n.id, 0) + 1
    return counts


def _grouped(loop: ast.For, fn: ast.AST, k: int) -> list[ast.stmt]:
    """The statements that replace ``loop`` (its own index ``k`` names the helpers)."""
    plan = _header(loop)
    kept = [(i, st) for i, st in enumerate(loop.body) if i not in plan.skip]
    header = set().union(*(_names(loop.body[i], ast.Store) for i in plan.skip))
    locals_ = set().union(*(_names(st, ast.Store) for _, st in kept))
    alias = {plan.mask, plan.loop_var} | (header - set(plan.rows) - {plan.var})
    if locals_ & (header | alias):
        raise _Refused("the loop assigns its mask, its variable or its rows again")
    in_fn, in_loop = _count_loads(fn), _count_loads(loop)
    for name in locals_ | header | {plan.loop_var}:
        if in_fn.get(name, 0) > in_loop.get(name, 0):
            raise _Refused(f"{name!r} is read after the loop")
    forbidden = {plan.var, *plan.rows, *alias}
    new_body: list[ast.stmt] = []
    assigned: set[str] = set()
    targets: dict[str, int] = {}
    for i, stmt in kept:
        if i > plan.where:
            assigned |= set(plan.rows)
        acc = _accumulation(stmt, plan)
        value = getattr(stmt, "value", None) if acc is None else acc[2]
        assert isinstance(value, ast.expr)
        early = (_names(value, ast.Load) & (locals_ | set(plan.rows))) - assigned
        if early:
            raise _Refused(f"line {stmt.lineno}: {sorted(early)} read before it is assigned")
        value = _Body(plan, forbidden, locals_).visit(copy.deepcopy(value))
        if acc is None:
            assert isinstance(stmt, ast.Assign)
            new_body.append(
                ast.Assign(targets=copy.deepcopy(stmt.targets), value=value, lineno=stmt.lineno)
            )
            assigned |= _names(stmt, ast.Store)
            continue
        kind, a, _ = acc
        if a in locals_ or a in forbidden:
            raise _Refused(f"line {stmt.lineno}: accumulation into a body local {a!r}")
        targets[a] = targets.get(a, 0) + 1
        parts = [value]
        if kind == "expert" and isinstance(value, ast.BinOp) and isinstance(value.op, ast.MatMult):
            kind, parts = "expert-mm", [value.left, value.right]  # one baddbmm_ into A
        for part in parts:
            tmp = f"_ka_acc_{plan.outputs}"
            plan.outputs += 1
            new_body.append(
                ast.Assign(targets=[ast.Name(tmp, ast.Store())], value=part, lineno=stmt.lineno)
            )
        plan.accs.append((kind, stmt))
    if not plan.accs:
        raise _Refused("the loop accumulates nothing")
    for a, n in targets.items():
        if in_loop.get(a, 0) != n:
            raise _Refused(f"{a!r} is read in the loop besides its accumulations")
    return _emit(loop, plan, new_body, k)


def _emit(loop: ast.For, plan: _Plan, new_body: list[ast.stmt], k: int) -> list[ast.stmt]:
    n, g, out, fn = f"_ka_n{k}", f"_ka_g{k}", f"_ka_out{k}", f"_ka_body{k}"
    rows = ", ".join(plan.rows) + ("," if len(plan.rows) == 1 else "")
    params = ", ".join(["_ka_rows", "_ka_valid", *plan.slices.values()])
    rets = ", ".join(f"_ka_acc_{i}" for i in range(plan.outputs)) + ","
    args = ", ".join([f"{g}.rows", f"{g}.valid", *(f"{y}[:{g}.n]" for y in plan.slices)])
    if plan.count is not None:
        head = [f"{n} = {ast.unparse(plan.count)}", f"{g} = {HELPER}({plan.mask}, {n}"]
        again = f"range({n})"
    else:
        head = [f"{g} = {HELPER}({plan.mask}, None, hit={plan.hit}"]
        again = str(plan.hit)
    head[-1] += ", squeeze=True)" if plan.squeeze else ")"
    apply: list[str] = []
    i = 0
    for kind, stmt in plan.accs:
        if kind == "expert-mm":
            assert isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Subscript)
            a = ast.unparse(stmt.target.value)
            apply.append(f"{g}.addmm_rows({a}, {out}[{i}], {out}[{i + 1}])")
            i += 2
            continue
        if kind == "expert":
            assert isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Subscript)
            apply.append(f"{g}.add_rows({ast.unparse(stmt.target.value)}, {out}[{i}])")
        elif kind == "pairs":
            assert isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Subscript)
            names = _row_index(stmt.target.slice, plan.rows, target=True) or []
            cols = ", ".join(f"{g}.cols[{plan.rows.index(r)}]" for r in names) + ","
            a = ast.unparse(stmt.target.value)
            apply.append(f"{a}.index_put_(({cols}), {g}.kept({out}[{i}]), accumulate=True)")
        else:
            assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            col = plan.rows.index(kind.split(":", 1)[1])
            a = ast.unparse(stmt.value.func.value)  # type: ignore[attr-defined]
            apply.append(f"{a}.index_add_(0, {g}.cols[{col}], {g}.kept({out}[{i}]))")
        i += 1
    text = "\n".join(
        [
            *head,
            f"if {g}.ok:",
            f"    def {fn}({params}):",
            f"        {rows} = _ka_rows",
            "        pass",
            f"        return ({rets})",
            f"    {out} = torch.func.vmap({fn})({args})",
            *(f"    {line}" for line in apply),
            "else:",
            f"    for {plan.loop_var} in {again}:",
            "        pass",
        ]
    )
    stmts = ast.parse(text).body
    branch = stmts[-1]
    assert isinstance(branch, ast.If)
    body_fn = branch.body[0]
    fallback = branch.orelse[0]
    assert isinstance(body_fn, ast.FunctionDef) and isinstance(fallback, ast.For)
    body_fn.body[1:2] = new_body
    fallback.body = loop.body
    for s in stmts:
        ast.copy_location(s, loop)
    return stmts


class _Grouper:
    def __init__(self, fn: ast.AST) -> None:
        self.fn = fn
        self.count = 0
        self.refusals: list[str] = []

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in stmts:
            if isinstance(stmt, ast.For):
                try:
                    out.extend(_grouped(stmt, self.fn, self.count + 1))
                    self.count += 1
                    continue
                except _Refused as e:
                    self.refusals.append(f"loop line {stmt.lineno}: {e}")
            for attr in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, attr, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    setattr(stmt, attr, self.block(inner))
            for handler in getattr(stmt, "handlers", []):
                handler.body = self.block(handler.body)
            out.append(stmt)
        return out


def group_loops(source: str, entry: str = "run") -> tuple[str, int, list[str]]:
    """``source`` with ``entry``'s matching expert loops batched over the experts, how many
    loops were rewritten (0: the source comes back unchanged) and why each other ``for``
    loop was refused."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise LoopRewriteError(f"reference: syntax error line {e.lineno}: {e.msg}") from e
    index = next(
        (
            i
            for i, s in enumerate(tree.body)
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == entry
        ),
        None,
    )
    if index is None:
        raise LoopRewriteError(f"reference: no top-level function {entry!r}")
    fn = tree.body[index]
    assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
    grouper = _Grouper(fn)
    fn.body = grouper.block(fn.body)
    if not grouper.count:
        return source, 0, grouper.refusals
    tree.body[index:index] = ast.parse(RUNTIME).body
    ast.fix_missing_locations(tree)
    text = ast.unparse(tree)
    compile(text, "solution.py", "exec")  # a syntax error here is a bug: fail loudly
    return text + "\n", grouper.count, grouper.refusals


__all__ = ["HELPER", "RUNTIME", "group_loops"]
