"""Source rewrite of an expert loop into one batched (grouped) pass over all experts.

A MoE reference loops over its experts: ``rows = torch.where(mask[e])`` picks the tokens
of expert ``e``, the body gathers them, multiplies them by ``W[e]`` and accumulates the
result. Every expert costs the host a device wait and a dozen launches of small GEMMs.
:func:`group_loops` replaces such a loop by one call of the body under
``torch.func.vmap`` over the experts: each expert's rows are padded to the largest
expert's count, ``W[e]`` becomes a batch of all ``W``, and the GEMMs become batched GEMMs
(one launch for all experts). The per-expert accumulations are applied once, after it.

Matched, in ``entry`` (top level or nested blocks; :mod:`.grouped_match`), a loop over the
experts, ``for V in range(n)`` or ``for V in hit: U = V.item()`` (``int(V)`` too; ``U`` then
stands for ``V`` below), whose body has:

1. ``r1, r2, ... = torch.where(X[V])`` (or ``torch.where(M)`` after ``M = X[V]``, or
   ``X[V].squeeze(0)``, or ``torch.nonzero(..., as_tuple=True)``), ``X`` a plain name,
   optionally followed by ``if r.numel() == 0: continue`` (or ``len(r) == 0``); or, in a
   ``range`` loop, a boolean mask ``M = F == V`` (optionally ``if M.any():`` around the
   rest), ``X[M]`` being the gathers;
2. assignments to plain names (the body's locals); every read of ``r1, r2, ...`` is a
   gather ``Y[ri, rj, ...]`` whose index is row names then ``None``/``:``; every read of
   ``V`` is ``Y[V]``;
3. accumulations: ``A[V] += e`` (one ``baddbmm_`` into ``A`` when ``e`` is ``L @ R``),
   ``A[ri, rj, ...] += e`` (all row names, any order: the pairs are unique),
   ``A.index_add_(0, ri, e)``, and with a boolean mask ``A[M] = e`` (the masks of a loop
   over ``F == V`` are disjoint); ``A`` is read nowhere else in the body.

Refused (the loop is left as it is): anything else in the body (another statement kind, a
``continue`` or ``break`` elsewhere, a local read before it is assigned or read after the
loop, ``X``, ``M`` or ``V`` used another way). At run time the original loop runs instead
when ``X`` is not a tensor of at least two dimensions with ``n`` rows or more, when no
expert has rows, when padding would more than double the rows (one expert takes most
tokens), or when ``hit`` is not exactly the experts that have rows, in order.

Not exact in two ways, which the guard's tolerance check judges: batched GEMMs round
differently from per-expert ones, and padding rows are gathered as zeros, so an
``A[V] += e`` that sums over rows is right only when the body maps zero rows to zero
contributions (true for linear layers, SwiGLU MLPs and their backward passes, not for a
bias or ``exp``). Data-dependent Python control flow in the body fails under ``vmap``,
and the candidate with it. Not covered: masks built otherwise in the loop (``.any()`` in
an expression, ``nonzero`` of a comparison), bodies that call ``.item()``, nested expert
loops, expert modules (``nn.Module`` lists). A loop this form refuses is tried in the
sorted-segment form (:mod:`.segments`: contiguous row segments of expert-sorted tokens,
``torch.cat`` of the per-expert outputs).
"""

from __future__ import annotations

import ast
import copy

from kernelarc.proposers.rewrite.grouped_match import (
    BodyTransformer,
    LoopRefused,
    Plan,
    accumulation,
    bool_form,
    names,
    read_header,
    row_index,
)
from kernelarc.proposers.rewrite.loops import (
    load_counts,
    nested_blocks,
    parse_entry,
    vmap_or_loop,
    with_runtime,
)
from kernelarc.proposers.rewrite.segments import RUNTIME as SEGMENTS_RUNTIME
from kernelarc.proposers.rewrite.segments import is_segment_loop, segment_loop

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
    def eq_mask(f, n):
        """``m[e] = (f == e)`` for every ``e < n`` (a boolean-mask loop's masks), or None."""
        if not isinstance(f, torch.Tensor) or type(n) is not int or n <= 0:
            return None
        return f.unsqueeze(0) == torch.arange(n, device=f.device).view((n,) + (1,) * f.dim())

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


