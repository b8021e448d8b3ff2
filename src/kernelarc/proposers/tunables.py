"""Finding and rewriting the launch tunables of Triton sources, with ``ast``.

Only integer *literals* are tunables; a value computed at run time (from a shape, e.g.
``BLOCK=triton.next_power_of_2(cols)`` or ``min(1024, ...)``) is a constraint of the kernel
and is left alone. A parameter is a tunable when its name says what it is: ``num_warps``,
``num_stages``, or an ALL_CAPS constexpr name with a token BLOCK*/TILE/BLK/CHUNK/XBLOCK/
RBLOCK (block sizes), ROWS (rows per program), GROUP* (grouped launch order, e.g.
``GROUP_M``), SPLIT* (split-K), WARPS, STAGES. Other literals (``HIDDEN=512``) are never
touched: changing them would change what the kernel computes.

Covered:

- launch sites ``kernel[grid](..., BLOCK_M=64, num_warps=4)``: keyword literals, and
  positional literals bound to ``tl.constexpr`` parameters of a kernel defined in the same
  file;
- module-level constants (``BLOCK = 128``, ``BLOCK: tl.constexpr = 128``,
  ``BLOCK = tl.constexpr(128)``) assigned once and referenced elsewhere in the module (a
  constant passed as ``num_warps=NUM_WARPS`` takes that keyword's kind);
- ``triton.Config({...}, num_warps=, num_stages=)`` lists of ``@triton.autotune`` (inline
  or a module-level list the decorator names); a list of several configs can be *pinned*
  to one of them (:func:`rewrite`'s ``pins``);
- grid literals: a ``cdiv(M, 64)`` in the grid of a launch (inline, or a grid variable
  assigned once in the same function) is linked to the launch's tunable of that value and
  moves with it. When the link is ambiguous (two tunables of that value, neither named
  after ``M``), those tunables are *fixed* instead (listed in :attr:`Tunables.fixed`).

Not covered: ``@triton.heuristics``, configs built by functions or comprehensions, launch
parameters passed through ``**kwargs`` dicts, swapping ``program_id`` axes (grid order is
tuned only through GROUP-style parameters), other literals in the grid expression.

Rewriting replaces exactly the literal's characters (ast positions, UTF-8 byte columns)
and nothing else: comments, formatting and every other value stay as they were.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kernelarc.problem.schema import Solution

Kind = Literal["block", "rows", "group", "split", "warps", "stages"]

_BLOCK_TOKENS = {"BLOCK", "BLK", "TILE", "CHUNK", "XBLOCK", "YBLOCK", "ZBLOCK", "RBLOCK"}
_CAPS = re.compile(r"[A-Z][A-Z0-9_]*")


def classify(name: str) -> Kind | None:
    """The kind of tunable a parameter named ``name`` is, or None when it is not one."""
    if name == "num_warps":
        return "warps"
    if name == "num_stages":
        return "stages"
    if not _CAPS.fullmatch(name):
        return None
    tokens = [t for t in name.split("_") if t]
    if "WARPS" in tokens:
        return "warps"
    if "STAGES" in tokens:
        return "stages"
    if any(t.startswith("SPLIT") for t in tokens):
        return "split"
    if any(t.startswith("GROUP") for t in tokens):
        return "group"
    if "ROWS" in tokens:
        return "rows"
    if any(t in _BLOCK_TOKENS or t.startswith("BLOCK") for t in tokens):
        return "block"
    return None


@dataclass(frozen=True)
class Span:
    """Source positions as ``ast`` gives them: 1-based lines, UTF-8 byte columns."""

    line: int
    col: int
    end_line: int
    end_col: int

    @classmethod
    def of(cls, node: ast.AST) -> Span:
        end_line, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
        if end_line is None or end_col is None:
            raise ValueError("node without an end position")
        return cls(node.lineno, node.col_offset, end_line, end_col)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Tunable:
    """One integer literal that may change. ``key`` is stable under value edits."""

    key: str
    file: str
    name: str
    kind: Kind
    value: int
    spans: tuple[Span, ...]
    """The literal itself first, then the grid literals linked to it."""
    site: str
    """Where it is, for people: ``launch of _kernel``, ``module constant``, ..."""
    autotune: str | None = None
    """The key of the autotune site whose config holds it (None elsewhere)."""


@dataclass(frozen=True)
class AutotuneSite:
    """A ``configs=[triton.Config(...), ...]`` list of one ``@triton.autotune``."""

    key: str
    file: str
    kernel: str
    list_span: Span
    configs: tuple[Span, ...]
    labels: tuple[str, ...]
    """Each config's literal values, e.g. ``BLOCK_M=128 num_warps=4``."""


