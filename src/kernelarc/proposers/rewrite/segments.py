"""Source rewrite of a sorted-segment expert loop into one batched pass over all experts.

The second form of :mod:`.grouped` (which tries it on every loop its own form refuses). A
DeepSeek-style ``moe_infer`` sorts the (token, slot) pairs by expert and walks the sorted
rows in consecutive segments, one per expert, of the lengths ``counts`` (host numbers)::

    outputs, start = [], 0
    for e in range(n):                    # or: for e, c in enumerate(counts):
        c = int(counts[e])                #     ``counts[e].item()``, ``counts[e]``
        if c == 0:                        #     or ``if not c:``; optional
            continue
        end = start + c                   # optional: slices ``X[start:start + c]``
        h = f(X[start:end], W[e], ...)
        outputs.append(h)
        start = end                       # or ``start += c``
    y = torch.cat(outputs, dim=0)

:func:`segment_loop` replaces it by one call of the body under ``torch.func.vmap`` over the
experts: each segment becomes one row block of a zero-padded ``[n, m, ...]`` batch (``m``
the largest count), ``W[e]`` becomes all of ``W``, and the valid output rows are taken
back in expert order, so ``torch.cat(outputs)`` is the same tensor, same shape and row
order (an expert without rows contributes nothing). The batched result is appended to
``outputs`` as one element.

Matched, in a block of ``entry``: ``start = 0`` and ``L = []`` (every list the body
appends to) earlier in the same block; a body of the statements above, assignments to
plain names (the body's locals) and ``L.append(e)`` (each list once); the segment slices
``X[start:end]`` of plain names ``X`` the loop does not assign, every read of ``e`` a
``W[e]``; outside the loop, each ``L`` read only as ``torch.cat(L)`` (``dim=0``),
``len(L) == 0`` (``!=``, ``>``), or ``L`` / ``len(L)`` as a truth value (``if``, ``x if
len(L) else y``, ``not``): the batched ``L`` holds one element where the loop as written
appends one per expert, equal only for these reads.

Refused, with the reason: the count, ``start``, ``end`` or ``e`` used another way (``e * 2``,
``X[start:end + 1]``), a slice before ``end`` is set or after ``start`` moves, another
statement kind, a local read before it is assigned or after the loop, a list read
otherwise, no ``start = 0`` or ``L = []`` before the loop. The loop as written runs
instead (``_KaSegments.ok``) when ``counts`` is not a 1-D sequence of ``n`` or more
non-negative ints, a segmented ``X`` has not ``sum(counts)`` rows, a ``W`` has fewer than
``n`` rows, no expert has rows, or padding would more than double the rows.

Not exact: batched GEMMs round differently. The body must be row-wise: one that mixes
rows (``h.sum(0)``, ``h.shape[0]``) sees the padding rows; the guard judges. Not covered:
segments by ``torch.split`` or offsets, ``start`` not 0, ``.item()`` in the body, expert
modules (DeepSeek's ``self.experts[i]``).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from kernelarc.proposers.rewrite.grouped_match import BodyTransformer, LoopRefused, index_of, names
from kernelarc.proposers.rewrite.loops import load_counts, vmap_or_loop

HELPER = "_KaSegments"
RUNTIME = f'''
import torch


class {HELPER}:
    """Consecutive row segments of the lengths ``counts[:n]`` (``n`` None: all), one per
    expert, as a zero-padded ``[n, m, ...]`` batch and back; ``ok`` is False when the loop
    should run as written (kernelarc's sorted-segment expert rewrite)."""

    def __init__(self, counts, n, xs, ys, waste=2.0):
        self.ok = False
        c = self.ints(counts)
        if c is None:
            return
        n = len(c) if n is None else n
        if type(n) is not int or not 0 < n <= len(c):
            return
        c = c[:n]
        total, m = sum(c), max(c)
        if m == 0 or n * m > waste * total + n:
            return
        for x in xs:
            if not (isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == total):
                return
        for y in ys:
            if not (isinstance(y, torch.Tensor) and y.dim() >= 1 and y.shape[0] >= n):
                return
        dev = xs[0].device
        ct = torch.tensor(c, device=dev)
        group = torch.repeat_interleave(torch.arange(n, device=dev), ct, output_size=total)
        starts = torch.cumsum(ct, 0) - ct
        self.flat = group * m + torch.arange(total, device=dev) - starts[group]
        self.n, self.m = n, m
        self.ok = True

    @staticmethod
    def ints(counts):
        """``counts`` as a list of non-negative ints, or None."""
        if isinstance(counts, torch.Tensor):
            kind = "b" if counts.dtype == torch.bool else "f" if counts.is_floating_point() else "i"
            kind = "c" if counts.is_complex() else kind
        else:  # a NumPy array; a list or tuple (of ints, checked below)
            kind = getattr(getattr(counts, "dtype", None), "kind", None)
        if isinstance(counts, (list, tuple)):
            values = list(counts)
        elif getattr(counts, "ndim", None) == 1 and kind in ("i", "u"):
            values = counts.tolist()
        else:
            return None
        return values if all(type(v) is int and v >= 0 for v in values) else None

    def pad(self, x):
        """``x``'s segments as ``[n, m, ...]``, zero rows after each expert's own."""
        rest = tuple(x.shape[1:])
        out = x.new_zeros((self.n * self.m,) + rest)
        out.index_copy_(0, self.flat.to(x.device), x)
        return out.view((self.n, self.m) + rest)

    def kept(self, out):
        """The valid rows of a batched ``[n, m, ...]`` result, in expert order: what
        ``torch.cat`` of the per-expert results is."""
        if out.dim() < 2 or tuple(out.shape[:2]) != (self.n, self.m):
            raise RuntimeError("segment rewrite: a per-expert result is not rows-first")
        flat = out.reshape((self.n * self.m,) + tuple(out.shape[2:]))
        return flat.index_select(0, self.flat.to(out.device))
'''


@dataclass
class _Seg:
    var: str
    """The expert index (the loop variable; ``V`` of ``for V, c in enumerate(...)``)."""
    count: str
    counts: ast.expr
    n: ast.expr | None = None
    """``n`` of ``range(n)``; None for ``enumerate(counts)``."""
    counts_name: str | None = None
    """The counts' name in a ``range`` loop (``c = int(counts[V])``)."""
    raw: str | None = None
    """``c`` of ``enumerate`` when the body converts it to another name first."""
    start: str = ""
    end: str | None = None
    skip: set[int] = field(default_factory=set)
    end_at: int = -1
    update_at: int = -1
    xs: dict[str, str] = field(default_factory=dict)
    """``X`` of every segment slice → the body's parameter for its padded batch."""
    ys: dict[str, str] = field(default_factory=dict)
    """``W`` of every ``W[V]`` → the body's parameter for its per-expert slice."""
    lists: list[str] = field(default_factory=list)


def _name(node: ast.AST | None, ident: str | None = None) -> bool:
    return isinstance(node, ast.Name) and (ident is None or node.id == ident)


def _sum_of(node: ast.expr, a: str, b: str) -> bool:
    """``node`` is ``a + b`` or ``b + a``."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
        return False
    ids = [x.id for x in (node.left, node.right) if isinstance(x, ast.Name)]
    return sorted(ids) == sorted([a, b])


def _assign(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _name(stmt.targets[0]):
        return stmt.targets[0].id, stmt.value  # type: ignore[attr-defined]
    return None


def _append(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    """``(L, e)`` of ``L.append(e)``."""
    if (
        isinstance(stmt, ast.Expr)
        and isinstance(call := stmt.value, ast.Call)
        and isinstance(f := call.func, ast.Attribute)
        and f.attr == "append"
        and isinstance(f.value, ast.Name)
        and len(call.args) == 1
        and not isinstance(call.args[0], ast.Starred)
        and not call.keywords
    ):
        return f.value.id, call.args[0]
    return None


def _count_of(value: ast.expr, var: str) -> str | None:
    """``counts`` when ``value`` is ``int(counts[var])``, ``counts[var].item()`` or
    ``counts[var]``."""
    if isinstance(value, ast.Call) and not value.keywords:
        f = value.func
        if _name(f, "int") and len(value.args) == 1:
            value = value.args[0]
        elif isinstance(f, ast.Attribute) and f.attr == "item" and not value.args:
            value = f.value
    if isinstance(value, ast.Subscript) and _name(value.value) and _name(value.slice, var):
        return value.value.id  # type: ignore[attr-defined]
    return None


def _zero_skip(stmt: ast.stmt, count: str) -> bool:
    """``if c == 0: continue`` (``0 == c``) or ``if not c: continue``."""
    if not (
        isinstance(stmt, ast.If)
        and not stmt.orelse
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], ast.Continue)
    ):
        return False
    t = stmt.test
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
        return _name(t.operand, count)
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq):
        sides = [t.left, t.comparators[0]]
        zero = [s for s in sides if isinstance(s, ast.Constant) and s.value == 0]
        return len(zero) == 1 and any(_name(s, count) for s in sides)
    return False


def _header(loop: ast.For) -> _Seg:
    """The expert index, the count and its conversion (``skip``)."""
    if loop.orelse or not loop.body:
        raise LoopRefused("a loop with an else branch or no body")
    it, target, first = loop.iter, loop.target, loop.body[0]
    if not (isinstance(it, ast.Call) and _name(it.func) and len(it.args) == 1) or it.keywords:
        raise LoopRefused("not `for V in range(n)` nor `for V, c in enumerate(counts)`")
    kind = it.func.id  # type: ignore[attr-defined]
    if kind == "range" and isinstance(target, ast.Name):
        a = _assign(first)
        counts = _count_of(a[1], target.id) if a is not None else None
        if a is None or counts is None:
            raise LoopRefused("a `range` loop whose body does not start with `c = int(counts[V])`")
        seg = _Seg(target.id, a[0], a[1], n=it.args[0], counts_name=counts)
        seg.skip.add(0)
        return seg
    if (
        kind == "enumerate"
        and isinstance(target, ast.Tuple)
        and len(target.elts) == 2
        and isinstance(v := target.elts[0], ast.Name)
        and isinstance(c := target.elts[1], ast.Name)
    ):
        seg = _Seg(v.id, c.id, it.args[0], raw=c.id)
        if (conv := index_of(first, c.id)) is not None:  # ``n = int(c)``, ``c.item()``
            seg.count = conv
            seg.skip.add(0)
        return seg
    raise LoopRefused("not `for V in range(n)` nor `for V, c in enumerate(counts)`")


def _bounds(loop: ast.For, seg: _Seg) -> None:
    """``start`` (every segment slice's lower bound), ``end = start + c`` and the update
    ``start = end`` / ``start += c`` (``skip``)."""
    lowers = {
        n.slice.lower.id
        for st in loop.body
        for n in ast.walk(st)
        if isinstance(n, ast.Subscript)
        and isinstance(n.slice, ast.Slice)
        and isinstance(n.slice.lower, ast.Name)
    }
    if len(lowers) != 1:
        raise LoopRefused(f"slices start at {sorted(lowers)}, not at one `start`")
    seg.start = start = lowers.pop()
    c = seg.count
    for i, st in enumerate(loop.body):
        if i in seg.skip:
            continue
        a = _assign(st)
        if a is not None and a[0] != start and _sum_of(a[1], start, c):
            if seg.end is not None:
                raise LoopRefused(f"line {st.lineno}: `end = start + c` twice")
            seg.end, seg.end_at = a[0], i
            seg.skip.add(i)
            continue
        moved = False
        if isinstance(st, ast.AugAssign) and _name(st.target, start):
            if not (isinstance(st.op, ast.Add) and _name(st.value, c)):
                raise LoopRefused(f"line {st.lineno}: `start` moves by other than `+= c`")
            moved = True
        elif a is not None and a[0] == start:
            if not (_sum_of(a[1], start, c) or (seg.end and _name(a[1], seg.end))):
                raise LoopRefused(f"line {st.lineno}: `start` moves to other than `end`")
            moved = True
        if moved:
            if seg.update_at >= 0:
                raise LoopRefused(f"line {st.lineno}: `start` moves twice")
            seg.update_at = i
            seg.skip.add(i)
    if seg.update_at < 0:
        raise LoopRefused("no `start = end` or `start += c` in the body")
    if seg.end_at > seg.update_at:
        raise LoopRefused("`end = start + c` after `start` moves")


class _Body(BodyTransformer):
    """A body expression for ``vmap``: segment slices and ``W[V]`` → parameters."""

    def __init__(self, seg: _Seg, forbidden: set[str], locals_: set[str]) -> None:
        super().__init__(forbidden, locals_)
        self.seg, self.sliced = seg, False

    def _bound(self, s: ast.Slice) -> bool:
        seg = self.seg
        if s.step is not None or not _name(s.lower, seg.start) or s.upper is None:
            return False
        end = seg.end is not None and _name(s.upper, seg.end)
        return end or _sum_of(s.upper, seg.start, seg.count)

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        seg, sl = self.seg, node.slice
        if (isinstance(sl, ast.Slice) and self._bound(sl)) or _name(sl, seg.var):
            if not _name(node.value) or node.value.id in self.locals | self.forbidden:  # type: ignore[attr-defined]
                raise LoopRefused(f"line {node.lineno}: a segment slice or `[V]` of a body name")
            if isinstance(node.ctx, ast.Store):
                raise LoopRefused(f"line {node.lineno}: a write to a segment or to `W[V]`")
            x = node.value.id  # type: ignore[attr-defined]
            if isinstance(sl, ast.Slice):
                self.sliced = True
                return ast.Name(seg.xs.setdefault(x, f"_ka_seg_{len(seg.xs)}_{x}"), ast.Load())
            return ast.Name(seg.ys.setdefault(x, f"_ka_slice_{len(seg.ys)}_{x}"), ast.Load())
        self.generic_visit(node)
        return node


def _len_arg(node: ast.expr, lst: str) -> ast.expr:
    """``lst`` of ``len(lst)``, else ``node`` itself."""
    if isinstance(node, ast.Call) and _name(node.func, "len") and len(node.args) == 1:
        return node.args[0] if _name(node.args[0], lst) else node
    return node


def _list_reads(fn: ast.stmt, loop: ast.For, lst: str) -> list[int]:
    """Lines outside ``loop`` where ``lst`` is read other than as ``torch.cat(lst)``,
    ``len(lst) == 0`` (``!=``, ``>``), or as a truth value: ``lst`` or ``len(lst)`` as the
    test of an ``if``, a conditional expression or a ``while``, or under ``not``."""
    inside = {id(n) for n in ast.walk(loop)}
    ok: set[int] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and (
            isinstance(f := node.func, ast.Attribute)
            and f.attr in ("cat", "concat")
            and _name(f.value, "torch")
            and len(node.args) in (1, 2)
            and _name(node.args[0], lst)
            and all(isinstance(a, ast.Constant) and a.value == 0 for a in node.args[1:])
            and all(
                k.arg == "dim" and isinstance(k.value, ast.Constant) and k.value.value == 0
                for k in node.keywords
            )
        ):
            ok.add(id(node.args[0]))
        elif (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.Eq | ast.NotEq | ast.Gt)
            and isinstance(z := node.comparators[0], ast.Constant)
            and z.value == 0
        ):
            arg = _len_arg(node.left, lst)
            if arg is not node.left:
                ok.add(id(arg))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            ok.add(id(_len_arg(node.operand, lst)))
        elif isinstance(node, ast.If | ast.IfExp | ast.While):
            ok.add(id(_len_arg(node.test, lst)))
    skip = inside | ok
    reads = (n for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))
    return [n.lineno for n in reads if n.id == lst and id(n) not in skip]


def _set_before(before: list[ast.stmt], name: str) -> ast.expr | None:
    """``v`` when the last statement of ``before`` that stores ``name`` is ``name = v``."""
    for st in reversed(before):
        if name in names(st, ast.Store):
            a = _assign(st)
            return a[1] if a is not None and a[0] == name else None
    return None


def is_segment_loop(loop: ast.For) -> bool:
    """Whether ``loop``'s body appends to a list and slices by a name (``X[start:...]``):
    a segment loop, whose refusals :func:`segment_loop` explains."""
    body = ast.Module(loop.body, [])
    slices = any(
        isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and _name(n.slice.lower)
        for n in ast.walk(body)
    )
    return slices and any(_append(st) is not None for st in loop.body)


def segment_loop(loop: ast.For, before: list[ast.stmt], fn: ast.stmt, k: int) -> list[ast.stmt]:
    """The statements that replace the segment ``loop`` (``before``: the statements before
    it in its block; ``k`` names the helpers); raises :class:`LoopRefused`."""
    seg = _header(loop)
    _bounds(loop, seg)
    body = loop.body
    zero = [i for i, st in enumerate(body) if i not in seg.skip and _zero_skip(st, seg.count)]
    seg.skip |= set(zero[:1])
    kept = [(i, st) for i, st in enumerate(body) if i not in seg.skip]
    header = {seg.var, seg.count, seg.start, *(x for x in (seg.end, seg.raw) if x)}
    locals_ = set().union(*(names(st, ast.Store) for _, st in kept))
    if locals_ & header:
        raise LoopRefused(f"the body assigns {sorted(locals_ & header)} again")
    if seg.counts_name in locals_:
        raise LoopRefused("the body assigns the counts")
    in_fn, in_loop = load_counts([fn]), load_counts([loop])
    for name in locals_ | header:
        if in_fn.get(name, 0) > in_loop.get(name, 0):
            raise LoopRefused(f"{name!r} is read outside the loop")
    start = _set_before(before, seg.start)
    if not (isinstance(start, ast.Constant) and start.value == 0 and type(start.value) is int):
        raise LoopRefused(f"no `{seg.start} = 0` before the loop in its block")
    forbidden = header | ({seg.counts_name} if seg.counts_name else set())
    new_body: list[ast.stmt] = []
    assigned: set[str] = set()
    for i, st in kept:
        app = _append(st)
        value = app[1] if app is not None else getattr(st, "value", None)
        if app is None and not isinstance(st, ast.Assign):
            raise LoopRefused(f"line {st.lineno}: {type(st).__name__} statements are not batched")
        assert isinstance(value, ast.expr)
        if isinstance(st, ast.Assign) and not all(
            _name(t) or (isinstance(t, ast.Tuple) and all(_name(e) for e in t.elts))
            for t in st.targets
        ):
            raise LoopRefused(f"line {st.lineno}: an assignment to a subscript or attribute")
        early = (names(value, ast.Load) & locals_) - assigned
        if early:
            raise LoopRefused(f"line {st.lineno}: {sorted(early)} read before it is assigned")
        visitor = _Body(seg, forbidden, locals_)
        value = visitor.visit(copy.deepcopy(value))
        if visitor.sliced and not (seg.end_at < i < seg.update_at):
            raise LoopRefused(
                f"line {st.lineno}: a segment slice before `end` is set or after `start` moves"
            )
        if app is None:
            assert isinstance(st, ast.Assign)
            new_body.append(ast.Assign(copy.deepcopy(st.targets), value, lineno=st.lineno))
            assigned |= names(st, ast.Store)
            continue
        lst = app[0]
        if lst in seg.lists or lst in locals_ | forbidden:
            raise LoopRefused(f"line {st.lineno}: {lst!r} is appended to twice or is a body name")
        tmp = f"_ka_ret_{len(seg.lists)}"
        seg.lists.append(lst)
        new_body.append(ast.Assign([ast.Name(tmp, ast.Store())], value, lineno=st.lineno))
    if not seg.lists:
        raise LoopRefused("the loop appends nothing")
    if not seg.xs:
        raise LoopRefused("no segment slice `X[start:end]` in the body")
    for lst in seg.lists:
        if in_loop.get(lst, 0) != 1:
            raise LoopRefused(f"{lst!r} is read in the loop besides its append")
        lines = _list_reads(fn, loop, lst)
        if lines:
            raise LoopRefused(
                f"{lst!r} read outside the loop other than by torch.cat, line {lines[0]}"
            )
        init = _set_before(before, lst)
        if not (isinstance(init, ast.List) and not init.elts):
            raise LoopRefused(f"no `{lst} = []` before the loop in its block")
    for x in [*seg.xs, *seg.ys]:
        if x in locals_ | forbidden or x in seg.lists:
            raise LoopRefused(f"{x!r} is assigned in the loop")
    return _emit(loop, seg, new_body, k)


def _emit(loop: ast.For, seg: _Seg, new_body: list[ast.stmt], k: int) -> list[ast.stmt]:
    s, out, fn = f"_ka_s{k}", f"_ka_out{k}", f"_ka_seg{k}"
    head: list[str] = []
    if seg.n is not None:
        assert seg.counts_name is not None
        head.append(f"_ka_n{k} = {ast.unparse(seg.n)}")
        counts, n, again = seg.counts_name, f"_ka_n{k}", f"range(_ka_n{k})"
    else:
        counts, n = ast.unparse(seg.counts), "None"
        if not _name(seg.counts):
            head.append(f"_ka_c{k} = {counts}")
            counts = f"_ka_c{k}"
        again = f"enumerate({counts})"
    xs, ys = ", ".join(seg.xs) + ",", ", ".join(seg.ys) + ("," if seg.ys else "")
    head.append(f"{s} = {HELPER}({counts}, {n}, ({xs}), ({ys}))")
    params = ", ".join([*seg.xs.values(), *seg.ys.values()])
    args = ", ".join([*(f"{s}.pad({x})" for x in seg.xs), *(f"{y}[:{s}.n]" for y in seg.ys)])
    rets = ", ".join(f"_ka_ret_{i}" for i in range(len(seg.lists))) + ","
    return vmap_or_loop(
        head,
        f"{s}.ok",
        f"{fn}({params})",
        new_body,
        f"({rets})",
        f"{out} = torch.func.vmap({fn})({args})",
        [f"{lst}.append({s}.kept({out}[{i}]))" for i, lst in enumerate(seg.lists)],
        loop,
        f"{ast.unparse(loop.target)} in {again}",
    )


__all__ = ["HELPER", "RUNTIME", "is_segment_loop", "segment_loop"]