class _Body(BodyTransformer):
    """One body expression for ``vmap``: ``Y[V]`` → the slice parameter, gathers masked."""

    def __init__(self, plan: Plan, forbidden: set[str], locals_: set[str]) -> None:
        super().__init__(forbidden, locals_)
        self.plan = plan

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        plan = self.plan
        if isinstance(node.slice, ast.Name) and node.slice.id == plan.var:
            if not isinstance(node.value, ast.Name) or node.value.id in self.locals:
                raise LoopRefused(f"line {node.lineno}: `[V]` on a body local or an expression")
            if isinstance(node.ctx, ast.Store):
                raise LoopRefused(f"line {node.lineno}: a write to `Y[V]`")
            y = node.value.id
            param = plan.slices.setdefault(y, f"_ka_slice_{len(plan.slices)}_{y}")
            return ast.Name(param, ast.Load())
        if row_index(node.slice, plan.rows, target=False) is not None:
            node.value = self.visit(node.value)
            return ast.Call(
                ast.Attribute(ast.Name(HELPER, ast.Load()), "zero", ast.Load()),
                [node, ast.Name("_ka_valid", ast.Load())],
                [],
            )
        self.generic_visit(node)
        return node


def _grouped(loop: ast.For, fn: ast.stmt, k: int) -> list[ast.stmt]:
    """The statements that replace ``loop`` (its own index ``k`` names the helpers)."""
    work, eq = loop, f"_ka_eq{k}"
    try:
        plan = read_header(loop)
    except LoopRefused as refused:
        form = bool_form(loop, eq)
        if form is None:
            raise refused from None
        work, f = form
        plan = read_header(work)
        if plan.count is None:
            raise LoopRefused("a boolean-mask loop not over range(n)") from None
        plan.eq_of = f
    kept = [(i, st) for i, st in enumerate(work.body) if i not in plan.skip]
    header = set().union(*(names(work.body[i], ast.Store) for i in plan.skip))
    locals_ = set().union(*(names(st, ast.Store) for _, st in kept))
    alias = {plan.mask, plan.loop_var} | (header - set(plan.rows) - {plan.var})
    if locals_ & (header | alias):
        raise LoopRefused("the loop assigns its mask, its variable or its rows again")
    in_fn, in_loop = load_counts([fn]), load_counts([loop])
    for name in locals_ | header | {plan.loop_var}:
        if in_fn.get(name, 0) > in_loop.get(name, 0):
            raise LoopRefused(f"{name!r} is read after the loop")
    forbidden = {plan.var, *plan.rows, *alias}
    new_body: list[ast.stmt] = []
    assigned: set[str] = set()
    targets: dict[str, int] = {}
    for i, stmt in kept:
        if i > plan.where:
            assigned |= set(plan.rows)
        acc = accumulation(stmt, plan)
        value = getattr(stmt, "value", None) if acc is None else acc[2]
        assert isinstance(value, ast.expr)
        early = (names(value, ast.Load) & (locals_ | set(plan.rows))) - assigned
        if early:
            raise LoopRefused(f"line {stmt.lineno}: {sorted(early)} read before it is assigned")
        value = _Body(plan, forbidden, locals_).visit(copy.deepcopy(value))
        if acc is None:
            assert isinstance(stmt, ast.Assign)
            new_body.append(
                ast.Assign(targets=copy.deepcopy(stmt.targets), value=value, lineno=stmt.lineno)
            )
            assigned |= names(stmt, ast.Store)
            continue
        kind, a, _ = acc
        if a in locals_ or a in forbidden:
            raise LoopRefused(f"line {stmt.lineno}: accumulation into a body local {a!r}")
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
        raise LoopRefused("the loop accumulates nothing")
    for a, n in targets.items():
        if in_loop.get(a, 0) != n:
            raise LoopRefused(f"{a!r} is read in the loop besides its accumulations")
    return _emit(loop, plan, new_body, k)