@dataclass(frozen=True)
class Tunables:
    """Everything :func:`find_tunables` found in a source (or a whole solution)."""

    params: tuple[Tunable, ...] = ()
    autotune: tuple[AutotuneSite, ...] = ()
    fixed: tuple[str, ...] = ()
    """Why candidates were left alone (ambiguous grid links, unparseable files)."""

    def by_key(self) -> dict[str, Tunable]:
        return {t.key: t for t in self.params}

    def values(self) -> dict[str, int]:
        return {t.key: t.value for t in self.params}

    def __add__(self, other: Tunables) -> Tunables:
        return Tunables(
            self.params + other.params, self.autotune + other.autotune, self.fixed + other.fixed
        )


# ------------------------------------------------------------------------------ discovery


def _int_literal(node: ast.AST | None) -> ast.Constant | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node
    return None


def _v(lit: ast.Constant) -> int:
    value = lit.value
    assert isinstance(value, int)
    return value


def _callee(node: ast.AST) -> str | None:
    """The last name of a call target: ``triton.cdiv`` -> ``cdiv``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _const_literal(value: ast.AST | None) -> ast.Constant | None:
    """``128`` or ``tl.constexpr(128)``."""
    lit = _int_literal(value)
    if lit is not None:
        return lit
    if isinstance(value, ast.Call) and _callee(value.func) == "constexpr" and len(value.args) == 1:
        return _int_literal(value.args[0])
    return None


def _is_kernel(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if _callee(target) in ("jit", "autotune", "heuristics"):
            return True
    return False


@dataclass
class _Finder:
    file: str
    tree: ast.Module
    params: list[Tunable] = field(default_factory=list)
    sites: list[AutotuneSite] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)

    def run(self) -> Tunables:
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        self.parents = parents
        self.kernels = {
            n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef) and _is_kernel(n)
        }
        self._autotune()
        self._launches()
        self._constants()
        return Tunables(tuple(self.params), tuple(self.sites), tuple(self.fixed))

    def _add(
        self,
        key: str,
        name: str,
        kind: Kind,
        lit: ast.Constant,
        site: str,
        linked: tuple[Span, ...] = (),
        autotune: str | None = None,
    ) -> None:
        spans = (Span.of(lit), *linked)
        key = f"{self.file}::{key}"
        self.params.append(Tunable(key, self.file, name, kind, _v(lit), spans, site, autotune))

    # ---- module constants
    def _module_assigns(self) -> dict[str, list[ast.AST | None]]:
        out: dict[str, list[ast.AST | None]] = {}
        for stmt in self.tree.body:
            if isinstance(stmt, ast.Assign):
                for tgt in stmt.targets:
                    for n in ast.walk(tgt):
                        if isinstance(n, ast.Name):
                            out.setdefault(n.id, []).append(
                                stmt.value if isinstance(tgt, ast.Name) else None
                            )
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out.setdefault(stmt.target.id, []).append(stmt.value)
        return out

    def _constants(self) -> None:
        loads: dict[str, int] = {}
        via_keyword: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                loads[node.id] = loads.get(node.id, 0) + 1
            if isinstance(node, ast.keyword) and node.arg and isinstance(node.value, ast.Name):
                via_keyword.setdefault(node.value.id, node.arg)
        for name, values in self._module_assigns().items():
            lit = _const_literal(values[0]) if len(values) == 1 else None
            if lit is None or not loads.get(name) or not _CAPS.fullmatch(name):
                continue
            kind = classify(name) or classify(via_keyword.get(name, ""))
            if kind is None:
                continue
            self._add(f"const:{name}", name, kind, lit, "module constant")

    # ---- launches
    def _launches(self) -> None:
        seen: dict[str, int] = {}
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)):
                continue
            kernel = _callee(node.func.value)
            if kernel is None:
                continue
            occ = seen.get(kernel, 0)
            seen[kernel] = occ + 1
            found: list[tuple[str, ast.Constant]] = []
            for kw in node.keywords:
                lit = _int_literal(kw.value)
                if kw.arg and lit is not None and classify(kw.arg):
                    found.append((kw.arg, lit))
            fn = self.kernels.get(kernel)
            if fn is not None:
                for arg, param in zip(node.args, fn.args.args, strict=False):
                    if isinstance(arg, ast.Starred):
                        break
                    lit = _int_literal(arg)
                    annotated = param.annotation is not None and "constexpr" in ast.unparse(
                        param.annotation
                    )
                    if lit is not None and annotated and classify(param.arg):
                        found.append((param.arg, lit))
            links = self._grid_links(node, found)
            for name, lit in found:
                linked = links.get(name, ())
                if linked is None:
                    self.fixed.append(
                        f"{name}={_v(lit)} at the launch of {kernel}: a grid literal "
                        "of that value cannot be told apart from another tunable's"
                    )
                    continue
                key, kind = f"launch:{kernel}#{occ}:{name}", classify(name)
                assert kind is not None
                self._add(key, name, kind, lit, f"launch of {kernel}", linked)

    def _grid_expr(self, call: ast.Call) -> ast.AST | None:
        assert isinstance(call.func, ast.Subscript)
        grid = call.func.slice
        if not isinstance(grid, ast.Name):
            return grid
        scope: ast.AST | None = call
        while scope is not None and not isinstance(scope, ast.FunctionDef | ast.Module):
            scope = self.parents.get(scope)
        if scope is None:
            return None
        values = [
            n.value
            for n in ast.walk(scope)
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and n.targets[0].id == grid.id
        ]
        return values[0] if len(values) == 1 else None

    def _grid_links(
        self, call: ast.Call, found: list[tuple[str, ast.Constant]]
    ) -> dict[str, tuple[Span, ...] | None]:
        """Per tunable name: the grid literals linked to it (None: ambiguous, fix it)."""
        grid = self._grid_expr(call)
        out: dict[str, tuple[Span, ...] | None] = {}
        if grid is None:
            return out
        sized = [(n, lit) for n, lit in found if classify(n) in ("block", "rows", "split")]
        for node in ast.walk(grid):
            if not (isinstance(node, ast.Call) and _callee(node.func) == "cdiv"):
                continue
            if len(node.args) != 2 or (lit := _int_literal(node.args[1])) is None:
                continue
            same = [n for n, v in sized if _v(v) == _v(lit)]
            if len(same) > 1:
                axis = _callee(node.args[0])
                upper = axis.upper() if axis else ""
                named = [n for n in same if upper and n.split("_")[-1] == upper]
                named = named or [n for n in same if upper and upper in n.split("_")]
                if len(named) != 1:
                    for n in same:
                        out[n] = None
                    continue
                same = named
            if same and out.get(same[0], ()) is not None:
                out[same[0]] = (*(out.get(same[0]) or ()), Span.of(lit))
        return out

    # ---- autotune
    def _autotune(self) -> None:
        module_lists = {
            n.id: stmt.value
            for stmt in self.tree.body
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.List)
            for n in stmt.targets
            if isinstance(n, ast.Name)
        }
        done: set[int] = set()
        for name, fn in self.kernels.items():
            for dec in fn.decorator_list:
                if not (isinstance(dec, ast.Call) and _callee(dec.func) == "autotune"):
                    continue
                value: ast.AST | None = next(
                    (k.value for k in dec.keywords if k.arg == "configs"),
                    dec.args[0] if dec.args else None,
                )
                if isinstance(value, ast.Name):
                    value = module_lists.get(value.id)
                if not isinstance(value, ast.List) or id(value) in done or not value.elts:
                    continue
                done.add(id(value))
                self._configs(name, value)

    def _configs(self, kernel: str, lst: ast.List) -> None:
        site_key = f"{self.file}::autotune:{kernel}"
        spans, labels = [], []
        for i, elt in enumerate(lst.elts):
            if not (isinstance(elt, ast.Call) and _callee(elt.func) == "Config"):
                self.fixed.append(f"autotune of {kernel}: config {i} is not a triton.Config call")
                return
            pairs: list[tuple[str, ast.Constant]] = []
            kwargs = next((k.value for k in elt.keywords if k.arg == "kwargs"), None)
            d = elt.args[0] if elt.args else kwargs
            if isinstance(d, ast.Dict):
                for k, v in zip(d.keys, d.values, strict=True):
                    lit = _int_literal(v)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str) and lit:
                        pairs.append((k.value, lit))
            for kw in elt.keywords:
                lit = _int_literal(kw.value)
                if kw.arg in ("num_warps", "num_stages") and lit is not None:
                    pairs.append((kw.arg, lit))
            spans.append(Span.of(elt))
            labels.append(" ".join(f"{n}={_v(lit)}" for n, lit in pairs))
            for n, lit in pairs:
                if (kind := classify(n)) is not None:
                    where = f"autotune config {i} of {kernel}"
                    key = f"{site_key.split('::', 1)[1]}[{i}]:{n}"
                    self._add(key, n, kind, lit, where, autotune=site_key)
        self.sites.append(
            AutotuneSite(site_key, self.file, kernel, Span.of(lst), tuple(spans), tuple(labels))
        )


def find_tunables(source: str, file: str = "kernel.py") -> Tunables:
    """The tunables of one Python source (SyntaxError when it does not parse)."""
    return _Finder(file, ast.parse(source)).run()


def solution_tunables(solution: Solution) -> Tunables:
    """The tunables of every ``.py`` source of ``solution`` (unparseable ones are listed in
    :attr:`Tunables.fixed`, never silently skipped)."""
    out = Tunables()
    for src in solution.sources:
        if not src.path.endswith(".py"):
            continue
        try:
            out = out + find_tunables(src.content, src.path)
        except SyntaxError as e:
            out = out + Tunables(fixed=(f"{src.path} does not parse ({e.msg}, line {e.lineno})",))
    return out


# ------------------------------------------------------------------------------ rewriting


def _offset(starts: list[int], line: int, col: int) -> int:
    return starts[line - 1] + col


def rewrite(
    source: str,
    file: str,
    values: Mapping[str, int] | None = None,
    pins: Mapping[str, int] | None = None,
) -> str:
    """``source`` with new values for the tunables named by key in ``values`` and the
    autotune sites in ``pins`` reduced to the one config of the given index. Keys of other
    files are ignored; an unknown key of this file, a non-positive value, or a value edit
    inside a pinned list is a ValueError."""
    values = {k: v for k, v in (values or {}).items() if k.startswith(f"{file}::")}
    pins = {k: v for k, v in (pins or {}).items() if k.startswith(f"{file}::")}
    if not values and not pins:
        return source
    found = find_tunables(source, file)
    known, sites = found.by_key(), {s.key: s for s in found.autotune}
    data = source.encode()
    starts = [0]
    for line in data.split(b"\n")[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    edits: list[tuple[int, int, bytes]] = []
    for key, value in values.items():
        if key not in known:
            raise ValueError(f"{file}: no tunable {key!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key}: a tunable value must be a positive int, got {value!r}")
        if known[key].autotune in pins:
            raise ValueError(f"{key}: its autotune list is pinned in the same rewrite")
        for s in known[key].spans:
            a, b = _offset(starts, s.line, s.col), _offset(starts, s.end_line, s.end_col)
            edits.append((a, b, str(value).encode()))
    for key, index in pins.items():
        site = sites.get(key)
        if site is None:
            raise ValueError(f"{file}: no autotune site {key!r}")
        if not 0 <= index < len(site.configs):
            raise ValueError(f"{key}: config {index} not within 0..{len(site.configs) - 1}")
        c, lst = site.configs[index], site.list_span
        chosen = data[_offset(starts, c.line, c.col) : _offset(starts, c.end_line, c.end_col)]
        a, b = _offset(starts, lst.line, lst.col), _offset(starts, lst.end_line, lst.end_col)
        edits.append((a, b, b"[" + chosen + b"]"))
    edits.sort()
    for (_, end, _), (start, _, _) in zip(edits, edits[1:], strict=False):
        if start < end:
            raise ValueError(f"{file}: overlapping edits")
    for start, end, text in reversed(edits):
        data = data[:start] + text + data[end:]
    return data.decode()


def tuned_solution(
    solution: Solution,
    values: Mapping[str, int] | None = None,
    pins: Mapping[str, int] | None = None,
    *,
    name: str | None = None,
    author: str | None = None,
    description: str | None = None,
) -> Solution:
    """A copy of ``solution`` with its sources rewritten (see :func:`rewrite`)."""
    data = solution.model_dump(mode="json")
    data["sources"] = [
        {**s, "content": rewrite(s["content"], s["path"], values, pins)}
        if s["path"].endswith(".py")
        else s
        for s in data["sources"]
    ]
    for k, v in (("name", name), ("author", author), ("description", description)):
        if v is not None:
            data[k] = v
    return Solution.model_validate(data)


__all__ = [
    "AutotuneSite",
    "Span",
    "Tunable",
    "Tunables",
    "classify",
    "find_tunables",
    "rewrite",
    "solution_tunables",
    "tuned_solution",
]