def _emit(loop: ast.For, plan: Plan, new_body: list[ast.stmt], k: int) -> list[ast.stmt]:
    n, g, out, fn = f"_ka_n{k}", f"_ka_g{k}", f"_ka_out{k}", f"_ka_body{k}"
    rows = ", ".join(plan.rows) + ("," if len(plan.rows) == 1 else "")
    params = ", ".join(["_ka_rows", "_ka_valid", *plan.slices.values()])
    rets = ", ".join(f"_ka_acc_{i}" for i in range(plan.outputs)) + ","
    args = ", ".join([f"{g}.rows", f"{g}.valid", *(f"{y}[:{g}.n]" for y in plan.slices)])
    if plan.count is not None:
        head = [f"{n} = {ast.unparse(plan.count)}", f"{g} = {HELPER}({plan.mask}, {n}"]
        if plan.eq_of is not None:
            head.insert(1, f"{plan.mask} = {HELPER}.eq_mask({plan.eq_of}, {n})")
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
            picked = row_index(stmt.target.slice, plan.rows, target=True) or []
            cols = ", ".join(f"{g}.cols[{plan.rows.index(r)}]" for r in picked) + ","
            a = ast.unparse(stmt.target.value)
            apply.append(f"{a}.index_put_(({cols}), {g}.kept({out}[{i}]), accumulate=True)")
        elif kind.startswith("set:"):
            assert isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Subscript)
            a = ast.unparse(stmt.targets[0].value)
            col = plan.rows.index(kind.split(":", 1)[1])
            kept = f"{g}.kept({out}[{i}]).to({a}.dtype)"
            apply.append(f"{a}.index_put_(({g}.cols[{col}],), {kept})")
        else:
            assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            col = plan.rows.index(kind.split(":", 1)[1])
            a = ast.unparse(stmt.value.func.value)  # type: ignore[attr-defined]
            apply.append(f"{a}.index_add_(0, {g}.cols[{col}], {g}.kept({out}[{i}]))")
        i += 1
    return vmap_or_loop(
        head,
        f"{g}.ok",
        f"{fn}({params})",
        new_body,
        f"({rets})",
        f"{out} = torch.func.vmap({fn})({args})",
        apply,
        loop,
        f"{plan.loop_var} in {again}",
        prelude=f"{rows} = _ka_rows",
    )


class _Grouper:
    def __init__(self, fn: ast.stmt) -> None:
        self.fn = fn
        self.count = 0
        self.segments = 0
        self.refusals: list[str] = []

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in stmts:
            if isinstance(stmt, ast.For):
                try:
                    out.extend(_grouped(stmt, self.fn, self.count + 1))
                    self.count += 1
                    continue
                except LoopRefused as e:
                    why = f"loop line {stmt.lineno}: {e}"
                if is_segment_loop(stmt):  # the sorted-segment form (:mod:`.segments`)
                    try:
                        out.extend(segment_loop(stmt, out, self.fn, self.count + 1))
                        self.count += 1
                        self.segments += 1
                        continue
                    except LoopRefused as e:
                        why = f"loop line {stmt.lineno}: segments: {e}"
                self.refusals.append(why)
            nested_blocks(stmt, self.block)
            out.append(stmt)
        return out


def group_loops(source: str, entry: str = "run") -> tuple[str, int, list[str]]:
    """``source`` with ``entry``'s matching expert loops batched over the experts, how many
    loops were rewritten (0: the source comes back unchanged) and why each other ``for``
    loop was refused."""
    tree, index = parse_entry(source, entry)
    fn = tree.body[index]
    assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
    grouper = _Grouper(fn)
    fn.body = grouper.block(fn.body)
    if not grouper.count:
        return source, 0, grouper.refusals
    runtime = RUNTIME * (grouper.count > grouper.segments) + SEGMENTS_RUNTIME * bool(
        grouper.segments
    )
    return with_runtime(tree, index, runtime), grouper.count, grouper.refusals


__all__ = ["HELPER", "RUNTIME", "group_loops"]
